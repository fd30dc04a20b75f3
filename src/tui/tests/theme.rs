//! Theme files: the built-ins parse, bad ones are errors with the field named.

use crate::tui::theme::{Theme, ThemeError, ThemeName};

#[test]
fn builtin_themes_parse() {
    for name in ThemeName::ALL {
        let t = Theme::builtin(name, false).expect("parses");
        assert!(!t.name.is_empty());
    }
}

#[test]
fn bad_colour_names_the_field() {
    let text = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/assets/themes/dark.ron"
    ))
    .replace("allocated: \"#5fafff\"", "allocated: \"not-a-colour\"");
    match Theme::from_ron(&text, false) {
        Err(ThemeError::Color { field, .. }) => assert_eq!(field, "allocated"),
        other => panic!("expected a colour error, got {other:?}"),
    }
}

#[test]
fn bad_ron_is_an_error() {
    assert!(matches!(
        Theme::from_ron("(name: 1", false),
        Err(ThemeError::Ron(_))
    ));
}
