//! The planned calls' own buffers: GEMM workspaces and broadcast clones,
//! convolution workspaces (measured, or estimated and said to be), the
//! cuDNN LSTM's reserve and dropout state, and data-dependent ops sized
//! from an assumption or from the program's own values.

use super::*;

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

/// A reduction's staging buffers follow from its report alone: the answer
/// says what the same report takes again (`same`) and carries the headroom
/// from there on (`room`), and the same report sent without waiting (`oa`)
/// takes them again, placed with no answer.
#[test]
fn a_reductions_scratch_is_said_and_the_same_report_need_not_wait() {
    let (mut sim, sink) = simulator(None);
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    let report = json!([tensor(&[1 << 24], "float32"), [], false, Value::Null]);
    let count = |sim: &mut Simulator<Shared>| {
        (
            stat(sim, "allocation.all.allocated"),
            stat(sim, "requested_bytes.all.allocated"),
        )
    };
    let (n0, b0) = count(&mut sim);
    let r = ask(&mut sim, &json!(["op", "sum", false, report, Value::Null]));
    let (n1, b1) = count(&mut sim);
    assert_eq!(r[0], "ok");
    assert!(n1 > n0, "a whole-tensor sum stages its partial sums: {r}");
    assert_eq!(r[1]["same"], json!([b1 - b0, n1 - n0]), "what it took");
    let room = &r[1]["room"];
    assert!(
        room[0].as_u64() > Some(0) && room[1].as_u64() > Some(0),
        "{r}"
    );
    post(&mut sim, &json!(["oa", "sum", false, report, Value::Null]));
    assert_eq!(
        count(&mut sim),
        (2 * n1 - n0, 2 * b1 - b0),
        "the same again"
    );
    let (outcome, _, _) = finish(sim, &sink);
    assert!(outcome.untraced.is_empty(), "{:?}", outcome.untraced);
}

/// Before CUDA starts there is no headroom to give: an answer then carries
/// none (computing one would start the simulated device).
#[test]
fn an_answer_before_cuda_starts_carries_no_headroom() {
    let (mut sim, _) = simulator(None);
    let sdpa = json!(["sdpa", {"dtype": "float16", "mask": false, "dropout": 0.0, "head_dim": 64}]);
    let before = ask(&mut sim, &sdpa);
    assert_eq!(
        before.as_array().map(Vec::len),
        Some(2),
        "the backend alone: {before}"
    );
    assert_eq!(ask(&mut sim, &json!(["init", {}]))[0], "ok");
    let after = ask(&mut sim, &sdpa);
    assert_eq!(after[1], before[1], "the same backend");
    assert!(after[2]["room"][0].as_u64() > Some(0), "{after}");
}
