//! Each view drawn on `TestBackend`.

use crossterm::event::KeyCode;
use ratatui::style::Color;

use super::helpers::*;
use crate::producers::{RunMsg, Source, SourceMsg};
use crate::tui::app::{App, RunView};

#[test]
fn full_screen_shows_every_panel() {
    let mut app = leaky_app();
    keys(&mut app, "G");
    let s = screen(&mut app, 140, 44);
    for want in [
        "Memory map",
        "Timeline",
        "Stats",
        "Leaks",
        "Events",
        "large pool",
        "val_total",
    ] {
        assert!(s.contains(want), "missing {want:?} in\n{s}");
    }
    insta::assert_snapshot!("full_140x44_end", s);
}

#[test]
fn map_shows_selected_block_detail() {
    let mut app = leaky_app();
    keys(&mut app, "iii");
    // Down the map to the first block a tensor holds.
    for _ in 0..64 {
        keys(&mut app, "j");
        let r = &app.runs[0];
        let held = r.sel_block.and_then(|a| r.map.blocks.get(&a));
        if held.is_some_and(|b| b.state == crate::alloc::BlockState::ActiveAllocated) {
            break;
        }
    }
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("block 0xADDR"), "{s}");
    assert!(s.contains("requested"), "{s}");
    assert!(s.contains("segment 0xADDR"), "{s}");
    assert!(s.contains(" · op "), "tag description shown:\n{s}");
}

#[test]
fn map_selected_block_is_reversed() {
    let mut app = leaky_app();
    keys(&mut app, "ij");
    let mut t = terminal(140, 44);
    let buf = draw(&mut app, &mut t);
    let reversed = buf
        .content()
        .iter()
        .filter(|c| c.modifier.contains(ratatui::style::Modifier::REVERSED))
        .count();
    assert!(reversed > 0);
}

#[test]
fn timeline_marks_cursor_iterations_and_oom() {
    let mut app = leaky_app();
    keys(&mut app, "G");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains('▲'), "cursor\n{s}");
    assert!(s.contains('|'), "iteration marks\n{s}");
    let cap = crate::alloc::format_size(app.runs[0].capacity.expect("the scenario's device"));
    assert!(s.contains(&format!("cap {cap}")), "{s}");
    // The OOM is among the last events, near the cursor: it is in the column data.
    let marks = &app.runs[0].frame.timeline.marks;
    assert!(
        marks.contains(&Some(crate::tui::marks::Glyph::Oom)),
        "OOM mark"
    );
    // Zoomed in a little before it, it gets a column of its own.
    keys(&mut app, "gx");
    keys(&mut app, &"h".repeat(40));
    app.focus = crate::tui::layout::Focus::Timeline;
    keys(&mut app, "zzzz");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains('X'), "OOM mark drawn\n{s}");
}

#[test]
fn leak_panel_selection_shows_path_fix_and_highlights() {
    let mut app = leaky_app();
    keys(&mut app, "G");
    screen(&mut app, 140, 44);
    app.handle_key(code(KeyCode::Tab));
    app.handle_key(code(KeyCode::Tab));
    let leak = app.runs[0]
        .findings
        .iter()
        .position(|f| f.root == "val_total")
        .expect("the tour's leak");
    keys(&mut app, &"j".repeat(leak + 1));
    // Tall enough for the whole finding: its path, then its fix.
    let s = screen(&mut app, 140, 60);
    assert!(s.contains("path: val_total"), "{s}");
    assert!(s.contains("fix:"), "{s}");
    assert!(
        s.contains(crate::tui::views::segment_map::HIGHLIGHT_GLYPH),
        "highlighted blocks\n{s}"
    );
}

#[test]
fn stats_panel_numbers() {
    let mut app = leaky_app();
    keys(&mut app, "iii");
    let s = screen(&mut app, 140, 44);
    for want in [
        "allocated",
        "reserved",
        "inactive split",
        "cached free",
        "largest free",
        "OOMs so far",
    ] {
        assert!(s.contains(want), "missing {want}\n{s}");
    }
}

#[test]
fn event_log_marks_cursor_line() {
    let mut app = leaky_app();
    keys(&mut app, "o");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("▶"), "{s}");
    let r = &app.runs[0];
    let Some(crate::trace::Event::Marker(crate::trace::Marker::OpBegin { name, .. })) =
        r.cursor().and_then(|c| r.timeline.event(c))
    else {
        panic!("`o` lands on an op")
    };
    let line = s.lines().find(|l| l.contains("▶")).unwrap_or_default();
    assert!(line.contains(&format!("op {name}")), "{line}");
}

