//! The layers of `src/` hold by themselves: every `crate::…` and `super::…`
//! path in the library names only its own top-level module or one in a lower
//! layer. The order is written once, in `docs/architecture.md` (the block
//! after `<!-- layer order -->`), and read from there.
//!
//! Every `.rs` file under `src/` is parsed with `syn`, starting from
//! `src/lib.rs` and `src/main.rs` and following `mod` declarations, so a path
//! is judged from the module it really sits in (`super::` inside an inline
//! `mod tests` of `src/alloc/mod.rs` is `alloc`). Paths inside macro calls are
//! read from their tokens. Code under `#[cfg(test)]` is held to the same order:
//! a test of a lower layer that needs a higher one belongs in that layer or in
//! `tests/`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::visit::Visit;

/// The marker the order's code block follows in the architecture doc.
const ORDER_MARKER: &str = "<!-- layer order -->";

/// Top-level modules and the rank of their layer (0 = the bottom).
#[derive(Debug)]
struct Layers {
    rank: BTreeMap<String, usize>,
}

impl Layers {
    /// Reads the block of `doc` after [`ORDER_MARKER`]: one layer a line, the
    /// top first, each `module[, module…]` then what the layer does.
    fn from_doc(doc: &str) -> Result<Layers, String> {
        let after = doc
            .split_once(ORDER_MARKER)
            .ok_or_else(|| format!("no `{ORDER_MARKER}` in the doc"))?
            .1;
        let block = after
            .split_once("```")
            .and_then(|(_, rest)| rest.split_once('\n'))
            .and_then(|(_, rest)| rest.split_once("```"))
            .ok_or("no code block after the marker")?
            .0;
        let lines: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
        let mut rank = BTreeMap::new();
        for (i, line) in lines.iter().enumerate() {
            for name in layer_names(line) {
                if rank.insert(name.to_string(), lines.len() - 1 - i).is_some() {
                    return Err(format!("`{name}` is in the order twice"));
                }
            }
        }
        if rank.is_empty() {
            return Err("the layer order is empty".into());
        }
        Ok(Layers { rank })
    }
}

/// The modules a line of the order names: `a, b, c` before the description.
fn layer_names(line: &str) -> Vec<&str> {
    let mut names = Vec::new();
    for word in line.split_whitespace() {
        names.push(word.trim_end_matches(','));
        if !word.ends_with(',') {
            break;
        }
    }
    names
}

/// One path that names a module of a higher (or the same, other) layer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Violation {
    file: String,
    line: usize,
    column: usize,
    from: String,
    to: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}: `{}` uses `{}`, which is not in a lower layer",
            self.file, self.line, self.column, self.from, self.to
        )
    }
}

/// Walks one parsed file, keeping the module it is in (inline `mod`s
/// included) and collecting every crate-rooted module a path names.
struct Walker<'a> {
    file: &'a str,
    /// The module path of the current item, from the crate root.
    module: Vec<String>,
    /// `(top-level module named, position)`.
    uses: Vec<(String, Span)>,
    /// Inline modules met, with their `mod x;` children: `(module path, file)`.
    children: Vec<(Vec<String>, Option<String>)>,
    /// Errors of resolution (a `super` past the crate root).
    errors: Vec<String>,
}

impl Walker<'_> {
    /// The crate-root module a path of `segments` names, if it leaves the
    /// current top-level module through `crate` or `super`.
    fn resolve(&mut self, segments: &[String], span: Span) {
        let Some(first) = segments.first() else {
            return;
        };
        let target = match first.as_str() {
            "crate" => segments.get(1).cloned(),
            "super" => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                if ups > self.module.len() {
                    self.errors
                        .push(format!("{}: `super` past the crate root", self.file));
                    return;
                }
                let base = &self.module[..self.module.len() - ups];
                match base.first() {
                    Some(top) => Some(top.clone()),
                    None => segments.get(ups).cloned(),
                }
            }
            _ => None,
        };
        if let Some(t) = target {
            if t != "*" && t != "self" {
                self.uses.push((t, span));
            }
        }
    }

    /// Every path a `use` tree imports; `start`: where the path begins.
    fn use_tree(&mut self, prefix: &mut Vec<String>, start: Option<Span>, tree: &syn::UseTree) {
        let (leaf, span) = match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, start.or(Some(p.ident.span())), &p.tree);
                prefix.pop();
                return;
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, start, t);
                }
                return;
            }
            syn::UseTree::Name(n) => (n.ident.to_string(), n.ident.span()),
            syn::UseTree::Rename(r) => (r.ident.to_string(), r.ident.span()),
            syn::UseTree::Glob(g) => ("*".to_string(), g.star_token.span),
        };
        prefix.push(leaf);
        self.resolve(&prefix.clone(), start.unwrap_or(span));
        prefix.pop();
    }

    /// `crate :: name` and `super :: …` sequences inside a macro's tokens.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) if id == "crate" || id == "super" => {
                    let mut segments = vec![id.to_string()];
                    let mut j = i + 1;
                    while let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) =
                        (trees.get(j), trees.get(j + 1))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        match trees.get(j + 2) {
                            Some(TokenTree::Ident(next)) => segments.push(next.to_string()),
                            _ => break,
                        }
                        j += 3;
                    }
                    // `$crate` (a macro_rules! body) is the defining crate's root.
                    let dollar =
                        i > 0 && matches!(&trees[i - 1], TokenTree::Punct(p) if p.as_char() == '$');
                    if segments.len() > 1 && !dollar {
                        self.resolve(&segments, id.span());
                    }
                    i = j.max(i + 1);
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), None, &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if let Some(first) = path.segments.first() {
            self.resolve(&segments, first.ident.span());
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        self.module.push(item.ident.to_string());
        match &item.content {
            Some(_) => syn::visit::visit_item_mod(self, item),
            None => self
                .children
                .push((self.module.clone(), path_attr(&item.attrs))),
        }
        self.module.pop();
    }
}

