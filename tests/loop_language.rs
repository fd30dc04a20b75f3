//! The loop language as a user writes it: schedules, dicts, bounded deques,
//! the accuracy count, lists of buffers and the hidden state as a name.
//! `check` refuses at the step (file:line:column) what Python would refuse
//! when the loop runs; the built-ins that use them show what PyTorch does.

use vramscope::scenario::{load_str, resolve, run, LoadError, RunOptions, RunResult};

const MIB: u64 = 1 << 20;

/// An LSTM loop with `extra` after `optimizer.step()` (line 14 on).
fn lstm(extra: &str) -> String {
    format!(
        r#"Scenario(
    name: "lstm",
    description: "an LSTM loop",
    device: (name: "sim", capacity: "4GiB"),
    model: Preset("lstm-lm-ptb"),
    steps: [
        CarryHidden(detach: true),
        ZeroGrad(set_to_none: true),
        LoadBatch(x: "x", y: "y"),
        Forward(input: "x", output: "out"),
        Loss(output: "out", target: "y", into: "loss"),
        Backward(loss: "loss", retain_graph: false),
        OptimizerStep,
{extra}
    ],
    iterations: 3,
)
"#
    )
}

/// An MLP loop: `setup` (line 7 on, one line), then the loop with `extra`
/// after `optimizer.step()` (line 16 on).
fn mlp(setup: &str, extra: &str) -> String {
    format!(
        r#"Scenario(
    name: "mlp",
    description: "an MLP loop",
    device: (name: "sim", capacity: "1GiB"),
    model: Preset("mlp-mnist"),
    setup: [
{setup}
    ],
    steps: [
        ZeroGrad(set_to_none: true),
        LoadBatch(x: "x", y: "y"),
        Forward(input: "x", output: "out"),
        Loss(output: "out", target: "y", into: "loss"),
        Backward(loss: "loss", retain_graph: false),
        OptimizerStep,
{extra}
    ],
    iterations: 4,
)
"#
    )
}

fn refused(text: &str) -> (usize, usize, String) {
    match load_str(text, "loop.ron") {
        Err(LoadError::At {
            line,
            column,
            message,
            ..
        }) => (line, column, message),
        Err(other) => panic!("not a positioned error: {other}"),
        Ok(_) => panic!("loaded:\n{text}"),
    }
}

fn runs(text: &str) -> RunResult {
    let (s, built) = load_str(text, "loop.ron").unwrap_or_else(|e| panic!("{e}\n{text}"));
    let r = run(&s, &built, &RunOptions::default());
    assert!(
        r.error.is_none() && r.oom.is_none(),
        "{:?} {:?}",
        r.error,
        r.oom
    );
    r
}

// ---------------------------------------------------------------- the hidden state

#[test]
fn the_hidden_state_is_a_name_a_loop_can_keep_log_and_detach() {
    // hs.append(tuple(h.detach() for h in hidden)); last = hidden
    let r = runs(&lstm(
        "        Append(from: \"hidden\", list: \"hs\", what: Detach),\n        \
         Keep(from: \"hidden\", into: \"last\", what: Tensor),",
    ));
    assert_eq!(r.iterations_run, 3);
    // Three detached copies share the storage of three iterations' states.
    let (s, built) = load_str(
        &lstm("        Keep(from: \"hidden\", into: \"hidden\", what: Detach),"),
        "loop.ron",
    )
    .expect("`hidden = repackage_hidden(hidden)` by name loads");
    assert_eq!(run(&s, &built, &RunOptions::default()).iterations_run, 3);
}

#[test]
fn what_python_refuses_about_the_hidden_state_is_refused_at_the_step() {
    // A tuple has no .item().
    let (line, column, m) = refused(&lstm(
        "        Keep(from: \"hidden\", into: \"h\", what: Item),",
    ));
    assert_eq!((line, column), (14, 9), "{m}");
    assert!(m.contains("tuple (h, c)") && m.contains(".item()"), "{m}");
    // The LSTM's Forward reads `hidden` as (h, c): binding a tensor there
    // would break the next forward.
    let (line, _, m) = refused(&lstm(
        "        Keep(from: \"out\", into: \"hidden\", what: Detach),",
    ));
    assert_eq!(line, 14);
    assert!(m.contains("binds `hidden` to a tensor"), "{m}");
    // An MLP has no hidden state: the name is unbound, as in Python.
    let (line, _, m) = refused(&mlp(
        "",
        "        Append(from: \"hidden\", list: \"hs\", what: Tensor),",
    ));
    assert_eq!(line, 16);
    assert!(m.contains("`hidden`, which no earlier step binds"), "{m}");
}

