//! The program's holder walks: into the stream with the step and the
//! allocator's bytes, and the helper finds the walk where `launch` writes
//! it.

use super::*;

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
