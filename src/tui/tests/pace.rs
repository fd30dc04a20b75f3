//! Pace and attention for a room: playing by op, phase or iteration,
//! auto-pause at narration, starting paused, a moment's own narration, the
//! narration box in full beside an error, the narration history, and
//! "done" at the end.

use std::sync::Arc;
use std::time::Duration;

use super::helpers::*;
use crate::producers::{RunMsg, Source, SourceMsg};
use crate::trace::{Event, Marker, Phase};
use crate::tui::app::{App, TuiOptions};
use crate::tui::input::{Dir, Jump};
use crate::tui::playback::PlayUnit;

fn said(t: &str) -> Event {
    Event::Marker(Marker::Narration(Arc::from(t)))
}

fn m(marker: Marker) -> Event {
    Event::Marker(marker)
}

fn op() -> Event {
    m(Marker::OpBegin {
        name: Arc::from("linear"),
        module: Arc::from("fc"),
    })
}

/// Two iterations in markers alone: narration at the start, right after
/// iteration 1 begins and right after its backward begins.
fn lesson() -> Vec<Event> {
    use Marker::*;
    vec![
        said("premise"),                 // 0
        m(IterationBegin(1)),            // 1
        said("iteration one"),           // 2
        m(PhaseBegin(Phase::Forward)),   // 3
        op(),                            // 4
        m(OpEnd),                        // 5
        m(PhaseEnd(Phase::Forward)),     // 6
        m(PhaseBegin(Phase::Backward)),  // 7
        said("backward"),                // 8
        op(),                            // 9
        m(OpEnd),                        // 10
        m(PhaseEnd(Phase::Backward)),    // 11
        m(PhaseBegin(Phase::Optimizer)), // 12
        m(PhaseEnd(Phase::Optimizer)),   // 13
        m(IterationEnd(1)),              // 14
        m(IterationBegin(2)),            // 15
        m(PhaseBegin(Phase::Forward)),   // 16
        m(PhaseEnd(Phase::Forward)),     // 17
        m(IterationEnd(2)),              // 18
    ]
}

fn lesson_app(opts: &TuiOptions) -> App {
    let src = Source::from_messages([
        SourceMsg::Run(RunMsg::Events(lesson())),
        SourceMsg::Run(RunMsg::Finished),
    ]);
    app_with(vec![("lesson".into(), src)], opts)
}

/// Every stop of `unit` from the start, as `next_stop` gives them.
fn stops(app: &App, unit: PlayUnit) -> Vec<usize> {
    let r = &app.runs[0];
    std::iter::successors(r.next_stop(unit, 0), |&p| r.next_stop(unit, p)).collect()
}

#[test]
fn play_by_phase_stops_at_each_phase_begin_and_its_narration() {
    let app = lesson_app(&opts());
    // Phase begins at 3, 7 (narration at 8 goes with it), 12 and 16; then
    // the end of the finished run.
    assert_eq!(stops(&app, PlayUnit::Phase), [4, 9, 13, 17, 19]);
    assert_eq!(stops(&app, PlayUnit::Iteration), [3, 16, 19]);
    assert_eq!(stops(&app, PlayUnit::Op), [5, 10, 19]);
    assert_eq!(stops(&app, PlayUnit::Event).len(), 19);
}

#[test]
fn a_live_run_waits_for_its_next_boundary() {
    let (tx, rx) = flume::unbounded();
    let _ = tx.send(SourceMsg::Run(RunMsg::Events(lesson()[..10].to_vec())));
    let mut app = app_with(vec![("live".into(), Source::new(rx, None))], &opts());
    let r = &app.runs[0];
    assert_eq!(r.next_stop(PlayUnit::Phase, 4), Some(9));
    assert_eq!(
        r.next_stop(PlayUnit::Phase, 9),
        None,
        "phase 3 not here yet"
    );
    let _ = tx.send(SourceMsg::Run(RunMsg::Events(lesson()[10..].to_vec())));
    app.drain_sources();
    assert_eq!(app.runs[0].next_stop(PlayUnit::Phase, 9), Some(13));
}

#[test]
fn playing_by_phase_moves_one_phase_per_step_at_the_rate() {
    let mut app = lesson_app(&TuiOptions {
        start_paused: false,
        play_by: PlayUnit::Phase,
        unit_rate: 2.0,
        ..opts()
    });
    app.on_tick(Duration::from_millis(250));
    assert_eq!(app.runs[0].pos, 0, "half a step");
    app.on_tick(Duration::from_millis(250));
    assert_eq!(app.runs[0].pos, 4, "one phase at 2 phases/s");
    app.on_tick(Duration::from_secs(1));
    assert_eq!(app.runs[0].pos, 13, "two more");
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("▶ playing 2 phase/s"), "{s}");
    app.on_tick(Duration::from_secs(5));
    app.on_tick(Duration::from_millis(1));
    assert_eq!(app.runs[0].pos, 19);
    assert!(!app.playing, "stops at the end");
    let s = screen(&mut app, 80, 24);
    assert!(s.lines().next().unwrap_or("").contains("■ done"), "{s}");
}