#[test]
fn narration_callout_follows_cursor() {
    let (tour, _) = crate::scenario::resolve(LEAKY).expect("built-in");
    let opening = |n: usize| -> String {
        let text = &tour.narration[n].text;
        text.split_whitespace()
            .take(4)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut app = leaky_app();
    // The premise is said before any event: on screen from the start.
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("narration"), "{s}");
    assert!(s.contains(&opening(0)), "{s}");
    keys(&mut app, "n");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains(&opening(1)), "{s}");
    keys(&mut app, "n");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains(&opening(2)), "{s}");
}

#[test]
fn help_overlay_lists_every_key() {
    let mut app = leaky_app();
    keys(&mut app, "?");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains(" Keys "));
    for (k, _) in crate::tui::input::KEYS {
        assert!(s.contains(k), "help lacks {k}\n{s}");
    }
    insta::assert_snapshot!("help_140x44", s);
    app.handle_key(code(KeyCode::Esc));
    assert!(!screen(&mut app, 140, 44).contains(" Keys "));
}

#[test]
fn too_small_is_said_plainly() {
    let mut app = leaky_app();
    let s = screen(&mut app, 40, 10);
    assert!(s.contains("Terminal too small"), "{s}");
    assert!(s.contains("40×10"), "{s}");
    insta::assert_snapshot!("too_small_40x10", s);
}

#[test]
fn failure_is_drawn_not_crashed() {
    let src = Source::from_messages([SourceMsg::Run(RunMsg::Failed(
        "engine crashed: boom".into(),
    ))]);
    let mut app = app_with(vec![("broken".into(), src)], &opts());
    let s = screen(&mut app, 120, 40);
    assert!(s.contains("broken failed"), "{s}");
    assert!(s.contains("engine crashed: boom"), "{s}");
}

#[test]
fn vanished_source_is_a_failure() {
    let (tx, rx) = flume::unbounded();
    drop(tx);
    let mut app = app_with(vec![("gone".into(), Source::new(rx, None))], &opts());
    let s = screen(&mut app, 120, 40);
    assert!(s.contains("closed before the run finished"), "{s}");
}

#[test]
fn error_marker_shown_as_callout() {
    let mut app = leaky_app();
    keys(&mut app, "G");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains(" error "), "{s}");
    assert!(s.contains("out of memory"), "{s}");
}

#[test]
fn no_color_has_no_colour_and_keeps_glyphs() {
    let mut o = opts();
    o.no_color = Some(true);
    let mut app = leaky_app_with(&o);
    keys(&mut app, "iiij");
    let mut t = terminal(140, 44);
    let buf = draw(&mut app, &mut t);
    for c in buf.content() {
        assert_eq!(
            (c.fg, c.bg),
            (Color::Reset, Color::Reset),
            "coloured cell {c:?}"
        );
    }
    let s = text(&buf);
    assert!(
        s.contains('█') && s.contains('·'),
        "states differ by glyph\n{s}"
    );
    keys(&mut app, "c");
    let buf = draw(&mut app, &mut t);
    assert!(buf
        .content()
        .iter()
        .all(|c| c.fg == Color::Reset && c.bg == Color::Reset));
}

#[test]
fn category_mode_uses_category_colours() {
    let mut app = leaky_app();
    keys(&mut app, "iiic");
    let mut t = terminal(140, 44);
    let buf = draw(&mut app, &mut t);
    let s = text(&buf);
    assert!(s.contains("by category"), "{s}");
    // The legend names each category the map draws (only those), whole.
    assert!(
        s.contains("P parameter") && s.contains("O optimizer_state") && !s.contains("C amp"),
        "legend\n{s}"
    );
    // Each category its letter and its colour: none told apart by colour alone.
    let param = app.theme.palette.categories[0];
    assert!(
        buf.content()
            .iter()
            .any(|c| c.fg == param && c.symbol() == "P"),
        "parameter blocks"
    );
    assert!(
        !buf.content()
            .iter()
            .any(|c| c.fg == param && c.symbol() == "█"),
        "no parameter block drawn by colour alone"
    );
}

#[test]
fn compact_layout_at_80x24() {
    let mut app = leaky_app();
    // Ten iterations in: the detector has seen the growth.
    keys(&mut app, &"i".repeat(10));
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("Memory map") && s.contains("Timeline"), "{s}");
    assert!(!s.contains(" Stats "), "stats collapsed at 80x24\n{s}");
    app.handle_key(code(KeyCode::Tab));
    app.handle_key(code(KeyCode::Tab));
    let s = screen(&mut app, 80, 24);
    assert!(s.contains(" Leaks "), "leaks behind Tab\n{s}");
    insta::assert_snapshot!("compact_80x24_leaks", s);
    // A selected finding's path and evidence scroll into view.
    keys(&mut app, "j");
    let evidence = {
        let r = &app.runs[0];
        let f = &r.findings[r.sel_finding.expect("selected")];
        f.evidence.chars().take(30).collect::<String>()
    };
    let mut s = screen(&mut app, 80, 24);
    let mut pages = 0;
    while !s.contains(&evidence) && pages < 10 {
        app.handle_key(code(KeyCode::PageDown));
        s = screen(&mut app, 80, 24);
        pages += 1;
    }
    assert!(s.contains(&evidence), "evidence never in view\n{s}");
}

