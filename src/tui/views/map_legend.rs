//! The map's legend: a glyph and a name for everything the map draws, as
//! wide as the panel allows (full names, then short ones, then the glyphs
//! alone), so it is never cut. Without colour, categories are letters.

use ratatui::style::Style;
use ratatui::text::{Line, Span};

use super::segment_map::{CellKind, HIGHLIGHT_GLYPH};
use crate::tui::app::ColorMode;
use crate::tui::theme::{Theme, CATEGORIES, CATEGORY_LETTERS, CATEGORY_SHORT};

struct Item {
    glyph: &'static str,
    style: Style,
    name: &'static str,
    short: &'static str,
}

/// The legend for the map's `mode`, in at most `width` columns.
pub fn legend(th: &Theme, mode: ColorMode, by_line: bool, width: u16) -> Line<'static> {
    let items = items(th, mode, by_line);
    let fits = |name: fn(&Item) -> &'static str| {
        let w: usize = items
            .iter()
            .map(|i| i.glyph.chars().count() + name(i).chars().count() + 1)
            .sum();
        w <= usize::from(width)
    };
    let name: fn(&Item) -> &'static str = if fits(|i| i.name) {
        |i| i.name
    } else {
        |i| i.short
    };
    // Where even the short names do not all fit, the first items keep
    // theirs and the rest show their glyph alone.
    let glyphs: usize = items.iter().map(|i| i.glyph.chars().count() + 1).sum();
    let mut room = usize::from(width).saturating_sub(glyphs);
    let mut spans = Vec::new();
    for i in &items {
        let n = name(i);
        let named = n.chars().count() <= room;
        if named {
            room -= n.chars().count();
        } else {
            room = 0;
        }
        spans.push(Span::styled(i.glyph, i.style));
        spans.push(Span::styled(
            format!("{} ", if named { n } else { "" }),
            th.dim(),
        ));
    }
    Line::from(spans)
}

fn items(th: &Theme, mode: ColorMode, by_line: bool) -> Vec<Item> {
    let p = &th.palette;
    let mut items: Vec<Item> = match mode {
        ColorMode::State => [
            (CellKind::Allocated, "alloc", "alloc", p.allocated),
            (CellKind::Pending, "pending", "pend", p.pending),
            (
                CellKind::InactiveSplit,
                "split-free",
                "split",
                p.inactive_split,
            ),
            (CellKind::CachedFree, "cached", "cache", p.cached_free),
            (CellKind::Unmapped, "unmapped", "unmap", p.unmapped),
        ]
        .into_iter()
        .map(|(kind, name, short, color)| Item {
            glyph: kind.glyph(false),
            style: th.fg(color),
            name,
            short,
        })
        .collect(),
        ColorMode::Category => CATEGORIES
            .iter()
            .enumerate()
            .map(|(i, c)| Item {
                glyph: if th.no_color {
                    CATEGORY_LETTERS[i]
                } else {
                    "█"
                },
                style: th.fg(p.categories[i]),
                name: c.name(),
                short: CATEGORY_SHORT[i],
            })
            .collect(),
    };
    items.push(Item {
        glyph: HIGHLIGHT_GLYPH,
        style: th.fg(p.highlight),
        name: if by_line { "selected line" } else { "leak" },
        short: if by_line { "line" } else { "leak" },
    });
    items
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::theme::ThemeName;

    fn text(line: &Line) -> String {
        line.spans.iter().map(|s| s.content.as_ref()).collect()
    }

    #[test]
    fn the_legend_fits_its_width_and_names_what_it_can() {
        let th = Theme::builtin(ThemeName::Dark, false).expect("parses");
        for mode in [ColorMode::State, ColorMode::Category] {
            for width in [20u16, 40, 60, 78, 120, 200] {
                let t = text(&legend(&th, mode, false, width));
                assert!(
                    t.chars().count() <= usize::from(width),
                    "{mode:?} {width}: {t}"
                );
            }
        }
        let wide = text(&legend(&th, ColorMode::Category, false, 200));
        assert!(
            wide.contains("optimizer_state") && wide.contains("amp_cache"),
            "{wide}"
        );
        let narrow = text(&legend(&th, ColorMode::Category, false, 78));
        assert!(
            narrow.contains("optim") && narrow.contains("wksp"),
            "{narrow}"
        );
        // Too narrow for every name: the first ones keep theirs.
        let tight = text(&legend(&th, ColorMode::State, false, 34));
        assert!(tight.starts_with("█alloc ▒pend"), "{tight}");
        assert!(tight.contains('╌') && tight.contains('▚'), "{tight}");
    }

    #[test]
    fn without_colour_categories_are_letters() {
        let th = Theme::builtin(ThemeName::Dark, true).expect("parses");
        let t = text(&legend(&th, ColorMode::Category, false, 200));
        for (letter, c) in CATEGORY_LETTERS.iter().zip(CATEGORIES) {
            assert!(t.contains(&format!("{letter}{}", c.name())), "{t}");
        }
        let distinct: std::collections::HashSet<_> = CATEGORY_LETTERS.iter().collect();
        assert_eq!(distinct.len(), CATEGORY_LETTERS.len());
    }
}
