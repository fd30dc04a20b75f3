//! The loop's own Python: containers, schedules, the accuracy metric and the
//! hidden state as a name. Expected requests follow from CPython's reference
//! counting (a temporary dies when the expression that made it is done) and
//! the allocator's rules (512 B rounding, 20 MiB segments for requests under
//! 10 MiB, no split of a large-pool remainder of 1 MiB or less, 2 MiB
//! rounding above 10 MiB: CUDACachingAllocator.cpp's `round_size`,
//! `get_allocation_size` and `shouldSplit`), never from the engine's output.

use super::*;
use crate::engine::BatchAssign;
use crate::engine::{DType, DictKey, EngineConfig, EveryUnit, KeepWhat, Value};

const MIB: u64 = 1 << 20;

fn bare() -> Engine {
    Engine::bare(EngineConfig::default()).expect("engine")
}

/// Run `steps` as the setup (iteration 0), then return the requests the
/// step `last` makes.
fn requests_of(e: &mut Engine, before: Vec<Step>, last: Step) -> Vec<i64> {
    let mut setup = before;
    setup.push(last);
    let p = Program {
        setup,
        ..program(vec![Step::ResetPeakStats], 1)
    };
    let n = p.setup.len() - 1;
    for (i, s) in p.setup[..n].iter().enumerate() {
        e.run_step(s, i as u32, &p).expect("setup step");
    }
    e.take_events();
    e.run_step(&p.setup[n], n as u32, &p).expect("the step");
    requests(&e.take_events())
}

fn buffer(name: &str, bytes: u64) -> Step {
    Step::AllocateBuffer {
        name: s(name),
        shape: vec![bytes / 4],
        dtype: DType::F32,
        fill: crate::engine::Fill::Empty,
    }
}

fn count_correct(what: KeepWhat) -> Step {
    Step::CountCorrect {
        output: s("vout"),
        target: s("vy"),
        into: s("correct"),
        what,
    }
}

fn eval_batch() -> Vec<Step> {
    vec![
        Step::Eval {
            grad: crate::engine::GradContext::NoGrad,
        },
        Step::LoadBatch {
            x: s("vx"),
            y: s("vy"),
            assign: BatchAssign::Together,
        },
        Step::Forward {
            input: s("vx"),
            output: s("vout"),
            model: None,
        },
    ]
}

#[test]
fn count_correct_allocates_argmax_comparison_and_sum_then_adds() {
    // mlp-mnist, B = 256 (engine.md §10.1): out [256, 10] fp32, y int64 [256].
    let b = 256u64;
    // Requested bytes (the allocator rounds each to 512 B blocks).
    let argmax = (b * 8) as i64; // int64 [B]
    let eq = b as i64; // bool [B]
    let scalar = 8; // int64 0-dim
                    // `.sum()` of the bool comparison into int64 reads `eq.to(int64)`, made
                    // after the output and freed as the kernel returns (ReduceOpsUtils.h
                    // `make_reduction`; the H100 capture loop_schedule_metrics shows it).
    let cast = (b * 8) as i64;
    let mut e = engine(ModelConfig::mlp_mnist());
    let mut before = eval_batch();
    before.push(Step::Assign {
        name: s("correct"),
        value: 0,
    });
    // `correct = 0; correct += t`: int + tensor is Tensor.__radd__, a new
    // tensor; the sum dies after it.
    let first = requests_of(&mut e, before, count_correct(KeepWhat::Tensor));
    assert_eq!(
        first,
        [argmax, eq, -argmax, scalar, cast, -cast, -eq, scalar, -scalar],
        "argmax, ==, argmax freed, sum (and its int64 copy of ==), == freed, 0 + sum, sum freed"
    );
    assert!(matches!(e.binding("correct"), Some(Value::Tensor(_))));
    // Now `correct` is a tensor: `+=` is add_, in place.
    let second = requests_of(&mut e, eval_batch(), count_correct(KeepWhat::Tensor));
    assert_eq!(
        second,
        [argmax, eq, -argmax, scalar, cast, -cast, -eq, -scalar]
    );
}

#[test]
fn count_correct_with_item_keeps_a_number() {
    let b = 256u64;
    let (argmax, eq, scalar, cast) = ((b * 8) as i64, b as i64, 8, (b * 8) as i64);
    let mut e = engine(ModelConfig::mlp_mnist());
    let r = requests_of(&mut e, eval_batch(), count_correct(KeepWhat::Item));
    assert_eq!(r, [argmax, eq, -argmax, scalar, cast, -cast, -eq, -scalar]);
    assert!(matches!(e.binding("correct"), Some(Value::Float(_))));
}

