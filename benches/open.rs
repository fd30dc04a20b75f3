//! Opening a snapshot in the views, as the TUI does it (issue: an 82 MB and
//! a ~1 GB synthetic snapshot; first events ≤ 0.3 s / ≤ 1 s, fully loaded
//! ≤ 4 s for the large one, peak RSS ≤ 1× the file, seeking anywhere ≤ 5 ms).
//!
//! Then, in a process of its own again, the key latency: the real UI loop
//! (`tui::run_screen`, on a 200×60 `TestBackend`) opens the file while a key
//! (`c`, which redraws the status line) arrives every 37 ms; a key's latency
//! is from its arrival to the end of the frame that shows it (the loop's
//! next wait for input after the one that took it), split into keys that
//! came while events were being placed and once all was read.
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

use vramscope::alloc::AllocConfig;
use vramscope::producers::{
    snapshot_source, what_if_file_source, LoadProgress, RecordedMsg, RunMsg, SourceMsg,
};
use vramscope::trace::timeline::Timeline;

const SIZES: [u64; 2] = [82_000_000, 1_050_000_000];
const SEED: u64 = 1;
const SEEKS: usize = 200;
/// The config the what-if view replays the requests under.
const WHAT_IF: &str = "max_split_size_mb:128";

fn main() {
    if let Some(path) = std::env::args().skip_while(|a| a != "--open").nth(1) {
        open(Path::new(&path), None);
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--whatif") {
        let (conf, path) = (&args[at + 1], &args[at + 2]);
        open(Path::new(path), Some(conf));
        return;
    }
    if let Some(path) = std::env::args().skip_while(|a| a != "--keys").nth(1) {
        keys::latency(Path::new(&path));
        return;
    }
    let sizes: Vec<u64> = std::env::var("OPEN_BENCH_BYTES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| SIZES.to_vec());
    let me = std::env::current_exe().expect("this bench's path");
    for size in sizes {
        let (path, _) = synth_file::generated(size, SEED);
        let modes: [&[&str]; 3] = [&["--open"], &["--keys"], &["--whatif", WHAT_IF]];
        for mode in modes {
            let status = std::process::Command::new(&me)
                .args(mode)
                .arg(&path)
                .status()
                .expect("runs");
            assert!(status.success(), "{mode:?} {} failed", path.display());
        }
    }
}

mod keys {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use crossterm::event::{Event as CEvent, KeyCode, KeyEvent, KeyModifiers};
    use ratatui::backend::{Backend, ClearType, TestBackend, WindowSize};
    use ratatui::buffer::Cell;
    use ratatui::layout::{Position, Size};
    use ratatui::Terminal;
    use vramscope::producers::snapshot_source;
    use vramscope::tui::run::InputSource;
    use vramscope::tui::{run_screen, App, TuiOptions};

    /// A key every this long.
    const EVERY: Duration = Duration::from_millis(37);
    /// Keys once all is read, before `q`.
    const AFTER: usize = 40;

    /// Keys arriving on a clock; knows from the app's status (read through
    /// the shared flag) when all is read.
    struct Keys {
        next_at: Instant,
        /// (arrival, delivered) of the key the loop has taken, waiting for
        /// the frame that shows it.
        taken: Option<Instant>,
        /// Calls to `next` since a key was taken: the first is the loop
        /// draining further input, the second comes after the frame.
        calls_since: usize,
        /// Latencies, and whether all was read when the key arrived.
        seen: Vec<(Duration, bool)>,
        loaded: std::rc::Rc<std::cell::Cell<bool>>,
        after: usize,
    }

    impl InputSource for Keys {
        fn next(&mut self, timeout: Duration) -> anyhow::Result<Option<CEvent>> {
            if let Some(arrived) = self.taken {
                self.calls_since += 1;
                if self.calls_since == 2 {
                    self.seen.push((arrived.elapsed(), self.loaded.get()));
                    self.taken = None;
                    if self.loaded.get() {
                        self.after += 1;
                    }
                }
            }
            if self.after >= AFTER {
                return Ok(Some(key('q')));
            }
            let now = Instant::now();
            if now < self.next_at {
                std::thread::sleep(timeout.min(self.next_at - now));
            }
            if self.taken.is_none() && Instant::now() >= self.next_at {
                self.taken = Some(self.next_at);
                self.calls_since = 0;
                self.next_at += EVERY;
                // A key that came while the loop was busy waited: it
                // arrived at `next_at`, not now.
                return Ok(Some(key('c')));
            }
            Ok(None)
        }

        fn has_input(&mut self) -> bool {
            self.taken.is_none() && Instant::now() >= self.next_at
        }
    }

    fn key(c: char) -> CEvent {
        CEvent::Key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE))
    }

    pub fn latency(path: &Path) {
        let opts = TuiOptions {
            no_color: Some(false),
            ..TuiOptions::default()
        };
        let mut app = match App::new(vec![("bench".into(), snapshot_source(path, None))], &opts) {
            Ok(a) => a,
            Err(e) => panic!("{e}"),
        };
        let loaded = std::rc::Rc::new(std::cell::Cell::new(false));
        let mut keys = Keys {
            next_at: Instant::now() + EVERY,
            taken: None,
            calls_since: 0,
            seen: Vec::new(),
            loaded: loaded.clone(),
            after: 0,
        };
        let backend = Watched {
            inner: TestBackend::new(200, 60),
            loaded,
        };
        let mut term = Terminal::new(backend).expect("terminal");
        let t = Instant::now();
        run_screen(&mut term, &mut app, &mut keys).expect("runs");
        let total = t.elapsed();
        let (mut placing, mut done): (Vec<Duration>, Vec<Duration>) = (Vec::new(), Vec::new());
        for (d, l) in &keys.seen {
            if *l {
                done.push(*d)
            } else {
                placing.push(*d)
            }
        }
        let show = |v: &mut Vec<Duration>| {
            v.sort();
            if v.is_empty() {
                return "no keys".to_string();
            }
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            format!(
                "{} keys, median {:.1} ms, p90 {:.1} ms, worst {:.1} ms",
                v.len(),
                ms(v[v.len() / 2]),
                ms(v[v.len() * 9 / 10]),
                ms(v[v.len() - 1])
            )
        };
        println!(
            "{}: key latency while events are placed: {}; once all is read: {} ({:.1} s in the UI)",
            path.file_name().unwrap_or_default().to_string_lossy(),
            show(&mut placing),
            show(&mut done),
            total.as_secs_f64()
        );
    }

    /// The test terminal, telling from each frame's status line (the top
    /// row) whether all was read.
    struct Watched {
        inner: TestBackend,
        loaded: std::rc::Rc<std::cell::Cell<bool>>,
    }

    impl Backend for Watched {
        type Error = <TestBackend as Backend>::Error;

        fn draw<'a, I>(&mut self, content: I) -> Result<(), Self::Error>
        where
            I: Iterator<Item = (u16, u16, &'a Cell)>,
        {
            self.inner.draw(content)
        }
        fn hide_cursor(&mut self) -> Result<(), Self::Error> {
            self.inner.hide_cursor()
        }
        fn show_cursor(&mut self) -> Result<(), Self::Error> {
            self.inner.show_cursor()
        }
        fn get_cursor_position(&mut self) -> Result<Position, Self::Error> {
            self.inner.get_cursor_position()
        }
        fn set_cursor_position<P: Into<Position>>(&mut self, p: P) -> Result<(), Self::Error> {
            self.inner.set_cursor_position(p)
        }
        fn clear(&mut self) -> Result<(), Self::Error> {
            self.inner.clear()
        }
        fn clear_region(&mut self, t: ClearType) -> Result<(), Self::Error> {
            self.inner.clear_region(t)
        }
        fn size(&self) -> Result<Size, Self::Error> {
            self.inner.size()
        }
        fn window_size(&mut self) -> Result<WindowSize, Self::Error> {
            self.inner.window_size()
        }
        fn flush(&mut self) -> Result<(), Self::Error> {
            let buf = self.inner.buffer();
            // The status line is the top row.
            let status: String = (0..buf.area.width).map(|x| buf[(x, 0)].symbol()).collect();
            if status.contains("all read") {
                self.loaded.set(true);
            }
            self.inner.flush()
        }
    }
}

