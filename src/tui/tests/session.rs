//! Scripted sessions: playback, stepping both ways, selection, mouse,
//! compare mode, and the real loop on `TestBackend`.

use std::collections::VecDeque;
use std::time::Duration;

use crate::trace::{Event, Marker};
use crossterm::event::{
    Event as CEvent, KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};

use super::helpers::*;
use crate::producers::{RunMsg, ScenarioMsg};
use crate::tui::app::SyncMode;
use crate::tui::run::InputSource;
use crate::tui::screen::run_screen;

#[test]
fn play_advances_at_speed_and_pauses() {
    let mut app = leaky_app();
    assert_eq!(app.runs[0].pos, 0);
    keys(&mut app, " ");
    assert!(app.playing);
    app.on_tick(Duration::from_millis(100));
    assert_eq!(app.runs[0].pos, 50, "500 ev/s for 0.1 s");
    keys(&mut app, "+");
    app.on_tick(Duration::from_millis(100));
    assert_eq!(app.runs[0].pos, 150, "1000 ev/s");
    keys(&mut app, " ");
    app.on_tick(Duration::from_secs(1));
    assert_eq!(app.runs[0].pos, 150, "paused");
    let s = screen(&mut app, 120, 40);
    assert!(s.contains("paused 1000 ev/s"), "{s}");
}

#[test]
fn play_stops_at_the_end() {
    let mut app = leaky_app();
    keys(&mut app, " ");
    for _ in 0..100 {
        app.on_tick(Duration::from_secs(10));
    }
    assert_eq!(app.runs[0].pos, app.runs[0].len());
}

#[test]
fn stepping_back_matches_a_fresh_replay() {
    let mut app = leaky_app();
    keys(&mut app, "G");
    screen(&mut app, 120, 40);
    let len = app.runs[0].len();
    for k in ["h", "I", "P", "O", "h"] {
        keys(&mut app, k);
        screen(&mut app, 120, 40);
        let r = &app.runs[0];
        assert!(r.pos < len);
        assert_eq!(r.map, r.timeline.state_at(r.cursor()), "after {k}");
    }
    keys(&mut app, "g");
    screen(&mut app, 120, 40);
    assert_eq!(app.runs[0].pos, 0);
    assert!(app.runs[0].map.segments.is_empty());
}

/// A step lands on its mark, and on the narration said right after it (the
/// moment's own): `moment_start` is the mark.
#[test]
fn step_forward_kinds_land_on_marks() {
    let mut app = leaky_app();
    keys(&mut app, "i");
    let r = &app.runs[0];
    let c = r.moment_start().expect("moved");
    assert!(matches!(
        r.timeline.event(c).expect("an event there"),
        Event::Marker(Marker::IterationBegin(1))
    ));
    keys(&mut app, "p");
    let r = &app.runs[0];
    assert!(matches!(
        r.timeline
            .event(r.moment_start().unwrap_or(0))
            .expect("an event there"),
        Event::Marker(Marker::PhaseBegin(_) | Marker::PhaseEnd(_))
    ));
    keys(&mut app, "o");
    let r = &app.runs[0];
    assert!(matches!(
        r.timeline
            .event(r.moment_start().unwrap_or(0))
            .expect("an event there"),
        Event::Marker(Marker::OpBegin { .. })
    ));
    let before = app.runs[0].cursor();
    keys(&mut app, "l");
    assert_eq!(app.runs[0].cursor(), before.map(|b| b + 1));
    assert!(c < app.runs[0].cursor().unwrap_or(0));
    keys(&mut app, "x");
    let r = &app.runs[0];
    let at = &r
        .timeline
        .event(r.moment_start().unwrap_or(0))
        .expect("an event there");
    assert!(
        matches!(at, Event::Alloc(a) if a.action == crate::alloc::Action::Oom)
            || matches!(at, Event::Marker(Marker::Error(_))),
        "{at:?}"
    );
}

