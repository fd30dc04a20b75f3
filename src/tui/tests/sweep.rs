//! `vramscope sweep`'s chart on `TestBackend`, fed by the real sweep
//! producer running the shipped `resnet50-batch-sweep` scenario.

use std::collections::VecDeque;
use std::time::Duration;

use crossterm::event::{Event as CEvent, KeyCode};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

use super::helpers::{code, key, text};
use crate::producers::{sweep_source, Source};
use crate::scenario::{load_str, resolve};
use crate::sweep::SweepPlan;
use crate::tui::run::InputSource;
use crate::tui::screen::run_screen;
use crate::tui::sweep::{SweepScreen, SweepState};
use crate::tui::theme::{Theme, ThemeName};
use crate::tui::views::sweep::render;

/// The producer's messages for `text` (a scenario) swept at `batch`, all of
/// them: the chart then draws the finished sweep.
fn swept(text: Option<&str>, batch: Option<&str>) -> (SweepState, Source) {
    let (scenario, built) = match text {
        Some(t) => load_str(t, "variant.ron").expect("loads"),
        None => resolve("resnet50-batch-sweep").expect("the built-in loads"),
    };
    let plan = SweepPlan::new(&scenario, &built, batch, None, false).expect("plan");
    let state = SweepState::new(
        scenario.name.clone(),
        crate::sweep::capacity(&built),
        plan.points(),
        false,
        Theme::builtin(ThemeName::Dark, false).expect("theme"),
    );
    let live = sweep_source(scenario, built, plan, false, 2);
    let all: Vec<_> = std::iter::from_fn(|| live.recv()).collect();
    (state, Source::from_messages(all))
}

struct Script(VecDeque<CEvent>);

impl InputSource for Script {
    fn next(&mut self, _timeout: Duration) -> anyhow::Result<Option<CEvent>> {
        Ok(self.0.pop_front())
    }
}

fn run_keys(state: &mut SweepState, rx: &Source, keys: Vec<CEvent>) -> String {
    let mut t = Terminal::new(TestBackend::new(120, 40)).expect("test backend");
    let mut screen = SweepScreen { state, source: rx };
    run_screen(&mut t, &mut screen, &mut Script(keys.into_iter().collect())).expect("runs");
    t.draw(|f| render(f, state)).expect("draws");
    text(t.backend().buffer())
}