// ---------------------------------------------------------------- containers

#[test]
fn containers_are_refused_where_python_would_raise() {
    let cases = [
        // history[it] = out on a list: TypeError in Python.
        (
            "        AllocateBuffers(list: \"history\", count: 1, shape: [4], dtype: F32),",
            "        SetItem(dict: \"history\", key: Iteration, from: \"out\", what: Detach),",
            16,
            "is a list: item assignment here needs a dict",
        ),
        // a dict has no .append
        (
            "        NewDict(name: \"d\"),",
            "        Append(from: \"loss\", list: \"d\", what: Item),",
            16,
            "only a list or a deque has .append()",
        ),
        // a dict never created
        (
            "",
            "        SetItem(dict: \"history\", key: Name(\"last\"), from: \"out\", what: Tensor),",
            16,
            "`history`, which no earlier step binds",
        ),
        // del out[::2] on a tensor would slice the tensor, not free list elements
        (
            "",
            "        DeleteEvery(list: \"out\", step: 2),",
            16,
            "`out`, which is a tensor",
        ),
        // ValueError: slice step cannot be zero
        (
            "        AllocateBuffers(list: \"xs\", count: 4, shape: [4], dtype: F32),",
            "        DeleteEvery(list: \"xs\", step: 0),",
            16,
            "step cannot be zero",
        ),
        (
            "        AllocateBuffers(list: \"xs\", count: 0, shape: [4], dtype: F32),",
            "",
            7,
            "count ≥ 1",
        ),
        (
            "        NewDict(name: \"d\"),",
            "        SetItem(dict: \"d\", key: Name(\"a'b\"), from: \"out\", what: Tensor),",
            16,
            "plain word",
        ),
        // .detach() of a count makes no sense: Tensor or Item
        (
            "",
            "        CountCorrect(output: \"out\", target: \"y\", into: \"c\", what: Detach),",
            16,
            "Tensor or Item",
        ),        // a cycle of a name never bound: NameError
        (
            "",
            "        MakeCycle(from: \"preds\", into: \"rec\", what: Tensor),",
            16,
            "`preds`, which no earlier step binds",
        ),
        // the record is a dict, not a tensor: it has no .backward()
        (
            "        AllocateBuffer(name: \"b\", shape: [4], dtype: F32), MakeCycle(from: \"b\", into: \"rec\", what: Tensor),",
            "        Backward(loss: \"rec\", retain_graph: false),",
            16,
            "a dict that holds itself",
        ),
    ];
    for (setup, extra, line, text) in cases {
        let (at, column, m) = refused(&mlp(setup, extra));
        assert_eq!((at, column), (line, 9), "{setup} {extra}: {m}");
        assert!(m.contains(text), "{extra}: {m}");
    }
}

// ---------------------------------------------------------------- schedules

#[test]
fn a_name_bound_on_a_schedule_that_skips_the_first_iteration_is_unbound_after_it() {
    // `if it % 2 == 1: last = loss.item()` then `print(last)`: NameError at it = 0.
    let late = "        Every(n: 2, offset: 1, steps: [Keep(from: \"loss\", into: \"last\", what: Item)]),\n        \
                Append(from: \"last\", list: \"seen\", what: Tensor),";
    let (line, _, m) = refused(&mlp("", late));
    assert_eq!(line, 17, "at the Append after the block: {m}");
    assert!(m.contains("`last`, which no earlier step binds"), "{m}");
    // offset 0 runs at it = 0: bound from the first iteration on.
    let early = late
        .replace("offset: 1", "offset: 0")
        .replace("what: Tensor", "what: Detach");
    let (line, _, m) = refused(&mlp("", &early));
    assert_eq!(line, 17);
    assert!(m.contains("a Python number"), "kept as .item(): {m}");
    let ok = "        Every(n: 2, steps: [Keep(from: \"loss\", into: \"last\", what: Detach)]),\n        \
              Append(from: \"last\", list: \"seen\", what: Tensor),";
    assert_eq!(runs(&mlp("", ok)).iterations_run, 4);
}

#[test]
fn schedules_that_never_run_or_run_once_are_refused() {
    let (line, _, m) = refused(&mlp(
        "",
        "        Every(n: 5, offset: 5, steps: [EmptyCache]),",
    ));
    assert_eq!(line, 16);
    assert!(m.contains("never reached"), "{m}");
    let (line, _, m) = refused(&mlp("        Every(n: 2, steps: [EmptyCache]),", ""));
    assert_eq!(line, 7);
    assert!(m.contains("belongs in the loop"), "{m}");
    let (_, _, m) = refused(&mlp("", "        Every(n: 0, steps: [EmptyCache]),"));
    assert!(m.contains("n ≥ 1"), "{m}");
}