#[test]
fn select_block_then_enter_jumps_to_its_allocation() {
    let mut app = leaky_app();
    keys(&mut app, "iiij");
    screen(&mut app, 120, 40);
    let sel = app.runs[0].sel_block.expect("selected");
    app.handle_key(code(KeyCode::Enter));
    let r = &app.runs[0];
    let Event::Alloc(a) = &r
        .timeline
        .event(r.cursor().unwrap_or(0))
        .expect("an event there")
    else {
        panic!("not an alloc")
    };
    assert_eq!(a.addr, sel);
    app.handle_key(code(KeyCode::PageDown));
    assert!(app.runs[0].sel_block.is_some());
}

#[test]
fn mouse_click_selects_and_seeks() {
    let mut app = leaky_app();
    keys(&mut app, "G");
    screen(&mut app, 140, 44);
    // Click in the first segment row of the map.
    let m = app.runs[0].frame.map.clone();
    let y = m.rows_y + 1;
    let x = m.bar_x + 2;
    app.handle_mouse(MouseEvent {
        kind: MouseEventKind::Down(MouseButton::Left),
        column: x,
        row: y,
        modifiers: KeyModifiers::NONE,
    });
    assert!(app.runs[0].sel_block.is_some(), "click selects a block");
    // Click in the middle of the timeline.
    let t = app.areas.runs[0].timeline;
    let len = app.runs[0].len();
    app.handle_mouse(MouseEvent {
        kind: MouseEventKind::Down(MouseButton::Left),
        column: t.x + t.width / 2,
        row: t.y + 2,
        modifiers: KeyModifiers::NONE,
    });
    let pos = app.runs[0].pos;
    assert!(
        pos > len / 3 && pos < len * 2 / 3,
        "seeked to {pos} of {len}"
    );
    app.handle_mouse(MouseEvent {
        kind: MouseEventKind::Drag(MouseButton::Left),
        column: t.x + 2,
        row: t.y + 2,
        modifiers: KeyModifiers::NONE,
    });
    assert!(app.runs[0].pos < len / 10, "drag scrubs");
    app.handle_mouse(MouseEvent {
        kind: MouseEventKind::ScrollUp,
        column: t.x + 5,
        row: t.y + 2,
        modifiers: KeyModifiers::NONE,
    });
    assert_eq!(app.runs[0].tl_zoom, 2, "wheel zooms the timeline");
    screen(&mut app, 140, 44);
}

#[test]
fn zoom_and_pan_map() {
    let mut app = leaky_app();
    keys(&mut app, "iiizz>");
    screen(&mut app, 120, 40);
    assert_eq!(app.runs[0].map_zoom, 4);
    assert!(app.runs[0].map_scroll_x > 0);
    let s = screen(&mut app, 120, 40);
    assert!(s.contains("zoom ×4"));
}

