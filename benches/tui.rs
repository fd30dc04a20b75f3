//! The UI with a 1,000,000-event timeline (GPT-2 small's training loop run
//! for as many iterations as that takes): one 200×60 frame (prepare + draw on
//! `TestBackend`), a seek to an arbitrary event, the figures so far at a
//! cursor (`Timeline::peak_until`, `ooms_until`), and memory per event.

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion};
use ratatui::backend::TestBackend;
use ratatui::layout::Rect;
use ratatui::Terminal;
use vramscope::leak::Finding;
use vramscope::producers::Source;
use vramscope::scenario::{resolve, run, RunOptions};
use vramscope::trace::Event;
use vramscope::tui::app::{App, TuiOptions};

const EVENTS: usize = 1_000_000;
const SCENARIO: &str = "gpt2-small-fits";

/// The scenario's events over enough iterations for `at_least` of them.
fn scenario_events(at_least: usize) -> (Vec<Event>, Vec<Finding>) {
    let (scenario, built) = match resolve(SCENARIO) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let recorded = |iterations: u32| {
        let opts = RunOptions {
            iterations: Some(iterations),
            record_events: true,
        };
        run(&scenario, &built, &opts)
    };
    // Events beyond the setup grow by the same count each iteration.
    let (two, three) = (recorded(2).events.len(), recorded(3).events.len());
    let per_iteration = (three - two).max(1);
    let setup = two.saturating_sub(2 * per_iteration);
    let iterations = at_least.saturating_sub(setup).div_ceil(per_iteration) as u32;
    let r = recorded(iterations);
    assert!(r.events.len() >= at_least, "{} events", r.events.len());
    (r.events, r.findings)
}

fn loaded_app() -> App {
    let t = Instant::now();
    let (events, findings) = scenario_events(EVENTS);
    let n = events.len();
    let gen = t.elapsed();
    let opts = TuiOptions {
        no_color: Some(false),
        start_paused: true,
        ..TuiOptions::default()
    };
    let mut app = match App::new(
        vec![("bench".into(), Source::from_events(events, findings))],
        &opts,
    ) {
        Ok(a) => a,
        Err(e) => panic!("theme: {e}"),
    };
    let t = Instant::now();
    while app.runs[0].len() < n {
        app.drain_sources();
    }
    let r = &app.runs[0];
    let tl = r.timeline.heap_bytes();
    let marks = (r.marks.oom.capacity() + r.marks.error.capacity() + r.marks.narration.capacity())
        * 8
        + r.marks.iteration.capacity() * 16
        + r.marks.phase.capacity() * 16;
    eprintln!(
        "loaded {n} events (generate {gen:.2?}, drain+index {:.2?}); Timeline::heap_bytes {:.1} B/event, UI mark index {:.1} B/event, total {:.1} B/event; size_of::<Event>() = {}",
        t.elapsed(),
        tl as f64 / n as f64,
        marks as f64 / n as f64,
        (tl + marks) as f64 / n as f64,
        std::mem::size_of::<vramscope::trace::Event>()
    );
    app
}

fn benches(c: &mut Criterion) {
    let mut app = loaded_app();
    let len = app.runs[0].len();
    let mut term = match Terminal::new(TestBackend::new(200, 60)) {
        Ok(t) => t,
        Err(e) => panic!("{e}"),
    };
    let area = Rect::new(0, 0, 200, 60);
    app.runs[0].set_pos(len / 2 + 1234);
    app.runs[0].sync_map();
    // Split of one frame's time, for the report.
    let t = Instant::now();
    for _ in 0..50 {
        app.prepare(area);
    }
    let prep = t.elapsed() / 50;
    let t = Instant::now();
    for _ in 0..50 {
        let _ = term.draw(|f| app.draw(f));
    }
    eprintln!(
        "prepare {prep:.2?} + draw {:.2?} per frame",
        t.elapsed() / 50
    );
    {
        let r = &mut app.runs[0];
        let t = Instant::now();
        for _ in 0..50 {
            black_box(vramscope::tui::views::stats::prepare(r));
        }
        let st = t.elapsed() / 50;
        let t = Instant::now();
        for _ in 0..50 {
            let ymax = vramscope::tui::views::timeline::scale_max(r);
            black_box(vramscope::tui::views::timeline::prepare(
                r,
                Rect::new(0, 0, 124, 14),
                ymax,
            ));
        }
        let tl = t.elapsed() / 50;
        let t = Instant::now();
        for _ in 0..50 {
            black_box(vramscope::tui::views::segment_map::row_spans(&r.map));
        }
        eprintln!(
            "stats {st:.2?} timeline {tl:.2?} row_spans {:.2?}; {} segments {} blocks",
            t.elapsed() / 50,
            r.map.segments.len(),
            r.map.blocks.len()
        );
    }
    c.bench_function("frame_200x60_prepare_and_draw", |b| {
        b.iter(|| {
            app.prepare(area);
            let _ = term.draw(|f| app.draw(f));
            black_box(term.backend().buffer().area);
        })
    });
    // Positions spread over the whole run, each far from the last, so every
    // seek goes through `Timeline::state_at` (keyframe + replay).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next_pos = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % len as u64) as usize
    };
    c.bench_function("seek_random_event", |b| {
        b.iter(|| {
            let p = next_pos();
            let r = &mut app.runs[0];
            r.set_pos(p);
            r.sync_map();
            black_box(r.map.allocated);
        })
    });
    // The Stats panel's figures so far at a cursor anywhere in the run.
    c.bench_function("peak_and_ooms_until_random_event", |b| {
        b.iter(|| {
            let p = next_pos();
            let t = &app.runs[0].timeline;
            black_box((t.peak_until(p), t.ooms_until(p)));
        })
    });
    c.bench_function("seek_random_event_then_frame", |b| {
        b.iter(|| {
            let p = next_pos();
            app.runs[0].set_pos(p);
            app.prepare(area);
            let _ = term.draw(|f| app.draw(f));
        })
    });
    c.bench_function("step_back_one_event_then_frame", |b| {
        b.iter(|| {
            let p = app.runs[0].pos.saturating_sub(1).max(1);
            app.runs[0].set_pos(p);
            app.prepare(area);
            let _ = term.draw(|f| app.draw(f));
        })
    });
}

criterion_group! {
    name = tui;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3));
    targets = benches
}
criterion_main!(tui);
