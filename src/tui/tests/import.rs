//! Real PyTorch snapshots as sources.

use super::helpers::*;
use crate::producers::snapshot::snapshot_source;
use crate::producers::{RecordedMsg, RunMsg};
use crate::real_snapshots::real;

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn closed_trace_places_every_entry() {
    let p = real("adam-step_closed-trace_annotations.pickle");
    let src = snapshot_source(&p, None);
    let mut app = app_finished(vec![("adam".into(), src)], &opts());
    let r = &app.runs[0];
    assert_eq!(r.len(), 35);
    assert!(r.timeline.gaps().is_empty(), "{:?}", r.timeline.gaps());
    keys(&mut app, "Gj");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("large pool") && s.contains("small pool"), "{s}");
    assert!(
        s.contains("your code: ") && s.contains("b: all "),
        "the selected block's first user frame and its stack's length\n{s}"
    );
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn expandable_trace_with_oom() {
    let p = real("code-location_expandable_3gpu_oom.pickle");
    let src = snapshot_source(&p, Some(1));
    let mut app = app_finished(vec![("code-location".into(), src)], &opts());
    assert_eq!(app.runs[0].len(), 596);
    assert!(
        app.runs[0].timeline.gaps().is_empty(),
        "{:?}",
        &app.runs[0].timeline.gaps()[..1]
    );
    keys(&mut app, "x");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("L*"), "expandable rows\n{s}");
    assert!(s.contains("oom"), "{s}");
    // The OOM carries the free memory the driver reported, as recorded.
    let snap = crate::trace::snapshot::import_file(&p).expect("imports");
    let recorded: Vec<u64> = snap.device_traces[1]
        .iter()
        .filter_map(|e| snap.extra(e).device_free)
        .collect();
    let shown: Vec<u64> = app.runs[0]
        .timeline
        .events()
        .iter()
        .filter_map(|e| match e {
            crate::trace::Event::Alloc(a) if a.action == crate::alloc::Action::Oom => {
                Some(a.device_free)
            }
            _ => None,
        })
        .collect();
    assert!(!recorded.is_empty() && recorded.iter().all(|f| *f > 0));
    assert_eq!(shown, recorded);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn state_only_snapshot_shows_its_map() {
    let p = real("verl_private-pools_pending-free_state-only.pickle");
    let src = snapshot_source(&p, None);
    let mut app = app_finished(vec![("verl".into(), src)], &opts());
    assert_eq!(app.runs[0].len(), 0);
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("large pool"), "{s}");
    assert!(!app.runs[0].map.segments.is_empty());
}

/// A snapshot without a trace (one of the project's captures with its trace
/// taken out): the map is there, and its peaks are said to be unknown, not
/// shown as the state's own figures.
#[test]
fn a_state_only_snapshot_says_its_peaks_are_unknown() {
    let capture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pytorch/captured/peak_inside_step.pickle");
    let mut snap = crate::trace::snapshot::import_file(&capture).expect("a capture");
    snap.device_traces.clear();
    let dir = crate::scratch::temp_dir("state-only-tui");
    let p = dir.join("state-only.pickle");
    std::fs::write(&p, crate::trace::snapshot::export_bytes(&snap)).expect("write");
    let src = snapshot_source(&p, None);
    let mut app = app_finished(vec![("state".into(), src)], &opts());
    assert_eq!(app.runs[0].len(), 0);
    for (w, h) in [(80, 24), (140, 44)] {
        let s = screen(&mut app, w, h);
        assert!(s.contains("large pool"), "{s}");
        assert!(s.contains("peak unknown"), "{w}x{h}:\n{s}");
        // Nor is a peak drawn: a run of the peak's glyph is its level line
        // (the legend names the glyph once).
        assert!(!s.contains("┄┄"), "{w}x{h}: a peak line drawn:\n{s}");
        // The empty graph says why it is empty, and its legend names no
        // line it does not draw.
        assert!(s.contains("No trace in this file"), "{w}x{h}:\n{s}");
        for unnamed in ["peak so far", "capacity", "cursor"] {
            assert!(!s.contains(unnamed), "{w}x{h}: {unnamed} named:\n{s}");
        }
    }
    // The event list (shown at 200×60) says why it is empty.
    let s = screen(&mut app, 200, 60);
    assert!(
        s.contains("no events: the file holds the final state only"),
        "{s}"
    );
}

