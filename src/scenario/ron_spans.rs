//! Where each value of a RON file starts, by its place in the structure:
//! `model.net[0][2][1].block.kv_heads` → line 9, column 70. Errors found after
//! parsing (a model's arguments, a dimension) carry the path of what they
//! are about, and this index turns it into the file's line and column,
//! reading the same syntax `ron` parsed (comments, strings, raw strings,
//! nested block comments), so a word in a description or a comment is never
//! mistaken for the field.

use crate::engine::model_lang::Seg;

/// One step of a path into the file's value (a [`Seg`], or a field named
/// at run time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At<'a> {
    Field(&'a str),
    Index(usize),
    /// Last in a path: the value a field holds, not the field's name.
    Value,
}

impl<'a> From<&'a Seg> for At<'a> {
    fn from(s: &'a Seg) -> At<'a> {
        match s {
            Seg::Field(f) => At::Field(f),
            Seg::Index(i) => At::Index(*i),
        }
    }
}

/// A 1-based line and column (in characters, as `ron` counts them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub column: usize,
}

/// One parsed value: where it starts, and what it holds.
#[derive(Debug)]
struct Value {
    at: Pos,
    body: Body,
}

#[derive(Debug)]
enum Body {
    /// A number, string, char, unit or bare identifier.
    Atom,
    /// `Name(a: …, b: …)` or `(a: …)`: each field's name position and value.
    Fields(Vec<(String, Pos, Value)>),
    /// `[…]`, `(…, …)`, `Name(…)` (a newtype, tuple or `Some`).
    Items(Vec<Value>),
    /// `{key: value}`: keys as written (strings without their quotes).
    Map(Vec<(String, Pos, Value)>),
}

