//! The engine thread: stepping, running, errors as events.

use std::time::{Duration, Instant};

use super::super::{Command, EngineThread, ErrorKind};
use super::*;

fn collect_until(
    t: &EngineThread,
    pred: impl Fn(&EngineEvent) -> bool,
    secs: u64,
) -> Vec<EngineEvent> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut out = Vec::new();
    while Instant::now() < deadline {
        if let Ok(batch) = t.receiver().recv_timeout(Duration::from_millis(50)) {
            let hit = batch.iter().any(&pred);
            out.extend(batch);
            if hit {
                break;
            }
        }
    }
    out
}

#[test]
fn step_op_pause_and_run_to_end() {
    let t = EngineThread::spawn(
        EngineConfig::default(),
        ModelConfig::mlp_mnist(),
        OptimizerConfig::adamw(),
        Program::training(2),
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(t.try_events().is_empty(), "starts paused");
    t.send(Command::StepOp);
    let evs = collect_until(&t, |e| matches!(e, EngineEvent::OpEnd), 5);
    assert!(
        matches!(evs.last(), Some(EngineEvent::OpEnd)),
        "one op, then pause"
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(t.try_events().is_empty(), "paused after the op");
    t.send(Command::StepEvent);
    let evs = collect_until(&t, |_| true, 5);
    assert_eq!(evs.len(), 1);
    t.send(Command::StepIteration);
    let evs = collect_until(&t, |e| matches!(e, EngineEvent::IterationEnd { .. }), 5);
    assert!(matches!(
        evs.last(),
        Some(EngineEvent::IterationEnd { iter: 1, .. })
    ));
    t.send(Command::QueryLiveState);
    let evs = collect_until(&t, |e| matches!(e, EngineEvent::LiveState(_)), 5);
    assert!(evs
        .iter()
        .any(|e| matches!(e, EngineEvent::LiveState(ls) if ls.iteration == 1)));
    t.send(Command::RunToEnd);
    let evs = collect_until(&t, |e| matches!(e, EngineEvent::Finished), 10);
    assert!(matches!(evs.last(), Some(EngineEvent::Finished)));
    assert!(t.is_alive());
    t.shutdown();
}

#[test]
fn oom_arrives_as_an_event_and_restart_works() {
    let cfg = EngineConfig {
        device_bytes: 24 << 20,
        ..EngineConfig::default()
    };
    let t = EngineThread::spawn(
        cfg,
        ModelConfig::mlp_mnist(),
        OptimizerConfig::adamw(),
        Program::training(3),
    );
    t.send(Command::RunToEnd);
    let evs = collect_until(&t, |e| matches!(e, EngineEvent::Error { .. }), 10);
    let msg = evs.iter().find_map(|e| match e {
        EngineEvent::Error {
            kind: ErrorKind::OutOfMemory,
            message,
        } => Some(message.clone()),
        _ => None,
    });
    let msg = msg.expect("an OOM error event");
    assert!(
        msg.contains("CUDA out of memory. Tried to allocate"),
        "{msg}"
    );
    assert!(t.is_alive());
    t.send(Command::Restart);
    t.send(Command::RunToEnd);
    let evs = collect_until(&t, |e| matches!(e, EngineEvent::Error { .. }), 10);
    let errs: Vec<_> = evs
        .iter()
        .filter(|e| matches!(e, EngineEvent::Error { .. } | EngineEvent::Finished))
        .collect();
    assert!(
        evs.iter().any(|e| matches!(
            e,
            EngineEvent::Error {
                kind: ErrorKind::OutOfMemory,
                ..
            }
        )),
        "{errs:?} {}",
        evs.len()
    );
    assert!(t.is_alive());
    t.shutdown();
}
