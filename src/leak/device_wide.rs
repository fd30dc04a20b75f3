//! The detector's device-wide findings, beside the per-group ones
//! (classify.rs): fragmentation, a missing `zero_grad`, a one-off peak and
//! buffers rebound while still bound.

use super::detector::{Detector, GroupKind, IterationSample, MIN_GROWTH_STEPS, NONE};
use super::finding::{Finding, FindingKind, Severity};
use super::fix;
use super::reach::{lookup, Ctx, GroupAcc};
use crate::alloc::format_size;
use crate::engine::DeviceKind;

impl Detector {
    pub(super) fn fragmentation(&self, gpu_leak: bool) -> Option<Finding> {
        if gpu_leak || self.iterations.len() < MIN_GROWTH_STEPS + 1 {
            return None;
        }
        let v: Vec<&IterationSample> = self.iterations.iter().collect();
        // Skip iteration 1 (and setup): first-iteration state is not drift.
        let w: Vec<&IterationSample> = v.iter().copied().filter(|s| s.iteration >= 2).collect();
        if w.len() < MIN_GROWTH_STEPS + 1 {
            return None;
        }
        let ups = w
            .windows(2)
            .filter(|p| p[1].reserved > p[0].reserved)
            .count();
        let (first, last) = (w[0], w[w.len() - 1]);
        let r_growth = last.reserved.saturating_sub(first.reserved);
        let a_min = w.iter().map(|s| s.allocated).min().unwrap_or(0);
        let a_max = w.iter().map(|s| s.allocated).max().unwrap_or(0);
        let a_drift = a_max - a_min;
        let gap_first = first.reserved.saturating_sub(first.allocated);
        let gap_last = last.reserved.saturating_sub(last.allocated);
        // Reserved moves in steps (a new largest shape), not every iteration.
        // One rise counts when it is a quarter of what was reserved.
        let one_big_rise = ups == 1 && r_growth * 4 >= first.reserved;
        if (ups < 2 && !one_big_rise)
            || r_growth == 0
            || a_drift * 4 > r_growth
            || gap_last <= gap_first
        {
            return None;
        }
        // Reserved that follows a growing peak is the cache holding what the
        // largest step needs, not fragmentation: what counts is reserved
        // beyond the peak ever allocated, and it must account for a good part
        // of the growth.
        let waste_first = first.reserved.saturating_sub(first.peak_allocated);
        let waste_last = last.reserved.saturating_sub(last.peak_allocated);
        if waste_last.saturating_sub(waste_first) * 4 < r_growth {
            return None;
        }
        let n = (last.iteration - first.iteration).max(1) as i64;
        let mut f = Finding::new("allocator cache", FindingKind::CacheFragmentation);
        f.bytes = gap_last;
        f.growth_per_iter = r_growth as i64 / n;
        f.iterations = last.iteration - first.iteration + 1;
        f.path = vec![
            format!(
                "reserved {} → {}",
                format_size(first.reserved),
                format_size(last.reserved)
            ),
            format!(
                "allocated {}..{} (flat)",
                format_size(a_min),
                format_size(a_max)
            ),
            format!(
                "peak allocated {}: {} reserved beyond it",
                format_size(last.peak_allocated),
                format_size(waste_last)
            ),
            format!("reserved but unallocated {}", format_size(gap_last)),
        ];
        f.fix = fix::EXPANDABLE.into();
        f.evidence = format!(
            "Reserved grew in {ups} of {} iterations (+{} in total) while allocated at iteration end moved \
             by at most {}: cached free blocks of the wrong sizes, not a leak — no tensor is retained.",
            w.len() - 1,
            format_size(r_growth),
            format_size(a_drift),
        );
        f.severity = if self.capacity > 0 && last.reserved * 10 > self.capacity * 9 {
            Severity::Warning
        } else {
            Severity::Info
        };
        Some(f)
    }

    pub(super) fn missing_zero_grad(&self) -> Option<Finding> {
        let streak = self.grad_persist_streak as usize;
        if streak < MIN_GROWTH_STEPS {
            return None;
        }
        let known = self.facts.known;
        if known && (self.facts.has_zero_grad || !self.facts.has_backward) {
            return None;
        }
        let mut f = Finding::new("gradients", FindingKind::MissingZeroGrad);
        f.bytes = self.grad_bytes;
        f.growth_per_iter = 0;
        f.iterations = streak as u32;
        f.blocks = self.grad_blocks.clone();
        f.by_category = vec![("gradient", self.grad_bytes)];
        f.path = vec![
            format!("every param.grad is the same storage for {streak} iterations"),
            "each backward adds into it in place".into(),
        ];
        if known {
            f.fix = fix::ZERO_GRAD.into();
            f.severity = Severity::Warning;
            f.evidence = format!(
                "The program calls backward() every iteration but never zero_grad(): the {} of .grad \
                 storages have persisted for {streak} iterations and every backward adds into them in \
                 place. Memory stays flat; the gradients are summed over iterations, so the values \
                 are wrong.",
                format_size(self.grad_bytes)
            );
        } else {
            f.severity = Severity::Info;
            f.evidence = format!(
                "Every .grad storage ({}) has persisted unchanged for {streak} iterations. Either \
                 zero_grad() is never called (gradients summed: wrong values, memory flat) or it is \
                 called with set_to_none=False; the live state alone cannot tell which (the engine does \
                 not expose when a grad was last zeroed).",
                format_size(self.grad_bytes)
            );
        }
        Some(f)
    }

