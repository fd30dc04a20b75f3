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

/// The light theme paints its own background on every cell, popups
/// included: dark text stays readable on a dark terminal and a projector.
#[test]
fn the_light_theme_sets_the_background_of_every_cell() {
    use super::helpers::{draw, keys, leaky_app_with, opts, terminal};
    use ratatui::style::Color;
    let mut o = opts();
    o.theme = ThemeName::Light;
    let mut app = leaky_app_with(&o);
    keys(&mut app, "G");
    for popup in ["", "?"] {
        keys(&mut app, popup);
        let mut t = terminal(120, 40);
        let buf = draw(&mut app, &mut t);
        let unset = buf
            .content()
            .iter()
            .filter(|c| c.bg == Color::Reset)
            .count();
        assert_eq!(
            unset, 0,
            "{unset} cells on the terminal's own background ({popup:?})"
        );
    }
}
