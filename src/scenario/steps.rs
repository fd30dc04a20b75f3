//! Where each step of a scenario is written: the file, the line and column
//! of the step in it, and the PyTorch statement it stands for. The engine
//! tags every allocation with its step's number ([`crate::engine::numbered`]:
//! the setup's steps, then the loop's, a `Repeat`'s own steps after it), so a
//! block of a simulated run can point at the line that made it.
//!
//! serde keeps no positions, so the file is read a second time by a small
//! scanner that knows RON's comments, strings and brackets, and finds the
//! elements of `setup: [...]` and `steps: [...]` (and of each `Repeat`'s).

use std::sync::Arc;

use super::statement::{statement_in, LoopShape};
use crate::engine::{numbered, preorder_len, Step, NO_STEP};

/// One step as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepSite {
    /// 1-based, as the loader's errors count them; 0 where the scanner
    /// could not find the step (a file whose steps it cannot follow).
    pub line: usize,
    pub column: usize,
    pub statement: String,
}

/// Every step of a scenario, by step number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepSites {
    pub file: Arc<str>,
    /// How the model makes the statements read (`statement_in`).
    pub shape: LoopShape,
    sites: Vec<StepSite>,
}

impl StepSites {
    /// The sites of `setup` and `steps` as written in `text` (read from `file`).
    pub fn new(file: &str, text: &str, setup: &[Step], steps: &[Step]) -> StepSites {
        StepSites::for_loop(file, text, setup, steps, LoopShape::default())
    }

    /// [`StepSites::new`] for a loop of this `shape`.
    pub fn for_loop(
        file: &str,
        text: &str,
        setup: &[Step],
        steps: &[Step],
        shape: LoopShape,
    ) -> StepSites {
        let mut statements = Vec::new();
        collect(setup, 0, shape, &mut statements);
        collect(steps, preorder_len(setup), shape, &mut statements);
        let positions = positions(text)
            .filter(|p| p.len() == statements.len())
            .unwrap_or_else(|| vec![(0, 0); statements.len()]);
        StepSites {
            file: Arc::from(file),
            shape,
            sites: statements
                .into_iter()
                .zip(positions)
                .map(|(statement, (line, column))| StepSite {
                    line,
                    column,
                    statement,
                })
                .collect(),
        }
    }

    /// The step numbered `index`; `None` for [`NO_STEP`] (the model and
    /// optimizer being built) or a number the scenario does not have.
    pub fn get(&self, index: u32) -> Option<&StepSite> {
        if index == NO_STEP {
            return None;
        }
        self.sites.get(index as usize)
    }

    /// `file:line:column` of a step, or the file alone where it was not found.
    pub fn location(&self, site: &StepSite) -> String {
        match site.line {
            0 => self.file.to_string(),
            line => format!("{}:{line}:{}", self.file, site.column),
        }
    }
}

/// Statements in step-number order.
fn collect(steps: &[Step], first: u32, shape: LoopShape, out: &mut Vec<String>) {
    for (index, s) in numbered(steps, first) {
        out.push(statement_in(s, shape));
        if let Some(steps) = s.children() {
            collect(steps, index + 1, shape, out);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ident,
    Open,
    Close,
    Comma,
    Colon,
    Other,
}

#[derive(Debug, Clone, Copy)]
struct Token<'a> {
    kind: Kind,
    text: &'a str,
    line: usize,
    column: usize,
}

fn advance(c: char, line: &mut usize, column: &mut usize) {
    if c == '\n' {
        *line += 1;
        *column = 1;
    } else {
        *column += 1;
    }
}

/// RON's tokens without whitespace, comments or string contents.
fn tokens(text: &str) -> Vec<Token<'_>> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    let (mut line, mut column) = (1, 1);
    while let Some((i, c)) = chars.next() {
        let (l, col) = (line, column);
        advance(c, &mut line, &mut column);
        let next = chars.peek().map(|p| p.1);
        let kind = match c {
            '/' if next == Some('/') => {
                while let Some(&(_, c)) = chars.peek() {
                    if c == '\n' {
                        break;
                    }
                    advance(c, &mut line, &mut column);
                    chars.next();
                }
                continue;
            }
            '/' if next == Some('*') => {
                // Block comments nest in RON.
                let (mut depth, mut prev) = (0u32, '/');
                for (_, c) in chars.by_ref() {
                    advance(c, &mut line, &mut column);
                    match (prev, c) {
                        ('/', '*') => (depth, prev) = (depth + 1, ' '),
                        ('*', '/') => (depth, prev) = (depth - 1, ' '),
                        _ => prev = c,
                    }
                    if depth == 0 {
                        break;
                    }
                }
                continue;
            }
            '"' => {
                let mut escaped = false;
                for (_, c) in chars.by_ref() {
                    advance(c, &mut line, &mut column);
                    match c {
                        '\\' if !escaped => escaped = true,
                        '"' if !escaped => break,
                        _ => escaped = false,
                    }
                }
                Kind::Other
            }
            '(' | '[' | '{' => Kind::Open,
            ')' | ']' | '}' => Kind::Close,
            ',' => Kind::Comma,
            ':' => Kind::Colon,
            c if c.is_alphabetic() || c == '_' => {
                let mut end = i + c.len_utf8();
                while let Some(&(j, c)) = chars.peek() {
                    if !(c.is_alphanumeric() || c == '_') {
                        break;
                    }
                    advance(c, &mut line, &mut column);
                    end = j + c.len_utf8();
                    chars.next();
                }
                out.push(Token {
                    kind: Kind::Ident,
                    text: &text[i..end],
                    line: l,
                    column: col,
                });
                continue;
            }
            c if c.is_whitespace() => continue,
            _ => Kind::Other,
        };
        out.push(Token {
            kind,
            text: &text[i..i + c.len_utf8()],
            line: l,
            column: col,
        });
    }
    out
}

