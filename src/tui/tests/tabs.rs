//! Tabs (`vramscope open a b …`): the bar, switching by key and click, the
//! table across files and the diff view, on real snapshots through the
//! producer the binary uses.

use crossterm::event::KeyModifiers;
use crossterm::event::{KeyCode, MouseButton, MouseEvent, MouseEventKind};

use super::helpers::{code, keys, opts, screen};
use crate::alloc::format_size;
use crate::producers::{snapshot_source, snapshot_tab_source};
use crate::real_snapshots::real;
use crate::report::snapshot::SnapshotReport;
use crate::trace::snapshot::import_file;
use crate::tui::app::{App, DiffState, TabView, TuiOptions};

const ADAM: &str = "adam-step_closed-trace_annotations.pickle";
const TINY: &str = "cs336-silmont_tiny-closed-trace_cpp-frames.pickle";
const OOM3: &str = "code-location_expandable_3gpu_oom.pickle";

/// `files` as tabs, every tab's file read (a missing one failed).
fn tabs_app(files: &[&str]) -> App {
    let sources = files
        .iter()
        .map(|f| (f.to_string(), snapshot_tab_source(&real(f), None)))
        .collect();
    let o = TuiOptions {
        tabs: true,
        ..opts()
    };
    let mut app = App::new(sources, &o).expect("built-in theme parses");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let settled =
        |app: &App| (0..app.tab_count()).all(|i| app.tab_run(i).is_some_and(|r| !r.is_live()));
    while !settled(&app) {
        assert!(std::time::Instant::now() < deadline, "tabs never finished");
        if !app.drain_sources() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    app
}

fn shown(app: &App) -> (usize, String) {
    let t = app.tabs.as_ref().expect("tabs");
    (t.active, app.runs[0].title.clone())
}

fn live_bytes(file: &str) -> u64 {
    let snap = import_file(&real(file)).expect("real snapshot imports");
    SnapshotReport::new(file, &snap)
        .devices
        .iter()
        .map(|d| d.active_allocated.bytes + d.active_pending_free.bytes)
        .sum()
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn the_bar_names_every_file_marks_the_oom_and_keys_switch_tabs() {
    let mut app = tabs_app(&[ADAM, OOM3, TINY]);
    assert_eq!(app.tab_count(), 3);
    assert_eq!(app.runs.len(), 1, "one tab shown at a time");
    let s = screen(&mut app, 200, 60);
    let top = s.lines().next().unwrap_or_default();
    assert!(top.contains(&format!(" 1 {ADAM} ")), "{top}");
    assert!(top.contains(&format!(" 2 {OOM3} OOM ")), "{top}");
    assert!(top.contains(&format!(" 3 {TINY} ")), "{top}");
    assert!(
        !top.contains(&format!("{ADAM} OOM")),
        "adam records no OOM: {top}"
    );
    insta::assert_snapshot!("tabs_bar_200x60", s);
    keys(&mut app, "w");
    assert_eq!(shown(&app), (1, OOM3.to_string()));
    keys(&mut app, "W");
    assert_eq!(shown(&app), (0, ADAM.to_string()));
    keys(&mut app, "W");
    assert_eq!(shown(&app), (2, TINY.to_string()), "W wraps to the last");
    keys(&mut app, "1");
    assert_eq!(shown(&app), (0, ADAM.to_string()));
    keys(&mut app, "9");
    assert_eq!(
        shown(&app),
        (0, ADAM.to_string()),
        "no tab 9: nothing moves"
    );
    // Each tab keeps its own cursor.
    let end = app.runs[0].len();
    keys(&mut app, "G");
    assert_eq!(app.runs[0].pos, end);
    keys(&mut app, "2g1");
    assert_eq!(app.runs[0].pos, end, "tab 1's cursor stayed where it was");
    let s80 = screen(&mut app, 80, 24);
    insta::assert_snapshot!("tabs_bar_80x24", s80);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn a_click_on_the_bar_shows_that_tab() {
    let mut app = tabs_app(&[ADAM, TINY]);
    let _ = screen(&mut app, 120, 40);
    let second = app.tabs.as_ref().map(|t| t.bar[1].x + 2).expect("a bar");
    let click = MouseEvent {
        kind: MouseEventKind::Down(MouseButton::Left),
        column: second,
        row: 0,
        modifiers: KeyModifiers::NONE,
    };
    assert!(app.handle_mouse(click));
    assert_eq!(shown(&app), (1, TINY.to_string()));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn a_file_that_fails_shows_its_error_in_its_tab_and_the_others_work() {
    let mut app = tabs_app(&[ADAM, "no-such-file.pickle", TINY]);
    let s = screen(&mut app, 120, 40);
    assert!(
        s.lines()
            .next()
            .unwrap_or_default()
            .contains("2 no-such-file.pickle ✗"),
        "{s}"
    );
    keys(&mut app, "2");
    let s = screen(&mut app, 120, 40);
    assert!(s.contains("no-such-file.pickle failed"), "{s}");
    keys(&mut app, "3");
    assert!(app.runs[0].failure.is_none());
    assert!(
        !app.runs[0].is_empty(),
        "the tab after a failed one has its events"
    );
    keys(&mut app, "T");
    let s = screen(&mut app, 200, 60);
    assert!(s.contains("No such file"), "{s}");
    assert!(s.contains(ADAM) && s.contains(TINY), "{s}");
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn the_table_shows_each_files_figures_as_its_report_says() {
    let mut app = tabs_app(&[ADAM, OOM3]);
    keys(&mut app, "T");
    assert_eq!(app.tabs.as_ref().and_then(|t| t.view), Some(TabView::Table));
    let s = screen(&mut app, 200, 60);
    // Each file's reserved and allocated, from its own headless report.
    for f in [ADAM, OOM3] {
        let snap = import_file(&real(f)).expect("imports");
        for d in SnapshotReport::new(f, &snap).devices {
            let row = s
                .lines()
                .find(|l| {
                    l.contains(f.get(..20).unwrap_or(f))
                        && (l.contains(&format!("cuda:{}", d.device)) || f == ADAM)
                        && l.contains(&format_size(d.reserved))
                })
                .unwrap_or_else(|| panic!("no row for {f} device {}\n{s}", d.device));
            assert!(row.contains(&format_size(d.allocated)), "{row}");
            assert!(row.contains(&format_size(d.largest_free_block)), "{row}");
            let oom = if d.oom_count > 0 { "yes @" } else { " no " };
            assert!(row.contains(oom), "{row}");
        }
    }
    assert!(
        s.contains("frag: 1 - largest free block / cached free bytes"),
        "{s}"
    );
    insta::assert_snapshot!("tabs_table_200x60", s);
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("Across tabs"), "{s}");
    assert!(
        s.contains("a wider terminal shows"),
        "narrow: columns go, and it says so\n{s}"
    );
    insta::assert_snapshot!("tabs_table_80x24", s);
    app.handle_key(code(KeyCode::Esc));
    assert_eq!(app.tabs.as_ref().and_then(|t| t.view), None);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn the_diff_shows_what_is_alive_here_and_not_in_the_baseline() {
    let mut app = tabs_app(&[ADAM, TINY]);
    keys(&mut app, "A");
    let why = match app.tabs.as_ref().and_then(|t| t.diff.clone()) {
        Some(DiffState::NotYet(why)) => why,
        other => panic!("tab 1 has no baseline: {other:?}"),
    };
    assert!(why.contains("press B"), "{why}");
    keys(&mut app, "2");
    let Some(DiffState::Ready(0, 1, d)) = app.tabs.as_ref().and_then(|t| t.diff.clone()) else {
        panic!("tab 2 against tab 1");
    };
    // Two different jobs: every live block of tab 2 is new, and every one
    // of tab 1 gone; the sums are each file's live bytes in its report.
    let new: u64 = d.devices.iter().map(|x| x.new_bytes).sum();
    let gone: u64 = d.devices.iter().map(|x| x.gone_bytes).sum();
    assert_eq!(new, live_bytes(TINY));
    assert_eq!(gone, live_bytes(ADAM));
    let s = screen(&mut app, 200, 60);
    assert!(
        s.contains("Alive in tab 2 and not in tab 1 (baseline)"),
        "{s}"
    );
    assert!(
        s.contains(&format!("new here: {}", format_size(new))),
        "{s}"
    );
    insta::assert_snapshot!("tabs_diff_200x60", s);
    insta::assert_snapshot!("tabs_diff_80x24", screen(&mut app, 80, 24));
    // B on tab 2: tab 1 is now diffed against it.
    keys(&mut app, "B1");
    let Some(DiffState::Ready(1, 0, _)) = app.tabs.as_ref().and_then(|t| t.diff.clone()) else {
        panic!("tab 1 against the chosen baseline, tab 2");
    };
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn a_file_against_itself_has_nothing_new() {
    let mut app = tabs_app(&[OOM3, OOM3]);
    keys(&mut app, "2A");
    let Some(DiffState::Ready(0, 1, d)) = app.tabs.as_ref().and_then(|t| t.diff.clone()) else {
        panic!("a diff");
    };
    assert_eq!(d.devices.len(), 3, "every device of the file");
    for dev in &d.devices {
        assert_eq!((dev.new_blocks, dev.gone_blocks), (0, 0));
        assert_eq!(dev.a_live_bytes, dev.b_live_bytes);
    }
    assert_eq!(
        d.devices.iter().map(|x| x.b_live_bytes).sum::<u64>(),
        live_bytes(OOM3)
    );
    // Another device of the shown file: its figures (the whole file's) stay.
    keys(&mut app, "d");
    assert!(app.runs[0].summary.is_some());
    assert!(matches!(
        app.tabs.as_ref().and_then(|t| t.diff.clone()),
        Some(DiffState::Ready(0, 1, _))
    ));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn eight_rank_tabs_fit_80_columns_by_rank() {
    let dir = crate::scratch::temp_dir("rank-tabs");
    let sources = (0..8)
        .map(|r| {
            let p = dir.join(format!("oom_snapshot_rank-{r}.pickle"));
            std::fs::copy(real(ADAM), &p).expect("copy");
            (
                format!("oom_snapshot_rank-{r}.pickle"),
                snapshot_tab_source(&p, None),
            )
        })
        .collect();
    let o = TuiOptions {
        tabs: true,
        ..opts()
    };
    let mut app = App::new(sources, &o).expect("theme");
    let s = screen(&mut app, 80, 24);
    let top = s.lines().next().unwrap_or_default();
    for r in 0..8 {
        assert!(top.contains(&format!(" {}:r{r}", r + 1)), "{top}");
    }
    assert!(top.chars().count() <= 80);
    let s = screen(&mut app, 200, 60);
    let top = s.lines().next().unwrap_or_default();
    for r in 0..8 {
        assert!(top.contains(&format!(" {} rank {r} ", r + 1)), "{top}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn without_tabs_the_tab_keys_say_what_they_need() {
    let src = snapshot_source(&real(ADAM), None);
    let mut app = App::new(vec![(ADAM.into(), src)], &opts()).expect("theme");
    keys(&mut app, "T");
    assert!(app.tabs.is_none());
    assert!(app
        .notice
        .as_deref()
        .is_some_and(|n| n.contains("several files")));
}

/// More tabs than 80 columns hold: the bar scrolls to the shown tab, marks
/// the tabs left out on each side, and a click still shows the tab under it.
#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn a_bar_of_twenty_tabs_scrolls_to_the_shown_one() {
    let files: Vec<&str> = std::iter::repeat_n(TINY, 20).collect();
    let mut app = tabs_app(&files);
    let top = |app: &mut App| {
        let s = screen(app, 80, 24);
        s.lines().next().unwrap_or_default().to_string()
    };
    let first = top(&mut app);
    assert!(first.starts_with(" 1 "), "{first}");
    assert!(
        first.trim_end().ends_with('›') && !first.contains('‹'),
        "{first}"
    );
    for _ in 0..14 {
        keys(&mut app, "w");
    }
    assert_eq!(shown(&app).0, 14);
    let mid = top(&mut app);
    assert!(mid.contains(" 15 "), "the shown tab is on the bar: {mid}");
    assert!(
        mid.starts_with('‹') && mid.trim_end().ends_with('›'),
        "{mid}"
    );
    assert!(!mid.contains(" 1 "), "{mid}");
    assert!(mid.chars().count() <= 80);
    // The bar's labels carry where they are drawn: a click on the first
    // one drawn shows that tab.
    let (x, tab) = app
        .tabs
        .as_ref()
        .map(|t| (t.bar[0].x + 1, t.bar_first))
        .expect("a bar");
    let click = MouseEvent {
        kind: MouseEventKind::Down(MouseButton::Left),
        column: x,
        row: 0,
        modifiers: KeyModifiers::NONE,
    };
    assert!(app.handle_mouse(click));
    assert_eq!(shown(&app).0, tab);
    keys(&mut app, "W");
    keys(&mut app, "W");
    let last = top(&mut app);
    assert!(last.contains(&format!(" {} ", tab - 1)), "{last}");
}
