//! The built-in scenarios, compiled into the binary so `vramscope` works from
//! any directory.

/// One built-in scenario file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltIn {
    pub name: &'static str,
    pub source: &'static str,
}

macro_rules! builtins {
    ($($name:literal),* $(,)?) => {
        &[$(BuiltIn { name: $name, source: include_str!(concat!("../../scenarios/", $name, ".ron")) }),*]
    };
}

/// Every built-in, in the order `vramscope scenarios` lists them; the first is the guided tour.
static BUILTINS: &[BuiltIn] = builtins!["tour",];

pub fn builtins() -> &'static [BuiltIn] {
    BUILTINS
}

pub fn builtin(name: &str) -> Option<&'static BuiltIn> {
    let name = name.strip_suffix(".ron").unwrap_or(name);
    BUILTINS.iter().find(|b| b.name == name)
}
