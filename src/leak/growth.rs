//! Growth that does not come every iteration: in steps (every k
//! iterations, once an epoch), within one iteration (a container filled by
//! an inner loop until the memory ran out), and into a bounded container
//! whose bound does not fit in the memory. Each is a finding with the
//! evidence in numbers; `classify.rs` decides which applies.

use super::classify::{categories, Periodic};
use super::detector::{Detector, GroupHistory, GroupSample, NONE};
use super::finding::{Finding, FindingKind, Severity};
use super::fix;
use super::format::signed_size;
use super::reach::{blocks_of, lookup, path_for, Ctx, GroupAcc};
use crate::alloc::format_size;
use crate::engine::EveryUnit;
use crate::units::{counted, format_count};

impl Detector {
    /// Bytes the device can still give before the peak reaches it.
    pub(super) fn free_before_full(&self) -> u64 {
        let peak = self
            .iterations
            .back()
            .map_or(0, |s| s.peak_allocated.max(s.allocated));
        self.capacity.saturating_sub(peak)
    }

    pub(super) fn periodic_evidence(&self, name: &str, cur: &GroupSample, p: &Periodic) -> String {
        let when = match self.facts.scheduled.get(name) {
            Some((1, EveryUnit::Epoch)) => " (the program adds to it once per epoch)".to_string(),
            Some((n, EveryUnit::Epoch)) => format!(" (the program adds to it every {n} epochs)"),
            Some((n, EveryUnit::Iteration)) => {
                format!(" (the program adds to it every {n} iterations)")
            }
            None => String::new(),
        };
        let shown: Vec<String> =
            p.at.iter()
                .rev()
                .take(6)
                .rev()
                .map(|i| i.to_string())
                .collect();
        let more = if p.at.len() > 6 { "…, " } else { "" };
        format!(
            "`{name}` grows in steps, not every iteration{when}: it rose at iterations {more}{} and \
             never fell, {} per step, {} per iteration on average since iteration {}; it alone \
             holds {} now{}. Growth that skips iterations is still growth: it does not stop by \
             itself.",
            shown.join(", "),
            format_size(p.per_rise),
            signed_size(p.per_iter),
            p.since,
            format_size(cur.gpu()),
            if cur.graph > 0 {
                format!(", {} of it saved activations of graphs only it reaches", format_size(cur.graph))
            } else {
                String::new()
            },
        )
    }

    pub(super) fn within_evidence(
        &self,
        ctx: &Ctx,
        acc: &GroupAcc,
        name: &str,
        cur: &GroupSample,
    ) -> String {
        let items = u64::from(cur.elements);
        let each = item_bytes(ctx, acc, cur);
        let whole = match self.facts.inner_fills.get(name) {
            Some(&n) => format!(
                " The inner loop adds {} an iteration: {} for all of them.",
                counted(n, "item"),
                format_size(each.saturating_mul(n))
            ),
            None => String::new(),
        };
        format!(
            "`{name}` filled within iteration {} and never across iterations: all {} items ({} \
             each, {} in all{}) were made in this iteration, and the device ran out with {} \
             in it.{whole} Nothing grows from one iteration to the next, so only the iteration \
             itself shows it.",
            cur.iteration,
            format_count(items),
            format_size(each),
            format_size(cur.gpu()),
            if cur.graph > 0 {
                format!(
                    ", {} of it saved activations their graphs keep",
                    format_size(cur.graph)
                )
            } else {
                String::new()
            },
            counted(items, "item"),
        )
    }