/// The position of the value at `path` in `text` (for a field, of its
/// name), or `None` when the text does not parse or has no such value.
pub fn position(text: &str, path: &[At<'_>]) -> Option<Pos> {
    let mut p = Parser::new(text);
    p.skip_attributes();
    let root = p.value()?;
    resolve(&root, path, None)
}

fn resolve(v: &Value, path: &[At<'_>], name_at: Option<Pos>) -> Option<Pos> {
    let Some((first, rest)) = path.split_first() else {
        return Some(name_at.unwrap_or(v.at));
    };
    match (first, &v.body) {
        (At::Value, _) => Some(v.at),
        (At::Field(f), Body::Fields(fields) | Body::Map(fields)) => {
            let (_, at, value) = fields.iter().find(|(n, _, _)| n == f)?;
            resolve(value, rest, Some(*at))
        }
        (At::Index(i), Body::Items(items)) => resolve(items.get(*i)?, rest, None),
        // `Some(x)` (or a newtype) around what the path goes into.
        (At::Field(_), Body::Items(items)) if items.len() == 1 => resolve(&items[0], path, name_at),
        _ => None,
    }
}

struct Parser<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
    column: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Parser<'a> {
        Parser {
            chars: text.chars().peekable(),
            line: 1,
            column: 1,
        }
    }

    fn pos(&self) -> Pos {
        Pos {
            line: self.line,
            column: self.column,
        }
    }

    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
            self.column = 1;
        } else {
            self.column += 1;
        }
        Some(c)
    }

    /// Whitespace and comments (`//…`, nested `/* … */`).
    fn skip(&mut self) {
        loop {
            match self.peek() {
                Some(c) if c.is_whitespace() => {
                    self.bump();
                }
                Some('/') => {
                    let mut ahead = self.chars.clone();
                    ahead.next();
                    match ahead.next() {
                        Some('/') => {
                            while self.peek().is_some_and(|c| c != '\n') {
                                self.bump();
                            }
                        }
                        Some('*') => {
                            self.bump();
                            self.bump();
                            let mut depth = 1;
                            while depth > 0 {
                                match self.bump() {
                                    Some('*') if self.peek() == Some('/') => {
                                        self.bump();
                                        depth -= 1;
                                    }
                                    Some('/') if self.peek() == Some('*') => {
                                        self.bump();
                                        depth += 1;
                                    }
                                    Some(_) => {}
                                    None => return,
                                }
                            }
                        }
                        _ => return,
                    }
                }
                _ => return,
            }
        }
    }

    /// `#![enable(…)]` lines before the value.
    fn skip_attributes(&mut self) {
        self.skip();
        while self.peek() == Some('#') {
            while self.peek().is_some_and(|c| c != ']') {
                self.bump();
            }
            self.bump();
            self.skip();
        }
    }

    fn ident(&mut self) -> String {
        let mut s = String::new();
        if self.peek() == Some('r') {
            let mut ahead = self.chars.clone();
            ahead.next();
            if ahead.next() == Some('#') {
                self.bump();
                self.bump();
            }
        }
        while let Some(c) = self.peek().filter(|c| c.is_alphanumeric() || *c == '_') {
            s.push(c);
            self.bump();
        }
        s
    }

    /// A quoted string's contents (escapes kept as written; only keys use them).
    fn string(&mut self) -> Option<String> {
        self.bump();
        let mut s = String::new();
        loop {
            match self.bump()? {
                '"' => return Some(s),
                '\\' => {
                    s.push('\\');
                    s.push(self.bump()?);
                }
                c => s.push(c),
            }
        }
    }

    /// `r"…"`, `r#"…"#`, `br"…"` after the `r`.
    fn raw_string(&mut self) -> Option<()> {
        let mut hashes = 0;
        while self.peek() == Some('#') {
            self.bump();
            hashes += 1;
        }
        if self.bump()? != '"' {
            return None;
        }
        loop {
            if self.bump()? == '"' {
                let mut closing = 0;
                while closing < hashes && self.peek() == Some('#') {
                    self.bump();
                    closing += 1;
                }
                if closing == hashes {
                    return Some(());
                }
            }
        }
    }

    fn value(&mut self) -> Option<Value> {
        self.skip();
        let at = self.pos();
        let body = match self.peek()? {
            '(' => self.parenthesised()?,
            '[' => {
                self.bump();
                self.items(']')?
            }
            '{' => self.map()?,
            '"' => {
                self.string()?;
                // A string is pointed at by its first character, inside the quotes.
                let at = Pos {
                    column: at.column + 1,
                    ..at
                };
                return Some(Value {
                    at,
                    body: Body::Atom,
                });
            }
            '\'' => {
                self.bump();
                if self.bump()? == '\\' {
                    self.bump();
                }
                while self.bump()? != '\'' {}
                Body::Atom
            }
            'r' | 'b' => return self.prefixed(at),
            c if c.is_alphabetic() || c == '_' => self.named()?,
            _ => {
                // A number: everything up to a delimiter.
                while self.peek().is_some_and(|c| {
                    !matches!(c, ',' | ')' | ']' | '}' | ':') && !c.is_whitespace()
                }) {
                    self.bump();
                }
                Body::Atom
            }
        };
        Some(Value { at, body })
    }

    /// What starts with `r` or `b`: `r"…"`, `r#"…"#`, `b"…"`, `br"…"`, or
    /// an identifier (`r#type`, `bias`).
    fn prefixed(&mut self, at: Pos) -> Option<Value> {
        let mut ahead = self.chars.clone();
        let mut first = ahead.next();
        let byte = first == Some('b') && matches!(ahead.clone().next(), Some('"' | 'r'));
        if byte {
            first = ahead.next();
        }
        let raw = first == Some('r') && {
            let mut rest = ahead.clone();
            let mut next = rest.next();
            while next == Some('#') {
                next = rest.next();
            }
            next == Some('"')
        };
        let body = if byte && first == Some('"') {
            self.bump();
            self.string()?;
            Body::Atom
        } else if raw {
            if byte {
                self.bump();
            }
            self.bump();
            self.raw_string()?;
            Body::Atom
        } else {
            self.named()?
        };
        Some(Value { at, body })
    }

    /// `Name`, `Name(…)`.
    fn named(&mut self) -> Option<Body> {
        self.ident();
        self.skip();
        if self.peek() == Some('(') {
            self.parenthesised()
        } else {
            Some(Body::Atom)
        }
    }

    /// `(a: 1, …)` as fields, else `(…, …)` as items.
    fn parenthesised(&mut self) -> Option<Body> {
        self.bump();
        self.skip();
        if self.peek() == Some(')') {
            self.bump();
            return Some(Body::Items(Vec::new()));
        }
        // A field is an identifier followed by `:`.
        let mut ahead = self.chars.clone();
        let mut saw_ident = false;
        let is_field = loop {
            match ahead.next() {
                Some(c) if c.is_alphanumeric() || c == '_' || (c == '#' && saw_ident) => {
                    saw_ident = true
                }
                Some(c) if c.is_whitespace() && saw_ident => {
                    // Whitespace between a name and its colon.
                    let rest = ahead.clone().find(|c| !c.is_whitespace());
                    break rest == Some(':');
                }
                Some(':') => break saw_ident,
                _ => break false,
            }
        };
        if !is_field {
            return self.items(')');
        }
        let mut fields = Vec::new();
        loop {
            self.skip();
            if self.peek() == Some(')') {
                self.bump();
                return Some(Body::Fields(fields));
            }
            let at = self.pos();
            let name = self.ident();
            self.skip();
            if self.bump()? != ':' {
                return None;
            }
            let value = self.value()?;
            fields.push((name, at, value));
            self.skip();
            match self.bump()? {
                ',' => {}
                ')' => return Some(Body::Fields(fields)),
                _ => return None,
            }
        }
    }

    /// Items up to `close`, after the opening bracket.
    fn items(&mut self, close: char) -> Option<Body> {
        let mut items = Vec::new();
        loop {
            self.skip();
            if self.peek() == Some(close) {
                self.bump();
                return Some(Body::Items(items));
            }
            items.push(self.value()?);
            self.skip();
            match self.bump()? {
                ',' => {}
                c if c == close => return Some(Body::Items(items)),
                _ => return None,
            }
        }
    }

    fn map(&mut self) -> Option<Body> {
        self.bump();
        let mut entries = Vec::new();
        loop {
            self.skip();
            if self.peek() == Some('}') {
                self.bump();
                return Some(Body::Map(entries));
            }
            let at = self.pos();
            let key = match self.peek()? {
                '"' => self.string()?,
                // A key that is no string names nothing a path asks for.
                _ => {
                    self.value()?;
                    String::new()
                }
            };
            self.skip();
            if self.bump()? != ':' {
                return None;
            }
            let value = self.value()?;
            entries.push((key, at, value));
            self.skip();
            match self.bump()? {
                ',' => {}
                '}' => return Some(Body::Map(entries)),
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r##"#![enable(implicit_some)]
// kv_heads: a comment that names the field
Scenario(
    description: "kv_heads: Some(3) in a string", note: r#"a "raw" kv_heads"#,
    /* a block /* nested */ comment: kv_heads */
    model: Modules(
        net: Sequential([
            ("a", Linear(in: 1, out: 2)),
            ("b", Attention(hidden: 8, heads: 4, kv_heads: Some(3))),
        ]),
        lora: Some((r: 0, alpha: 1.0)),
    ),
    env: {"KEY": "v"},
)
"##;

    fn at(path: &[At<'_>]) -> Option<(usize, usize)> {
        position(TEXT, path).map(|p| (p.line, p.column))
    }

    #[test]
    fn a_field_is_found_by_its_place_not_by_its_name() {
        let kv = [
            At::Field("model"),
            At::Field("net"),
            At::Index(0),
            At::Index(1),
            At::Index(1),
            At::Field("kv_heads"),
        ];
        // Line 9, where `kv_heads:` starts, past the comment and the strings.
        let line = TEXT.lines().nth(8).expect("line 9");
        let column = line.find("kv_heads").expect("there") + 1;
        assert_eq!(at(&kv), Some((9, column)));
        let value = [&kv[..5], &[At::Value]].concat();
        assert_eq!(
            at(&value),
            Some((9, line.find("Attention").expect("there") + 1))
        );
    }

    #[test]
    fn some_is_looked_through_and_maps_are_keyed_by_their_strings() {
        let r = [At::Field("model"), At::Field("lora"), At::Field("r")];
        let column = |line: usize, marker: &str| {
            TEXT.lines()
                .nth(line - 1)
                .and_then(|l| l.find(marker))
                .expect("there")
                + 1
        };
        assert_eq!(at(&r), Some((11, column(11, "r: 0"))));
        let key = [At::Field("env"), At::Field("KEY")];
        assert_eq!(at(&key), Some((13, column(13, "\"KEY\""))));
    }

    #[test]
    fn a_path_to_nothing_has_no_position() {
        assert_eq!(at(&[At::Field("model"), At::Field("input")]), None);
        assert_eq!(
            at(&[At::Field("model"), At::Field("net"), At::Index(9)]),
            None
        );
        assert_eq!(position("Scenario(oops", &[At::Field("model")]), None);
    }
}