#[test]
fn m_cycles_the_unit_and_plus_speeds_that_unit() {
    let mut app = lesson_app(&opts());
    let before = app.speed;
    keys(&mut app, "m");
    assert_eq!(app.play_unit, PlayUnit::Op);
    keys(&mut app, "m+");
    assert_eq!(app.play_unit, PlayUnit::Phase);
    assert_eq!(app.unit_rate, 2.0);
    assert_eq!(app.speed, before, "events per second unchanged");
    keys(&mut app, "mm");
    assert_eq!(app.play_unit, PlayUnit::Event);
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("paused 500 ev/s"), "{s}");
}

#[test]
fn auto_pause_stops_at_every_narration_until_space() {
    let mut app = lesson_app(&TuiOptions {
        start_paused: false,
        auto_pause: true,
        ..opts()
    });
    // The premise is said before any event: shown from the start, and
    // playback holds there first.
    assert_eq!(app.runs[0].said_upto(), 1);
    app.on_tick(Duration::from_secs(1));
    assert_eq!(app.runs[0].pos, 0);
    assert!(!app.playing);
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("narration: space goes on"), "{s}");
    assert!(s.contains("premise"), "{s}");
    keys(&mut app, " ");
    app.on_tick(Duration::from_secs(1));
    assert_eq!(app.runs[0].pos, 3, "stopped on 'iteration one'");
    assert!(!app.playing);
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("narration: space goes on"), "{s}");
    assert!(s.contains("iteration one"), "{s}");
    app.on_tick(Duration::from_secs(1));
    assert_eq!(app.runs[0].pos, 3, "holds until space");
    keys(&mut app, " ");
    app.on_tick(Duration::from_secs(1));
    assert_eq!(app.runs[0].pos, 9, "on to 'backward'");
    keys(&mut app, "a ");
    app.on_tick(Duration::from_secs(1));
    assert_eq!(app.runs[0].pos, 19, "auto-pause off: through to the end");
}

#[test]
fn paused_at_start_nothing_moves_and_the_premise_is_shown() {
    let mut app = leaky_app_with(&TuiOptions {
        start_paused: true,
        auto_pause: true,
        ..opts()
    });
    for _ in 0..10 {
        app.on_tick(Duration::from_secs(1));
    }
    assert_eq!(app.runs[0].pos, 0);
    let (tour, _) = crate::scenario::resolve(LEAKY).expect("built-in");
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("⏸ paused"), "{s}");
    assert!(s.contains("event 0/"), "{s}");
    let premise: String = tour.narration[0].text.chars().take(30).collect();
    assert!(s.contains(&premise), "{s}");
    keys(&mut app, " ");
    app.on_tick(Duration::from_secs(1));
    let s = screen(&mut app, 80, 24);
    let first: String = tour.narration[1].text.chars().take(30).collect();
    assert!(
        s.contains(&first),
        "the next narration, and there it waits\n{s}"
    );
    assert!(s.contains("narration: space goes on"), "{s}");
}

/// The text of a run's narration callout, its rows joined.
fn callout_text(app: &App) -> String {
    app.runs[0].frame.narration.join(" ")
}

#[test]
fn landing_on_a_moment_shows_its_own_narration() {
    let (tour, _) = crate::scenario::resolve(LEAKY).expect("built-in");
    let text = |k: usize| tour.narration[k].text.clone();
    let mut app = leaky_app();
    keys(&mut app, "i");
    screen(&mut app, 140, 44);
    assert_eq!(callout_text(&app), text(1), "iteration 1's own words");
    keys(&mut app, "iii");
    screen(&mut app, 140, 44);
    assert_eq!(callout_text(&app), text(3), "iteration 4's");
    keys(&mut app, "I");
    screen(&mut app, 140, 44);
    let r = &app.runs[0];
    assert!(matches!(
        r.timeline
            .event(r.moment_start().unwrap_or(0))
            .expect("an event there"),
        Event::Marker(Marker::IterationBegin(3))
    ));
    keys(&mut app, "gx");
    screen(&mut app, 140, 44);
    assert_eq!(callout_text(&app), text(5), "the OOM's narration");
    // n and N walk the moments, never landing twice on one.
    keys(&mut app, "g");
    let mut seen = Vec::new();
    while app.runs[0].jump(Jump::Narration, Dir::Fwd) {
        screen(&mut app, 140, 44);
        seen.push(callout_text(&app));
    }
    let all: Vec<String> = tour.narration.iter().map(|n| n.text.clone()).collect();
    assert_eq!(seen, all[1..], "the premise is said at the start");
    let mut back = 0;
    while app.runs[0].jump(Jump::Narration, Dir::Back) {
        back += 1;
    }
    assert_eq!(back, all.len() - 2, "back to the first after the premise");
}