#[test]
fn compare_two_runs_synchronised() {
    let mut app = app_finished(
        vec![
            ("leaky".into(), scenario(BUGGY)),
            ("fixed".into(), scenario(FIXED)),
        ],
        &opts(),
    );
    keys(&mut app, "iiii");
    let s = screen(&mut app, 160, 44);
    assert!(
        s.contains("Memory map · leaky") && s.contains("Memory map · fixed"),
        "{s}"
    );
    assert!(
        s.contains("Stats · leaky") && s.contains("Stats · fixed"),
        "{s}"
    );
    // By iteration unless told: both cursors at the start of the same one.
    assert_eq!(app.sync, SyncMode::Iteration);
    assert_eq!(app.runs[0].frame.iteration, app.runs[1].frame.iteration);
    keys(&mut app, "i");
    screen(&mut app, 160, 44);
    assert_eq!(app.runs[0].frame.iteration, app.runs[1].frame.iteration);
    assert_eq!(app.runs[0].frame.iteration, Some(5));
    // One y scale: the same bytes stand at the same height on both sides.
    let (ta, tb) = (&app.runs[0].frame.timeline, &app.runs[1].frame.timeline);
    assert_eq!(ta.ymax, tb.ymax);
    assert_eq!(
        ta.ymax,
        crate::tui::views::timeline::scale_max(&app.runs[0])
            .max(crate::tui::views::timeline::scale_max(&app.runs[1]))
    );
    insta::assert_snapshot!("compare_160x44", screen(&mut app, 160, 44));
    keys(&mut app, "s");
    assert_eq!(app.sync, SyncMode::Fraction);
    keys(&mut app, "i");
    let (a, b) = (&app.runs[0], &app.runs[1]);
    let fa = a.pos as f64 / a.len() as f64;
    let fb = b.pos as f64 / b.len() as f64;
    assert!((fa - fb).abs() < 0.01, "fraction sync {fa} {fb}");
    // Both runs' findings side by side; the keys drive the active one's.
    keys(&mut app, "G");
    app.focus = crate::tui::layout::Focus::Leaks;
    let s = screen(&mut app, 160, 44);
    let title =
        |r: &crate::tui::run_view::RunView| format!("Leaks · {} · {}", r.title, r.findings.len());
    let (leaky, fixed) = (title(&app.runs[0]), title(&app.runs[1]));
    assert!(s.contains(&leaky) && s.contains(&fixed), "{s}");
    assert!(
        !app.runs[0].findings.is_empty(),
        "the leaky run has findings"
    );
    assert_eq!(
        app.areas.leaks,
        app.areas.leak_panels.get(app.active).copied()
    );
    app.focus = crate::tui::layout::Focus::Map;
    keys(&mut app, "w");
    assert_eq!(app.active, 1);
    let s = screen(&mut app, 80, 24);
    assert!(
        s.contains("Map · leaky") && s.contains("Memory map · fixed"),
        "compare at 80x24\n{s}"
    );
}

/// Keys from a script; quits (Ctrl-C) when it runs out.
struct Script(VecDeque<CEvent>);

impl InputSource for Script {
    fn next(&mut self, timeout: Duration) -> anyhow::Result<Option<CEvent>> {
        // One event per frame, so every step is drawn.
        if timeout.is_zero() {
            return Ok(None);
        }
        // Ctrl-C, which quits from anywhere (q in the help closes the help).
        Ok(Some(self.0.pop_front().unwrap_or(CEvent::Key(
            KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL),
        ))))
    }
}

#[test]
fn real_loop_on_test_backend() {
    let mut app = leaky_app();
    let mut term = terminal(120, 40);
    let script = "iiij?"
        .chars()
        .map(|c| CEvent::Key(key(c)))
        .chain([CEvent::Resize(100, 30)]);
    run_screen(&mut term, &mut app, &mut Script(script.collect())).expect("loop runs");
    assert!(app.quit);
    let s = text(term.backend().buffer());
    assert!(s.contains(" Keys "), "help open at the last frame\n{s}");
}

