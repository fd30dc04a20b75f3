//! The findings as JSON (report, TUI export) and as headless text.

use serde_json::{json, Value};

use super::finding::{Finding, FindingKind};
use super::format::signed_size;
use crate::alloc::format_size;

/// `[{"root","kind","bytes","growth_per_iter","iterations","path":[…],"fix","severity", …}, …]`.
pub fn findings_json(findings: &[Finding]) -> Value {
    Value::Array(
        findings
            .iter()
            .map(|f| {
                let cats: serde_json::Map<String, Value> = f
                    .by_category
                    .iter()
                    .map(|(k, v)| ((*k).to_string(), json!(v)))
                    .collect();
                json!({
                    "root": f.root,
                    "kind": f.kind.as_str(),
                    "is_leak": f.kind.is_leak(),
                    "bytes": f.bytes,
                    "growth_per_iter": f.growth_per_iter,
                    "iterations": f.iterations,
                    "path": f.path,
                    "fix": f.fix,
                    "severity": f.severity.as_str(),
                    "evidence": f.evidence,
                    "full_at_iteration": f.full_at_iteration,
                    "ran_out_at_iteration": f.ran_out_at_iteration,
                    "by_category": cats,
                    "blocks": f.blocks.len(),
                })
            })
            .collect(),
    )
}

fn headline(kind: FindingKind) -> &'static str {
    match kind {
        FindingKind::RetainedGraphGpu => "retained autograd graph on the GPU — leak",
        FindingKind::RetainedGraphHost => {
            "graphs retained on the host — a leak of host memory; GPU flat"
        }
        FindingKind::StoredTensors => {
            "stored tensors on the GPU — a growing container, not a graph"
        }
        FindingKind::CarriedHiddenState => {
            "hidden state carried across iterations — chains their graphs"
        }
        FindingKind::CacheFragmentation => "allocator cache grows (fragmentation) — not a leak",
        FindingKind::OneOffPeak => "one-off peak — not a leak",
        FindingKind::MissingZeroGrad => "gradients never zeroed — values wrong, memory flat",
        FindingKind::SurvivingAllocations => {
            "allocations survive iteration boundaries and accumulate"
        }
        FindingKind::StaleAutocastCache => {
            "autocast's weight cache kept across steps — stale weights, memory flat"
        }
        FindingKind::StaleOptimizerParams => {
            "an old model's parameters kept by the optimizer — a leak of one model, never stepped"
        }
        FindingKind::StrayGradients => {
            "a second model's gradients, which no optimizer zeroes or steps — held, and summed"
        }
        FindingKind::GrowingHolder => "a Python name holds what grew — where to look",
        FindingKind::PythonHolder => "held by a Python name",
    }
}

/// The headless report's leak section.
pub fn findings_text(findings: &[Finding]) -> String {
    if findings.is_empty() {
        return "Leak detector: no finding — nothing retained grows across iterations.\n".into();
    }
    let leaks = findings.iter().filter(|f| f.kind.is_leak()).count();
    let mut out = format!(
        "Leak detector: {} finding(s), {} of them leak(s)\n",
        findings.len(),
        leaks
    );
    for f in findings {
        out.push_str(&format!(
            "\n[{}] {} — {}\n",
            f.severity.as_str().to_uppercase(),
            f.root,
            headline(f.kind)
        ));
        let mut line = format!("  holds {}", format_size(f.bytes));
        if f.growth_per_iter != 0 {
            line.push_str(&format!(
                ", {} per iteration",
                signed_size(f.growth_per_iter)
            ));
        }
        if f.iterations > 0 {
            line.push_str(&format!(
                ", spans {}",
                crate::units::counted(f.iterations, "iteration")
            ));
        }
        if let Some(n) = f.ran_out_at_iteration {
            line.push_str(&format!("; the run ran out of memory at iteration {n}"));
        } else if let Some(n) = f.full_at_iteration {
            line.push_str(&format!(
                "; at this rate the device is full at iteration {n}"
            ));
        }
        out.push_str(&line);
        out.push('\n');
        if !f.path.is_empty() && f.kind.is_leak() {
            out.push_str(&format!("  path: {}\n", f.path.join(" → ")));
        } else if !f.path.is_empty() {
            out.push_str(&format!("  seen: {}\n", f.path.join("; ")));
        }
        if !f.by_category.is_empty() {
            let cats: Vec<String> = f
                .by_category
                .iter()
                .map(|(k, v)| format!("{k} {}", format_size(*v)))
                .collect();
            out.push_str(&format!("  by category: {}\n", cats.join(", ")));
        }
        if !f.evidence.is_empty() {
            out.push_str(&format!("  evidence: {}\n", f.evidence));
        }
        if !f.fix.is_empty() {
            out.push_str(&format!("  fix: {}\n", f.fix));
        }
    }
    out
}
