//! Opening a snapshot in the views, as the TUI does it (issue: an 82 MB and
//! a ~1 GB synthetic snapshot; first events ≤ 0.3 s / ≤ 1 s, fully loaded
//! ≤ 4 s for the large one, peak RSS ≤ 1× the file, seeking anywhere ≤ 5 ms).
//!
//! Run: `cargo bench --bench open`. The files come from the snapshot
//! bench's generator, into `std::env::temp_dir()` (`vramscope-synth-*`,
//! reused while their size matches the `.stats` file beside them);
//! `OPEN_BENCH_BYTES=82000000,1050000000` picks the sizes. Each file is
//! opened in a process of its own (this binary, re-run with the file), so
//! that its peak RSS is the view's alone: the producer reads the file on its
//! worker thread and sends its events, and this thread keeps them in a
//! timeline, as the UI thread does. Then it seeks to random events and
//! reports the worst seek. `benches/open_in_tmux.sh` measures the same
//! files through the real binary in a terminal (first frame, fully loaded).

use std::path::Path;
use std::time::{Duration, Instant};

#[path = "common/synth_file.rs"]
mod synth_file;

use vramscope::producers::{snapshot_source, RecordedMsg, RunMsg, SourceMsg};
use vramscope::trace::timeline::Timeline;

const SIZES: [u64; 2] = [82_000_000, 1_050_000_000];
const SEED: u64 = 1;
const SEEKS: usize = 200;

fn main() {
    if let Some(path) = std::env::args().skip_while(|a| a != "--open").nth(1) {
        open(Path::new(&path));
        return;
    }
    let sizes: Vec<u64> = std::env::var("OPEN_BENCH_BYTES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| SIZES.to_vec());
    let me = std::env::current_exe().expect("this bench's path");
    for size in sizes {
        let (path, _) = synth_file::generated(size, SEED);
        let status = std::process::Command::new(&me)
            .arg("--open")
            .arg(&path)
            .status()
            .expect("runs");
        assert!(status.success(), "opening {} failed", path.display());
    }
}

fn open(path: &Path) {
    let len = std::fs::metadata(path).expect("generated").len();
    let t = Instant::now();
    let source = snapshot_source(path, None);
    let mut timeline = Timeline::new();
    // What the views keep of `Opened` (the stacks, the times) stays too.
    let (mut opened, mut first, mut kept) = (None, None, None);
    while let Some(msg) = source.recv() {
        match msg {
            SourceMsg::Recorded(RecordedMsg::Opened(o)) => {
                opened = Some(t.elapsed());
                kept = Some(o);
            }
            SourceMsg::Run(RunMsg::Start(map)) => timeline = Timeline::starting_from(*map),
            SourceMsg::Run(RunMsg::Part(mut part)) => {
                first.get_or_insert(t.elapsed());
                timeline.extend_part(&mut part);
                source.give_back(part);
            }
            SourceMsg::Run(RunMsg::Events(events)) => timeline.extend(events),
            SourceMsg::Run(RunMsg::Failed(why)) => panic!("{why}"),
            SourceMsg::Run(RunMsg::Finished) => break,
            _ => {}
        }
    }
    let loaded = t.elapsed();
    let hwm = status_kb("VmHWM:") * 1024;
    let seeks = seek_times(&timeline);
    drop(kept);
    let secs = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64());
    println!(
        "{}: {:.0} MB, {} events; read and planned {:.2} s, first events {:.2} s, \
         fully loaded {:.2} s; peak RSS {:.0} MB = {:.2}x the file; {} random seeks: \
         median {:.2} ms, worst {:.2} ms",
        path.file_name().unwrap_or_default().to_string_lossy(),
        len as f64 / 1e6,
        timeline.len(),
        secs(opened),
        secs(first),
        loaded.as_secs_f64(),
        hwm as f64 / 1e6,
        hwm as f64 / len as f64,
        SEEKS,
        seeks[seeks.len() / 2].as_secs_f64() * 1e3,
        seeks.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1e3),
    );
}

/// Seeks to events spread by a fixed-seed generator, sorted.
fn seek_times(timeline: &Timeline) -> Vec<Duration> {
    let n = timeline.len().max(1);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut times: Vec<Duration> = (0..SEEKS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = (x % n as u64) as usize;
            let t = Instant::now();
            std::hint::black_box(timeline.state_at(Some(at)));
            t.elapsed()
        })
        .collect();
    times.sort();
    times
}

fn status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