/// Line and column of every step, setup first, in step-number order; `None`
/// where the file does not have the shape the scanner expects.
fn positions(text: &str) -> Option<Vec<(usize, usize)>> {
    let t = tokens(text);
    // The scenario's own `(`: the first one outside any `#![enable(...)]`.
    let mut depth = 0usize;
    let open = t.iter().position(|x| {
        let top = depth == 0 && x.text == "(";
        match x.kind {
            Kind::Open => depth += 1,
            Kind::Close => depth = depth.saturating_sub(1),
            _ => {}
        }
        top
    })?;
    let mut out = Vec::new();
    for field in ["setup", "steps"] {
        if let Some(list) = field_list(&t, open, field) {
            elements(&t, list, &mut out)?;
        }
    }
    Some(out)
}

/// The `[` of `name: [` directly inside the group opened at `open`.
fn field_list(t: &[Token], open: usize, name: &str) -> Option<usize> {
    let mut depth = 0usize;
    for i in open + 1..t.len() {
        match t[i].kind {
            Kind::Open => depth += 1,
            Kind::Close if depth == 0 => return None,
            Kind::Close => depth -= 1,
            Kind::Ident if depth == 0 && t[i].text == name => {
                let colon = t.get(i + 1)?;
                let list = t.get(i + 2)?;
                if colon.kind == Kind::Colon && list.text == "[" {
                    return Some(i + 2);
                }
            }
            _ => {}
        }
    }
    None
}

/// The positions of the elements of the list opened at `open`, each
/// `Repeat`'s (or `Every`'s) own steps right after it.
fn elements(t: &[Token], open: usize, out: &mut Vec<(usize, usize)>) -> Option<()> {
    let mut depth = 0usize;
    let mut at_start = true;
    for i in open + 1..t.len() {
        let tok = t[i];
        if depth == 0 {
            match tok.kind {
                Kind::Close => return Some(()),
                Kind::Comma => {
                    at_start = true;
                    continue;
                }
                _ if at_start => {
                    at_start = false;
                    out.push((tok.line, tok.column));
                    let nests = matches!(tok.text, "Repeat" | "Every");
                    if nests && t.get(i + 1).is_some_and(|x| x.text == "(") {
                        let inner = field_list(t, i + 1, "steps")?;
                        elements(t, inner, out)?;
                    }
                }
                _ => {}
            }
        }
        match tok.kind {
            Kind::Open => depth += 1,
            Kind::Close => depth = depth.checked_sub(1)?,
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"#![enable(implicit_some)] // a comment with steps: [Forward]
Scenario(
    name: "x", // "steps" in a comment
    description: "steps: [Train] in a string, (unbalanced",
    setup: [AllocateBuffer(name: "buf", shape: [2, 3], dtype: F32)],
    steps: [
        ZeroGrad(set_to_none: true),
        Repeat(times: 2, steps: [
            LoadBatch(x: "x", y: "y"),
            /* a block comment ] */ Forward(input: "x", output: "out"),
        ]),
        OptimizerStep,
    ],
)"#;

    #[test]
    fn every_step_is_found_where_it_is_written() {
        let p = positions(TEXT).expect("the steps are found");
        assert_eq!(p, vec![(5, 13), (7, 9), (8, 9), (9, 13), (10, 37), (12, 9)]);
    }

    #[test]
    fn sites_pair_numbers_with_lines_and_statements() {
        let step = |s: &str| ron::from_str::<Step>(s).expect("a step");
        let setup = [step(
            r#"AllocateBuffer(name: "buf", shape: [2, 3], dtype: F32)"#,
        )];
        let steps = [
            step("ZeroGrad(set_to_none: Some(true))"),
            step(
                r#"Repeat(times: 2, steps: [LoadBatch(x: "x", y: "y"), Forward(input: "x", output: "out")])"#,
            ),
            step("OptimizerStep"),
        ];
        let sites = StepSites::new("scenarios/x.ron", TEXT, &setup, &steps);
        let forward = sites.get(4).expect("step 4");
        assert_eq!(forward.statement, "out = model(x)");
        assert_eq!(sites.location(forward), "scenarios/x.ron:10:37");
        assert_eq!(sites.get(5).map(|s| s.line), Some(12));
        assert!(sites.get(NO_STEP).is_none());
    }

    #[test]
    fn every_shipped_step_is_found() {
        for b in crate::scenario::builtins() {
            let file = format!("scenarios/{}.ron", b.name);
            let (_, built) = crate::scenario::load_str(b.source, &file).expect("ships valid");
            let p = &built.program;
            let n = preorder_len(&p.setup) + preorder_len(&p.steps);
            let lines: Vec<&str> = b.source.lines().collect();
            for i in 0..n {
                let site = built.steps.get(i).expect("every number has a site");
                assert!(site.line > 0, "{file}: step {i} not found");
                let at: String = lines[site.line - 1].chars().skip(site.column - 1).collect();
                assert!(
                    at.starts_with(char::is_uppercase),
                    "{file}:{}: {at}",
                    site.line
                );
            }
        }
    }
}
