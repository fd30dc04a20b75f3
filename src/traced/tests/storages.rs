//! Storages on the allocator model as PyTorch counts them: placed, freed,
//! out of memory (PyTorch's message, on the stream too), posted within the
//! headroom without an answer, a malformed request named, and the held
//! range the first request outside a module's `.to()` opens.

use super::*;

#[test]
fn storages_are_placed_freed_and_counted_as_pytorch_counts_them() {
    let (mut sim, sink) = simulator(None);
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    post(
        &mut sim,
        &json!(["s", 0, [["/home/u/train.py", 7, "<module>"]]]),
    );
    assert_eq!(ask(&mut sim, &json!(["m", 1001, 1000, 0]))[0], "ok");
    assert_eq!(ask(&mut sim, &json!(["m", 1002, 3 << 20, 0]))[0], "ok");
    // 1000 B round to 1,024 in a 2 MiB small segment; 3 MiB in a 20 MiB one.
    assert_eq!(
        stat(&mut sim, "allocated_bytes.all.current"),
        1024 + (3 << 20)
    );
    assert_eq!(
        stat(&mut sim, "reserved_bytes.all.current"),
        (2 << 20) + (20 << 20)
    );
    post(&mut sim, &json!(["f", 1002]));
    post(&mut sim, &json!(["step"]));
    assert_eq!(stat(&mut sim, "allocated_bytes.all.current"), 1024);
    assert_eq!(stat(&mut sim, "allocated_bytes.all.peak"), 1024 + (3 << 20));
    assert_eq!(ask(&mut sim, &json!(["empty_cache"]))[0], "ok");
    assert_eq!(stat(&mut sim, "reserved_bytes.all.current"), 2 << 20);
    let (outcome, snap, session) = finish(sim, &sink);
    assert_eq!(outcome.peak_allocated, 1024 + (3 << 20));
    assert_eq!(outcome.steps, 1);
    assert_eq!(session.steps().len(), 1);
    let allocs = session
        .trace(0)
        .iter()
        .filter(|e| e.action == crate::alloc::Action::Alloc)
        .count();
    assert_eq!(allocs, 2, "both requests are in the stream");
    assert_eq!(snap.segments.len(), 1, "the small segment is left");
}

#[test]
fn an_oom_answers_with_pytorchs_message_and_reaches_the_stream() {
    let (mut sim, sink) = simulator(None);
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    assert_eq!(ask(&mut sim, &json!(["fraction", 0.001]))[0], "ok");
    let r = ask(&mut sim, &json!(["m", 7, 1u64 << 30, Value::Null]));
    assert_eq!(r[0], "oom");
    let message = r[1].as_str().expect("a message");
    assert!(
        message.starts_with("CUDA out of memory. Tried to allocate 1024.00 MiB."),
        "{message}"
    );
    let (outcome, _, session) = finish(sim, &sink);
    assert_eq!(outcome.ooms, 1);
    assert_eq!(session.ooms().len(), 1);
    assert_eq!(session.ooms()[0].pytorch_message.as_deref(), Some(message));
}

#[test]
fn a_malformed_request_is_an_error_naming_it() {
    let (mut sim, _) = simulator(None);
    let e = sim.handle(5, &json!(["m", "x"])).expect_err("not a number");
    assert!(e.to_string().contains("message 5"), "{e}");
    assert!(sim.handle(6, &json!({"t": 1})).is_err());
}

#[test]
fn a_storage_within_the_headroom_is_placed_without_an_answer() {
    let (mut sim, sink) = simulator(None);
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    let r = ask(&mut sim, &json!(["m", 1, 1 << 20, Value::Null]));
    let (room, count) = (r[1].as_u64().expect("room"), r[2].as_u64().expect("count"));
    // 2·room + 20 MiB·count within half of what the device leaves.
    let free = ask(&mut sim, &json!(["mem_get_info"]))[1][0]
        .as_u64()
        .expect("free");
    assert!(room > 0 && count > 0);
    assert!(2 * room + (20 << 20) * count <= free / 2, "{room} {count}");
    post(&mut sim, &json!(["ma", 2, 3 << 20, Value::Null]));
    assert_eq!(allocated(&mut sim), (1 << 20) + (3 << 20));
    post(&mut sim, &json!(["f", 2]));
    assert_eq!(allocated(&mut sim), 1 << 20);
    let (outcome, _, _) = finish(sim, &sink);
    assert_eq!(outcome.allocations, 2);
    assert!(outcome.untraced.is_empty());
}

/// On a card whose driver layout is modelled (`Placement::H100Driver`), the
/// trace tells the device where the program's kernels start: its first
/// request not made under `nn.Module._apply`. The module's segments go
/// below the range the context holds, the program's own into it.
#[test]
fn the_first_request_outside_a_modules_to_opens_the_held_range() {
    let h100 = profile("H100-SXM-80GB").expect("H100");
    let gpu: &'static crate::device::GpuProfile = Box::leak(Box::new(crate::device::GpuProfile {
        placement: crate::device::Placement::H100Driver,
        ..*h100
    }));
    let sink = Shared::default();
    let opts = SimOptions {
        gpu,
        steps: None,
        conf: None,
        holders_budget_ms: super::super::simulator::HOLDERS_BUDGET_MS,
    };
    let mut sim = Simulator::new(opts, sink.clone(), vec!["python".into(), "t.py".into()]);
    ask(
        &mut sim,
        &json!(["hello", {"pid": 42, "argv": ["t.py"], "torch": "2.11.0+cu130"}]),
    );
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    let module = "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py";
    post(
        &mut sim,
        &json!([
            "s",
            0,
            [
                [module, 1370, "convert"],
                [module, 965, "_apply"],
                ["/home/u/train.py", 9, "<module>"]
            ]
        ]),
    );
    post(
        &mut sim,
        &json!(["s", 1, [["/home/u/train.py", 12, "<module>"]]]),
    );
    let mib = 1u64 << 20;
    for (cd, stack) in [(1, 0), (2, 0), (3, 1)] {
        assert_eq!(ask(&mut sim, &json!(["m", cd, 20 * mib, stack]))[0], "ok");
    }
    let (_, snap, _) = finish(sim, &sink);
    let at: Vec<u64> = snap.device_traces[0]
        .iter()
        .filter(|e| e.action == crate::alloc::Action::SegmentAlloc)
        .map(|e| e.addr)
        .collect();
    assert_eq!(at.len(), 3, "one 20 MiB segment each: {at:x?}");
    let (first, module_s, programs) = (at[0], at[1], at[2]);
    assert!(
        module_s < programs && programs < first,
        "the first segment on top, the module's below the held range, the \
         program's in it: {first:#x} {module_s:#x} {programs:#x}"
    );
}
