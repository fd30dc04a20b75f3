//! The H100 driver's segment layout (docs/driver_addresses.md): every
//! capture's own requests and frees, in its order, through the allocator on
//! a simulated device laid out in request order and on one laid out by the
//! H100 rule (`Placement::H100Driver`), each judged against what PyTorch
//! measured on the H100 (the capture's JSON): the peaks, every iteration
//! end, the OOM. Only the addresses differ between the two replays, so what
//! changes is what the driver's layout decides.

use std::collections::HashMap;
use std::path::Path;

use vramscope::alloc::{Action, CachingAllocator, Tag};
use vramscope::device::{Device, Placement, SimDevice};
use vramscope::trace::replay::from_snapshot;
use vramscope::trace::snapshot::import_file;

use crate::harness::{captured, meta, u64_field};

/// What PyTorch reports: the peaks, allocated / reserved / the running peak
/// at each iteration's end, and whether the run met an OOM.
#[derive(Debug, PartialEq)]
struct Figures {
    peak_allocated: u64,
    peak_reserved: u64,
    ends: Vec<(u64, u64, u64)>,
    oom: bool,
}

fn programs() -> Vec<String> {
    let dir = captured("any", "pickle");
    let dir = dir.parent().expect("the captures' folder");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("the captures' folder reads")
        .filter_map(|e| {
            let p = e.ok()?.path();
            let stem = p.file_stem()?.to_str()?.to_string();
            (p.extension()? == "pickle").then_some(stem)
        })
        .collect();
    names.sort();
    names
}

fn measured(stem: &str) -> Figures {
    let m = meta(stem);
    Figures {
        peak_allocated: u64_field(&m, "max_memory_allocated"),
        peak_reserved: u64_field(&m, "max_memory_reserved"),
        ends: m["per_iteration"]
            .as_array()
            .expect("per_iteration")
            .iter()
            .map(|p| {
                (
                    u64_field(p, "allocated"),
                    u64_field(p, "reserved"),
                    u64_field(p, "peak_allocated"),
                )
            })
            .collect(),
        oom: !m["oom"].is_null(),
    }
}

/// The capture's requests on a device of its budget laid out by `placement`,
/// held to the run's memory fraction. Iterations end where the program's
/// next `iteration N` annotation starts; a program with none (the token LM
/// loop, the LoRA fine-tune) is judged on its peaks and OOM alone.
fn replayed(stem: &str, placement: Placement) -> Figures {
    let snap = import_file(&captured(stem, "pickle")).expect("imports");
    let entries = from_snapshot::entries(&snap, 0);
    let trace = &snap.device_traces[0];
    let starts: Vec<i64> = snap
        .external_annotations
        .iter()
        .filter(|a| &*a.stage == "START" && a.name.starts_with("iteration "))
        .map(|a| a.time_us)
        .collect();
    let m = meta(stem);
    let device = SimDevice::new("replay", u64_field(&m, "budget_bytes"), 0).placed(placement);
    let mut a = CachingAllocator::new(device, from_snapshot::config(&snap));
    if let Some(allowed) = m["allowed_memory_maximum"].as_u64() {
        a.set_allowed_memory(allowed);
    }
    let end = |a: &CachingAllocator<SimDevice>| {
        let s = a.stats();
        (
            s.allocated_bytes(),
            s.reserved_bytes(),
            s.peak_allocated_bytes(),
        )
    };
    // The program's kernels start at its first request not made by a
    // module's `.to()` (read from its stacks, as the trace tells the device).
    let mut ours: HashMap<u64, u64> = HashMap::new();
    let (mut ends, mut oom, mut next, mut emptying) = (Vec::new(), false, 1, false);
    let mut kernels = false;
    for (e, t) in entries.iter().zip(trace) {
        if !kernels && e.starts_kernels() {
            kernels = true;
            a.device_mut().kernels_started();
        }
        if let Some(at) = t.time_us() {
            while next < starts.len() && at >= starts[next] {
                ends.push(end(&a));
                next += 1;
            }
        }
        // An explicit empty_cache() shows as a run of segment frees.
        let empties = e.action == Action::SegmentFree && e.in_empty_cache;
        if empties && !emptying {
            a.empty_cache();
        }
        emptying = empties;
        match e.action {
            Action::Alloc | Action::Oom => match a.malloc(e.size, e.stream, Tag(0)) {
                Ok(addr) if e.action == Action::Alloc => {
                    ours.insert(e.addr, addr);
                }
                Ok(addr) => {
                    a.free(addr).expect("frees");
                }
                Err(_) => oom = true,
            },
            Action::FreeRequested => {
                if let Some(addr) = ours.remove(&e.addr) {
                    a.free(addr).expect("frees");
                }
            }
            _ => {}
        }
    }
    ends.push(end(&a));
    let s = a.stats();
    let ends = if starts.is_empty() { Vec::new() } else { ends };
    Figures {
        peak_allocated: s.peak_allocated_bytes(),
        peak_reserved: s.peak_reserved_bytes(),
        ends,
        oom,
    }
}

