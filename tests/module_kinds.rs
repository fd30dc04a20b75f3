//! A new module kind of the model language touches one file: every match
//! on a kind (a pattern naming `Module::X` or `Leaf::X` for an X that is
//! not a container) is in `src/engine/model_lang/kinds.rs`, and there each
//! match names every kind with an arm of its own (no `_` arm that would
//! let a new kind pass unnoticed). The kinds are read from the enums in
//! `spec.rs` and `kinds.rs`; the containers are the variants that hold a
//! `Module` (`Sequential`, `Repeat`, …), which the analysis, the build and
//! the forward walk themselves.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

const KINDS: &str = "src/engine/model_lang/kinds.rs";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn parse(path: &Path) -> syn::File {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The variants of `enum name` in `file`, and those that hold a `Module`.
fn variants(file: &syn::File, name: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut all = BTreeSet::new();
    let mut containers = BTreeSet::new();
    for item in &file.items {
        let syn::Item::Enum(e) = item else { continue };
        if e.ident != name {
            continue;
        }
        for v in &e.variants {
            all.insert(v.ident.to_string());
            let holds_module = v.fields.iter().any(|f| names_module(&f.ty));
            if holds_module {
                containers.insert(v.ident.to_string());
            }
        }
    }
    assert!(!all.is_empty(), "no `enum {name}`");
    (all, containers)
}

/// Whether a type mentions `Module` (`Box<Module>`, `Vec<(String, Module)>`).
fn names_module(ty: &syn::Type) -> bool {
    struct V(bool);
    impl<'ast> Visit<'ast> for V {
        fn visit_path_segment(&mut self, s: &'ast syn::PathSegment) {
            self.0 |= s.ident == "Module";
            syn::visit::visit_path_segment(self, s);
        }
    }
    let mut v = V(false);
    v.visit_type(ty);
    v.0
}

/// Identifiers in a token stream, nested groups included.
fn quote_tokens(ts: TokenStream) -> Vec<String> {
    let mut out = Vec::new();
    for t in ts {
        match t {
            TokenTree::Ident(i) => out.push(i.to_string()),
            TokenTree::Group(g) => out.extend(quote_tokens(g.stream())),
            _ => {}
        }
    }
    out
}

/// One pattern that names a kind: the enum, the variant and its line.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Site {
    file: String,
    line: usize,
    kind: String,
}

/// The kinds each `match` names, and every pattern naming a kind.
struct Finder<'a> {
    file: String,
    /// `(enum, leaf variants)` to look for.
    enums: &'a [(&'a str, BTreeSet<String>)],
    sites: Vec<Site>,
    /// For each match on one of the enums: the kinds its arms name, and
    /// whether an arm catches everything (`_`, or a bare binding).
    matches: Vec<(usize, BTreeSet<String>, bool)>,
}

impl Finder<'_> {
    /// The `Enum::Kind` a path names, when Kind is a leaf of one of the enums.
    fn kind(&self, path: &syn::Path) -> Option<String> {
        let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let [.., e, v] = segs.as_slice() else {
            return None;
        };
        self.enums
            .iter()
            .find(|(name, leaves)| name == e && leaves.contains(v))
            .map(|(name, _)| format!("{name}::{v}"))
    }

    fn kinds_in(&self, pat: &syn::Pat, out: &mut BTreeSet<String>) {
        struct P<'b, 'c>(&'b Finder<'c>, &'b mut BTreeSet<String>);
        impl<'ast> Visit<'ast> for P<'_, '_> {
            fn visit_path(&mut self, p: &'ast syn::Path) {
                if let Some(k) = self.0.kind(p) {
                    self.1.insert(k);
                }
                syn::visit::visit_path(self, p);
            }
        }
        P(self, out).visit_pat(pat);
    }
}

