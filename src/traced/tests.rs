//! The simulator driven by hand-written requests, as the helper sends them:
//! what it answers, and the stream it writes read back by `attach`'s session.

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use super::outcome::TraceOutcome;
use super::simulator::{SimOptions, Simulator};
use crate::device::profile;
use crate::job::{decode, FrameReader, Session};
use crate::trace::snapshot::Snapshot;

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn simulator(conf: Option<&str>) -> (Simulator<Shared>, Shared) {
    let sink = Shared::default();
    let opts = SimOptions {
        gpu: profile("H100-SXM-80GB").expect("H100"),
        steps: None,
        conf: conf.map(String::from),
        holders_budget_ms: super::simulator::HOLDERS_BUDGET_MS,
    };
    let mut sim = Simulator::new(opts, sink.clone(), vec!["python".into(), "t.py".into()]);
    let hello = json!(["hello", {"pid": 42, "argv": ["t.py"], "torch": "2.11.0+cu130"}]);
    let reply = ask(&mut sim, &hello);
    assert_eq!(reply["device"]["total_memory"], 85_017_493_504u64);
    assert!(reply["after_ops"]
        .as_array()
        .is_some_and(|a| a.iter().any(|o| o == "addmm")));
    (sim, sink)
}

fn ask(sim: &mut Simulator<Shared>, msg: &Value) -> Value {
    sim.handle(0, msg)
        .expect("a valid request")
        .expect("a request that waits gets an answer")
}

fn post(sim: &mut Simulator<Shared>, msg: &Value) {
    assert!(sim.handle(0, msg).expect("a valid request").is_none());
}

fn stat(sim: &mut Simulator<Shared>, key: &str) -> u64 {
    ask(sim, &json!(["stats"]))[1][key]
        .as_u64()
        .expect("a counter")
}

fn finish(sim: Simulator<Shared>, sink: &Shared) -> (TraceOutcome, Snapshot, Session) {
    let (outcome, snap) = sim.finish(Some(0)).expect("finished");
    let bytes = sink.0.lock().expect("not poisoned").clone();
    let mut frames = FrameReader::new(bytes.as_slice(), "test");
    let mut session = Session::new("test");
    while let Some((i, b)) = frames.next_frame().expect("framed") {
        if let Some(m) = decode("test", i, b).expect("decodes") {
            session.apply(i, m).expect("the session takes it");
        }
    }
    (outcome, snap, session)
}

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
fn the_programs_environment_sets_the_allocator_and_workspaces() {
    let (mut sim, sink) = simulator(None);
    let env = json!(["init", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                              "CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8", "CUBLASLT_WORKSPACE_SIZE": "1024"}]);
    assert_eq!(ask(&mut sim, &env)[0], "ok");
    let linear = |backward: bool| {
        json!(["op", "addmm", backward, [{"shape": [768], "dtype": "float32", "contiguous": true},
                                        {"shape": [8, 768], "dtype": "float32", "contiguous": true}], Value::Null])
    };
    assert_eq!(ask(&mut sim, &linear(false))[0], "ok");
    let one_thread = 8_519_680 + (1 << 20);
    assert_eq!(stat(&mut sim, "allocated_bytes.all.current"), one_thread);
    assert_eq!(ask(&mut sim, &linear(false))[0], "ok");
    assert_eq!(
        stat(&mut sim, "allocated_bytes.all.current"),
        one_thread,
        "cached per thread"
    );
    assert_eq!(ask(&mut sim, &linear(true))[0], "ok");
    assert_eq!(
        stat(&mut sim, "allocated_bytes.all.current"),
        2 * one_thread,
        "autograd's own"
    );
    assert_eq!(ask(&mut sim, &json!(["clear_workspaces"]))[0], "ok");
    assert_eq!(stat(&mut sim, "allocated_bytes.all.current"), 0);
    let (outcome, snap, _) = finish(sim, &sink);
    assert_eq!(outcome.alloc_conf, "expandable_segments:True");
    assert!(snap.segments.iter().all(|s| s.is_expandable));
}

