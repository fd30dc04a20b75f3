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
    assert_eq!(ask(&mut sim, &json!(["m", 1001, 1000, 0])), json!(["ok"]));
    assert_eq!(
        ask(&mut sim, &json!(["m", 1002, 3 << 20, 0])),
        json!(["ok"])
    );
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