    pub(super) fn one_off_peak(&self, ctx: &Ctx, accs: &[GroupAcc]) -> Option<Finding> {
        if !(self.facts.known && self.facts.eval_with_grad)
            || self.iterations.len() < MIN_GROWTH_STEPS
        {
            return None;
        }
        // The graph variables hold at iteration end, shared or not.
        let ls = ctx.ls;
        let mut names = Vec::new();
        let mut bytes = 0;
        let mut blocks = Vec::new();
        let mut seen = vec![false; ls.storages.len()];
        for acc in accs.iter().filter(|a| a.kind == GroupKind::Variable) {
            let mut any = false;
            for &ri in &acc.roots {
                for s in &ls.roots[ri].saved_storages {
                    let p = lookup(ctx.spos, s.0);
                    if p == NONE || seen[p as usize] {
                        continue;
                    }
                    let st = &ls.storages[p as usize];
                    if st.device != DeviceKind::Cuda || st.tensor_refs > 0 || st.engine_held {
                        continue;
                    }
                    seen[p as usize] = true;
                    any = true;
                    bytes += st.block;
                    if let Some(a) = st.addr {
                        blocks.push(a);
                    }
                }
            }
            if any {
                names.push(acc.name);
            }
        }
        if bytes == 0 {
            return None;
        }
        let mut f = Finding::new(names.join(", "), FindingKind::OneOffPeak);
        f.bytes = bytes;
        f.iterations = 1;
        f.blocks = blocks;
        f.by_category = vec![("autograd_saved", bytes)];
        f.path = names
            .iter()
            .map(|n| {
                format!(
                    "`{n}` holds the saved tensors of iteration {}",
                    ls.iteration
                )
            })
            .collect();
        f.fix = fix::no_grad_eval(&self.facts);
        f.evidence = format!(
            "Evaluation runs with grad enabled: {} of saved tensors stay alive through `{}` until the next \
             forward rebinds them, so the peak is about two iterations' activations. Flat across \
             iterations: a higher peak, not a leak (model.eval() alone still records the graph).",
            format_size(bytes),
            names.join("`, `"),
        );
        f.severity = Severity::Info;
        Some(f)
    }
    /// `buf = torch.empty(...)` in the loop while `buf` still
    /// holds the last one. Python builds the new buffer before the
    /// assignment drops the old: two are alive at that moment, every
    /// iteration. A higher peak, not a leak.
    pub(super) fn rebound_buffer_peaks(&self, ctx: &Ctx) -> Vec<Finding> {
        if !self.facts.known || self.iterations.len() < MIN_GROWTH_STEPS {
            return Vec::new();
        }
        let ls = ctx.ls;
        let variables: rustc_hash::FxHashMap<&str, &crate::engine::RootInfo> = ls
            .roots
            .iter()
            .filter(|r| matches!(r.kind, crate::engine::RootKind::Variable))
            .map(|r| (r.name.as_str(), r))
            .rev() // the first root of a name wins, as a search from the front found it
            .collect();
        let mut out = Vec::new();
        for name in &self.facts.rebound_buffers {
            let Some(root) = variables.get(name.as_str()) else {
                continue;
            };
            if root.device != DeviceKind::Cuda {
                continue;
            }
            let p = lookup(ctx.spos, root.storage.0);
            let storage = (p != NONE).then(|| &ls.storages[p as usize]);
            let bytes = storage.map_or(0, |s| s.block);
            let mut f = Finding::new(name.clone(), FindingKind::OneOffPeak);
            f.bytes = bytes;
            f.iterations = 1;
            if let Some(s) = storage {
                f.blocks.extend(s.addr);
            }
            f.by_category = vec![("temporary", bytes)];
            f.path = vec![
                format!("{name} = torch.empty(...)  # in the loop"),
                format!("the previous {name} ({}) still bound", format_size(bytes)),
            ];
            f.fix = fix::rebound_buffer(name);
            f.evidence = format!(
                "Each iteration creates a new `{name}` while the last one is still bound: for a \
                 moment both are alive, {} more at the peak. Flat across iterations: a higher peak, \
                 not a leak (or allocate it once before the loop).",
                format_size(bytes)
            );
            f.severity = Severity::Info;
            out.push(f);
        }
        merge_beyond(out, LISTED_REBOUND)
    }
}

/// Rebound buffers named one finding each; past this many, the rest are one
/// finding together (a program can rebind thousands of names).
const LISTED_REBOUND: usize = 20;

/// `findings` with everything from the `keep`-th on merged into its last
/// one: the bytes summed, the roots counted, the blocks kept.
fn merge_beyond(mut findings: Vec<Finding>, keep: usize) -> Vec<Finding> {
    if findings.len() <= keep {
        return findings;
    }
    let rest = findings.split_off(keep - 1);
    let first = rest[0].root.clone();
    let mut merged = rest[0].clone();
    merged.root = format!(
        "{first} and {} more",
        crate::units::format_count(rest.len() as u64 - 1)
    );
    merged.bytes = rest.iter().map(|f| f.bytes).sum();
    merged.blocks = rest.iter().flat_map(|f| f.blocks.iter().copied()).collect();
    merged.by_category = vec![("temporary", merged.bytes)];
    merged.path = vec![format!(
        "{} names each rebound every iteration while still bound: {first}, {}, …",
        crate::units::format_count(rest.len() as u64),
        rest[1].root
    )];
    merged.fix =
        format!("del {first}  # and each of the others, before re-creating it in the loop");
    merged.evidence = format!(
        "{} buffers are each created anew every iteration while the last one is still \
         bound: {} more at the peak in all. Flat across iterations: a higher peak, not a leak.",
        crate::units::format_count(rest.len() as u64),
        format_size(merged.bytes)
    );
    findings.push(merged);
    findings
}