fn catches_all(pat: &syn::Pat) -> bool {
    match pat {
        syn::Pat::Wild(_) => true,
        syn::Pat::Ident(i) => {
            i.subpat.is_none() && i.ident.to_string().starts_with(char::is_lowercase)
        }
        syn::Pat::Or(o) => o.cases.iter().any(catches_all),
        _ => false,
    }
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_pat(&mut self, pat: &'ast syn::Pat) {
        let mut kinds = BTreeSet::new();
        self.kinds_in(pat, &mut kinds);
        let line = syn::spanned::Spanned::span(pat).start().line;
        for kind in kinds {
            self.sites.push(Site {
                file: self.file.clone(),
                line,
                kind,
            });
        }
        // Nested patterns were read with this one.
    }

    fn visit_expr_match(&mut self, m: &'ast syn::ExprMatch) {
        let mut named = BTreeSet::new();
        let mut wild = false;
        for arm in &m.arms {
            self.kinds_in(&arm.pat, &mut named);
            wild |= catches_all(&arm.pat);
        }
        if !named.is_empty() {
            let line = m.match_token.span.start().line;
            self.matches.push((line, named, wild));
        }
        syn::visit::visit_expr_match(self, m);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // `matches!(m, Module::Linear { .. })`: a pattern in tokens.
        let idents = quote_tokens(mac.tokens.clone());
        for w in idents.windows(2) {
            if let Some((name, _)) = self
                .enums
                .iter()
                .find(|(name, leaves)| w[0] == *name && leaves.contains(&w[1]))
            {
                let is_pattern_macro =
                    mac.path.is_ident("matches") || mac.path.is_ident("assert_matches");
                if is_pattern_macro {
                    self.sites.push(Site {
                        file: self.file.clone(),
                        line: mac.path.segments[0].ident.span().start().line,
                        kind: format!("{name}::{}", w[1]),
                    });
                }
            }
        }
        syn::visit::visit_macro(self, mac);
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src") {
        let p = entry.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The kinds of the language and of its built form, leaves only.
fn leaf_enums() -> Vec<(&'static str, BTreeSet<String>)> {
    let root = repo();
    let spec = parse(&root.join("src/engine/model_lang/spec.rs"));
    let (modules, containers) = variants(&spec, "Module");
    let kinds = parse(&root.join(KINDS));
    let (leaves, _) = variants(&kinds, "Leaf");
    assert_eq!(
        containers,
        [
            "Checkpoint",
            "Frame",
            "HfModel",
            "Registered",
            "Repeat",
            "Residual",
            "Sequential"
        ]
        .map(String::from)
        .into(),
        "the containers the walkers handle"
    );
    vec![("Module", &modules - &containers), ("Leaf", leaves)]
}

fn find(file: &str, source: &str, enums: &[(&str, BTreeSet<String>)]) -> Finder<'static> {
    let parsed = syn::parse_file(source).unwrap_or_else(|e| panic!("{file}: {e}"));
    // The finder borrows `enums` only while it runs; keep it owned.
    let enums: &'static [(&'static str, BTreeSet<String>)] = Box::leak(
        enums
            .iter()
            .map(|(n, s)| (&*Box::leak(n.to_string().into_boxed_str()), s.clone()))
            .collect::<Vec<_>>()
            .into_boxed_slice(),
    );
    let mut f = Finder {
        file: file.to_string(),
        enums,
        sites: Vec::new(),
        matches: Vec::new(),
    };
    f.visit_file(&parsed);
    f
}

#[test]
fn every_match_on_a_module_kind_is_in_kinds_rs() {
    let enums = leaf_enums();
    let root = repo();
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    let mut outside = Vec::new();
    for path in &files {
        let rel = path
            .strip_prefix(&root)
            .expect("under the repo")
            .display()
            .to_string();
        if rel == KINDS {
            continue;
        }
        let text = fs::read_to_string(path).expect("read");
        outside.extend(find(&rel, &text, &enums).sites);
    }
    assert!(
        outside.is_empty(),
        "a module kind is matched outside {KINDS} (give it an arm there instead):\n{}",
        outside
            .iter()
            .map(|s| format!("  {}:{}: {}", s.file, s.line, s.kind))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn each_match_in_kinds_rs_gives_every_kind_an_arm() {
    let enums = leaf_enums();
    let text = fs::read_to_string(repo().join(KINDS)).expect("read");
    let found = find(KINDS, &text, &enums);
    let mut concerns = 0;
    for (line, named, wild) in &found.matches {
        // The one `if let` that turns a Linear into a Proj is not a match.
        let enum_name = named
            .iter()
            .next()
            .and_then(|k| k.split("::").next())
            .expect("a kind");
        let all = &enums.iter().find(|(n, _)| *n == enum_name).expect("enum").1;
        let missing: Vec<&String> = all
            .iter()
            .filter(|k| !named.contains(&format!("{enum_name}::{k}")))
            .collect();
        // A match on one kind's fields (`Mlp { gated: true }`) is inside an arm.
        if named.len() <= 2 && missing.len() > 2 {
            continue;
        }
        concerns += 1;
        assert!(
            missing.is_empty() && !wild,
            "{KINDS}:{line}: a match on {enum_name} without an arm for {missing:?}{}",
            if *wild {
                " (it has a catch-all arm)"
            } else {
                ""
            }
        );
    }
    // args, out_shape, projection_names, pytorch_refusal, the build, the
    // forward, projections.
    assert!(
        concerns >= 7,
        "{concerns} matches over the kinds in {KINDS}"
    );
}

#[test]
fn a_planted_match_outside_kinds_rs_is_found() {
    let enums = vec![(
        "Module",
        ["Linear", "ReLU"].map(String::from).into_iter().collect(),
    )];
    let src = "fn f(m: &Module) -> u64 {\n    match m {\n        Module::Linear { out, .. } => *out,\n        Module::Sequential(_) => 0,\n        _ => 1,\n    }\n}\nfn g(m: &Module) -> bool { matches!(m, Module::ReLU) }\nfn h() -> Module { Module::ReLU }\n";
    let f = find("src/x.rs", src, &enums);
    let at: Vec<(usize, &str)> = f.sites.iter().map(|s| (s.line, s.kind.as_str())).collect();
    assert_eq!(at, [(3, "Module::Linear"), (8, "Module::ReLU")]);
    assert_eq!(f.matches.len(), 1);
    assert!(f.matches[0].2, "the `_` arm is a catch-all");
}