#[test]
fn themes_render() {
    for name in crate::tui::theme::ThemeName::ALL {
        let mut o = opts();
        o.theme = name;
        let mut app = leaky_app_with(&o);
        keys(&mut app, "ii");
        let s = screen(&mut app, 120, 40);
        assert!(s.contains("Memory map"));
    }
}

#[test]
fn a_message_pytorch_breaks_over_lines_reads_as_one_paragraph() {
    use crate::trace::{Event, Marker};
    // ATen's autocast BCE ban breaks its text over lines; the callout and the
    // failure box must not glue "autocast." to "Many".
    let msg = "RuntimeError: x are unsafe to autocast.\nMany models use a sigmoid layer";
    let src = Source::from_messages([
        SourceMsg::Run(RunMsg::Events(vec![Event::Marker(Marker::Error(
            msg.into(),
        ))])),
        SourceMsg::Run(RunMsg::Failed(msg.into())),
    ]);
    let mut app = app_with(vec![("bce".into(), src)], &opts());
    keys(&mut app, "G");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("unsafe to autocast. Many models"), "{s}");
    assert!(!s.contains("autocast.Many"), "{s}");
}

/// The Stats panel of `run` as drawn (its area cut from the screen).
fn stats_panel(app: &mut App, run: usize) -> String {
    let mut t = terminal(140, 44);
    let buf = draw(app, &mut t);
    let a = app.areas.stats[run];
    let mut out = String::new();
    for y in a.y..a.y + a.height {
        for x in a.x..a.x + a.width {
            out.push_str(buf[(x, y)].symbol());
        }
        out.push('\n');
    }
    mask_hex(&out)
}

/// The OOM entries among `events`, counted here rather than asked of the
/// timeline.
fn oom_entries(events: &crate::trace::event_store::EventStore) -> Vec<usize> {
    events
        .iter()
        .enumerate()
        .filter(|(_, e)| {
            matches!(e, crate::trace::Event::Alloc(a) if a.action == crate::alloc::Action::Oom)
        })
        .map(|(i, _)| i)
        .collect()
}

/// The largest allocated and reserved bytes over the start state and the
/// first `pos` events' samples.
fn peak_by_hand(r: &RunView, pos: usize) -> (u64, u64) {
    let start = r.timeline.state_at(None);
    r.timeline
        .samples()
        .take(pos)
        .fold((start.allocated, start.reserved), |(a, res), s| {
            (a.max(s.allocated), res.max(s.reserved))
        })
}

/// Draws a frame and checks that the Stats rows and the timeline title give
/// the figures at the cursor, worked out here from the events and samples;
/// the Stats panel drawn.
fn assert_stats_at_cursor(app: &mut App, what: &str) -> String {
    use crate::alloc::format_size;
    let panel = stats_panel(app, 0);
    let r = &app.runs[0];
    let (pa, pr) = peak_by_hand(r, r.pos);
    let ooms = oom_entries(r.timeline.events());
    let so_far = ooms.iter().filter(|i| **i < r.pos).count();
    let retries = r.stats.as_ref().map(|s| s.num_alloc_retries);
    let plural = |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let run = match retries {
        Some(n) => format!(
            "{}, {}",
            plural(ooms.len() as u64, "OOM", "OOMs"),
            plural(n, "retry", "retries")
        ),
        None => plural(ooms.len() as u64, "OOM", "OOMs"),
    };
    for want in [
        format!(
            "allocated       {}  (peak {})",
            format_size(r.map.allocated),
            format_size(pa)
        ),
        format!(
            "reserved        {}  (peak {})",
            format_size(r.map.reserved),
            format_size(pr)
        ),
        format!("OOMs so far     {so_far}  (run: {run})"),
        // A run on a named GPU shows its compute estimate where the event
        // count (also on the status line) otherwise is.
        match r.compute_at_cursor() {
            Some((iteration, e)) => format!(
                "compute (est.)  ~{} iter {iteration}",
                crate::engine::estimate::format_ms(e.milliseconds)
            ),
            None => format!("event           {} of {}", r.pos, r.len()),
        },
    ] {
        assert!(
            panel.contains(&want),
            "{what}: missing {want:?} in\n{panel}"
        );
    }
    let title = &r.frame.timeline.title;
    assert!(
        title.contains(&format!(
            "alloc {} · reserved {} · peak {} ",
            format_size(r.map.allocated),
            format_size(r.map.reserved),
            format_size(pa)
        )),
        "{what}: {title}"
    );
    panel
}

