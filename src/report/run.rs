//! The headless report of a scenario run: `memory_summary()`, the timeline's
//! peaks, OOMs, narration, leak findings and the scenario's expectations.

use std::fmt::Write;

use serde_json::{json, Value};

use crate::alloc::format_size;
use crate::device::Kernel;
use crate::engine::estimate::{format_flops, format_ms};
use crate::scenario::{Conditions, ExpectationResult, GpuRun, RunResult, Scenario};

pub fn text(s: &Scenario, r: &RunResult, checks: &[ExpectationResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "scenario {}: {}", s.name, s.description);
    conditions_text(&mut out, &r.conditions, &s.alloc_conf);
    if let Some(g) = &r.gpu {
        gpu_text(&mut out, g);
    }
    let _ = writeln!(out, "{}", iterations_line(r));
    let _ = writeln!(
        out,
        "peak allocated {}, peak reserved {}",
        format_size(r.peak_allocated),
        format_size(r.peak_reserved)
    );
    if let Some(line) = compute_text(r) {
        let _ = writeln!(out, "{line}");
    }
    if !r.per_iteration.is_empty() {
        // The change column keeps small growth visible: 512 B an iteration
        // does not move a figure printed to 0.01 MiB.
        let _ = writeln!(out, "\n iter   allocated    reserved   allocated change");
        let mut last = None;
        for p in &r.per_iteration {
            let change = last.map_or(String::new(), |l: u64| {
                signed_bytes(p.allocated as i64 - l as i64)
            });
            last = Some(p.allocated);
            let _ = writeln!(
                out,
                "{:>5} {:>11} {:>11}   {change}",
                p.iteration,
                format_size(p.allocated),
                format_size(p.reserved)
            );
        }
    }
    if !r.narration.is_empty() {
        let _ = writeln!(out, "\nnarration:");
        for (iter, text) in &r.narration {
            let _ = writeln!(out, "  [iteration {iter}] {text}");
        }
    }
    if let Some(o) = &r.oom {
        let _ = writeln!(
            out,
            "\nOOM in iteration {}:\n  torch.OutOfMemoryError: {}",
            o.iteration, o.message
        );
        if let Some(a) = &o.answer {
            for line in a.lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
    if let Some(e) = &r.error {
        let _ = writeln!(out, "\nthe run stopped: {e}");
    }
    if !r.warnings.is_empty() {
        let _ = writeln!(out, "\nwarnings:");
        for w in &r.warnings {
            let _ = writeln!(out, "  {w}");
        }
    }
    kernels_text(&mut out, r);
    let _ = writeln!(out, "\nleaks:");
    match (
        r.findings.is_empty(),
        r.oom.as_ref().and_then(|o| o.answer.as_ref()),
    ) {
        (true, Some(a)) => {
            let _ = writeln!(
                out,
                "  nothing retained grows across iterations; at the OOM (above) the largest \
                 holder is {}",
                a.holders
                    .first()
                    .map_or("nothing on the GPU".to_string(), |h| format!(
                        "{} ({}, {})",
                        h.name,
                        format_size(h.bytes),
                        h.what
                    ))
            );
        }
        (true, None) if r.oom.is_some() => {
            // No engine to look at: the model itself did not fit.
            let _ = writeln!(
                out,
                "  the run ran out of memory building the model, before any step: what held the \
                 memory is the model's own parameters and buffers (`vramscope model` lists them)"
            );
        }
        (true, None) => {
            let _ = writeln!(out, "  none found");
        }
        _ => {}
    }
    for f in &r.findings {
        let _ = writeln!(
            out,
            "  [{}] {} — {}: {} held, {} per iteration over {} {}{}",
            f.severity.as_str(),
            f.root,
            f.kind.label(),
            format_size(f.bytes),
            format_size(f.growth_per_iter.max(0) as u64),
            f.iterations,
            if f.iterations == 1 {
                "iteration"
            } else {
                "iterations"
            },
            match (f.ran_out_at_iteration, f.full_at_iteration) {
                (Some(i), _) => format!("; the run ran out of memory at iteration {i}"),
                (None, Some(i)) => format!("; at this rate the device is full at iteration {i}"),
                (None, None) => String::new(),
            }
        );
        // Only a leak's path is a chain, each step reaching the next.
        match (f.path.is_empty(), f.kind.is_leak()) {
            (true, _) => {}
            (false, true) => {
                let _ = writeln!(out, "      path: {}", f.path.join(" → "));
            }
            (false, false) => {
                let _ = writeln!(out, "      seen: {}", f.path.join("; "));
            }
        }
        if !f.fix.is_empty() {
            let _ = writeln!(out, "      fix: {}", f.fix);
        }
        if !f.evidence.is_empty() {
            let _ = writeln!(out, "      evidence: {}", f.evidence);
        }
    }
    let _ = writeln!(out, "\n{}", r.summary);
    let _ = writeln!(out, "expectations:");
    for c in checks {
        let _ = writeln!(
            out,
            "  [{}] {} — {}",
            if c.passed { "ok" } else { "FAILED" },
            c.expectation,
            c.observed
        );
    }
    out
}

/// The estimated compute time of the last iteration, part by part.
pub fn compute_text(r: &RunResult) -> Option<String> {
    let (iteration, e) = r.compute_estimate()?;
    let parts: Vec<String> = e
        .parts
        .iter()
        .filter(|p| p.milliseconds >= 0.001)
        .map(|p| format!("{} {}", p.part, format_ms(p.milliseconds)))
        .collect();
    let recompute = if e.recompute_share > 0.0 {
        format!(
            "; recomputing checkpointed layers is {:.0}% of the FLOPs",
            e.recompute_share * 100.0
        )
    } else {
        String::new()
    };
    let kinds = match e.kinds.as_slice() {
        [] | [_] => String::new(),
        many => format!(
            " ({})",
            many.iter()
                .map(|k| format!("{} {}", k.kind, format_flops(k.flops)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Some(format!(
        "compute time, iteration {iteration}: ~{} on {} ({}: {}{kinds}, {} moved{recompute}) — {}",
        format_ms(e.milliseconds),
        e.gpu,
        parts.join(", "),
        format_flops(e.flops),
        format_size(e.bytes),
        e.label
    ))
}

/// How far the run got: an OOM or error stops it part-way through an
/// iteration, which is not counted as run.
fn iterations_line(r: &RunResult) -> String {
    let done = r.iterations_run;
    match (&r.oom, &r.error) {
        (Some(o), _) => format!(
            "iterations completed: {done}; the OOM stopped the run in iteration {}",
            o.iteration
        ),
        (None, Some(_)) => format!("iterations completed: {done}; then the run stopped (below)"),
        (None, None) => format!("iterations run: {done}"),
    }
}

/// A signed byte count, exact below 1 MiB (`+512 B`), else as `format_size`.
fn signed_bytes(delta: i64) -> String {
    let sign = if delta < 0 { "-" } else { "+" };
    let n = delta.unsigned_abs();
    if n < 1 << 20 {
        format!("{sign}{} B", crate::units::format_count(n))
    } else {
        format!("{sign}{}", format_size(n))
    }
}

pub fn json(r: &RunResult, checks: &[ExpectationResult]) -> Value {
    let leaks: Vec<Value> = r
        .findings
        .iter()
        .map(|f| {
            json!({
                "root": f.root, "kind": f.kind.as_str(), "is_leak": f.kind.is_leak(), "bytes": f.bytes, "growth_per_iter": f.growth_per_iter,
                "iterations": f.iterations, "path": f.path, "fix": f.fix, "severity": f.severity,
                "evidence": f.evidence, "full_at_iteration": f.full_at_iteration,
                "ran_out_at_iteration": f.ran_out_at_iteration,
            })
        })
        .collect();
    json!({
        "scenario": r.scenario,
        "iterations_run": r.iterations_run,
        "peak_allocated": r.peak_allocated,
        "peak_reserved": r.peak_reserved,
        "oom": r.oom,
        "error": r.error,
        "warnings": r.warnings,
        "leaks": leaks,
        "stats": r.stats.to_map(false),
        "per_iteration": r.per_iteration,
        "narration": r.narration,
        "expectations": checks,
        "kernels": kernels_json(r),
        "gpu": r.gpu,
        "conditions": r.conditions,
        "compute_estimate": r.compute_estimate().map(|(iteration, e)| json!({"iteration": iteration, "estimate": e})),
    })
}

/// What the run was under: the device and its GPU profile, the release's
/// rules, the environment, and the capture it is checked against.
fn conditions_text(out: &mut String, c: &Conditions, alloc_conf: &str) {
    let held = if c.overhead > 0 {
        format!(
            "{}, {} of it not the allocator's",
            format_size(c.capacity),
            format_size(c.overhead)
        )
    } else {
        format_size(c.capacity)
    };
    let _ = writeln!(out, "device {} ({held})", c.device_name);
    match &c.gpu {
        Some(g) => {
            let _ = writeln!(
                out,
                "GPU profile {}: {}, {} SMs × {} threads; {} memory",
                g.name,
                g.arch.name(),
                g.sm_count,
                g.max_threads_per_sm,
                if g.memory_measured {
                    "measured"
                } else {
                    "nominal (vendor)"
                }
            );
        }
        None => {
            let _ = writeln!(
                out,
                "no GPU profile: sm_80 rules, reductions take no scratch"
            );
        }
    }
    let env: Vec<String> = c.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(
        out,
        "PyTorch {} rules{}; PYTORCH_CUDA_ALLOC_CONF=\"{alloc_conf}\"{}",
        c.torch,
        match &c.transformers {
            Some(t) => format!(
                ", transformers {}'s {}",
                crate::units::escape_controls(t),
                transformers_scope(t)
            ),
            None => String::new(),
        },
        if env.is_empty() {
            String::new()
        } else {
            format!("; {}", env.join(" "))
        }
    );
    if !c.stated_engine.is_empty() {
        let _ = writeln!(
            out,
            "engine settings the scenario states: {}",
            c.stated_engine.join("; ")
        );
    }
    for a in &c.assumptions {
        let _ = writeln!(out, "data-dependent, as the scenario states it: {a}");
    }
    let _ = writeln!(out, "{}", c.verification());
}

/// The card a CUDA run ran on, and NVML's reading against the model's.
fn gpu_text(out: &mut String, g: &GpuRun) {
    let held = match g.held_to {
        Some(cap) => format!(
            "; the allocator is held to the scenario's {} device",
            format_size(cap)
        ),
        None => String::new(),
    };
    let _ = writeln!(
        out,
        "run on {} ({}){held}",
        g.device,
        format_size(g.device_total)
    );
    let known = |v: Option<u64>| v.map_or_else(|| "unknown".to_string(), format_size);
    let a = &g.at_end;
    let _ = writeln!(
        out,
        "NVML at the end: this process uses {} = CUDA context {} + allocator reserved {} + other {}",
        known(a.nvml_used),
        known(a.context),
        known(a.reserved),
        known(a.other)
    );
}

/// Kernel launches of a CUDA run, per kernel, and the failures.
fn kernels_text(out: &mut String, r: &RunResult) {
    if let Some(why) = &r.kernels_unavailable {
        let _ = writeln!(out, "\nkernels: none launched: {why}");
    }
    let Some(k) = &r.kernels else { return };
    let per: Vec<String> = Kernel::ALL
        .iter()
        .map(|&kernel| format!("{} {}", kernel.name(), k.count(kernel)))
        .collect();
    let _ = writeln!(
        out,
        "\nkernels: {} launched ({}), {} failed",
        k.total(),
        per.join(", "),
        k.failed
    );
    if let Some(e) = &k.first_error {
        let _ = writeln!(out, "  first failure: {e}");
    }
}

fn kernels_json(r: &RunResult) -> Value {
    match (&r.kernels, &r.kernels_unavailable) {
        (Some(k), _) => {
            let launched: serde_json::Map<String, Value> = Kernel::ALL
                .iter()
                .map(|&kernel| (kernel.name().to_string(), json!(k.count(kernel))))
                .collect();
            json!({
                "launched": launched, "total": k.total(), "failed": k.failed,
                "first_error": k.first_error,
            })
        }
        (None, Some(why)) => json!({ "unavailable": why }),
        (None, None) => Value::Null,
    }
}

/// What a named transformers release decides in the engine: 4.x its
/// attention's k/v path; 5.x also how a 4-bit model loads and what the
/// model's forward makes before its layers (`engine::hf_load`, `hf_v5`).
fn transformers_scope(t: &str) -> &'static str {
    use crate::engine::config::TransformersVersion;
    match t.parse::<TransformersVersion>() {
        Ok(v) if v >= TransformersVersion::FIVE => {
            "attention, from_pretrained's 4-bit loading and model forward"
        }
        _ => "attention",
    }
}
