//! Legends of the map and the timeline: a glyph and a name for everything
//! they draw, as wide as the panel allows (full names, then short ones, then
//! the first items named and the rest as glyphs), so a legend is never cut.
//! The map's categories are letters, in their colours where there is colour.

use ratatui::style::Style;
use ratatui::text::{Line, Span};

use super::segment_map::{CellKind, Drawn, HIGHLIGHT_GLYPH};
use crate::trace::Phase;
use crate::tui::app::ColorMode;
use crate::tui::marks::Glyph;
use crate::tui::theme::{Theme, CATEGORIES, CATEGORY_LETTERS, CATEGORY_SHORT};

struct Item {
    glyph: &'static str,
    style: Style,
    name: &'static str,
    short: &'static str,
}

/// The map's legend for its colour `mode`, in at most `width` columns:
/// what the rows in view draw (`drawn`; everything where nothing is drawn).
pub fn map(
    th: &Theme,
    mode: ColorMode,
    by_line: bool,
    width: u16,
    drawn: Option<&Drawn>,
) -> Line<'static> {
    fit(th, &map_items(th, mode, by_line, drawn), width)
}

/// The timeline's curves and lines: glyph, full name, short name.
pub const CURVES: [(&str, &str, &str); 5] = [
    ("█", "allocated", "alloc"),
    ("░", "reserved", "resv"),
    ("┄", "peak so far", "peak"),
    ("━", "capacity", "cap"),
    ("▲", "cursor", "cur"),
];

/// The marks, in the legend's order: glyph, full name, short name.
fn mark_names() -> [(Glyph, &'static str, &'static str); 10] {
    [
        (Glyph::Iteration, "iteration", "iter"),
        (Glyph::Phase(Phase::Forward), "forward", "fwd"),
        (Glyph::Phase(Phase::Backward), "backward", "bwd"),
        (Glyph::ZeroGrad, "zero_grad", "zero"),
        (Glyph::Phase(Phase::Optimizer), "optimizer", "opt"),
        (Glyph::Phase(Phase::Eval), "eval", "eval"),
        (Glyph::Phase(Phase::Setup), "setup/other", "other"),
        (Glyph::Narration, "narration", "note"),
        (Glyph::Oom, "OOM", "OOM"),
        (Glyph::Error, "error", "err"),
    ]
}

/// Whether the curves' names go to the title (the figures there carry
/// their glyphs, `█ alloc 3 MiB`) because the legend of `width` columns
/// cannot name them and every mark `drawn` with short names; the cursor
/// `▲` stays in the legend. `curves`: which of [`CURVES`] the graph draws.
pub fn curves_in_title(width: u16, drawn: &[Option<Glyph>], curves: [bool; 5]) -> bool {
    let shown = |g: &Glyph| drawn.iter().flatten().any(|d| d.symbol() == g.symbol());
    let entry = |glyph: &str, short: &str| {
        glyph.chars().count() + usize::from(glyph.is_ascii()) + short.chars().count() + 1
    };
    let w: usize = CURVES
        .iter()
        .zip(curves)
        .filter(|(_, on)| *on)
        .map(|((g, _, s), _)| entry(g, s))
        .sum::<usize>()
        + mark_names()
            .iter()
            .filter(|(g, _, _)| shown(g))
            .map(|(g, _, s)| entry(g.symbol(), s))
            .sum::<usize>();
    w > usize::from(width)
}

/// The timeline's legend: the curves and lines the graph draws (`curves`,
/// in [`CURVES`]' order: a line that is not drawn, a capacity above the
/// scale, a peak a file does not give, is not named; only the cursor where
/// `curves_in_title`: the title names the rest), then the marks `drawn`
/// under it (only those: a mark no column shows needs no name, and the
/// room it leaves keeps the others' names whole at 80 columns).
pub fn timeline(
    th: &Theme,
    width: u16,
    drawn: &[Option<Glyph>],
    curves_in_title: bool,
    curves: [bool; 5],
) -> Line<'static> {
    let p = &th.palette;
    let colors = [
        p.allocated_line,
        p.reserved_line,
        p.peak,
        p.capacity,
        p.cursor,
    ];
    let mut items: Vec<Item> = CURVES
        .iter()
        .zip(colors)
        .zip(curves)
        .filter(|(((g, _, _), _), on)| *on && (!curves_in_title || *g == "▲"))
        .map(|((&(glyph, name, short), color), _)| Item {
            glyph,
            style: th.fg(color),
            name,
            short,
        })
        .collect();
    let shown = |g: &Glyph| drawn.iter().flatten().any(|d| d.symbol() == g.symbol());
    items.extend(
        mark_names()
            .into_iter()
            .filter(|(g, _, _)| shown(g))
            .map(|(g, name, short)| Item {
                glyph: g.symbol(),
                style: super::timeline::mark_style(th, g),
                name,
                short,
            }),
    );
    fit(th, &items, width)
}

/// A name after a glyph that is a letter or a sign ("X OOM") stands apart
/// from it; after a block or a line ("█alloc") it needs no space.
fn gap(i: &Item) -> usize {
    usize::from(i.glyph.is_ascii())
}