    /// A `deque(maxlen=k)` whose k items do not fit: it would fill at item
    /// k, the device runs out first.
    pub(super) fn bounded_overflow(
        &self,
        ctx: &Ctx,
        g: u32,
        acc: &GroupAcc,
        h: &GroupHistory,
        maxlen: u32,
    ) -> Option<Finding> {
        let cur = *h.samples.back()?;
        let items = u64::from(cur.elements);
        if items == 0 || cur.gpu() == 0 || items >= u64::from(maxlen) {
            return None;
        }
        let each = item_bytes(ctx, acc, &cur);
        let need = each.saturating_mul(u64::from(maxlen));
        let it = cur.iteration;
        // Items added per iteration, from the history (an inner loop adds several).
        let first = h.samples.front()?;
        let per_iter_items = match it.saturating_sub(first.iteration) {
            0 => self.facts.inner_fills.get(acc.name).copied().unwrap_or(1),
            n => (items.saturating_sub(u64::from(first.elements)) / u64::from(n)).max(1),
        };
        let (runs_out_at, ran_out) = if self.ran_out {
            (items + 1, true)
        } else {
            let free = self.free_before_full();
            if self.capacity == 0 || free >= need.saturating_sub(cur.gpu()) {
                return None;
            }
            (items + free / each.max(1) + 1, false)
        };
        if runs_out_at > u64::from(maxlen) {
            return None;
        }
        let kind = if cur.graph > 0 {
            FindingKind::RetainedGraphGpu
        } else {
            FindingKind::StoredTensors
        };
        let mut f = Finding::new(acc.name, kind);
        f.bytes = cur.gpu();
        f.growth_per_iter = (each * per_iter_items) as i64;
        f.iterations = cur
            .oldest_storage_iteration
            .map_or(1, |o| it.saturating_sub(o) + 1);
        f.by_category = categories(&acc.by_cat);
        f.blocks = blocks_of(ctx, g);
        f.path = path_for(ctx, g, acc, kind, None);
        if !ran_out {
            let left = runs_out_at - items;
            f.full_at_iteration = Some(u64::from(it) + left.div_ceil(per_iter_items));
        }
        f.fix = fix::fix_for(&self.facts, acc.name, acc.kind, kind);
        let holds = if cur.graph > 0 {
            "tensors that still hold their graphs"
        } else {
            "GPU tensors"
        };
        let verb = if ran_out { "ran" } else { "runs" };
        f.evidence = format!(
            "`{name}` is a deque(maxlen={}) of {holds}: each item keeps {} alive, so a full deque \
             needs {} — more than the device has. It fills at item {}; the device {verb} out at \
             item {}. A bound stops growth only if the bound fits in the memory.",
            format_count(u64::from(maxlen)),
            format_size(each),
            format_size(need),
            format_count(u64::from(maxlen)),
            format_count(runs_out_at),
            name = acc.name,
        );
        f.severity = Severity::Critical;
        Some(f)
    }
}

/// What one item of a container keeps alive: its own storage (shared with a
/// name or not: the item keeps it either way) and its share of the graph
/// bytes only the container reaches.
fn item_bytes(ctx: &Ctx, acc: &GroupAcc, cur: &GroupSample) -> u64 {
    let items = u64::from(cur.elements).max(1);
    let own: u64 = acc
        .roots
        .iter()
        .map(|&ri| {
            let p = lookup(ctx.spos, ctx.ls.roots[ri].storage.0);
            if p == NONE {
                0
            } else {
                ctx.ls.storages[p as usize].block
            }
        })
        .sum();
    (own + cur.graph) / items
}

impl Detector {
    /// An autocast block kept open across iteration boundaries while the
    /// optimizer steps: the weight-cast cache (engine.md §6.2) is cleared
    /// only when the outermost block exits, so the fp16/bf16 copies made in
    /// the first forward serve every later one — the weights of before the
    /// first update. Memory stays flat; the values are stale.
    pub(super) fn stale_autocast_cache(&self, ctx: &Ctx, accs: &[GroupAcc]) -> Option<Finding> {
        let cache = accs.iter().find(|a| a.name == "autocast cache")?;
        let it = ctx.ls.iteration;
        let since = cache.sample.oldest_storage_iteration?;
        if !self.facts.steps_optimizer || since >= it || cache.sample.own == 0 {
            return None;
        }
        let entries = cache.roots.len();
        let mut f = Finding::new("autocast cache", FindingKind::StaleAutocastCache);
        f.bytes = cache.sample.own;
        f.iterations = it - since + 1;
        f.by_category = vec![("amp_cache", cache.sample.own)];
        f.path = vec![
            format!(
                "{} cached casts of fp32 weights, made in iteration {since}",
                format_count(entries as u64)
            ),
            format!(
                "optimizer steps since: {} (each updates the fp32 weights in place)",
                it - since
            ),
        ];
        let dtype = match self.facts.autocast_around_loop {
            Some(crate::engine::DType::BF16) => "torch.bfloat16",
            _ => "torch.float16",
        };
        f.fix = format!(
            "with torch.autocast(\"cuda\", dtype={dtype}):  # inside the loop, around the forward \
             and the loss only: leaving it clears the cast cache"
        );
        f.evidence = format!(
            "The `with torch.autocast(...)` block is open across iteration boundaries, so its \
             cache of low-precision weight casts is never cleared: {} cached casts ({}) made in \
             iteration {since} served every forward since, while optimizer.step() updated the \
             fp32 weights {} times in place. Every forward after the first runs with the weights \
             of before the first update (the model stops learning); memory is flat, not a leak.",
            format_count(entries as u64),
            format_size(cache.sample.own),
            it - since,
        );
        f.severity = Severity::Warning;
        Some(f)
    }
}