// ---------------------------------------------------------------- the built-ins

fn builtin(name: &str) -> RunResult {
    let (s, built) = resolve(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    run(&s, &built, &RunOptions::default())
}

#[test]
fn the_fragmentation_experiment_gets_a_new_segment_on_a_large_device() {
    let r = builtin("fragmentation-experiment");
    assert!(r.oom.is_none());
    // 20 segments of 20 MiB (five 4,000,256 B tensors each), the 100 MB
    // tensor's own 96 MiB segment (100,000,256 B rounded up to 2 MiB), the
    // Linear's 2 MiB small-pool segment.
    assert_eq!(r.peak_reserved, 20 * 20 * MIB + 96 * MIB + 2 * MIB);
    // Every block of the 100 tensors: 400 MiB exactly (the fifth in each
    // segment takes the unsplit rest), and the two 512 B blocks of the Linear.
    assert_eq!(r.peak_allocated, 400 * MIB + 1024);
    let end = r.per_iteration.last().expect("one iteration");
    assert_eq!(
        end.allocated,
        200 * MIB + 1024,
        "big deleted, 50 tensors left"
    );
}

#[test]
fn the_fragmentation_experiment_fails_where_the_segment_cannot_be_had() {
    let r = builtin("fragmentation-experiment-oom");
    let oom = r.oom.as_ref().expect("an OOM");
    assert_eq!(oom.iteration, 1);
    assert_eq!(oom.requested, 100_000_000);
    for part in [
        "Tried to allocate 96.00 MiB",
        // 450 MiB − 402 MiB reserved
        "of which 48.00 MiB is free",
        // 402 MiB reserved − 200 MiB + 1 KiB allocated
        "202.00 MiB is reserved by PyTorch but unallocated",
        "expandable_segments:True",
    ] {
        assert!(oom.message.contains(part), "{part}: {}", oom.message);
    }
    // No segment was fully free, so the allocator's own release before
    // raising (what empty_cache() would do) released nothing.
    assert_eq!(r.peak_reserved, 402 * MIB);
    assert_eq!(r.stats.reserved_bytes(), 402 * MIB);
}

#[test]
fn the_realistic_loop_leaks_through_its_dict_not_its_deque() {
    let r = builtin("loop-schedule-metrics");
    assert!(r.oom.is_none() && r.error.is_none());
    assert_eq!(r.iterations_run, 60);
    let roots: Vec<&str> = r.findings.iter().map(|f| f.root.as_str()).collect();
    assert_eq!(roots, ["history"], "the bounded deque is not a leak");
    let a: Vec<u64> = r.per_iteration.iter().map(|p| p.allocated).collect();
    let out = 256 * 10 * 4; // out [256, 10] fp32, kept detached each step
    let loss = 512; // a 0-dim fp32 loss's block
                    // Iterations 2–5: an output and a loss more (the deque fills); then an
                    // output only: the deque drops a loss for each it takes.
    for i in 1..5 {
        assert_eq!(a[i] - a[i - 1], out + loss, "iteration {}", i + 1);
    }
    for i in 5..60 {
        // Iteration 30 ends epoch 4 (6 batches each) with validation: vx [256, 784] fp32,
        // vy int64 [256], vout [256, 10] fp32 and `correct` (int64, 512 B)
        // stay bound after the `if` block, as Python names do.
        let validation = if i == 29 {
            256 * 784 * 4 + 256 * 8 + out + 512
        } else {
            0
        };
        assert_eq!(a[i] - a[i - 1], out + validation, "iteration {}", i + 1);
    }
}

#[test]
fn a_deque_still_filling_is_bounded_and_a_list_is_not() {
    // recent = deque(maxlen=100) vs recent = []; recent.append(out.detach())
    // for 20 iterations: both grow by one output per step so far, but the
    // deque stops at 100 by itself.
    let keep = "        Append(from: \"out\", list: \"recent\", what: Detach),";
    let deque = mlp("        NewDeque(name: \"recent\", maxlen: 100),", keep)
        .replace("iterations: 4", "iterations: 20");
    let list = mlp("", keep).replace("iterations: 4", "iterations: 20");
    let roots = |text: &str| -> Vec<String> {
        runs(text).findings.iter().map(|f| f.root.clone()).collect()
    };
    assert_eq!(roots(&list), ["recent"], "a list keeps every output");
    assert!(roots(&deque).is_empty(), "{:?}", roots(&deque));
}
