//! The presenter layout for the back of a room (issue 41): allocated,
//! reserved, the peak so far and the step in large glyphs above the
//! timeline where the screen is large enough, each under its name.

use super::helpers::{leaky_app_with, opts, screen};
use crate::alloc::format_size;
use crate::tui::layout::LayoutMode;
use crate::tui::views::figures::room_size;
use crate::tui::{App, TuiOptions};

fn presenter() -> App {
    leaky_app_with(&TuiOptions {
        layout: LayoutMode::Presenter,
        ..opts()
    })
}

/// Cells drawn with the big font's quarter-block glyphs.
fn quadrants(line: &str) -> usize {
    line.chars()
        .filter(|c| "▘▝▀▖▌▞▛▗▚▐▜▄▙▟█".contains(*c))
        .count()
}

#[test]
fn the_figures_that_matter_are_large_in_the_presenter_layout() {
    let mut app = presenter();
    crate::tui::tests::helpers::keys(&mut app, "iiip");
    for (w, h) in [(120, 40), (200, 60)] {
        let s = screen(&mut app, w, h);
        let strip = app.areas.runs[0].figures.expect("a figures strip");
        let lines: Vec<&str> = s.lines().collect();
        let names = lines[usize::from(strip.y)];
        let r = &app.runs[0];
        let iteration = r.frame.iteration.expect("an iteration");
        for name in [
            "allocated",
            "reserved",
            "peak so far",
            &format!("iteration {iteration}"),
        ] {
            assert!(names.contains(name), "{w}×{h}: {name} in {names}");
        }
        // Four rows of large glyphs under the names.
        for row in 1..=4 {
            let line = lines[usize::from(strip.y) + row];
            assert!(quadrants(line) > 20, "{w}×{h} row {row}: {line}");
        }
        // The large value is the exact one, rounded: the timeline's title
        // says it to the hundredth.
        let exact = format_size(r.map.allocated);
        assert!(s.contains(&format!("alloc {exact}")), "{s}");
        let big = &r.frame.big[0].value;
        let whole = big.split(['.', ' ']).next().unwrap_or_default();
        assert!(exact.starts_with(whole), "{big} rounds {exact}");
    }
    // At 80×24 there is no room: the map keeps its rows, no strip.
    screen(&mut app, 80, 24);
    assert!(app.areas.runs[0].figures.is_none());
}

#[test]
fn sizes_for_the_room_keep_three_figures() {
    const MIB: u64 = 1024 * 1024;
    assert_eq!(room_size(591 * MIB + MIB / 4), "591 MiB");
    assert_eq!(room_size(1475 * MIB), "1.4 GiB");
    assert_eq!(room_size(20 * MIB), "20 MiB");
    assert_eq!(room_size(3 * MIB + MIB / 2), "3.5 MiB");
    assert_eq!(room_size(512), "512 B");
}

/// Presenter: where the timeline has room after a phase's mark, the phase
/// is spelled out (`forward`, else `fwd`), starting at its mark.
#[test]
fn phase_marks_are_spelled_out_where_there_is_room() {
    let mut app = presenter();
    crate::tui::tests::helpers::keys(&mut app, "iii");
    app.focus = crate::tui::layout::Focus::Timeline;
    let plain = screen(&mut app, 200, 60);
    crate::tui::tests::helpers::keys(&mut app, "zzzzz");
    let s = screen(&mut app, 200, 60);
    let t = &app.runs[0].frame.timeline;
    let row = s
        .lines()
        .nth(usize::from(t.inner.y + t.graph_h))
        .unwrap_or_default()
        .to_string();
    let words = [
        "forward",
        "backward",
        "optimizer",
        "zero_grad",
        "fwd",
        "bwd",
        "opt",
        "zero",
    ];
    assert!(
        words.iter().any(|w| row.contains(w)),
        "a phase spelled out when zoomed in:\n{row}\n(before zooming:)\n{plain}"
    );
    // Each word starts at its phase's mark.
    let cols: Vec<char> = row.chars().collect();
    let x0 = usize::from(t.inner.x);
    for (c, g) in t.marks.iter().enumerate() {
        if let Some(g) = g {
            let first = g.symbol().chars().next().unwrap_or(' ');
            let at = cols.get(x0 + c).copied().unwrap_or(' ');
            if t.cursor_col != Some(c as u16) {
                assert_eq!(at, first, "column {c}: {row}");
            }
        }
    }
    // Not in the normal layout: its marks stay one glyph each.
    crate::tui::tests::helpers::keys(&mut app, "L");
    let normal = screen(&mut app, 200, 60);
    let t = &app.runs[0].frame.timeline;
    let row = normal
        .lines()
        .nth(usize::from(t.inner.y + t.graph_h))
        .unwrap_or_default();
    assert!(
        !words.iter().any(|w| row.contains(w)),
        "one glyph a mark: {row}"
    );
}