#[test]
fn live_scenario_thread_and_restart() {
    let mut app = app_with(vec![("live".into(), scenario(FIXED))], &opts());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !app.runs[0].finished && std::time::Instant::now() < deadline {
        app.drain_sources();
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(app.runs[0].finished);
    let n = app.runs[0].len();
    assert!(n > 100);
    keys(&mut app, "G");
    assert_eq!(app.runs[0].pos, n);
    keys(&mut app, "r");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    app.runs[0].finished = false;
    while !app.runs[0].finished && std::time::Instant::now() < deadline {
        app.drain_sources();
        std::thread::sleep(Duration::from_millis(5));
    }
    // `Restarted` cleared the run: the cursor went back to the start.
    assert!(app.runs[0].finished);
    assert_eq!(app.runs[0].pos, 0);
    assert_eq!(app.runs[0].len(), n, "same deterministic run again");
}

#[test]
fn follows_live_events_at_the_end() {
    let (tx, rx) = flume::unbounded();
    let mut app = app_with(
        vec![("live".into(), crate::producers::Source::new(rx, None))],
        &opts(),
    );
    keys(&mut app, " ");
    let events = recorded_events(FIXED);
    let (a, b) = events.split_at(200);
    tx.send(crate::producers::SourceMsg::Run(RunMsg::Events(a.to_vec())))
        .expect("send");
    app.drain_sources();
    app.on_tick(Duration::from_secs(10));
    assert_eq!(app.runs[0].pos, 200);
    tx.send(crate::producers::SourceMsg::Run(RunMsg::Events(
        b[..100].to_vec(),
    )))
    .expect("send");
    app.drain_sources();
    app.on_tick(Duration::from_secs(1));
    assert_eq!(app.runs[0].pos, 300, "cursor follows new events");
    let s = screen(&mut app, 120, 40);
    assert!(s.contains("LIVE"), "{s}");
}

#[test]
fn keep_first_forgets_the_later_events_and_the_cursor_past_them() {
    use crate::producers::SourceMsg;
    let (tx, rx) = flume::unbounded();
    let mut app = app_with(
        vec![("what-if".into(), crate::producers::Source::new(rx, None))],
        &opts(),
    );
    let events = recorded_events(FIXED);
    let (a, b) = events.split_at(events.len() / 2);
    let keep = a.len() / 2;
    let send = |m: RunMsg| tx.send(SourceMsg::Run(m)).expect("send");
    send(RunMsg::Events(a.to_vec()));
    app.drain_sources();
    keys(&mut app, "G");
    assert_eq!(app.runs[0].pos, a.len());
    send(RunMsg::KeepFirst(keep));
    app.drain_sources();
    let run = &app.runs[0];
    assert_eq!(run.len(), keep);
    assert_eq!(run.pos, keep, "the cursor stays within the kept events");
    let mut want = crate::trace::Timeline::new();
    want.extend(a[..keep].iter().cloned());
    assert!(
        run.map == want.state_at(Some(keep - 1)),
        "the map at the cursor"
    );
    assert_eq!(run.timeline.peak(), want.peak());
    // The right events follow, and the view goes on from the cut.
    send(RunMsg::Events(b.to_vec()));
    app.drain_sources();
    assert_eq!(app.runs[0].len(), keep + b.len());
    keys(&mut app, "G");
    assert_eq!(app.runs[0].pos, keep + b.len());
    screen(&mut app, 120, 40);
}

#[test]
fn live_findings_follow_the_cursor() {
    use crate::leak::{Finding, FindingKind};
    use crate::producers::SourceMsg;
    let first = recorded_events(FIXED);
    let half = first.len() / 2;
    let found = Finding::new("total_loss", FindingKind::RetainedGraphGpu);
    let source = crate::producers::Source::from_messages([
        SourceMsg::Run(RunMsg::Events(first[..half].to_vec())),
        SourceMsg::Run(RunMsg::FindingsNow(Vec::new())),
        SourceMsg::Run(RunMsg::Events(first[half..].to_vec())),
        SourceMsg::Run(RunMsg::FindingsNow(vec![found])),
        SourceMsg::Run(RunMsg::Finished),
    ]);
    let mut app = app_with(vec![("live".into(), source)], &opts());
    keys(&mut app, "g");
    screen(&mut app, 120, 40);
    assert!(
        app.runs[0].findings.is_empty(),
        "nothing was known at the start"
    );
    keys(&mut app, "G");
    screen(&mut app, 120, 40);
    assert_eq!(
        app.runs[0].findings.len(),
        1,
        "at the end the detector had found the leak"
    );
    assert!(screen(&mut app, 120, 40).contains("total_loss"));
    keys(&mut app, "g");
    screen(&mut app, 120, 40);
    assert!(
        app.runs[0].findings.is_empty(),
        "stepping back hides what was not known yet"
    );
}

#[test]
fn colon_prompt_opens_another_run() {
    let mut app = leaky_app();
    keys(&mut app, ":");
    assert!(app.prompt.is_some());
    assert!(screen(&mut app, 140, 44).contains("open:"));
    for c in "no-such-scenario".chars() {
        keys(&mut app, &c.to_string());
    }
    app.handle_key(crossterm::event::KeyEvent::from(KeyCode::Enter));
    assert!(app.prompt.is_none());
    assert!(
        app.notice
            .as_deref()
            .is_some_and(|n| n.contains("no built-in scenario")),
        "{:?}",
        app.notice
    );
    assert_ne!(
        app.runs[0].title, "no-such-scenario",
        "a failed open keeps the run"
    );
    let narrow = screen(&mut app, 80, 24);
    let status = narrow.lines().next().unwrap_or_default();
    assert!(
        status.contains("no built-in scenario"),
        "seen at 80 columns: {status}"
    );
    keys(&mut app, ":");
    for c in "zero-grad-fixed".chars() {
        keys(&mut app, &c.to_string());
    }
    app.handle_key(crossterm::event::KeyEvent::from(KeyCode::Enter));
    assert_eq!(app.runs[0].title, "zero-grad-fixed");
    assert!(screen(&mut app, 140, 44).contains("zero-grad-fixed"));
    keys(&mut app, ":");
    app.handle_key(crossterm::event::KeyEvent::from(KeyCode::Esc));
    assert!(app.prompt.is_none(), "Esc cancels");
}

#[test]
fn a_source_far_ahead_of_the_ui_is_taken_a_few_chunks_per_drain() {
    use crate::alloc::{AllocConfig, CachingAllocator, Tag};
    use crate::device::SimDevice;
    use crate::producers::{Source, SourceMsg};
    use crate::tui::App;

    let mut a = CachingAllocator::new(SimDevice::new("sim", 1 << 34, 0), AllocConfig::default());
    for _ in 0..150_000 {
        let p = a.malloc(512, 0, Tag::NONE).expect("fits");
        a.free(p).expect("live");
    }
    let events: Vec<Event> = a.take_events().into_iter().map(Event::Alloc).collect();
    let chunk = 1 << 16;
    let mut msgs: Vec<SourceMsg> = events
        .chunks(chunk)
        .map(|c| SourceMsg::Run(RunMsg::Events(c.to_vec())))
        .collect();
    let n = msgs.len();
    assert!(n >= 3, "{n} chunks");
    msgs.push(SourceMsg::Run(RunMsg::Finished));
    let mut app = App::new(vec![("big".into(), Source::from_messages(msgs))], &opts())
        .expect("built-in theme parses");
    let mut drains = 0;
    while !app.runs[0].finished {
        assert!(app.drain_sources(), "a drain took nothing");
        drains += 1;
        // Each drain stops once it has taken its share, so frames keep coming.
        assert!(app.runs[0].len() <= drains * 4 * chunk, "drain {drains}");
    }
    assert_eq!(app.runs[0].len(), events.len());
    assert!(drains > 1, "all {} events in one drain", events.len());
}

/// A named pipe typed at the `:` prompt froze the UI waiting for a writer.
#[cfg(unix)]
#[test]
fn a_named_pipe_at_the_prompt_is_refused_at_once() {
    let dir = crate::scratch::temp_dir("prompt-fifo");
    let pipe = dir.join("pipe.pickle");
    let _ = std::fs::remove_file(&pipe);
    let c = std::ffi::CString::new(pipe.to_str().expect("utf-8")).expect("no nul");
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut app = leaky_app();
    app.open(pipe.to_str().expect("utf-8"));
    let notice = app.notice.clone().unwrap_or_default();
    assert!(notice.contains("a named pipe"), "{notice}");
    assert_eq!(app.runs[0].title, LEAKY, "the run stays");
}

/// A key pressed while a source's events pour in stops the drain after
/// the events it holds: the loop answers the key before it takes more.
#[test]
fn a_pressed_key_cuts_a_drain_short() {
    use crate::producers::{RunMsg, Source, SourceMsg};
    let events = recorded_events(FIXED);
    let msgs = events
        .chunks(50)
        .take(20)
        .map(|c| SourceMsg::Run(RunMsg::Events(c.to_vec())))
        .chain([SourceMsg::Run(RunMsg::Finished)]);
    let mut app =
        crate::tui::app::App::new(vec![("busy".into(), Source::from_messages(msgs))], &opts())
            .expect("built-in theme parses");
    let mut asked = 0;
    assert!(app.drain_sources_until(&mut || {
        asked += 1;
        true
    }));
    assert_eq!(app.runs[0].len(), 50, "one message, then the key");
    assert!(asked >= 1 && app.has_backlog());
    // No key: a drain takes on.
    app.drain_sources();
    assert_eq!(app.runs[0].len(), 1000);
}

/// The loop waits for keys between frames unless a source has more than
/// one drain takes: a source that piled up is taken at once, and once it
/// has finished (or gone) the loop waits again instead of spinning.
#[test]
fn a_backlog_skips_the_frame_wait_until_the_source_is_drained() {
    use crate::producers::{Source, SourceMsg};
    let marker = || Event::Marker(Marker::Narration("step".into()));
    // More messages than one drain takes, then the end.
    let msgs = (0..5000)
        .map(|_| SourceMsg::Run(RunMsg::Events(vec![marker()])))
        .chain([SourceMsg::Run(RunMsg::Finished)]);
    let mut app =
        crate::tui::app::App::new(vec![("piled".into(), Source::from_messages(msgs))], &opts())
            .expect("built-in theme parses");
    app.drain_sources();
    assert!(app.has_backlog(), "5,000 messages are more than one drain");
    for _ in 0..10 {
        app.drain_sources();
    }
    assert_eq!(app.runs[0].len(), 5000);
    assert!(
        !app.has_backlog(),
        "a finished source leaves nothing waiting"
    );
    app.drain_sources();
    assert!(!app.has_backlog(), "nor does a source that is gone");
}

#[test]
fn a_compute_estimate_arriving_after_its_events_reaches_the_stats_panel() {
    use crate::producers::SourceMsg;
    let (tx, rx) = flume::unbounded();
    let mut app = app_with(
        vec![("live".into(), crate::producers::Source::new(rx, None))],
        &opts(),
    );
    let events = recorded_events(FIXED);
    tx.send(SourceMsg::Run(RunMsg::Events(events)))
        .expect("send");
    app.drain_sources();
    keys(&mut app, "G");
    screen(&mut app, 160, 44);
    let row = |app: &crate::tui::App| {
        app.runs[0]
            .frame
            .stats
            .rows
            .iter()
            .any(|(k, _)| *k == "compute (est.)")
    };
    assert!(!row(&app), "no estimate yet");
    // The producer sends an iteration's estimate after its events: no new
    // event and no cursor move, yet the panel must show it.
    let mut work = crate::engine::work::WorkTally::default();
    work.add_flops(
        crate::engine::work::WorkPart::Forward,
        crate::engine::work::FlopKind::Matmul,
        crate::engine::work::MathUnit::Half,
        1_000_000_000,
    );
    let gpu = crate::device::profile("H100-SXM-80GB").expect("known");
    tx.send(SourceMsg::Scenario(ScenarioMsg::Compute(Box::new((
        1,
        crate::engine::estimate::estimate(&work, gpu),
    )))))
    .expect("send");
    app.drain_sources();
    screen(&mut app, 160, 44);
    assert!(row(&app), "{:?}", app.runs[0].frame.stats.rows);
}
