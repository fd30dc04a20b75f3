//! Run-view keys a room meets (issue 41): `q` in the help closes the help,
//! space at `■ done` says that it replays, `x` says why it found no OOM
//! (and goes to the first one once it comes), the first `x` shows PyTorch's
//! message, `zero_grad` is marked apart from the optimizer's step, `t` says
//! the theme at 80 columns, and the timeline's legend names every mark it
//! draws at 80 columns.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::helpers::{app_finished, app_with, keys, opts, scenario, screen};
use crate::tui::marks::Glyph;
use crate::tui::App;

fn oom_run() -> App {
    app_finished(vec![("s".into(), scenario("store-outputs-bug"))], &opts())
}

/// The status line's notice or the error box: what the last key said.
fn status(app: &mut App) -> String {
    screen(app, 80, 24)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn q_in_the_help_closes_the_help_and_ctrl_c_still_quits() {
    let mut app = oom_run();
    keys(&mut app, "?");
    assert!(app.show_help);
    let help = screen(&mut app, 80, 24);
    assert!(help.contains("q closes"), "{help}");
    keys(&mut app, "q");
    assert!(!app.show_help && !app.quit, "q closed the help only");
    keys(&mut app, "?");
    app.handle_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
    assert!(app.quit, "Ctrl-C quits from the help");
}

#[test]
fn space_at_done_says_it_replays_from_the_start() {
    let mut app = oom_run();
    keys(&mut app, "G");
    let len = app.runs[0].len();
    assert_eq!(app.runs[0].pos, len);
    let done = status(&mut app);
    assert!(done.contains("■ done"), "{done}");
    keys(&mut app, " ");
    assert_eq!(app.runs[0].pos, 0, "it replays");
    assert!(app.playing);
    let said = status(&mut app);
    assert!(said.contains("replaying from the start"), "{said}");
}

#[test]
fn the_first_x_lands_on_the_oom_with_pytorch_s_message() {
    let mut app = oom_run();
    let oom = app.runs[0].marks.oom[0];
    keys(&mut app, "x");
    let s = screen(&mut app, 80, 24);
    assert!(app.runs[0].pos > oom, "past the OOM entry");
    assert!(
        app.runs[0].frame.error_marker.is_some(),
        "the message is at the cursor"
    );
    assert!(s.contains("out of memory"), "PyTorch's words:\n{s}");
    assert!(s.contains(" error "), "the error box:\n{s}");
    // There is one OOM: a second x finds none, and says so.
    let at = app.runs[0].pos;
    keys(&mut app, "x");
    assert_eq!(app.runs[0].pos, at);
    let said = status(&mut app);
    assert!(said.contains("no OOM or error after the cursor"), "{said}");
}

#[test]
fn x_while_the_run_arrives_says_so_and_lands_when_it_comes() {
    // Paced as the UI paces a scenario, so it is still arriving at the key.
    let (sc, built) = crate::scenario::resolve("store-outputs-bug").expect("built-in");
    let paced = crate::producers::scenario_source(sc, built, std::time::Duration::from_millis(10));
    let mut app = app_with(vec![("s".into(), paced)], &opts());
    assert!(app.runs[0].is_live(), "the engine is still sending");
    assert!(app.runs[0].marks.oom.is_empty());
    keys(&mut app, "x");
    let said = status(&mut app);
    assert!(
        said.contains("no OOM yet: the run is still arriving"),
        "{said}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while app.runs[0].is_live() && std::time::Instant::now() < deadline {
        app.drain_sources();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    app.drain_sources();
    let oom = app.runs[0].marks.oom[0];
    assert!(app.runs[0].pos > oom, "the cursor went to the OOM");
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("out of memory"), "{s}");
}

#[test]
fn zero_grad_is_marked_apart_from_the_optimizer_s_step() {
    let mut app = app_finished(vec![("t".into(), scenario("tour"))], &opts());
    let r = &app.runs[0];
    assert!(!r.marks.zero_grad.is_empty(), "the tour zeroes its grads");
    // Each is an optimizer phase whose first op is zero_grad (read here
    // from the events, not from the index).
    let events = r.timeline.events();
    for &at in &r.marks.zero_grad {
        let op = (at + 1..r.len()).find_map(|i| match events.get(i) {
            Some(crate::trace::Event::Marker(crate::trace::Marker::OpBegin { name, .. })) => {
                Some(name.to_string())
            }
            _ => None,
        });
        assert_eq!(op.as_deref(), Some("zero_grad"));
    }
    let first = r.marks.zero_grad[0];
    app.runs[0].seek_to_event(first);
    let s = screen(&mut app, 120, 40);
    let top = s.lines().next().unwrap_or_default();
    assert!(top.contains("zero_grad"), "the status names it: {top}");
    // Its column's mark, where no iteration or narration outranks it.
    assert_eq!(
        app.runs[0].marks.glyph_in(first, first + 1),
        Some(Glyph::ZeroGrad)
    );
    assert_eq!(Glyph::ZeroGrad.symbol(), "z");
    // The step's own phase is still the optimizer's.
    let step = app.runs[0]
        .marks
        .phase
        .iter()
        .find(|(i, p)| {
            *p == crate::trace::Phase::Optimizer
                && *i > first
                && !app.runs[0].marks.zero_grad.contains(i)
        })
        .map(|x| x.0)
        .expect("an optimizer step");
    app.runs[0].seek_to_event(step);
    let top = screen(&mut app, 120, 40)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(top.contains("optimizer"), "{top}");
}

#[test]
fn t_says_the_theme_at_80_columns() {
    let mut app = oom_run();
    keys(&mut app, "t");
    let said = status(&mut app);
    assert!(
        said.contains(&format!("theme {}", app.theme.name)),
        "{said}"
    );
    assert_ne!(app.theme.name, "dark");
}

/// Every mark the timeline draws is named in its legend (its glyph
/// followed by a name, not alone) at 80 and 120 columns.
#[test]
fn the_timeline_legend_names_every_mark_it_draws() {
    for name in ["store-outputs-bug", "tour", "accumulate-loss-train-bug"] {
        let mut app = app_finished(vec![("s".into(), scenario(name))], &opts());
        // One event in: the cursor is drawn, and named (the legend is the
        // bottom border that carries `▲`).
        keys(&mut app, "l");
        for (w, h) in [(80, 24), (120, 40)] {
            let s = screen(&mut app, w, h);
            let drawn: Vec<Glyph> = app.runs[0]
                .frame
                .timeline
                .marks
                .iter()
                .flatten()
                .copied()
                .collect();
            assert!(!drawn.is_empty(), "{name}: marks drawn");
            let legend = s
                .lines()
                .rfind(|l| l.contains('└') && l.contains('▲'))
                .unwrap_or_default()
                .to_string();
            for g in drawn {
                let sym = g.symbol();
                // "X OOM", or after a glyph that is no letter, "·other".
                let named = legend.split(sym).skip(1).any(|rest| {
                    rest.trim_start_matches(' ')
                        .chars()
                        .next()
                        .is_some_and(char::is_alphabetic)
                });
                assert!(named, "{name} at {w}×{h}: {sym} unnamed in {legend}");
            }
        }
    }
}

/// At an OOM the narration and the error box are open; the map keeps
/// its few rows whatever the terminal's height (down to where the UI says
/// the terminal is too small), and says how many segments it hides.
#[test]
fn an_open_error_box_never_shrinks_the_map_below_a_few_rows() {
    let mut app = oom_run();
    keys(&mut app, "x");
    for h in 16..=40 {
        for w in [80, 120] {
            let s = screen(&mut app, w, h);
            if app.areas.too_small {
                continue;
            }
            let Some(map) = app.areas.runs[0].map else {
                continue;
            };
            assert!(map.height >= 5, "{w}×{h}: map {map:?}\n{s}");
            assert!(app.areas.runs[0].error.is_some(), "{w}×{h}: the error box");
            // Every segment is in view or counted as hidden.
            let m = &app.runs[0].frame.map;
            let in_view = m
                .rows
                .iter()
                .filter(|r| matches!(r, crate::tui::views::segment_map::MapRow::Segment { .. }))
                .count();
            let segments = app.runs[0].map.segments.len();
            assert_eq!(
                in_view + m.hidden_above + m.hidden_below,
                segments,
                "{w}×{h}"
            );
            assert!(m.hidden_below > 0, "{w}×{h}: 23 segments never fit");
            assert!(
                s.contains(&format!("↓ {} more", m.hidden_below)),
                "{w}×{h}: the map says what it hides\n{s}"
            );
        }
    }
}

/// `M` scrolls the map to the segment of the latest allocator event at the
/// cursor (a narration's own event): at 80×24 the caching-allocator
/// lesson's new segment is many `PgDn` away; one key shows it.
#[test]
fn m_shows_the_segment_the_cursor_s_event_touched() {
    let mut app = oom_run();
    // The OOM's moment: the latest allocator event before it has an address.
    let at = app.runs[0].marks.oom[0];
    app.runs[0].seek_to_event(at);
    let before = screen(&mut app, 80, 24);
    let events = app.runs[0].timeline.events();
    // Its segment on the map at the cursor (a freed one is not).
    let segments = &app.runs[0].map.segments;
    let live = |addr: u64| {
        segments
            .range(..=addr)
            .next_back()
            .is_some_and(|(start, seg)| addr < start + seg.size)
    };
    let (i, addr) = (0..=at)
        .rev()
        .find_map(|i| match events.get(i) {
            Some(crate::trace::Event::Alloc(a)) if a.addr != 0 && live(a.addr) => Some((i, a.addr)),
            _ => None,
        })
        .expect("an allocator event");
    keys(&mut app, "M");
    let s = screen(&mut app, 80, 24);
    let m = &app.runs[0].frame.map;
    let shown = m.rows.iter().any(|r| match r {
        crate::tui::views::segment_map::MapRow::Segment { start, .. } => {
            *start <= addr
                && app.runs[0]
                    .map
                    .segments
                    .get(start)
                    .is_some_and(|seg| addr < start + seg.size)
        }
        _ => false,
    });
    assert!(
        shown,
        "the segment holding {addr:#x} is in view\n{before}\n{s}"
    );
    let status = s.lines().next().unwrap_or_default();
    assert!(status.contains(&format!("of event {i}:")), "{status}");
    assert!(app.runs[0].frame.map.first_row > 0, "it scrolled: {status}");
}
