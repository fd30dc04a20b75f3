//! The program's own snapshots (`_dump_snapshot()`) against its
//! `_record_memory_history` calls, and the trace vramscope keeps.

use super::*;

/// The program's own snapshots follow `_record_memory_history`: every event
/// until it first turns recording on, from then what PyTorch records (off
/// clears the buffer and records nothing, on again starts afresh); the
/// trace vramscope keeps has every event.
#[test]
fn the_programs_snapshots_follow_its_record_memory_history() {
    let (mut sim, sink) = simulator(None);
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    post(
        &mut sim,
        &json!(["s", 0, [["/home/u/train.py", 7, "<module>"]]]),
    );
    let scratch = crate::scratch::temp_dir("traced-history");
    let dumped = |sim: &mut Simulator<Shared>, name: &str| -> Vec<u64> {
        let path = scratch.join(name);
        let path = path.to_string_lossy().into_owned();
        assert_eq!(ask(sim, &json!(["dump", path]))[0], "ok");
        let snap =
            crate::trace::snapshot::import_file(std::path::Path::new(&path)).expect("a snapshot");
        snap.device_traces
            .first()
            .map(|t| {
                t.iter()
                    .filter(|e| e.action == crate::alloc::Action::Alloc)
                    .map(|e| e.size)
                    .collect()
            })
            .unwrap_or_default()
    };
    let kib = |k: u64| k << 10;
    assert_eq!(ask(&mut sim, &json!(["m", 1, kib(1), 0]))[0], "ok");
    assert_eq!(
        dumped(&mut sim, "a.pickle"),
        [kib(1)],
        "never turned on: every event"
    );
    assert_eq!(ask(&mut sim, &json!(["history", true, false]))[0], "ok");
    assert_eq!(ask(&mut sim, &json!(["m", 2, kib(2), 0]))[0], "ok");
    assert_eq!(
        dumped(&mut sim, "b.pickle"),
        [kib(2)],
        "from the first call on"
    );
    assert_eq!(ask(&mut sim, &json!(["history", false, false]))[0], "ok");
    assert_eq!(ask(&mut sim, &json!(["m", 3, kib(3), 0]))[0], "ok");
    assert!(
        dumped(&mut sim, "c.pickle").is_empty(),
        "off: cleared, nothing recorded"
    );
    assert_eq!(ask(&mut sim, &json!(["history", true, false]))[0], "ok");
    assert_eq!(ask(&mut sim, &json!(["m", 4, kib(4), 0]))[0], "ok");
    assert_eq!(dumped(&mut sim, "d.pickle"), [kib(4)], "on again: afresh");
    assert_eq!(ask(&mut sim, &json!(["history", true, true]))[0], "ok");
    assert_eq!(ask(&mut sim, &json!(["m", 5, kib(5), 0]))[0], "ok");
    assert_eq!(dumped(&mut sim, "e.pickle"), [kib(5)], "clear_history=True");
    let (_, snap, _) = finish(sim, &sink);
    let all: Vec<u64> = snap.device_traces[0]
        .iter()
        .filter(|e| e.action == crate::alloc::Action::Alloc)
        .map(|e| e.size)
        .collect();
    assert_eq!(
        all,
        [kib(1), kib(2), kib(3), kib(4), kib(5)],
        "vramscope keeps all"
    );
}