/// A `#[path = "…"]` attribute's value.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// What one file names: `(top-level module used, line, column)`, and the
/// `mod x;` children it declares.
struct FileUses {
    uses: Vec<(String, usize, usize)>,
    children: Vec<(Vec<String>, Option<String>)>,
}

/// Parses `source` as the file of module `module` and lists what it names.
fn file_uses(file: &str, module: &[String], source: &str) -> Result<FileUses, String> {
    let ast = syn::parse_file(source).map_err(|e| {
        let at = e.span().start();
        format!("{file}:{}:{}: {e}", at.line, at.column + 1)
    })?;
    let mut w = Walker {
        file,
        module: module.to_vec(),
        uses: Vec::new(),
        children: Vec::new(),
        errors: Vec::new(),
    };
    w.visit_file(&ast);
    if let Some(e) = w.errors.first() {
        return Err(e.clone());
    }
    Ok(FileUses {
        uses: w
            .uses
            .into_iter()
            .map(|(t, s)| (t, s.start().line, s.start().column + 1))
            .collect(),
        children: w.children,
    })
}

/// Every use in `source` (module `module`) against the order.
fn check_source(
    layers: &Layers,
    file: &str,
    module: &[String],
    source: &str,
) -> Result<Vec<Violation>, String> {
    let Some(from) = module.first() else {
        return Ok(Vec::new());
    };
    let from_rank = *layers
        .rank
        .get(from)
        .ok_or_else(|| format!("{file}: module `{from}` is not in the layer order"))?;
    let mut out = Vec::new();
    for (to, line, column) in file_uses(file, module, source)?.uses {
        if &to == from {
            continue;
        }
        let to_rank = *layers
            .rank
            .get(&to)
            .ok_or_else(|| format!("{file}:{line}: module `{to}` is not in the layer order"))?;
        if to_rank >= from_rank {
            out.push(Violation {
                file: file.to_string(),
                line,
                column,
                from: from.clone(),
                to,
            });
        }
    }
    Ok(out)
}

/// The file a `mod name;` declared in `parent_file` (module `parent_dir_module`)
/// lives in.
fn child_file(parent_file: &Path, inline: &[String], name: &str, attr: Option<&str>) -> PathBuf {
    let dir = parent_file.parent().unwrap_or(Path::new("."));
    let stem = parent_file
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();
    let owns_dir = matches!(stem, "mod" | "lib" | "main");
    let mut base = dir.to_path_buf();
    if !owns_dir {
        base.push(stem);
    }
    for m in inline {
        base.push(m);
    }
    if let Some(p) = attr {
        return dir.join(p);
    }
    let flat = base.join(format!("{name}.rs"));
    if flat.exists() {
        flat
    } else {
        base.join(name).join("mod.rs")
    }
}

/// Walks the library's module tree from `src/lib.rs` (and the binary's from
/// `src/main.rs`), checking every library file; returns the violations and
/// every file reached.
fn check_tree(root: &Path, layers: &Layers) -> Result<(Vec<Violation>, BTreeSet<PathBuf>), String> {
    let mut violations = Vec::new();
    let mut reached = BTreeSet::new();
    // (file, its module path, whether it is the library's)
    let mut queue = vec![
        (root.join("src/lib.rs"), Vec::<String>::new(), true),
        (root.join("src/main.rs"), Vec::new(), false),
    ];
    while let Some((file, module, library)) = queue.pop() {
        let shown = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        let source = fs::read_to_string(&file).map_err(|e| format!("{shown}: {e}"))?;
        let uses = file_uses(&shown, &module, &source)?;
        if library {
            violations.extend(check_source(layers, &shown, &module, &source)?);
        }
        for (child, attr) in uses.children {
            let inline = &child[module.len()..child.len() - 1];
            let name = child.last().cloned().unwrap_or_default();
            let path = child_file(&file, inline, &name, attr.as_deref());
            queue.push((path, child, library));
        }
        reached.insert(fs::canonicalize(&file).unwrap_or(file));
    }
    violations.sort();
    violations.dedup();
    Ok((violations, reached))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn layers() -> Layers {
    let doc = fs::read_to_string(repo().join("docs/architecture.md"))
        .expect("docs/architecture.md holds the layer order");
    Layers::from_doc(&doc).expect("a layer order")
}

#[test]
fn no_library_module_uses_a_higher_layer() {
    let (violations, _) = check_tree(&repo(), &layers()).expect("the tree parses");
    let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(
        list.is_empty(),
        "imports against the layer order of docs/architecture.md:\n{}",
        list.join("\n")
    );
}

#[test]
fn every_source_file_is_reached_from_a_crate_root() {
    let root = repo();
    let (_, reached) = check_tree(&root, &layers()).expect("the tree parses");
    let mut all = Vec::new();
    rust_files(&root.join("src"), &mut all);
    let missed: Vec<String> = all
        .into_iter()
        .filter(|p| !reached.contains(&fs::canonicalize(p).unwrap_or(p.clone())))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        missed.is_empty(),
        "files the walk did not reach: {missed:?}"
    );
}

