//! The simulator driven by hand-written requests, as the helper sends them:
//! what it answers, and the stream it writes read back by `attach`'s session.
//! The requests' helpers are here, the tests by subject beside them.

mod environment;
mod holders;
mod kernels;
mod snapshots;
mod storages;

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

// `launch`, `HELPER_MODULES` and `HOLDERS_SOURCE` as `super::` names for
// holders.rs, whose helper-source test names them so (moved from tests.rs; it now reads every module of the helper package).
use super::outcome::TraceOutcome;
use super::simulator::{SimOptions, Simulator};
use super::{launch, HELPER_MODULES, HOLDERS_SOURCE};
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