#[test]
fn the_resnet50_sweep_is_a_chart_with_its_points_and_fit() {
    let (mut s, rx) = swept(None, None);
    let out = run_keys(
        &mut s,
        &rx,
        vec![CEvent::Key(key('G')), CEvent::Key(key('q'))],
    );
    assert!(s.quit);
    assert!(s.sweep.is_some(), "the fit arrived");
    for want in [
        "vramscope sweep │ resnet50-batch-sweep │ 7 of 7 points │ capacity 78.66 GiB",
        "capacity 78.66 GiB is above the chart",
        "batch 64 │ peak allocated 5.35 GiB │ peak reserved 6.53 GiB │ fits",
        "Peak allocated ≈ 225.07 MiB + 81.97 MiB × batch",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    insta::assert_snapshot!("sweep_resnet50_120x40", out);
}

#[test]
fn arrows_move_between_points_and_enter_asks_for_the_point_s_run() {
    let (mut s, rx) = swept(None, None);
    let keys = [
        KeyCode::Right,
        KeyCode::Right,
        KeyCode::Left,
        KeyCode::Right,
        KeyCode::Enter,
    ]
    .map(|k| CEvent::Key(code(k)))
    .to_vec();
    let out = run_keys(&mut s, &rx, keys);
    assert_eq!(s.open, Some(2), "Enter on the third point (batch 4)");
    assert!(!s.quit);
    assert!(out.contains("batch 4 │ peak allocated"), "{out}");
}

#[test]
fn an_oom_point_is_marked_and_left_out_of_the_line_with_the_capacity_drawn() {
    let small = include_str!("../../../scenarios/resnet50-batch-sweep.ron").replace(
        "device: (name: \"sim: H100 80 GB\", gpu: \"H100-SXM-80GB\")",
        "device: (name: \"sim: 2 GiB\", gpu: \"H100-SXM-80GB\", capacity: \"2GiB\", overhead: \"0MiB\")",
    );
    let (mut s, rx) = swept(Some(&small), Some("1,2,4,8,16,32"));
    let out = run_keys(
        &mut s,
        &rx,
        vec![CEvent::Key(key('G')), CEvent::Key(key('q'))],
    );
    let sweep = s.sweep.as_ref().expect("finished");
    let oom: Vec<u64> = sweep
        .points
        .iter()
        .filter(|p| p.oom)
        .map(|p| p.batch)
        .collect();
    assert_eq!(
        oom,
        vec![32],
        "2 GiB holds batch 16 (1.49 GiB) but not 32 (2.76 GiB)"
    );
    for want in [
        "capacity",
        "OOM",
        "batch 32 │",
        "out of memory",
        "left out of the fitted line",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    assert!(!out.contains("above the chart"), "{out}");
}

#[test]
fn x_puts_batch_on_a_log_axis_and_back() {
    let (mut s, rx) = swept(None, None);
    let out = run_keys(
        &mut s,
        &rx,
        vec![CEvent::Key(key('x')), CEvent::Key(key('q'))],
    );
    assert!(s.log_x);
    assert!(out.contains("batch (log₂)"), "{out}");
    // log₂ 1 … log₂ 64: the middle of the axis is batch 8 (linear: 32).
    let axis = out
        .lines()
        .find(|l| l.trim_start_matches('│').trim_start().starts_with("1 "))
        .expect("the x labels");
    assert!(axis.contains(" 8 ") && axis.contains("64"), "{axis}");
    s.quit = false;
    let out = run_keys(
        &mut s,
        &rx,
        vec![CEvent::Key(key('x')), CEvent::Key(key('q'))],
    );
    assert!(!s.log_x && !out.contains("log₂)"), "{out}");
}

#[test]
fn the_largest_batch_at_the_selected_point_s_sequence_length_is_shown() {
    let (scenario, built) = resolve("checkpoint-none").expect("the built-in loads");
    let plan = SweepPlan::new(&scenario, &built, Some("1,2"), Some("128,256"), true).expect("plan");
    let mut s = SweepState::new(
        scenario.name.clone(),
        crate::sweep::capacity(&built),
        plan.points(),
        true,
        Theme::builtin(ThemeName::Dark, false).expect("theme"),
    );
    let live = sweep_source(scenario, built, plan, true, 2);
    let rx = Source::from_messages(std::iter::from_fn(|| live.recv()).collect::<Vec<_>>());
    // The last point is at seq 256: its search's result is the one shown.
    let out = run_keys(
        &mut s,
        &rx,
        vec![CEvent::Key(key('G')), CEvent::Key(key('q'))],
    );
    let found = &s.sweep.as_ref().expect("finished").max_batch_by_seq;
    assert_eq!(
        found.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![Some(128), Some(256)],
        "one search per length"
    );
    let at_256 = &found[1];
    let best = at_256.batch.expect("a batch fits");
    let want = format!(
        "largest batch that fits at seq 256: {best}; {} runs out of memory ({} runs)",
        best + 1,
        at_256.runs
    );
    assert!(out.contains(&want), "missing {want:?} in\n{out}");
    // The words (scrolled to with ↓) hold both searches side by side.
    let words = &s.sweep.as_ref().expect("finished").explanation;
    let side_by_side = format!(
        "Largest batch that fits by sequence length: seq 128 → {}, seq 256 → {best}",
        found[0].batch.expect("a batch fits at 128")
    );
    assert!(
        words.iter().any(|l| l.starts_with(&side_by_side)),
        "{words:#?}"
    );
}

/// The allocated and reserved lines differ by glyph, not by colour alone
/// (issue 41): with colour off, a room still tells them apart, and the
/// legend shows each line's own glyph.
#[test]
fn allocated_and_reserved_are_drawn_with_different_glyphs() {
    let (mut s, rx) = swept(None, None);
    let out = run_keys(
        &mut s,
        &rx,
        vec![CEvent::Key(key('G')), CEvent::Key(key('q'))],
    );
    let mut t = Terminal::new(TestBackend::new(120, 40)).expect("test backend");
    t.draw(|f| render(f, &s)).expect("draws");
    let p = &s.theme.palette;
    let glyphs = |color| -> std::collections::HashSet<String> {
        t.backend()
            .buffer()
            .content()
            .iter()
            // The chart's cells: the legend's words are left out.
            .filter(|c| c.fg == color && c.symbol() != " ")
            .filter(|c| !c.symbol().chars().any(char::is_alphanumeric))
            .map(|c| c.symbol().to_string())
            .collect()
    };
    let braille = |g: &String| g.chars().all(|c| ('\u{2800}'..='\u{28FF}').contains(&c));
    let allocated = glyphs(p.allocated_line);
    let reserved = glyphs(p.reserved_line);
    assert!(!allocated.is_empty() && !reserved.is_empty());
    assert!(
        reserved.iter().all(braille),
        "reserved is dots: {reserved:?}"
    );
    assert!(
        allocated.iter().all(|g| !braille(g)),
        "allocated is half blocks, no dots: {allocated:?}"
    );
    assert!(
        out.contains("▀▄ allocated") && out.contains("⠤ reserved"),
        "{out}"
    );
}

/// At 60 columns the status line keeps the capacity whole (the program's
/// name gives way) and the key hints end in `…` rather than mid-word.
#[test]
fn a_narrow_sweep_screen_cuts_its_lines_with_an_ellipsis() {
    let (mut s, rx) = swept(None, None);
    run_keys(&mut s, &rx, vec![CEvent::Key(key('q'))]);
    let mut t = Terminal::new(TestBackend::new(60, 30)).expect("test backend");
    t.draw(|f| render(f, &s)).expect("draws");
    let out = text(t.backend().buffer());
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].trim_end().ends_with("capacity 78.66 GiB")
            && !lines[0].contains("vramscope sweep"),
        "{out}"
    );
    assert!(lines[lines.len() - 1].trim_end().ends_with('…'), "{out}");
}