#[test]
fn every_top_level_module_is_in_the_order() {
    let layers = layers();
    let lib = fs::read_to_string(repo().join("src/lib.rs")).expect("src/lib.rs");
    let ast = syn::parse_file(&lib).expect("src/lib.rs parses");
    for item in ast.items {
        if let syn::Item::Mod(m) = item {
            let name = m.ident.to_string();
            assert!(
                layers.rank.contains_key(&name),
                "src/lib.rs declares `{name}`, which docs/architecture.md's layer order leaves out"
            );
        }
    }
}

// The checker itself, on planted sources.

fn planted_order() -> Layers {
    Layers::from_doc(
        "# t\n<!-- layer order -->\n```text\ntui  the top\nreport, job  peers\nengine  middle\nalloc  bottom\n```\n",
    )
    .expect("an order")
}

fn module(path: &str) -> Vec<String> {
    path.split("::").map(String::from).collect()
}

#[test]
fn a_planted_upward_use_is_found_with_its_position() {
    let src = "//! doc\nuse crate::alloc::Block;\n\nuse crate::engine::work::Tally;\n";
    let v =
        check_source(&planted_order(), "src/alloc/x.rs", &module("alloc::x"), src).expect("parses");
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!((v[0].to.as_str(), v[0].line, v[0].column), ("engine", 4, 5));
}

#[test]
fn downward_uses_pass() {
    let src = "use crate::{alloc::Block, engine::Tensor};\nfn f() { crate::alloc::go(); }\n";
    let v = check_source(&planted_order(), "src/tui/x.rs", &module("tui::x"), src).expect("parses");
    assert!(v.is_empty(), "{v:?}");
}

#[test]
fn a_peer_of_the_same_layer_is_refused() {
    let src = "fn f() -> crate::job::Session { todo!() }\n";
    let v = check_source(
        &planted_order(),
        "src/report/x.rs",
        &module("report::x"),
        src,
    )
    .expect("parses");
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].to, "job");
}

#[test]
fn grouped_uses_expression_paths_and_macro_tokens_are_read() {
    let src = "use crate::{tui::App};\nfn f() { let _ = crate::report::run(); }\nfn g() { println!(\"{}\", crate::job::NAME); }\n";
    let v = check_source(
        &planted_order(),
        "src/engine/x.rs",
        &module("engine::x"),
        src,
    )
    .expect("parses");
    let to: Vec<&str> = v.iter().map(|v| v.to.as_str()).collect();
    assert_eq!(to, ["tui", "report", "job"]);
}

#[test]
fn super_is_resolved_from_the_module_it_is_in() {
    // In `alloc/mod.rs` (module `alloc`), `super` is the crate root.
    let up = "use super::engine::Tensor;\n";
    let v =
        check_source(&planted_order(), "src/alloc/mod.rs", &module("alloc"), up).expect("parses");
    assert_eq!(v.len(), 1, "{v:?}");
    // In `alloc/x.rs`, an inline `mod tests` reaches `alloc::x` with one
    // `super`, and `alloc` with two: both its own layer.
    let own = "mod tests { use super::super::Block; use super::f; }\n";
    let v =
        check_source(&planted_order(), "src/alloc/x.rs", &module("alloc::x"), own).expect("parses");
    assert!(v.is_empty(), "{v:?}");
    // Three reach the root, then `tui`.
    let far = "mod tests { use super::super::super::tui::App; }\n";
    let v =
        check_source(&planted_order(), "src/alloc/x.rs", &module("alloc::x"), far).expect("parses");
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0].to, "tui");
}

#[test]
fn doc_comments_and_strings_are_not_uses() {
    let src = "/// See [`crate::tui::App`].\nfn f() -> &'static str { \"crate::tui\" }\n";
    let v =
        check_source(&planted_order(), "src/alloc/x.rs", &module("alloc::x"), src).expect("parses");
    assert!(v.is_empty(), "{v:?}");
}

#[test]
fn a_module_missing_from_the_order_is_an_error() {
    let src = "use crate::nowhere::X;\n";
    let e = check_source(&planted_order(), "src/tui/x.rs", &module("tui::x"), src)
        .expect_err("not in the order");
    assert!(e.contains("nowhere"), "{e}");
}
