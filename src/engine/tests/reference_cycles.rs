//! Reference cycles (`MakeCycle`, `GcCollect`): CPython frees an object when
//! its reference count reaches zero, which never happens inside a cycle, so
//! an unbound cycle keeps what it holds until the cyclic collector runs
//! (Modules/gcmodule.c). Expected requests follow from those rules and the
//! allocator's (a 4 MiB request is one 4 MiB block), not from the engine.

use super::*;
use crate::engine::BatchAssign;
use crate::engine::{DType, EngineConfig, KeepWhat, Value};

const MIB: i64 = 1 << 20;

fn bare() -> Engine {
    Engine::bare(EngineConfig::default()).expect("engine")
}

fn buffer(name: &str) -> Step {
    Step::AllocateBuffer {
        name: s(name),
        shape: vec![(MIB as u64)],
        dtype: DType::F32,
        fill: crate::engine::Fill::Empty,
    }
}

fn cycle(from: &str) -> Step {
    Step::MakeCycle {
        from: s(from),
        into: s("rec"),
        what: KeepWhat::Tensor,
    }
}

fn keep(from: &str) -> Step {
    Step::Keep {
        from: s(from),
        into: s("rec"),
        what: KeepWhat::Tensor,
    }
}

/// Run each step; the requests each one made.
fn run_each(steps: &[Step]) -> Vec<Vec<i64>> {
    let mut e = bare();
    let p = Program {
        setup: steps.to_vec(),
        ..program(vec![Step::ResetPeakStats], 1)
    };
    p.setup
        .iter()
        .enumerate()
        .map(|(i, st)| {
            e.take_events();
            e.run_step(st, i as u32, &p).expect("step");
            requests(&e.take_events())
        })
        .collect()
}

#[test]
fn an_unbound_cycle_keeps_its_tensor_until_gc_collect() {
    // a = empty(4 MiB); rec = {"a": a}; rec["self"] = rec; del a
    // b = empty(4 MiB); rec = {"b": b}; rec["self"] = rec; del b
    // del rec; gc.collect()
    let r = run_each(&[
        buffer("a"),
        cycle("a"),
        Step::Delete { name: s("a") },
        buffer("b"),
        cycle("b"),
        Step::Delete { name: s("b") },
        Step::Delete { name: s("rec") },
        Step::GcCollect,
    ]);
    assert_eq!(r[0], vec![4 * MIB]);
    assert!(r[1].is_empty(), "the record holds a, it allocates nothing");
    assert!(r[2].is_empty(), "del a: the record still holds it");
    // Rebinding rec: the first record is unreachable, its count is not zero.
    assert!(r[4].is_empty(), "{:?}", r[4]);
    assert!(r[5].is_empty());
    assert!(r[6].is_empty(), "del rec frees nothing either");
    // The collector frees both records, oldest first, and their tensors.
    assert_eq!(r[7], vec![-4 * MIB, -4 * MIB]);
}

#[test]
fn without_the_cycle_rebinding_frees_the_old_value_at_once() {
    // The same with rec = a (no self-reference): refcounting frees a at the
    // rebinding, and gc.collect() has nothing to do.
    let r = run_each(&[
        buffer("a"),
        keep("a"),
        Step::Delete { name: s("a") },
        buffer("b"),
        keep("b"),
        Step::GcCollect,
    ]);
    assert_eq!(r[4], vec![-4 * MIB]);
    assert!(r[5].is_empty());
}

#[test]
fn a_collected_cycle_leaves_the_live_binding_alone() {
    let mut e = bare();
    let p = Program {
        setup: vec![
            buffer("a"),
            cycle("a"),
            buffer("b"),
            cycle("b"),
            Step::GcCollect,
        ],
        ..program(vec![Step::ResetPeakStats], 1)
    };
    for (i, st) in p.setup.iter().enumerate() {
        e.run_step(st, i as u32, &p).expect("step");
    }
    // rec still refers to b's record, reachable: the collector keeps it.
    assert!(matches!(e.binding("rec"), Some(Value::Cycle { key, .. }) if key == "b"));
    let roots: Vec<String> = e.held_state().roots.into_iter().map(|r| r.name).collect();
    assert!(roots.iter().any(|n| n == "rec[\"b\"]"), "{roots:?}");
    assert!(
        !roots.iter().any(|n| n.contains("unreachable")),
        "{roots:?}"
    );
}

#[test]
fn a_cycle_holding_the_hidden_state_roots_both_tensors() {
    // rec = {"hidden": hidden}; rec["self"] = rec, after an LSTM forward.
    let mut e = engine(crate::engine::ModelConfig::lstm_lm_ptb());
    let p = program(
        vec![
            Step::LoadBatch {
                x: s("x"),
                y: s("y"),
                assign: BatchAssign::Together,
            },
            Step::Forward {
                input: s("x"),
                output: s("out"),
                model: None,
            },
            cycle("hidden"),
        ],
        1,
    );
    run_program(&mut e, &p).expect("runs");
    let roots: Vec<String> = e.held_state().roots.into_iter().map(|r| r.name).collect();
    for want in ["rec[\"hidden\"][0]", "rec[\"hidden\"][1]"] {
        assert!(roots.iter().any(|n| n == want), "{want} in {roots:?}");
    }
}

/// `x, y = next(batches)` makes both before the names let go of the last
/// batch; `x = ...` then `y = ...` lets go of each as its new one is made.
#[test]
fn a_batch_bound_in_turn_frees_each_old_tensor_before_the_next_is_made() {
    let second_load = |assign: BatchAssign| {
        let mut e = engine(crate::engine::ModelConfig::mlp_mnist());
        let load = Step::LoadBatch {
            x: s("x"),
            y: s("y"),
            assign,
        };
        let p = program(vec![load.clone()], 1);
        e.run_step(&load, 0, &p).expect("first batch");
        let first = requests(&e.take_events());
        e.run_step(&load, 0, &p).expect("second batch");
        (first, requests(&e.take_events()))
    };
    let (first, together) = second_load(BatchAssign::Together);
    // The first step also makes the model's parameters; the batch comes last.
    let [.., x, y] = first[..] else {
        panic!("the first batch makes x and y: {first:?}")
    };
    assert!(x > 0 && y > 0 && x != y, "{first:?}");
    assert_eq!(together, [x, y, -x, -y]);
    let (_, in_turn) = second_load(BatchAssign::InTurn);
    assert_eq!(in_turn, [x, -x, y, -y]);
}