fn open(path: &Path, under: Option<&str>) {
    let len = std::fs::metadata(path).expect("generated").len();
    let t = Instant::now();
    let source = match under {
        None => snapshot_source(path, None),
        Some(conf) => what_if_file_source(
            path,
            None,
            AllocConfig::parse(conf).expect("a config the bench names"),
        ),
    };
    let mut timeline = Timeline::new();
    // What the views keep of `Opened` (the stacks, the times) stays too.
    let (mut first, mut read, mut kept, mut restarts) = (None, None, None, 0);
    // Events a what-if showed, then kept the first of (its replay needed
    // more than the device holds after them).
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    while let Some(msg) = source.recv() {
        match msg {
            SourceMsg::Recorded(RecordedMsg::Opened(o)) => kept = Some(o),
            SourceMsg::Recorded(RecordedMsg::Loading(LoadProgress::Reading { done, total }))
                if done >= total =>
            {
                read = Some(t.elapsed());
            }
            SourceMsg::Run(RunMsg::Start(map)) => timeline = Timeline::starting_from(*map),
            SourceMsg::Run(RunMsg::Part(mut part)) => {
                first.get_or_insert(t.elapsed());
                timeline.extend_part(&mut part);
                source.give_back(part);
            }
            SourceMsg::Run(RunMsg::Events(events)) => {
                first.get_or_insert(t.elapsed());
                timeline.extend(events);
            }
            SourceMsg::Run(RunMsg::Restarted) => {
                restarts += 1;
                first = None;
                timeline = Timeline::new();
            }
            SourceMsg::Run(RunMsg::KeepFirst(n)) => {
                cuts.push((timeline.len(), n));
                timeline.truncate(n);
                if n == 0 {
                    first = None;
                }
            }
            SourceMsg::Run(RunMsg::Failed(why)) => panic!("{why}"),
            SourceMsg::Run(RunMsg::Finished) => break,
            _ => {}
        }
    }
    let loaded = t.elapsed();
    let cpu = cpu_seconds();
    let hwm = status_kb("VmHWM:") * 1024;
    let seeks = seek_times(&timeline);
    drop(kept);
    let secs = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64());
    println!(
        "{}{}: {:.0} MB, {} events; first events {:.2} s, file read {:.2} s, fully loaded {:.2} s \
         ({:.2} s of CPU{}); peak RSS {:.0} MB = {:.2}x the file; {} random seeks: median {:.2} ms, \
         worst {:.2} ms; load average {}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        under.map(|c| format!(" what-if {c}")).unwrap_or_default(),
        len as f64 / 1e6,
        timeline.len(),
        secs(first),
        secs(read),
        loaded.as_secs_f64(),
        cpu,
        if restarts > 0 { format!(", started over {restarts}x") } else { String::new() }
            + &cuts
                .iter()
                .map(|(shown, n)| format!(", kept the first {n} of {shown} events shown"))
                .collect::<String>(),
        hwm as f64 / 1e6,
        hwm as f64 / len as f64,
        SEEKS,
        seeks[seeks.len() / 2].as_secs_f64() * 1e3,
        seeks.last().map_or(f64::NAN, |d| d.as_secs_f64() * 1e3),
        load_average(),
    );
}

/// User and system CPU time of this process so far.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command (which may hold spaces) are space-separated;
    // utime and stime are the 14th and 15th fields of the whole line.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // `rest` starts at field 3 (state, not a number, is skipped by parse).
    let ticks = f.get(10).copied().unwrap_or(0.0) + f.get(11).copied().unwrap_or(0.0);
    ticks / 100.0
}

/// The machine's 1-minute load average (other work on it slows every figure).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
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
