//! `vramscope watch`'s view on `TestBackend`, from readings built here (no
//! GPU needed): two GPUs, a process whose memory NVML does not report, an
//! unknown utilisation, history sparklines, and the reconciliation bar.

use std::collections::VecDeque;
use std::time::Duration;

use crossterm::event::{Event as CEvent, KeyCode};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

use super::helpers::{code, key, text};
use crate::device::nvml::{GpuReading, ProcessMemory};
use crate::device::GpuUnavailable;
use crate::producers::{Source, SourceMsg};
use crate::tui::run::InputSource;
use crate::tui::screen::run_screen;
use crate::tui::theme::{Theme, ThemeName};
use crate::tui::views::watch::render;
use crate::tui::watch::{WatchScreen, WatchState};

const GIB: u64 = 1 << 30;

fn h100(used: u64, unknown_process: bool) -> GpuReading {
    GpuReading {
        index: 0,
        pci: None,
        uuid: None,
        name: Some("NVIDIA H100 80GB HBM3".into()),
        total: Some(80 * GIB),
        used: Some(used),
        free: Some(80 * GIB - used),
        utilization_gpu: Some(45),
        utilization_memory: Some(30),
        temperature_c: Some(41),
        processes: vec![
            ProcessMemory {
                pid: 4242,
                name: Some("python".into()),
                used: Some(12 * GIB),
            },
            ProcessMemory {
                pid: 777,
                name: None,
                used: if unknown_process { None } else { Some(4 * GIB) },
            },
        ],
    }
}

/// NVML answered the memory query but not utilisation or temperature.
fn a100() -> GpuReading {
    GpuReading {
        name: Some("NVIDIA A100-SXM4-40GB".into()),
        total: Some(40 * GIB),
        used: Some(2 * GIB),
        free: Some(38 * GIB),
        ..GpuReading::unknown(1)
    }
}

fn state() -> WatchState {
    WatchState::new(Theme::builtin(ThemeName::Dark, false).expect("built-in theme"))
}

/// Ten readings with used memory climbing on GPU 0.
fn watched(unknown_process: bool) -> WatchState {
    let mut s = state();
    for k in 0..10u64 {
        s.ingest(Ok(vec![h100((20 + 5 * k) * GIB, unknown_process), a100()]));
    }
    s
}

fn screen(s: &WatchState, w: u16, h: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).expect("test backend");
    t.draw(|f| render(f, s)).expect("draws");
    text(t.backend().buffer())
}

fn line_with<'a>(screen: &'a str, needle: &str) -> &'a str {
    screen
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in\n{screen}"))
}

