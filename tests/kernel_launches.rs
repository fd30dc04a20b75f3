//! A run with a kernel launcher (what `run --device cuda` does, recorded here
//! without a GPU) makes exactly the allocator decisions of a run without one,
//! and its report carries the launch counts and the failed launches.

use vramscope::device::{Kernel, Launch, RecordingLauncher, SimDevice};
use vramscope::scenario::{check, resolve, run, run_launching, RunOptions, RunResult, Scenario};
use vramscope::trace::Event;

const OPTS: RunOptions = RunOptions {
    iterations: Some(2),
    record_events: true,
};

fn load(name: &str) -> (Scenario, vramscope::scenario::Built) {
    resolve(name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The scenario run through `launcher`, on the same simulated device `run` uses.
fn launching(name: &str, launcher: RecordingLauncher) -> RunResult {
    let (s, b) = load(name);
    let dev = Box::new(
        SimDevice::new(
            &b.conditions.device_name,
            b.engine.device_bytes,
            b.engine.device_overhead,
        )
        .placed(b.engine.placement),
    );
    run_launching(&s, &b, &OPTS, dev, Some(Box::new(launcher)))
}

fn alloc_events(r: &RunResult) -> Vec<&Event> {
    r.events
        .iter()
        .filter(|e| matches!(e, Event::Alloc(_)))
        .collect()
}

fn launches(log: &std::sync::Arc<std::sync::Mutex<Vec<Launch>>>) -> Vec<Launch> {
    log.lock().map(|l| l.clone()).unwrap_or_default()
}

#[test]
fn the_allocator_event_stream_is_the_same_with_and_without_a_launcher() {
    // An MLP, a GPT under autocast, and expandable segments (the VM path).
    for name in ["zero-grad-fixed", "amp-fp16", "var-batch-expandable-fixed"] {
        let (s, b) = load(name);
        let plain = run(&s, &b, &OPTS);
        let rec = RecordingLauncher::new();
        let log = rec.log();
        let with = launching(name, rec);
        assert!(plain.error.is_none() && plain.oom.is_none(), "{name} ran");
        assert_eq!(with.iterations_run, plain.iterations_run);
        let (a, b_) = (alloc_events(&plain), alloc_events(&with));
        assert!(!a.is_empty());
        assert_eq!(a.len(), b_.len(), "{name}: allocator event count");
        assert!(a == b_, "{name}: allocator events differ");
        assert!(plain.events == with.events, "{name}: event streams differ");
        assert_eq!(plain.segments, with.segments, "{name}: final segments");
        assert_eq!(plain.peak_reserved, with.peak_reserved);
        // The launcher did run, and the run counted what it recorded.
        let recorded = launches(&log);
        let k = with.kernels.as_ref().expect("launch counts");
        assert!(!recorded.is_empty());
        assert_eq!(k.total(), recorded.len() as u64);
        assert!(plain.kernels.is_none(), "a simulated run launches nothing");
        for kernel in Kernel::ALL {
            let n = recorded.iter().filter(|l| l.kernel() == kernel).count() as u64;
            assert_eq!(k.count(kernel), n, "{name}: {}", kernel.name());
        }
    }
}

#[test]
fn failed_launches_are_counted_and_reported_not_fatal() {
    let name = "zero-grad-fixed";
    let mut rec = RecordingLauncher::new();
    rec.fail_every = Some(5);
    let log = rec.log();
    let r = launching(name, rec);
    let (s, b) = load(name);
    let plain = run(&s, &b, &OPTS);
    assert!(r.error.is_none(), "{:?}", r.error);
    assert_eq!(r.iterations_run, 2);
    assert!(
        plain.events == r.events,
        "failures change no allocator decision"
    );
    let attempted = launches(&log).len() as u64;
    let k = r.kernels.as_ref().expect("launch counts");
    assert_eq!(k.failed, attempted / 5);
    assert_eq!(k.total() + k.failed, attempted);
    let first = k.first_error.as_deref().unwrap_or("");
    assert!(first.contains("injected failure"), "{first}");

    let checks = check(&s.expect, &r);
    let text = vramscope::report::run::text(&s, &r, &checks);
    let line = text
        .lines()
        .find(|l| l.starts_with("kernels:"))
        .expect("a kernels line");
    assert!(
        line.contains(&format!("{} failed", attempted / 5)),
        "{line}"
    );
    assert!(line.contains(&format!("{} launched", attempted - attempted / 5)));
    assert!(text.contains("first failure:"));
    let json = vramscope::report::run::json(&r, &checks);
    assert_eq!(json["kernels"]["failed"], attempted / 5);
    let per: u64 = Kernel::ALL
        .iter()
        .map(|k| json["kernels"]["launched"][k.name()].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(per, attempted - attempted / 5);

    // A simulated run's report says nothing about kernels.
    let plain_text = vramscope::report::run::text(&s, &plain, &check(&s.expect, &plain));
    assert!(!plain_text.contains("kernels:"));
    assert!(vramscope::report::run::json(&plain, &[])["kernels"].is_null());
}