#[test]
fn a_bad_allocator_config_is_an_error_the_program_raises() {
    let (mut sim, _) = simulator(Some("max_split_size_mb:banana"));
    let r = ask(&mut sim, &json!(["init", {}]));
    assert_eq!(r[0], "error");
    assert!(
        r[1].as_str()
            .is_some_and(|m| m.contains("max_split_size_mb")),
        "{r}"
    );
}

#[test]
fn sdpa_follows_the_dispatcher_and_the_programs_switches() {
    let (mut sim, _) = simulator(None);
    let call = |dtype: &str, enabled: Value| {
        json!(["sdpa", {"dtype": dtype, "mask": false, "dropout": 0.0, "head_dim": 64, "gqa": false,
                        "enabled": enabled}])
    };
    let all = json!({"flash": true, "efficient": true, "math": true, "cudnn": true});
    assert_eq!(ask(&mut sim, &call("float32", all.clone()))[1], "efficient");
    assert_eq!(
        ask(&mut sim, &call("bfloat16", all))[1],
        "cudnn",
        "2.11 on sm90"
    );
    let flash_only = json!({"flash": true, "efficient": false, "math": false, "cudnn": false});
    assert_eq!(ask(&mut sim, &call("float16", flash_only))[1], "flash");
}

#[test]
fn a_malformed_request_is_an_error_naming_it() {
    let (mut sim, _) = simulator(None);
    let e = sim.handle(5, &json!(["m", "x"])).expect_err("not a number");
    assert!(e.to_string().contains("message 5"), "{e}");
    assert!(sim.handle(6, &json!({"t": 1})).is_err());
}