#[test]
fn the_error_and_the_narration_are_both_on_screen() {
    let mut app = leaky_app();
    keys(&mut app, "G");
    for (w, h) in [(80, 24), (140, 44)] {
        let s = screen(&mut app, w, h);
        assert!(s.contains(" error "), "{s}");
        assert!(s.contains("CUDA out of memory"), "{s}");
        assert!(s.contains(" narration "), "{s}");
        assert!(s.contains("Out of memory: PyTorch's own message"), "{s}");
    }
}

/// The longest narration of the library, beside the OOM it explains: every
/// word of it on an 80×24 screen.
#[test]
fn the_narration_box_holds_the_whole_text_at_80x24() {
    let name = "gpt2-small-oom";
    let (file, _) = crate::scenario::resolve(name).expect("built-in");
    let text = file
        .narration
        .iter()
        .map(|n| n.text.clone())
        .max_by_key(String::len)
        .expect("narration");
    let mut app = app_finished(vec![(name.into(), scenario(name))], &opts());
    keys(&mut app, "G");
    let s = screen(&mut app, 80, 24);
    let shown: String = s
        .lines()
        .map(|l| l.trim_matches(|c| c == '│' || c == ' '))
        .collect::<Vec<_>>()
        .join(" ");
    assert!(shown.contains(&text), "{s}");
    assert!(s.contains(" error "), "the OOM beside it\n{s}");
    insta::assert_snapshot!("narration_in_full_80x24", s);
}

#[test]
fn the_narration_history_lists_everything_said_up_to_the_cursor() {
    let (tour, _) = crate::scenario::resolve(LEAKY).expect("built-in");
    let mut app = leaky_app();
    keys(&mut app, "iiiE");
    let p = app.popup.as_ref().expect("E opens the history");
    let lines: Vec<String> = p.lines().into_iter().map(|l| l.text).collect();
    let joined = lines.join(" ");
    for n in &tour.narration[..3] {
        let start: String = n.text.chars().take(25).collect();
        assert!(joined.contains(&start), "{start:?} in {lines:?}");
    }
    let later: String = tour.narration[3].text.chars().take(25).collect();
    assert!(!joined.contains(&later), "nothing from after the cursor");
    keys(&mut app, "E");
    assert!(app.popup.is_none(), "E closes it");
    keys(&mut app, "GE");
    for (w, h) in [(80, 24), (140, 44)] {
        let s = screen(&mut app, w, h);
        // Scrolled to the newest, last.
        assert!(s.contains("Out of memory: PyTorch"), "{s}");
        insta::assert_snapshot!(format!("narration_history_{w}x{h}"), s);
    }
}

#[test]
fn help_at_80x24_reaches_quit() {
    let mut app = leaky_app();
    keys(&mut app, "?");
    let first = screen(&mut app, 80, 24);
    assert!(first.contains("q closes"), "{first}");
    keys(&mut app, "G");
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("quit"), "{s}");
    assert!(s.contains("q  ctrl-c  quit"), "{s}");
    insta::assert_snapshot!("help_80x24_end", s);
}

#[test]
fn the_status_line_keeps_help_in_view_at_80_columns() {
    let mut app = leaky_app();
    let check = |app: &mut App, what: &str| {
        let s = screen(app, 80, 24);
        let status = s.lines().next().unwrap_or_default().trim_end().to_string();
        assert!(status.ends_with("? help"), "{what}: {status}");
        status
    };
    check(&mut app, "paused at the start");
    keys(&mut app, "mma");
    let status = check(&mut app, "by phase, auto-pause");
    assert!(status.contains("1 phase/s"), "{status}");
    assert!(status.contains("auto-pause"), "{status}");
    keys(&mut app, "G");
    assert!(check(&mut app, "at the end").contains("■ done"));
    let mut two = app_finished(
        vec![
            (BUGGY.into(), scenario(BUGGY)),
            (FIXED.into(), scenario(FIXED)),
        ],
        &opts(),
    );
    check(&mut two, "compare");
}