/// The same file under another allocator config: with no trace there is
/// nothing to replay, and the view says its map is the recorded state
/// rather than letting it pass for the other config's.
#[test]
fn a_what_if_of_a_state_only_snapshot_says_nothing_was_replayed() {
    use crate::producers::snapshot::what_if_file_source;
    let capture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pytorch/captured/peak_inside_step.pickle");
    let mut snap = crate::trace::snapshot::import_file(&capture).expect("a capture");
    snap.device_traces.clear();
    let dir = crate::scratch::temp_dir("state-only-what-if-tui");
    let p = dir.join("state-only.pickle");
    std::fs::write(&p, crate::trace::snapshot::export_bytes(&snap)).expect("write");
    let config = crate::alloc::AllocConfig::parse("max_split_size_mb:64").expect("a config");
    let mut app = app_finished(
        vec![("what-if".into(), what_if_file_source(&p, None, config))],
        &opts(),
    );
    let s = screen(&mut app, 200, 60);
    assert!(
        s.contains("no trace: nothing replayed under max_split_size_mb:64"),
        "{s}"
    );
    // Where the status line has no room, the map's title says it first.
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("Memory map · no trace, recorded state"), "{s}");
    // The file as it is says no such thing.
    let mut plain = app_finished(vec![("state".into(), snapshot_source(&p, None))], &opts());
    assert!(!screen(&mut plain, 200, 60).contains("nothing replayed"));
}

#[test]
fn a_long_trace_streams_in_chunks_that_add_up_to_the_whole_trace() {
    use crate::producers::snapshot::snapshot_to_source;
    use crate::producers::Polled;
    use crate::producers::SourceMsg;
    use crate::trace::mirror::trace_events;
    use crate::trace::replay::from_snapshot;
    use crate::trace::snapshot::{import_bytes, synthetic_snapshot};

    let mut bytes = Vec::new();
    synthetic_snapshot(&mut bytes, 12_000_000, 7).expect("generates");
    let snap = import_bytes(&bytes).expect("imports");
    let src = snapshot_to_source(&snap, None).expect("device 0 is traced");
    let (mut streamed, mut messages, mut announced) = (Vec::new(), 0, None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        assert!(std::time::Instant::now() < deadline, "never finished");
        match src.poll() {
            Polled::Msg(SourceMsg::Run(RunMsg::Part(mut p))) => {
                messages += 1;
                assert_eq!(p.events.len(), p.samples.len(), "a sample per event");
                streamed.append(&mut p.events);
                p.samples.clear();
                // As the UI does: the worker may fill it again.
                src.give_back(p);
            }
            Polled::Msg(SourceMsg::Run(RunMsg::Finished)) => break,
            Polled::Msg(SourceMsg::Recorded(RecordedMsg::Opened(o))) => {
                assert!(streamed.is_empty(), "opened before the first event");
                announced = o.events;
            }
            Polled::Msg(other) => panic!("unexpected message {other:?}"),
            Polled::Empty => std::thread::sleep(std::time::Duration::from_millis(1)),
            Polled::Closed => panic!("closed before Finished"),
        }
    }
    let entries = from_snapshot::entries(&snap, 0);
    let whole = trace_events(
        &entries,
        |i| {
            snap.device_traces[0]
                .get(i)
                .and_then(|e| snap.extra(e).device_free)
        },
        &from_snapshot::config(&snap),
    );
    assert!(entries.len() > 100_000, "{} entries", entries.len());
    assert!(messages > 1, "one message for {} events", whole.len());
    assert_eq!(streamed.len(), whole.len());
    assert_eq!(announced, Some(whole.len()), "the count said up front");
    assert!(
        streamed == whole,
        "the chunks differ from the whole trace's events"
    );
}