fn fit(th: &Theme, items: &[Item], width: u16) -> Line<'static> {
    let fits = |name: fn(&Item) -> &'static str| {
        let w: usize = items
            .iter()
            .map(|i| i.glyph.chars().count() + gap(i) + name(i).chars().count() + 1)
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
    for i in items {
        let n = name(i);
        let named = n.chars().count() + gap(i) <= room;
        if named {
            room -= n.chars().count() + gap(i);
        } else {
            room = 0;
        }
        spans.push(Span::styled(i.glyph, i.style));
        let text = match (named, gap(i)) {
            (false, _) => " ".to_string(),
            (true, 0) => format!("{n} "),
            (true, _) => format!(" {n} "),
        };
        spans.push(Span::styled(text, th.dim()));
    }
    Line::from(spans)
}

fn map_items(th: &Theme, mode: ColorMode, by_line: bool, drawn: Option<&Drawn>) -> Vec<Item> {
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
        .filter(|(kind, ..)| drawn.is_none_or(|d| d.kinds.contains(kind)))
        .map(|(kind, name, short, color)| Item {
            // Neighbouring allocated blocks alternate `█` and `▓`.
            glyph: if kind == CellKind::Allocated && drawn.is_none_or(|d| d.alt) {
                "█▓"
            } else {
                kind.glyph(false)
            },
            style: th.fg(color),
            name,
            short,
        })
        .collect(),
        ColorMode::Category => CATEGORIES
            .iter()
            .enumerate()
            .filter(|(i, _)| drawn.is_none_or(|d| d.cats.contains(&u8::try_from(*i).ok())))
            .map(|(i, c)| Item {
                glyph: CATEGORY_LETTERS[i],
                style: th.fg(p.categories[i]),
                name: c.name(),
                short: CATEGORY_SHORT[i],
            })
            .collect(),
    };
    if drawn.is_none_or(|d| d.highlighted) {
        items.push(Item {
            glyph: HIGHLIGHT_GLYPH,
            style: th.fg(p.highlight),
            name: if by_line { "selected line" } else { "leak" },
            short: if by_line { "line" } else { "leak" },
        });
    }
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
                let t = text(&map(&th, mode, false, width, None));
                assert!(
                    t.chars().count() <= usize::from(width),
                    "{mode:?} {width}: {t}"
                );
            }
        }
        let wide = text(&map(&th, ColorMode::Category, false, 200, None));
        assert!(
            wide.contains("optimizer_state") && wide.contains("amp_cache"),
            "{wide}"
        );
        let narrow = text(&map(&th, ColorMode::Category, false, 78, None));
        assert!(
            narrow.contains("optim") && narrow.contains("wksp"),
            "{narrow}"
        );
        // Too narrow for every name: the first ones keep theirs.
        let tight = text(&map(&th, ColorMode::State, false, 34, None));
        assert!(tight.starts_with("█▓alloc ▒pend"), "{tight}");
        assert!(tight.contains('╌') && tight.contains('▚'), "{tight}");
    }

    #[test]
    fn categories_are_letters_with_or_without_colour() {
        for no_color in [true, false] {
            let th = Theme::builtin(ThemeName::Dark, no_color).expect("parses");
            let t = text(&map(&th, ColorMode::Category, false, 200, None));
            for (letter, c) in CATEGORY_LETTERS.iter().zip(CATEGORIES) {
                assert!(t.contains(&format!("{letter} {}", c.name())), "{t}");
            }
        }
        let distinct: std::collections::HashSet<_> = CATEGORY_LETTERS.iter().collect();
        assert_eq!(distinct.len(), CATEGORY_LETTERS.len());
    }

    #[test]
    fn the_timeline_legend_names_every_mark_it_can_and_is_never_cut() {
        let th = Theme::builtin(ThemeName::Dark, false).expect("parses");
        let all = [Glyph::Oom, Glyph::Error, Glyph::Narration, Glyph::Iteration]
            .map(Some)
            .to_vec();
        let wide = text(&timeline(&th, 200, &all, false, ALL_CURVES));
        for name in [
            "allocated",
            "reserved",
            "peak so far",
            "capacity",
            "OOM",
            "narration",
        ] {
            assert!(wide.contains(name), "{name}: {wide}");
        }
        for width in [30u16, 60, 78, 120] {
            let t = text(&timeline(
                &th,
                width,
                &all,
                curves_in_title(width, &all, ALL_CURVES),
                ALL_CURVES,
            ));
            assert!(t.chars().count() <= usize::from(width), "{width}: {t}");
            assert!(
                t.contains('X') && t.contains('E'),
                "every glyph at {width}: {t}"
            );
        }
        // A mark no column draws is not in it.
        let none = text(&timeline(
            &th,
            200,
            &[Some(Glyph::Iteration)],
            false,
            ALL_CURVES,
        ));
        assert!(
            none.contains("iteration") && !none.contains("OOM"),
            "{none}"
        );
    }

    const ALL_CURVES: [bool; 5] = [true; 5];

    #[test]
    fn a_line_the_graph_does_not_draw_is_not_named() {
        let th = Theme::builtin(ThemeName::Dark, false).expect("parses");
        // No peak line (a file with no trace), no capacity line (above the
        // scale): the legend names neither.
        let t = text(&timeline(
            &th,
            200,
            &[],
            false,
            [true, true, false, false, true],
        ));
        assert!(t.contains("allocated") && t.contains("cursor"), "{t}");
        assert!(!t.contains("peak") && !t.contains("capacity"), "{t}");
        // Fewer names need fewer columns: the curves keep their names where
        // all five would have gone to the title.
        let w = (40..200)
            .find(|&w| !curves_in_title(w, &[], ALL_CURVES))
            .expect("fits somewhere");
        assert!(!curves_in_title(
            w - 1,
            &[],
            [true, true, false, false, true]
        ));
    }
}