fn tensor(shape: &[u64], dtype: &str) -> Value {
    let mut strides = vec![1u64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    json!({"shape": shape, "stride": strides, "dtype": dtype, "contiguous": true})
}

fn allocated(sim: &mut Simulator<Shared>) -> u64 {
    stat(sim, "allocated_bytes.all.current")
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

#[test]
fn a_gemm_is_quiet_once_its_threads_workspaces_are_cached() {
    let (mut sim, _) = simulator(None);
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    let mm = json!([
        "op",
        "mm",
        false,
        [tensor(&[8, 64], "float32"), tensor(&[64, 64], "float32")],
        Value::Null
    ]);
    let first = ask(&mut sim, &mm);
    assert_eq!(
        first[1]["quiet"], true,
        "the cuBLAS workspace is now cached"
    );
    let addmm = json!([
        "op",
        "addmm",
        false,
        [
            tensor(&[64], "float32"),
            tensor(&[8, 64], "float32"),
            tensor(&[64, 64], "float32")
        ],
        Value::Null
    ]);
    assert_eq!(
        ask(&mut sim, &addmm)[1]["quiet"],
        true,
        "and now cuBLASLt's"
    );
    let backward = json!([
        "op",
        "mm",
        true,
        [tensor(&[8, 64], "float32"), tensor(&[64, 64], "float32")],
        Value::Null
    ]);
    let again = ask(&mut sim, &backward);
    assert_eq!(again[1]["quiet"], true);
    assert_eq!(
        again[1]["still"], true,
        "operands cuBLAS takes as they are: the same call takes nothing at all"
    );
}

#[test]
fn a_broadcast_gemm_operand_is_cloned_for_the_call() {
    let (mut sim, _) = simulator(None);
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    let warm = json!([
        "op",
        "mm",
        true,
        [tensor(&[4, 4], "float32"), tensor(&[4, 4], "float32")],
        Value::Null
    ]);
    ask(&mut sim, &warm);
    let before = stat(&mut sim, "allocation.all.allocated");
    let held = allocated(&mut sim);
    // sum().backward()'s [16, 1000] gradient (stride 0) times a weight.
    let expanded =
        json!({"shape": [16, 1000], "stride": [0, 0], "dtype": "float32", "contiguous": false});
    let mm = json!([
        "op",
        "mm",
        true,
        [expanded, tensor(&[1000, 2048], "float32")],
        Value::Null
    ]);
    let r = ask(&mut sim, &mm);
    assert_eq!(r[0], "ok");
    assert_eq!(r[1]["quiet"], true, "no workspace to take");
    assert_eq!(
        r[1]["still"], false,
        "a clone each call: the helper must report it each time"
    );
    assert_eq!(
        stat(&mut sim, "allocation.all.allocated"),
        before + 1,
        "one clone"
    );
    assert_eq!(allocated(&mut sim), held, "freed after the call");
    assert_eq!(
        stat(&mut sim, "allocated_bytes.all.peak"),
        held + 16 * 1000 * 4,
        "the clone's bytes"
    );
}

#[test]
fn a_convolution_takes_its_measured_workspace_after_its_output() {
    let (mut sim, sink) = simulator(None);
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    let args = json!([
        tensor(&[32, 3, 224, 224], "float32"),
        tensor(&[64, 3, 7, 7], "float32"),
        Value::Null,
        [2, 2],
        [3, 3],
        [1, 1],
        false,
        [0, 0],
        1
    ]);
    let before = json!(["before", "convolution", false, args.clone(), Value::Null]);
    assert_eq!(ask(&mut sim, &before)[0], "ok");
    ask(&mut sim, &json!(["m", 1, 102_760_448, Value::Null]));
    assert_eq!(
        ask(
            &mut sim,
            &json!(["out", "convolution", false, args.clone(), Value::Null, 0])
        )[0],
        "ok"
    );
    assert_eq!(
        ask(
            &mut sim,
            &json!(["op", "convolution", false, args, Value::Null])
        )[0],
        "ok"
    );
    assert_eq!(allocated(&mut sim), 102_760_448, "the workspace is gone");
    assert_eq!(
        stat(&mut sim, "allocated_bytes.all.peak"),
        102_760_448 + 122_065_680u64.div_ceil(512) * 512,
        "the stem's measured forward workspace, rounded to 512 B"
    );
    let (outcome, _, _) = finish(sim, &sink);
    assert!(outcome.estimates.is_empty(), "measured on the H100");
}

#[test]
fn an_unmeasured_convolution_is_estimated_and_said_to_be() {
    let (mut sim, sink) = simulator(None);
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    let args = json!([
        tensor(&[2, 3, 32, 32], "float32"),
        tensor(&[8, 3, 3, 3], "float32"),
        Value::Null,
        [1, 1],
        [1, 1],
        [1, 1],
        false,
        [0, 0],
        1
    ]);
    ask(
        &mut sim,
        &json!(["before", "convolution", false, args.clone(), Value::Null]),
    );
    ask(
        &mut sim,
        &json!(["out", "convolution", false, args.clone(), Value::Null, 0]),
    );
    ask(
        &mut sim,
        &json!(["op", "convolution", false, args, Value::Null]),
    );
    // The engine's estimate: min(64 MiB, the input's bytes).
    assert_eq!(
        stat(&mut sim, "allocated_bytes.all.peak"),
        2 * 3 * 32 * 32 * 4
    );
    let (outcome, _, _) = finish(sim, &sink);
    assert_eq!(outcome.estimates.len(), 1);
    assert!(
        outcome.estimates[0].what.contains("convolution"),
        "{:?}",
        outcome.estimates
    );
}

#[test]
fn a_cudnn_lstm_sizes_its_reserve_and_keeps_one_dropout_state() {
    let (mut sim, _) = simulator(None);
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    let args = json!([
        tensor(&[35, 20, 200], "float32"),
        [],
        4,
        tensor(&[563200], "float32"),
        tensor(&[2, 20, 200], "float32"),
        tensor(&[2, 20, 200], "float32"),
        2,
        200,
        0,
        2,
        false,
        0.2,
        true,
        false,
        [],
        Value::Null
    ]);
    let r = ask(
        &mut sim,
        &json!(["before", "_cudnn_rnn", false, args.clone(), Value::Null]),
    );
    assert_eq!(r[1]["sizes"]["3"], 6_177_760, "the H100's measured reserve");
    assert_eq!(allocated(&mut sim), 6_488_064, "the dropout state, kept");
    let r = ask(
        &mut sim,
        &json!(["before", "_cudnn_rnn", false, args, Value::Null]),
    );
    assert_eq!(r[0], "ok");
    assert_eq!(allocated(&mut sim), 6_488_064, "made once");
}

/// The program's holder walk goes into the stream as PROTOCOL.md's
/// `holders`, with the stream's `seq`, the step that just ended (none at an
/// OOM) and the simulated allocator's bytes, and the session reads it.
#[test]
fn the_program_s_holder_walks_reach_the_stream_with_the_step_and_the_bytes() {
    let (mut sim, sink) = simulator(None);
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    assert_eq!(
        ask(&mut sim, &json!(["m", 1, 3 << 20, Value::Null]))[0],
        "ok"
    );
    post(&mut sim, &json!(["step"]));
    post(&mut sim, &json!(["step"]));
    let chain = json!({"where": "t.py:9 in train", "path": ["self", ".history"],
        "holder": "list", "items": 2, "tensors": 2, "bytes": 8, "graph_bytes": 4096,
        "graph_complete": true, "grew_bytes": 2052,
        "example": {"link": "[1]", "what": "0-dim tensor float32", "graph_bytes": 2048},
        "what": null, "fix": "self.history.append(x.item())"});
    let walk = |reason: &str| {
        json!(["holders", {"reason": reason, "budget_ms": 25.0, "spent_ms": 1.5,
            "complete": true, "holders_seen": 1, "chains": [chain.clone()]}])
    };
    post(&mut sim, &walk("grew"));
    assert_eq!(ask(&mut sim, &json!(["fraction", 0.0001]))[0], "ok");
    assert_eq!(
        ask(&mut sim, &json!(["m", 2, 1u64 << 30, Value::Null]))[0],
        "oom"
    );
    post(&mut sim, &walk("oom"));
    let err = sim
        .handle(9, &json!(["holders", "not an object"]))
        .expect_err("refused");
    assert!(err.to_string().contains("holders"), "{err}");
    let (_, _, session) = finish(sim, &sink);
    let walks = session.holders();
    assert_eq!(walks.len(), 2);
    assert_eq!(walks[0].reason, "grew");
    assert_eq!(walks[0].step, Some(session.steps().len() as u64));
    // 3 MiB lands in a 20 MiB segment, allocated as asked.
    assert_eq!(walks[0].allocated, Some(3 << 20));
    assert_eq!(walks[0].chains[0].path, ["self", ".history"]);
    assert_eq!(walks[1].reason, "oom");
    assert_eq!(walks[1].step, None);
    assert!(walks[1].seq > walks[0].seq, "the OOM's entry came between");
}

/// The helper loads the holder walk under the name `vramscope trace` writes
/// it beside the helper.
#[test]
fn the_helper_looks_for_the_holder_walk_where_launch_writes_it() {
    let name = super::launch::HOLDERS_FILE;
    assert!(
        super::HELPER_MODULES
            .iter()
            .any(|(_, text)| text.contains(&format!("\"{name}\""))),
        "the helper's HOLDERS_FILES (python/vramscope_trace/_session.py) names {name}"
    );
    assert!(super::HOLDERS_SOURCE.contains("def find("));
}

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
        holders_budget_ms: super::simulator::HOLDERS_BUDGET_MS,
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

/// `nonzero` of a router's mask `chosen == e` takes balanced routing's
/// rows for expert e (the engine's `counts_for`), any other mask all its
/// elements (an upper bound); each assumption is in the outcome with its
/// calls, and the kernel's count and cub scratch are taken around the
/// result as on the H100.
#[test]
fn a_data_dependent_nonzero_takes_an_assumed_size_and_says_so() {
    let (mut sim, sink) = simulator(None);
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    // 2,049 tokens × top 2 over 8 experts: 4,098 rows, two experts one more.
    let router = json!({"router": {"experts": 8, "top_k": 2, "tokens": 2049, "expert": 1}});
    let args = json!([tensor(&[2049, 2], "bool")]);
    for _ in 0..2 {
        let r = ask(
            &mut sim,
            &json!(["before", "nonzero", false, args, Value::Null, router]),
        );
        assert_eq!(r[1]["rows"], 513, "{r}");
        assert_eq!(allocated(&mut sim), 512, "the 4-byte count, one block");
        ask(&mut sim, &json!(["m", 7, 513 * 2 * 8, Value::Null]));
        ask(
            &mut sim,
            &json!(["op", "nonzero", false, args, Value::Null]),
        );
        assert_eq!(allocated(&mut sim), (513u64 * 16).div_ceil(512) * 512);
        post(&mut sim, &json!(["f", 7]));
    }
    let other = json!([tensor(&[64, 3], "bool")]);
    let r = ask(
        &mut sim,
        &json!(["before", "nonzero", false, other, Value::Null]),
    );
    assert_eq!(r[1]["rows"], 192, "every element true");
    ask(
        &mut sim,
        &json!(["op", "nonzero", false, other, Value::Null]),
    );
    let (outcome, _, _) = finish(sim, &sink);
    assert_eq!(outcome.assumed.len(), 2, "{:?}", outcome.assumed);
    assert_eq!(outcome.assumed[0].what, "aten.nonzero");
    assert_eq!(outcome.assumed[0].calls, 2);
    assert!(outcome.assumed[0].assumption.contains("512 or 513 rows"));
    assert!(outcome.assumed[1].assumption.contains("upper bound"));
}

/// A data-dependent op whose input's values the helper knows (`{"known":
/// rows}`, found running it on the CPU copy) takes that size, whatever a
/// router would have assumed, and is listed as sized from the program's
/// values, not as assumed; the kernel's own buffers are the same.
#[test]
fn a_data_dependent_op_on_known_values_takes_their_size_and_assumes_nothing() {
    let (mut sim, sink) = simulator(None);
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    let args = json!([tensor(&[2049, 2], "bool")]);
    let known = json!({"known": 37});
    let r = ask(
        &mut sim,
        &json!(["before", "nonzero", false, args, Value::Null, known]),
    );
    assert_eq!(r[1]["rows"], 37, "{r}");
    assert_eq!(allocated(&mut sim), 512, "the 4-byte count, as ever");
    ask(
        &mut sim,
        &json!(["op", "nonzero", false, args, Value::Null]),
    );
    let bins = json!([tensor(&[100], "int64"), Value::Null, 3]);
    let r = ask(
        &mut sim,
        &json!(["before", "bincount", false, bins, Value::Null, {"known": 9}]),
    );
    assert_eq!(r[1]["rows"], 9, "the largest value + 1, not minlength: {r}");
    ask(
        &mut sim,
        &json!(["op", "bincount", false, bins, Value::Null]),
    );
    post(
        &mut sim,
        &json!(["known", "aten._unique2.default", Value::Null]),
    );
    post(
        &mut sim,
        &json!(["known", "aten._unique2.default", Value::Null]),
    );
    let (outcome, _, _) = finish(sim, &sink);
    assert!(outcome.assumed.is_empty(), "{:?}", outcome.assumed);
    let what: Vec<(&str, u64)> = outcome
        .known
        .iter()
        .map(|k| (k.what.as_str(), k.calls))
        .collect();
    assert_eq!(
        what,
        [
            ("aten.nonzero", 1),
            ("aten.bincount", 1),
            ("aten._unique2", 2)
        ]
    );
}