/// Frame names that would set the terminal's title or clear it are shown
/// escaped in the block detail (and nothing raw reaches a cell).
#[test]
fn control_sequences_in_frames_are_shown_escaped() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hostile/escapes.pickle");
    let src = snapshot_source(&p, None);
    let mut app = app_finished(vec![("evil".into(), src)], &opts());
    keys(&mut app, "G");
    app.handle_key(code(crossterm::event::KeyCode::Down));
    let mut t = terminal(140, 44);
    let buf = draw(&mut app, &mut t);
    assert!(buf
        .content()
        .iter()
        .all(|c| !c.symbol().contains(char::is_control)));
    let s = text(&buf);
    assert!(s.contains("\\u{1b}]0;pwned\\u{7}evil.py:7"), "{s}");
}

/// Drain until every source has finished (after a device switch).
fn finish(app: &mut crate::tui::app::App) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while app.runs.iter().any(|r| r.is_live()) {
        assert!(std::time::Instant::now() < deadline, "never finished");
        if !app.drain_sources() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn x_goes_on_to_the_oom_of_another_device_and_d_switches_devices() {
    let p = real("code-location_expandable_3gpu_oom.pickle");
    let snap = crate::trace::snapshot::import_file(&p).expect("imports");
    let ooms: Vec<usize> = (0..snap.device_traces.len())
        .filter(|d| {
            snap.device_traces[*d]
                .iter()
                .any(|e| e.action == crate::alloc::Action::Oom)
        })
        .collect();
    assert_eq!(ooms, [1], "the file's one OOM is on device 1");
    let src = snapshot_source(&p, None);
    let mut app = app_finished(vec![("code-location".into(), src)], &opts());
    let s = screen(&mut app, 200, 60);
    assert!(s.contains("device 0 (1 of 3)"), "{s}");
    keys(&mut app, "x");
    finish(&mut app);
    let r = &app.runs[0];
    assert_eq!(r.devices.as_ref().map(|d| d.current), Some(1));
    // The cursor stands on device 1's OOM: the event just applied is it.
    let at = r.pos.checked_sub(1).expect("moved");
    assert!(
        matches!(&r.timeline.event(at).expect("an event there"), crate::trace::Event::Alloc(a) if a.action == crate::alloc::Action::Oom),
        "cursor at {at}"
    );
    let s = screen(&mut app, 200, 60);
    assert!(s.contains("device 1 (2 of 3)"), "{s}");
    assert!(s.contains("the next OOM is on device 1"), "{s}");
    keys(&mut app, "d");
    finish(&mut app);
    assert_eq!(app.runs[0].devices.as_ref().map(|d| d.current), Some(2));
    keys(&mut app, "D");
    keys(&mut app, "D");
    finish(&mut app);
    assert_eq!(app.runs[0].devices.as_ref().map(|d| d.current), Some(0));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn a_file_of_device_1_alone_opens_on_device_1() {
    let p = real("layout-editing_legacy-segment-list_device1.pickle");
    let src = snapshot_source(&p, None);
    let mut app = app_finished(vec![("layout".into(), src)], &opts());
    let r = &app.runs[0];
    assert_eq!(r.devices.as_ref().map(|d| d.current), Some(1));
    assert!(r.map.stats().reserved > 0);
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("device 1"), "{s}");
    let app = app_finished(
        vec![("layout".into(), snapshot_source(&p, Some(0)))],
        &opts(),
    );
    assert_eq!(
        app.runs[0].failure.as_deref(),
        Some(
            format!(
                "{}: the snapshot has no device 0; it holds device 1",
                p.display()
            )
            .as_str()
        )
    );
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn in_compare_d_moves_both_views_of_the_same_file() {
    use crate::producers::{open_source, open_source_under};
    let p = real("code-location_expandable_3gpu_oom.pickle");
    let input = p.to_str().expect("utf-8 path");
    let recorded = open_source(input).expect("opens");
    let what_if = open_source_under(input, "expandable_segments:False").expect("opens");
    let mut app = app_finished(vec![recorded, what_if], &opts());
    let on = |app: &crate::tui::app::App| -> Vec<Option<usize>> {
        app.runs
            .iter()
            .map(|r| r.devices.as_ref().map(|d| d.current))
            .collect()
    };
    assert_eq!(on(&app), [Some(0), Some(0)]);
    keys(&mut app, "d");
    finish(&mut app);
    assert_eq!(on(&app), [Some(1), Some(1)]);
    // The what-if side is still a replay under its config.
    assert!(
        app.runs[1].title.contains("expandable_segments:False"),
        "{}",
        app.runs[1].title
    );
    assert!(app.runs[1]
        .devices
        .as_ref()
        .is_some_and(|d| d.under.is_some()));
}

/// A file named on the command line that does not open ends the UI, and the
/// error goes back to the shell (`open` exits 2 with it); a source that
/// fails without reading a file (a scenario's error) stays on screen.
#[test]
fn a_file_that_fails_to_open_ends_the_ui_with_its_error() {
    let dir = crate::scratch::temp_dir("bad-pickle");
    let bad = dir.join("bad.pickle");
    std::fs::write(&bad, b"\xf8 not a pickle").expect("temp file");
    let stop = crate::tui::app::TuiOptions {
        stop_on_load_failure: true,
        ..opts()
    };
    let mut app =
        crate::tui::app::App::new(vec![("bad".into(), snapshot_source(&bad, None))], &stop)
            .expect("theme");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !app.quit {
        assert!(std::time::Instant::now() < deadline, "the UI did not stop");
        app.drain_sources();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let why = app.load_failure.clone().expect("the error");
    assert!(why.contains("not a valid pickle"), "{why}");
    let _ = std::fs::remove_file(&bad);

    let failed = crate::producers::Source::from_messages([crate::producers::SourceMsg::Run(
        RunMsg::Failed("the model does not build".into()),
    )]);
    let app = app_finished(vec![("scenario".into(), failed)], &stop);
    assert!(!app.quit && app.load_failure.is_none());
}

/// The status line of a frame.
fn status_of(app: &mut crate::tui::app::App) -> String {
    let mut t = terminal(160, 44);
    let s = text(&draw(app, &mut t));
    s.lines().next().unwrap_or_default().to_string()
}

/// A file view's first frame, drawn before the worker has said anything,
/// says the file is being read (it once read `event 0/0 LIVE`); its last
/// says all was read.
#[test]
fn a_file_view_says_it_reads_from_its_first_frame_to_its_end() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hostile/escapes.pickle");
    let mut app = crate::tui::app::App::new(vec![("f".into(), snapshot_source(&p, None))], &opts())
        .expect("built-in theme parses");
    let first = status_of(&mut app);
    assert!(first.contains("reading"), "{first}");
    assert!(
        !first.contains("LIVE") && !first.contains("event 0/0"),
        "{first}"
    );
    finish(&mut app);
    let last = status_of(&mut app);
    assert!(last.contains("all read"), "{last}");
}

/// Events placed while the file is still read: the status counts them
/// beside the reading, and says the map's start is assumed until the
/// file is read; then neither.
#[test]
fn events_placed_while_a_file_is_read_are_shown_beside_the_reading() {
    use crate::producers::{
        LoadProgress, Opened, RecordedMsg, RunMsg, SnapshotDevices, Source, SourceMsg,
    };
    let opened = |assumed| {
        SourceMsg::Recorded(RecordedMsg::Opened(Box::new(Opened {
            tags: None,
            capacity: None,
            devices: SnapshotDevices {
                path: None,
                devices: vec![0],
                current: 0,
                with_oom: Vec::new(),
                under: None,
            },
            events: None,
            since_step: false,
            assumed_empty_start: assumed,
        })))
    };
    let reading = |done| {
        SourceMsg::Recorded(RecordedMsg::Loading(LoadProgress::Reading {
            done,
            total: 4000,
        }))
    };
    let (tx, rx) = flume::unbounded();
    let mut app = crate::tui::app::App::new(
        vec![("f".into(), Source::new(rx, None).reading(4000))],
        &opts(),
    )
    .expect("built-in theme parses");
    let events = recorded_events(FIXED);
    for m in [
        reading(0),
        opened(true),
        SourceMsg::Run(RunMsg::Events(events[..100].to_vec())),
        reading(2000),
    ] {
        tx.send(m).expect("send");
    }
    app.drain_sources();
    let s = status_of(&mut app);
    assert!(s.contains("event 0/100+ · reading"), "{s}");
    assert!(s.contains("as if nothing was held before the trace"), "{s}");
    for m in [
        reading(4000),
        opened(false),
        SourceMsg::Run(RunMsg::Finished),
    ] {
        tx.send(m).expect("send");
    }
    app.drain_sources();
    let s = status_of(&mut app);
    assert!(s.contains("event 0/100 · all read"), "{s}");
    assert!(!s.contains("as if nothing"), "{s}");
}

/// At a recorded OOM the leak panel answers it, as `open` does: the request,
/// the lines that held the memory, the what-ifs — never "no findings" alone
/// (the project's capture of a deque of losses that keep their graphs,
/// which runs out of memory in iteration 39).
#[test]
fn the_leak_panel_answers_a_recorded_oom() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pytorch/captured/bounded_deque_graphs_bug.pickle");
    let snap = crate::trace::snapshot::import_file(&p).expect("imports");
    let report = crate::report::snapshot::SnapshotReport::new("deque", &snap);
    let expected = report.devices[0]
        .oom_answer
        .as_ref()
        .expect("the report answers the OOM")
        .lines();
    let mut app = app_finished(vec![("deque".into(), snapshot_source(&p, None))], &opts());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while app.runs[0].oom_answer.is_none() {
        assert!(std::time::Instant::now() < deadline, "no answer came");
        if !app.drain_sources() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    assert_eq!(
        app.runs[0].oom_answer.as_ref().map(|a| a.lines()),
        Some(expected.clone())
    );
    keys(&mut app, "\t\t");
    let s = screen(&mut app, 200, 60);
    let head: String = expected[0].chars().take(60).collect();
    assert!(s.contains(&head), "{s}");
    assert!(s.contains("largest holders:"), "{s}");
}

/// The event list is narrower than its lines at 200×60: each address it
/// shows is one of the file's, whole, and a line the border cuts ends in
/// `…` (a cut address would read as another one).
#[test]
fn the_event_list_shows_addresses_whole() {
    let capture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pytorch/captured/peak_inside_step.pickle");
    let snap = crate::trace::snapshot::import_file(&capture).expect("a capture");
    let recorded: std::collections::BTreeSet<String> = snap
        .device_traces
        .iter()
        .flatten()
        .map(|e| format!("{:#x}", e.addr))
        .collect();
    let src = snapshot_source(&capture, None);
    let mut app = app_finished(vec![("capture".into(), src)], &opts());
    let s = raw_text(&draw(&mut app, &mut terminal(200, 60)));
    let rows: Vec<&str> = s
        .lines()
        .filter_map(|l| l.rsplit("││").next())
        .filter(|l| l.contains(" alloc ") || l.contains(" free_"))
        .collect();
    assert!(rows.len() > 5, "the event list at 200x60:\n{s}");
    let mut cut = 0;
    for row in &rows {
        let text = row.trim_end_matches('│').trim_end();
        for word in text.split_whitespace().filter(|w| w.starts_with("0x")) {
            let addr = word.trim_end_matches('…');
            assert!(
                recorded.contains(addr) && !word.ends_with('…'),
                "{word} is not an address of the file, whole:\n{s}"
            );
        }
        if text.contains(" alloc ") && text.ends_with('…') {
            cut += 1;
        }
    }
    assert!(cut > 0 || rows.iter().all(|r| r.contains("block")), "{s}");
}