/// The replay meets every figure PyTorch measured: the peaks, the OOM, and
/// each iteration end where the replay could cut iterations.
fn meets(real: &Figures, mut ours: Figures) -> bool {
    // A run that stopped early ended fewer iterations than the replay.
    ours.ends.truncate(real.ends.len());
    let ends = ours.ends.is_empty() || ours.ends == real.ends;
    ends && (ours.peak_allocated, ours.peak_reserved, ours.oom)
        == (real.peak_allocated, real.peak_reserved, real.oom)
}

struct Verdicts {
    /// (program, exact in request order, exact under the H100 rule)
    each: Vec<(String, bool, bool)>,
}

fn verdicts() -> Verdicts {
    let each = programs()
        .into_iter()
        .map(|p| {
            let real = measured(&p);
            let exact = |placement| meets(&real, replayed(&p, placement));
            let in_order = exact(Placement::InOrder);
            let rule = exact(Placement::H100Driver);
            (p, in_order, rule)
        })
        .collect();
    Verdicts { each }
}

#[test]
fn the_h100_rule_makes_more_captures_exact_than_request_order() {
    let v = verdicts();
    let count = |f: fn(&(String, bool, bool)) -> bool| v.each.iter().filter(|e| f(e)).count();
    let names = |f: fn(&(String, bool, bool)) -> bool| -> Vec<&str> {
        v.each
            .iter()
            .filter(|e| f(e))
            .map(|e| e.0.as_str())
            .collect()
    };
    let (order, rule) = (count(|e| e.1), count(|e| e.2));
    println!(
        "{} programs: exact in request order {order}, under the H100 rule {rule}",
        v.each.len()
    );
    // Derived on the even programs (name order), judged on the odd too.
    let held_out = |pick: fn(&(String, bool, bool)) -> bool| {
        v.each.iter().skip(1).step_by(2).filter(|e| pick(e)).count()
    };
    println!(
        "the held-out half (odd programs): {} in request order, {} under the rule",
        held_out(|e| e.1),
        held_out(|e| e.2)
    );
    assert!(
        held_out(|e| e.2) > held_out(|e| e.1),
        "the held-out half: {} under the rule, {} in request order",
        held_out(|e| e.2),
        held_out(|e| e.1)
    );
    assert!(
        rule > order,
        "{rule} exact under the rule, {order} in order"
    );
    assert_eq!(
        names(|e| e.2 && !e.1),
        [
            "adam_first_step_oom_bug",
            "adamw_forloop",
            "adamw_fused",
            "amp_bf16",
            "amp_fp16",
            "amp_fp16_math",
            "amp_fp16_overflow",
            "amp_fp32",
            "attention_math_fallback",
            "bf16_model",
            "checkpoint_none",
            "checkpoint_reentrant_frozen_fixed",
            "checkpoint_sqrt_segments",
            "clip_grad_norm",
            "default_workspaces",
            "gpt_dropout",
            "grad_accum_fixed",
            "loop_schedule_metrics",
            "moe_small",
            "resnet18_train",
            "resnet50_batch_sweep",
            "resnet50_sum",
            "sdpa_default_fp16",
            "sdpa_default_fp32",
        ],
        "made exact by the rule (docs/driver_addresses.md)"
    );
    assert_eq!(
        names(|e| e.1 && !e.2),
        ["reference_cycle_bug", "reference_cycle_gc"],
        "exact in request order only: the rule's known misses (the held range \
         opens two segments later in these captures than at their first kernel)"
    );
}

/// The replay itself (its iteration cuts, OOMs, `empty_cache()` and memory
/// limit) meets PyTorch's figures: small programs are exact on either
/// layout, so what the test above finds apart is the layout.
#[test]
fn small_programs_meet_every_figure_on_either_layout() {
    for stem in ["zero_grad_fixed", "fragmentation_oom_bug", "cuda_context"] {
        assert!(Path::new(&captured(stem, "pickle")).exists());
        let real = measured(stem);
        for placement in [Placement::InOrder, Placement::H100Driver] {
            let mut ours = replayed(stem, placement);
            assert!(!ours.ends.is_empty(), "{stem}: iterations cut");
            ours.ends.truncate(real.ends.len());
            assert_eq!(ours, real, "{stem} laid out {placement:?}");
        }
    }
}