#[test]
fn count_correct_refuses_shapes_that_do_not_broadcast() {
    // A GPT's logits [B, T, V]: argmax(1) is [B, V]; y [B, T] does not broadcast.
    let mut e = engine(ModelConfig::gpt_tiny());
    let mut steps = eval_batch();
    steps.push(count_correct(KeepWhat::Tensor));
    let err = run_program(&mut e, &program(steps, 1)).expect_err("a shape error");
    assert!(
        err.to_string().contains("must match the size of tensor b"),
        "{err}"
    );
}

#[test]
fn a_full_deque_drops_its_oldest_after_the_append() {
    let kib4 = 4096;
    let mut e = bare();
    let steps = vec![
        buffer("buf", kib4),
        Step::Append {
            from: s("buf"),
            list: s("recent"),
            what: KeepWhat::Tensor,
        },
    ];
    let p = Program {
        setup: vec![Step::NewDeque {
            name: s("recent"),
            maxlen: 2,
        }],
        ..program(steps, 4)
    };
    e.run_step(&p.setup[0], 0, &p).expect("deque");
    let mut held = Vec::new();
    let mut per_iteration = Vec::new();
    for _ in 0..4 {
        e.take_events();
        e.run_iteration(&p).expect("iteration");
        per_iteration.push(requests(&e.take_events()));
        held.push(e.allocated_bytes());
    }
    // buf is the newest element too: two buffers at most.
    assert_eq!(held, [kib4, 2 * kib4, 2 * kib4, 2 * kib4]);
    // Iteration 3: the new buffer first, then the oldest leaves the deque.
    assert_eq!(per_iteration[2], [kib4 as i64, -(kib4 as i64)]);
    let names: Vec<String> = e
        .held_state()
        .roots
        .iter()
        .map(|r| r.name.clone())
        .collect();
    assert!(names.contains(&s("recent[0]")) && names.contains(&s("recent[1]")));
    assert!(!names.contains(&s("recent[2]")), "{names:?}");
}

#[test]
fn a_dict_keyed_by_the_step_grows_and_a_fixed_key_is_replaced() {
    let kib4 = 4096;
    let run = |key: DictKey| {
        let mut e = bare();
        let steps = vec![
            buffer("out", kib4),
            Step::SetItem {
                dict: s("history"),
                key,
                from: s("out"),
                what: KeepWhat::Detach,
            },
        ];
        let p = Program {
            setup: vec![Step::NewDict { name: s("history") }],
            ..program(steps, 3)
        };
        run_program(&mut e, &p).expect("runs");
        let names: Vec<String> = e
            .held_state()
            .roots
            .iter()
            .map(|r| r.name.clone())
            .collect();
        (e.allocated_bytes(), names)
    };
    let (grown, names) = run(DictKey::Iteration);
    assert_eq!(
        grown,
        3 * kib4,
        "one output per step (the last also bound to out)"
    );
    for k in ["history[0]", "history[1]", "history[2]"] {
        assert!(names.contains(&s(k)), "{k} in {names:?}");
    }
    let (flat, names) = run(DictKey::Name(s("last")));
    assert_eq!(
        flat, kib4,
        "the entry is replaced: only the newest output lives"
    );
    assert!(names.contains(&s("history['last']")), "{names:?}");
}

#[test]
fn every_runs_on_its_schedule() {
    let count = |n: u32, offset: u32, unit: EveryUnit, epoch_len: u32, iterations: u32| {
        let mut e = bare();
        let steps = vec![Step::Every {
            n,
            offset,
            unit,
            steps: vec![
                buffer("b", 512),
                Step::Append {
                    from: s("b"),
                    list: s("seen"),
                    what: KeepWhat::Tensor,
                },
            ],
        }];
        let p = Program {
            epoch_len,
            ..program(steps, iterations)
        };
        run_program(&mut e, &p).expect("runs");
        match e.binding("seen") {
            Some(Value::List(l)) => l.len(),
            _ => 0,
        }
    };
    // `if it % 2 == 0` over it = 0..5: 0, 2, 4.
    assert_eq!(count(2, 0, EveryUnit::Iteration, 0, 5), 3);
    // `it % 3 == 2`: 2, 5.
    assert_eq!(count(3, 2, EveryUnit::Iteration, 0, 7), 2);
    // 4 epochs of 3 batches, `epoch % 2 == 1` after the epoch: epochs 1, 3.
    assert_eq!(count(2, 1, EveryUnit::Epoch, 3, 12), 2);
    // Every epoch of a one-epoch run: once, at the last iteration.
    assert_eq!(count(1, 0, EveryUnit::Epoch, 0, 4), 1);
}