#[test]
fn panes_show_every_gpu_with_unknowns_as_unknown() {
    let s = watched(true);
    let out = screen(&s, 130, 44);
    for want in [
        "GPU 0 · NVIDIA H100 80GB HBM3",
        "GPU 1 · NVIDIA A100-SXM4-40GB",
        "memory used 65.00 GiB of 80.00 GiB · free 15.00 GiB",
        "GPU utilisation 45% · memory utilisation 30% · 41°C",
        "memory used 2.00 GiB of 40.00 GiB · free 38.00 GiB",
        "GPU utilisation unknown · memory utilisation unknown · temperature unknown",
        "reading 10",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    assert!(
        !out.contains("utilisation 0%"),
        "unknown drawn as 0:\n{out}"
    );
    insta::assert_snapshot!("watch_two_gpus_130x44", out);
}

#[test]
fn sparklines_draw_the_history() {
    let s = watched(false);
    let out = screen(&s, 130, 44);
    // GPU 0's used memory climbs: its sparkline has bars of several heights.
    let used = line_with(&out, "│used ");
    let bars: std::collections::BTreeSet<char> =
        used.chars().filter(|c| ('▁'..='█').contains(c)).collect();
    assert!(bars.len() >= 3, "climbing history drawn flat: {used:?}");
    // GPU 1's utilisation was never read: '?' for every reading, no bars.
    let util_lines: Vec<&str> = out.lines().filter(|l| l.contains("│util ")).collect();
    assert_eq!(util_lines.len(), 2, "{out}");
    assert!(util_lines[1].contains("??????????"), "{:?}", util_lines[1]);
    assert!(!util_lines[1].chars().any(|c| ('▁'..='█').contains(&c)));
}

#[test]
fn process_table_and_reconciliation_with_an_unknown_process() {
    let s = watched(true);
    let out = screen(&s, 130, 44);
    let python = line_with(&out, "4242");
    assert!(
        python.contains("python") && python.contains("12.00 GiB"),
        "{python}"
    );
    assert_eq!(
        python.matches("unknown").count(),
        3,
        "context/reserved/other: {python}"
    );
    let other = line_with(&out, "777");
    assert_eq!(
        other.matches("unknown").count(),
        5,
        "name, used and the split: {other}"
    );
    assert!(out.contains("Reconciliation · GPU 0"), "{out}");
    let rec = line_with(&out, "NVML used 65.00 GiB");
    assert!(
        rec.contains("processes unknown (1 of 2 report no memory)")
            && rec.contains("not attributed unknown"),
        "{rec}"
    );
    assert!(out.contains("▒ used (split unknown)"), "{out}");
}

#[test]
fn reconciliation_sums_processes_against_used() {
    let s = watched(false);
    let out = screen(&s, 130, 44);
    // 65 GiB used; 12 + 4 GiB in processes; 49 GiB nobody listed holds.
    let rec = line_with(&out, "NVML used 65.00 GiB");
    assert!(
        rec.contains("processes 16.00 GiB (2 listed)") && rec.contains("not attributed 49.00 GiB"),
        "{rec}"
    );
    let bar = line_with(&out, "█ processes");
    let (full, mid) = (bar.matches('█').count() - 1, bar.matches('▒').count() - 1);
    assert!(full > 0 && mid > full, "16 vs 49 GiB: {bar}");
}

#[test]
fn keys_select_the_gpu_whose_processes_are_shown() {
    let mut s = watched(true);
    assert!(s.handle_key(key('j')));
    assert_eq!(s.selected, 1);
    assert!(!s.handle_key(code(KeyCode::Down)), "already the last GPU");
    let out = screen(&s, 130, 44);
    assert!(out.contains("Processes · GPU 1 · 0 listed"), "{out}");
    let rec = line_with(&out, "NVML used 2.00 GiB");
    assert!(rec.contains("processes 0 bytes (0 listed)"), "{rec}");
    assert!(s.handle_key(key('k')));
    assert_eq!(s.selected, 0);
    s.handle_key(key('q'));
    assert!(s.quit);
}

#[test]
fn many_gpus_scroll_to_keep_the_selected_one_visible() {
    let mut s = state();
    let gpus: Vec<GpuReading> = (0..6).map(|i| GpuReading { index: i, ..a100() }).collect();
    s.ingest(Ok(gpus));
    s.handle_key(code(KeyCode::End));
    let out = screen(&s, 100, 30);
    assert!(out.contains("GPU 5 · "), "{out}");
    assert!(!out.contains("GPU 0 · "), "{out}");
}

#[test]
fn nvml_failure_is_a_message() {
    let mut s = state();
    s.ingest(Err(GpuUnavailable::NoNvml(
        "libnvidia-ml.so.1: not found".into(),
    )));
    let out = screen(&s, 100, 20);
    assert!(
        out.contains("NVML stopped answering: no NVIDIA driver found"),
        "{out}"
    );
}

struct Script(VecDeque<CEvent>);

impl InputSource for Script {
    fn next(&mut self, timeout: Duration) -> anyhow::Result<Option<CEvent>> {
        // One key a frame, as a person types: each is drawn.
        if timeout.is_zero() {
            return Ok(None);
        }
        Ok(self.0.pop_front())
    }
}

#[test]
fn the_loop_takes_readings_from_the_channel_and_quits_on_q() {
    let (tx, rx) = flume::unbounded();
    for used in [20 * GIB, 30 * GIB] {
        tx.send(SourceMsg::Gpus(Ok(vec![h100(used, false), a100()])))
            .expect("send");
    }
    let rx = Source::new(rx, None);
    let mut s = state();
    let mut t = Terminal::new(TestBackend::new(120, 40)).expect("test backend");
    let mut input = Script(
        [CEvent::Key(key('j')), CEvent::Key(key('q'))]
            .into_iter()
            .collect(),
    );
    let mut screen = WatchScreen {
        state: &mut s,
        source: &rx,
    };
    run_screen(&mut t, &mut screen, &mut input).expect("runs");
    assert!(s.quit);
    assert_eq!((s.readings, s.selected), (2, 1));
    assert_eq!(s.history[0].used.len(), 2);
    let out = text(t.backend().buffer());
    assert!(out.contains("Reconciliation · GPU 1"), "{out}");
}

#[test]
fn the_memory_the_driver_keeps_back_is_named_not_lost() {
    // What NVML read on the H100 the captures ran on: total 79.65 GiB, used
    // 0, free 79.18 GiB. The 480 MiB between them is the driver's.
    let idle = GpuReading {
        name: Some("NVIDIA H100 80GB HBM3".into()),
        total: Some(85_520_809_984),
        used: Some(0),
        free: Some(85_017_493_504),
        ..GpuReading::unknown(0)
    };
    let mut s = state();
    s.ingest(Ok(vec![idle]));
    let screen = screen(&s, 130, 44);
    let line = line_with(&screen, "the driver keeps back");
    assert!(line.contains("480.00 MiB"), "{line}");
    // Where used + free is the total, nothing is said.
    let mut s = state();
    s.ingest(Ok(vec![a100()]));
    assert!(!screen_has(&s, "the driver keeps back"));
}

fn screen_has(s: &WatchState, needle: &str) -> bool {
    screen(s, 130, 44).contains(needle)
}

#[test]
fn at_80_columns_the_process_title_is_whole_not_cut() {
    let s = watched(true);
    let out = screen(&s, 80, 24);
    let title = line_with(&out, "Processes · GPU 0");
    assert!(title.contains("listed ─"), "{title:?}");
    assert!(!title.contains("invisible"), "cut mid-sentence: {title:?}");
    // The reconciliation pane says what the columns cannot know.
    assert!(
        out.contains("per process: context + reserved + other unknown"),
        "{out}"
    );
}
