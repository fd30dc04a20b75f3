//! Colours, loaded from the RON files in `assets/themes/` (compiled in, so the
//! binary needs no files at run time). Views never name a colour: they ask the
//! theme for a style, and with `NO_COLOR` every style the theme hands out is
//! colourless, so states must also differ by glyph (see `segment_map.rs`).

use std::collections::BTreeMap;
use std::str::FromStr;

use ratatui::style::{Color, Modifier, Style};
use serde::Deserialize;

use crate::engine::Category;

const DARK: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/themes/dark.ron"
));
const LIGHT: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/themes/light.ron"
));
const HIGH_CONTRAST: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/themes/high_contrast.ron"
));

/// The tensor categories the map colours, in legend order (the theme files
/// name them by [`Category::name`]); the others draw neutral. The index into
/// this list is what the map caches per block.
pub const CATEGORIES: [Category; 9] = [
    Category::Parameter,
    Category::Gradient,
    Category::OptimizerState,
    Category::Activation,
    Category::AutogradSaved,
    Category::Temporary,
    Category::Input,
    Category::Workspace,
    Category::AmpCache,
];

/// Without colour, a category's cells are its letter (lowercase while the
/// block is pending free), so the categories stay apart.
pub const CATEGORY_LETTERS: [&str; 9] = ["P", "G", "O", "A", "S", "T", "I", "W", "C"];
pub const CATEGORY_LETTERS_PENDING: [&str; 9] = ["p", "g", "o", "a", "s", "t", "i", "w", "c"];
/// Names for a narrow legend.
pub const CATEGORY_SHORT: [&str; 9] = [
    "param", "grad", "optim", "act", "saved", "temp", "input", "wksp", "amp",
];

/// The built-in themes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThemeName {
    #[default]
    Dark,
    Light,
    HighContrast,
}

impl ThemeName {
    pub const ALL: [ThemeName; 3] = [ThemeName::Dark, ThemeName::Light, ThemeName::HighContrast];

    pub fn parse(s: &str) -> Option<ThemeName> {
        match s {
            "dark" => Some(ThemeName::Dark),
            "light" => Some(ThemeName::Light),
            "high_contrast" | "high-contrast" => Some(ThemeName::HighContrast),
            _ => None,
        }
    }

    pub fn next(self) -> ThemeName {
        match self {
            ThemeName::Dark => ThemeName::Light,
            ThemeName::Light => ThemeName::HighContrast,
            ThemeName::HighContrast => ThemeName::Dark,
        }
    }