#[test]
fn a_hundred_4mb_tensors_fill_twenty_segments_and_every_other_one_frees_200_mib() {
    // torch.randn(1000, 1000): 4,000,000 B, rounded to 512: 4,000,256 B.
    let t = round512(4_000_000);
    assert_eq!(t, 4_000_256);
    let segment = 20 * MIB; // kLargeBuffer: a request of 1–10 MiB
                            // Four splits leave 20 MiB − 4 t; a fifth leaves 970,240 B ≤ 1 MiB,
                            // which the large pool does not split off: the fifth takes it all.
    let fifth = segment - 4 * t;
    assert!(segment - 5 * t <= MIB);
    let mut e = bare();
    let p = Program {
        setup: vec![
            Step::AllocateBuffers {
                list: s("tensors"),
                count: 100,
                shape: vec![1000, 1000],
                dtype: DType::F32,
            },
            Step::DeleteEvery {
                list: s("tensors"),
                step: 2,
                offset: 0,
            },
        ],
        ..program(vec![buffer("big", 100_000_000)], 1)
    };
    e.run_step(&p.setup[0], 0, &p).expect("allocate");
    assert_eq!(e.reserved_bytes(), 20 * segment);
    assert_eq!(e.allocated_bytes(), 80 * t + 20 * fifth);
    e.take_events();
    e.run_step(&p.setup[1], 1, &p).expect("del tensors[::2]");
    // Fifty frees of the 4,000,000 B asked for, in index order. Even
    // indices: 0, 2, 4 of segment 0, 6, 8 of segment 1, …; ten of them (i %
    // 10 == 4) sit at a segment's end and free the larger fifth block.
    assert_eq!(requests(&e.take_events()), vec![-4_000_000; 50]);
    assert_eq!(e.allocated_bytes(), 40 * t + 10 * fifth);
    assert_eq!(40 * t + 10 * fifth, 200 * MIB);
    assert!(matches!(e.binding("tensors"), Some(Value::List(l)) if l.len() == 50));
    // 100,000,000 B: over 10 MiB, so a segment rounded up to 2 MiB, 96 MiB.
    e.run_iteration(&p)
        .expect("the big tensor fits on a large device");
    assert_eq!(e.reserved_bytes(), 20 * segment + 48 * 2 * MIB);
}

#[test]
fn the_hidden_state_can_be_kept_detached_and_appended() {
    let mut e = engine(ModelConfig::lstm_lm_ptb());
    let mut steps = vec![Step::CarryHidden {
        detach: true,
        part: Default::default(),
    }];
    steps.extend(train_steps());
    steps.push(Step::Append {
        from: s("hidden"),
        list: s("hs"),
        what: KeepWhat::Detach,
    });
    steps.push(Step::Keep {
        from: s("hidden"),
        into: s("h_last"),
        what: KeepWhat::Tensor,
    });
    run_program(&mut e, &program(steps, 3)).expect("trains");
    assert!(matches!(e.binding("h_last"), Some(Value::Pair(..))));
    let names: Vec<String> = e
        .held_state()
        .roots
        .iter()
        .map(|r| r.name.clone())
        .collect();
    for n in ["hs[0][0]", "hs[0][1]", "hs[2][1]"] {
        assert!(names.contains(&s(n)), "{n} in {names:?}");
    }
}

fn train_steps() -> Vec<Step> {
    let mut v = vec![Step::ZeroGrad {
        set_to_none: Some(true),
        optimizer: None,
    }];
    v.extend(forward_steps());
    v.push(Step::Backward {
        loss: s("loss"),
        retain_graph: false,
    });
    v.push(Step::OptimizerStep);
    v
}

#[test]
fn detaching_half_of_the_hidden_state_still_reaches_the_last_graph() {
    // hidden = (h.detach(), c): c's grad_fn is the last batch's LSTM, whose
    // saved tensors the last backward freed (§8.3), so the second backward
    // raises, as with no detach at all. Likewise with c detached and h not.
    for part in [crate::engine::HiddenPart::H, crate::engine::HiddenPart::C] {
        let mut e = engine(ModelConfig::lstm_lm_ptb());
        let mut steps = vec![Step::CarryHidden { detach: true, part }];
        steps.extend(train_steps());
        let p = program(steps, 2);
        e.run_iteration(&p).expect("iteration 1");
        let err = e.run_iteration(&p).expect_err("iteration 2");
        assert_eq!(
            err,
            crate::engine::EngineError::Runtime(crate::engine::BACKWARD_TWICE.into()),
            "{part:?}"
        );
    }
}
