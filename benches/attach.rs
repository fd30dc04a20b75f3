//! `attach` against a job served on a local unix socket (a helper stand-in
//! writing `job::synth::training_job`'s stream):
//! - connect to the first frame with data drawn, for a job whose log holds
//!   1,000,000 entries (target ≤ 1 s), and to everything read;
//! - the UI's cost per frame (drain the source, prepare, draw 200×60) while
//!   the job sends 50,000 events a second (target ≤ 2 ms);
//! - decoding one step's `entries` message (301 entries), and applying a
//!   whole 40-step job (~12,000 entries) to a session.

use std::hint::black_box;
use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use ratatui::backend::TestBackend;
use ratatui::layout::Rect;
use ratatui::Terminal;
use vramscope::job::frame::FrameReader;
use vramscope::job::synth::training_job;
use vramscope::job::{connect, decode, Address, Session};
use vramscope::producers::job_source;
use vramscope::tui::app::{App, TuiOptions};

/// 3 × 100 temporaries + 1 kept per step: ~1,000,000 entries.
const STEPS: u64 = 3_322;
const TEMPS: usize = 100;

fn socket_path(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vramscope-bench-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let p = dir.join(format!("{tag}.sock"));
    let _ = std::fs::remove_file(&p);
    p
}

/// Serve `chunks` to one client after its hello, waiting `pause` between them.
fn serve(tag: &str, chunks: Vec<Vec<u8>>, pause: Duration) -> Address {
    let path = socket_path(tag);
    let listener = match UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => panic!("bind {}: {e}", path.display()),
    };
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else {
            return;
        };
        let mut frames = FrameReader::new(&mut s, "bench");
        let _ = frames.next_frame();
        for c in chunks {
            if s.write_all(&c).is_err() {
                return;
            }
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
        }
    });
    Address::Unix(path)
}

fn app_on(addr: &Address) -> App {
    let c = match connect(addr, None, Arc::default()) {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let src = job_source(c.frames, Some(c.hello), None, Arc::default());
    let opts = TuiOptions {
        no_color: Some(false),
        start_paused: false,
        ..TuiOptions::default()
    };
    match App::new(vec![("bench".into(), src)], &opts) {
        Ok(a) => a,
        Err(e) => panic!("{e}"),
    }
}

fn terminal() -> Terminal<TestBackend> {
    match Terminal::new(TestBackend::new(200, 60)) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    }
}

fn frame(app: &mut App, term: &mut Terminal<TestBackend>) {
    app.drain_sources();
    app.prepare(Rect::new(0, 0, 200, 60));
    let _ = term.draw(|f| app.draw(f));
}

fn first_frame_at_1m() {
    let job = training_job(STEPS, 2 << 20, TEMPS);
    let mb = job.bytes.len() as f64 / 1e6;
    let addr = serve("first", vec![job.bytes], Duration::ZERO);
    let mut term = terminal();
    let t = Instant::now();
    let mut app = app_on(&addr);
    let mut first = None;
    while app.runs[0].is_live() {
        frame(&mut app, &mut term);
        if first.is_none() && !app.runs[0].is_empty() {
            first = Some(t.elapsed());
        }
    }
    eprintln!(
        "1M-entry job ({mb:.0} MB on the wire, {} events): first frame with data {:.2?} \
         (target ≤ 1 s), all read {:.2?}",
        app.runs[0].len(),
        first.unwrap_or_default(),
        t.elapsed()
    );
}

/// The job's stream cut into 20 ms slices of 1,000 events (50,000/s).
fn per_frame_at_50k_per_s() {
    let job = training_job(600, 2 << 20, 333);
    let bytes = job.bytes;
    // Cut at frame boundaries, about 1,000 entries' worth of bytes each.
    let mut chunks = Vec::new();
    let mut at = 0;
    let per = 1_000 * bytes.len() / 600_000;
    while at < bytes.len() {
        let mut end = at;
        while end < bytes.len() && end - at < per {
            let Some(len) = bytes.get(end..end + 4) else {
                break;
            };
            let n = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
            end += 4 + n;
        }
        chunks.push(bytes[at..end.min(bytes.len())].to_vec());
        at = end;
    }
    let addr = serve("paced", chunks, Duration::from_millis(20));
    let mut app = app_on(&addr);
    let mut term = terminal();
    let mut times = Vec::new();
    let (mut drain, mut prepare, mut draw) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let t = Instant::now();
    while app.runs[0].is_live() && t.elapsed() < Duration::from_secs(10) {
        let f = Instant::now();
        app.drain_sources();
        let d = f.elapsed();
        app.prepare(Rect::new(0, 0, 200, 60));
        let p = f.elapsed();
        let _ = term.draw(|f| app.draw(f));
        times.push(f.elapsed());
        drain = drain.max(d);
        prepare = prepare.max(p - d);
        draw = draw.max(f.elapsed() - p);
        std::thread::sleep(Duration::from_millis(16));
    }
    eprintln!("slowest parts: drain {drain:.2?}, prepare {prepare:.2?}, draw {draw:.2?}");
    times.sort_unstable();
    let mean = times.iter().sum::<Duration>() / times.len().max(1) as u32;
    let p99 = times
        .get(times.len() * 99 / 100)
        .copied()
        .unwrap_or_default();
    eprintln!(
        "while receiving ~50,000 events/s: {} frames, mean {mean:.2?}, p99 {p99:.2?}, max {:.2?} \
         per frame (target ≤ 2 ms); {} events received",
        times.len(),
        times.last().copied().unwrap_or_default(),
        app.runs[0].len()
    );
}

fn benches(c: &mut Criterion) {
    first_frame_at_1m();
    per_frame_at_50k_per_s();
    // One step's entries (3 × 100 temporaries + 1 kept) as they come off the wire.
    let job = training_job(40, 2 << 20, 100);
    let mut frames = FrameReader::new(job.bytes.as_slice(), "bench");
    let mut messages = Vec::new();
    while let Ok(Some((i, b))) = frames.next_frame() {
        messages.push((i, b.to_vec()));
    }
    let Some((_, big)) = messages.iter().max_by_key(|(_, b)| b.len()).cloned() else {
        return;
    };
    c.bench_function("decode_one_step_301_entries", |b| {
        b.iter(|| black_box(decode("bench", 0, &big)))
    });
    c.bench_function("session_apply_whole_40_step_job", |b| {
        b.iter(|| {
            let mut s = Session::new("bench");
            for (i, m) in &messages {
                if let Ok(Some(msg)) = decode("bench", *i, m) {
                    let _ = s.apply(*i, msg);
                }
            }
            black_box(s.trace(0).len())
        })
    });
}

criterion_group! {
    name = attach;
    config = Criterion::default().sample_size(10).measurement_time(Duration::from_secs(5));
    targets = benches
}
criterion_main!(attach);