    fn source(self) -> &'static str {
        match self {
            ThemeName::Dark => DARK,
            ThemeName::Light => LIGHT,
            ThemeName::HighContrast => HIGH_CONTRAST,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ThemeError {
    #[error("theme file: {0}")]
    Ron(#[from] ron::error::SpannedError),
    #[error("theme field `{field}`: `{value}` is not a colour")]
    Color { field: String, value: String },
}

/// The file's shape: every colour as text, parsed once into [`Palette`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ThemeFile {
    name: String,
    fg: String,
    bg: String,
    dim: String,
    border: String,
    border_focus: String,
    title: String,
    status_fg: String,
    status_bg: String,
    allocated: String,
    allocated_alt: String,
    pending: String,
    inactive_split: String,
    cached_free: String,
    unmapped: String,
    selected: String,
    highlight: String,
    allocated_line: String,
    reserved_line: String,
    peak: String,
    capacity: String,
    cursor: String,
    iteration: String,
    phase: String,
    oom: String,
    narration: String,
    error: String,
    neutral: String,
    categories: BTreeMap<String, String>,
}

/// Resolved colours.
#[derive(Debug, Clone, PartialEq)]
pub struct Palette {
    pub fg: Color,
    pub bg: Color,
    pub dim: Color,
    pub border: Color,
    pub border_focus: Color,
    pub title: Color,
    pub status_fg: Color,
    pub status_bg: Color,
    pub allocated: Color,
    pub allocated_alt: Color,
    pub pending: Color,
    pub inactive_split: Color,
    pub cached_free: Color,
    pub unmapped: Color,
    pub selected: Color,
    pub highlight: Color,
    pub allocated_line: Color,
    pub reserved_line: Color,
    pub peak: Color,
    pub capacity: Color,
    pub cursor: Color,
    pub iteration: Color,
    pub phase: Color,
    pub oom: Color,
    pub narration: Color,
    pub error: Color,
    pub neutral: Color,
    /// Indexed like [`CATEGORIES`].
    pub categories: [Color; 9],
}

#[derive(Debug, Clone, PartialEq)]
pub struct Theme {
    pub name: String,
    pub palette: Palette,
    /// `NO_COLOR`: every style is colourless.
    pub no_color: bool,
}

fn color(field: &str, value: &str) -> Result<Color, ThemeError> {
    Color::from_str(value).map_err(|_| ThemeError::Color {
        field: field.to_string(),
        value: value.to_string(),
    })
}

impl Theme {
    pub fn builtin(name: ThemeName, no_color: bool) -> Result<Theme, ThemeError> {
        Theme::from_ron(name.source(), no_color)
    }

    /// Parse a theme file; an unknown category name is kept out (neutral).
    pub fn from_ron(text: &str, no_color: bool) -> Result<Theme, ThemeError> {
        let f: ThemeFile = ron::from_str(text)?;
        let mut categories = [Color::Reset; 9];
        let neutral = color("neutral", &f.neutral)?;
        for (i, c) in CATEGORIES.iter().enumerate() {
            let name = c.name();
            categories[i] = match f.categories.get(name) {
                Some(v) => color(name, v)?,
                None => neutral,
            };
        }
        let palette = Palette {
            fg: color("fg", &f.fg)?,
            bg: color("bg", &f.bg)?,
            dim: color("dim", &f.dim)?,
            border: color("border", &f.border)?,
            border_focus: color("border_focus", &f.border_focus)?,
            title: color("title", &f.title)?,
            status_fg: color("status_fg", &f.status_fg)?,
            status_bg: color("status_bg", &f.status_bg)?,
            allocated: color("allocated", &f.allocated)?,
            allocated_alt: color("allocated_alt", &f.allocated_alt)?,
            pending: color("pending", &f.pending)?,
            inactive_split: color("inactive_split", &f.inactive_split)?,
            cached_free: color("cached_free", &f.cached_free)?,
            unmapped: color("unmapped", &f.unmapped)?,
            selected: color("selected", &f.selected)?,
            highlight: color("highlight", &f.highlight)?,
            allocated_line: color("allocated_line", &f.allocated_line)?,
            reserved_line: color("reserved_line", &f.reserved_line)?,
            peak: color("peak", &f.peak)?,
            capacity: color("capacity", &f.capacity)?,
            cursor: color("cursor", &f.cursor)?,
            iteration: color("iteration", &f.iteration)?,
            phase: color("phase", &f.phase)?,
            oom: color("oom", &f.oom)?,
            narration: color("narration", &f.narration)?,
            error: color("error", &f.error)?,
            neutral,
            categories,
        };
        Ok(Theme {
            name: f.name,
            palette,
            no_color,
        })
    }

    /// Foreground only.
    pub fn fg(&self, c: Color) -> Style {
        if self.no_color {
            Style::default()
        } else {
            Style::default().fg(c)
        }
    }

    /// Foreground and background.
    pub fn fg_bg(&self, fg: Color, bg: Color) -> Style {
        if self.no_color {
            Style::default()
        } else {
            Style::default().fg(fg).bg(bg)
        }
    }

    /// The base text style of panels.
    pub fn text(&self) -> Style {
        self.fg_bg(self.palette.fg, self.palette.bg)
    }

    pub fn dim(&self) -> Style {
        self.fg(self.palette.dim)
    }

    pub fn border(&self, focused: bool) -> Style {
        match (self.no_color, focused) {
            // Without colour, focus shows as a bold border.
            (true, true) => Style::default().add_modifier(Modifier::BOLD),
            (true, false) => Style::default(),
            (false, true) => Style::default().fg(self.palette.border_focus),
            (false, false) => Style::default().fg(self.palette.border),
        }
    }

    pub fn title(&self) -> Style {
        self.fg(self.palette.title).add_modifier(Modifier::BOLD)
    }

    pub fn status(&self) -> Style {
        if self.no_color {
            Style::default().add_modifier(Modifier::REVERSED)
        } else {
            self.fg_bg(self.palette.status_fg, self.palette.status_bg)
        }
    }

    /// Colour of a category name (`None` or unknown → neutral).
    pub fn category(&self, index: Option<u8>) -> Color {
        index
            .and_then(|i| self.palette.categories.get(usize::from(i)).copied())
            .unwrap_or(self.palette.neutral)
    }
}

/// The index of a category in [`CATEGORIES`].
pub fn category_index(category: Category) -> Option<u8> {
    CATEGORIES
        .iter()
        .position(|c| *c == category)
        .and_then(|i| u8::try_from(i).ok())
}

/// Whether the environment asks for no colour (<https://no-color.org>: any
/// non-empty value).
pub fn no_color_from_env() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}