#[test]
fn stats_panel_is_at_the_cursor() {
    use crate::alloc::format_size;
    let mut app = app_finished(vec![(BUGGY.into(), scenario(BUGGY))], &opts());
    let ooms = oom_entries(app.runs[0].timeline.events());
    assert!(!ooms.is_empty(), "{BUGGY} runs out of memory");
    let run_peak = format_size(peak_by_hand(&app.runs[0], app.runs[0].len()).0);

    keys(&mut app, "g");
    assert_eq!(app.runs[0].pos, 0);
    let start = assert_stats_at_cursor(&mut app, "event 0");
    // Nothing has happened yet: no peak of the run's, no OOM.
    assert!(start.contains("(peak 0 bytes)"), "{start}");
    assert!(!start.contains(&run_peak), "{start}");
    assert!(start.contains("OOMs so far     0  (run: "), "{start}");
    assert!(
        !app.runs[0].frame.timeline.title.contains(&run_peak),
        "{}",
        app.runs[0].frame.timeline.title
    );
    insta::assert_snapshot!("stats_at_event_0", start);

    // Either side of the first OOM entry.
    app.runs[0].set_pos(ooms[0]);
    assert_stats_at_cursor(&mut app, "before the OOM");
    app.runs[0].seek_to_event(ooms[0]);
    let at = assert_stats_at_cursor(&mut app, "at the OOM");
    assert!(at.contains("OOMs so far     1  (run: "), "{at}");

    keys(&mut app, "G");
    assert_eq!(app.runs[0].pos, app.runs[0].len());
    let end = assert_stats_at_cursor(&mut app, "the end");
    assert!(end.contains(&format!("(peak {run_peak})")), "{end}");
    assert!(
        end.contains(&format!("OOMs so far     {}  (run: ", ooms.len())),
        "{end}"
    );
    insta::assert_snapshot!("stats_at_end", end);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn stats_of_real_snapshots_are_at_the_cursor() {
    use crate::alloc::format_size;
    use crate::producers::snapshot::snapshot_source;
    let (mut opened_on_memory, mut oomed) = (false, false);
    for (file, device) in [
        // A trace with an OOM entry.
        ("code-location_expandable_3gpu_oom.pickle", Some(1)),
        // An open trace: its view starts from the state its first entry found.
        ("cs336-magma_windows_user-metadata.pickle", None),
    ] {
        let p = crate::real_snapshots::real(file);
        let src = snapshot_source(&p, device);
        let mut app = app_finished(vec![(file.into(), src)], &opts());
        let start = app.runs[0].timeline.state_at(None);
        let ooms = oom_entries(app.runs[0].timeline.events()).len();
        opened_on_memory |= start.allocated > 0;
        oomed |= ooms > 0;
        keys(&mut app, "g");
        let panel = assert_stats_at_cursor(&mut app, file);
        assert!(
            panel.contains("OOMs so far     0  (run: "),
            "{file}\n{panel}"
        );
        let peak = format!("(peak {})", format_size(start.allocated));
        assert!(panel.contains(&peak), "{file}: the start state\n{panel}");
        keys(&mut app, "G");
        let panel = assert_stats_at_cursor(&mut app, file);
        let want = format!("OOMs so far     {ooms}  (run: ");
        assert!(panel.contains(&want), "{file}\n{panel}");
    }
    assert!(opened_on_memory && oomed);
}

/// Without colour, the category view tells categories apart by letter
/// (uppercase allocated, lowercase pending free), and its legend says which.
#[test]
fn without_colour_categories_are_letters_on_the_map() {
    use crate::tui::theme::{CATEGORY_LETTERS, CATEGORY_LETTERS_PENDING};
    let mut o = opts();
    o.no_color = Some(true);
    let mut app = leaky_app_with(&o);
    keys(&mut app, "iiic");
    let mut t = terminal(140, 44);
    let buf = draw(&mut app, &mut t);
    let map = app.areas.runs[0].map.expect("a map");
    let mut seen = std::collections::HashSet::new();
    for y in map.y + 2..map.y + map.height - 1 {
        for x in map.x + 10..map.x + map.width - 1 {
            let s = buf[(x, y)].symbol().to_string();
            if CATEGORY_LETTERS.contains(&s.as_str())
                || CATEGORY_LETTERS_PENDING.contains(&s.as_str())
            {
                seen.insert(s);
            }
        }
    }
    assert!(
        seen.len() >= 3,
        "categories by letter on the map: {seen:?}\n{}",
        text(&buf)
    );
    let s = text(&buf);
    assert!(
        s.contains("P parameter") && s.contains("O optimizer_state") && !s.contains("C amp"),
        "{s}"
    );
}
