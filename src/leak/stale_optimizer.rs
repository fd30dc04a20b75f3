//! An optimizer that outlives its model (issue 39, a model re-created
//! inside the loop): `model = Net().cuda()` after the optimizer was built
//! leaves the old parameters in `optimizer.param_groups`. They stay alive
//! with their gradients and their state, and `zero_grad()` and `step()`
//! act on them, not on the model that trains. Judged on the state at one
//! observation: the holder is known (the optimizer), nothing needs to grow.

use super::detector::Detector;
use super::finding::{Finding, FindingKind, Severity};
use super::fix;
use super::reach::{blocks_of, Ctx, GroupAcc, CAT_NAMES};
use crate::alloc::format_size;
use crate::units::format_count;

/// The group the engine's stale optimizer roots fall in (`reach.rs`).
const GROUP: &str = "optimizer";

fn cat(acc: &GroupAcc, name: &str) -> u64 {
    CAT_NAMES
        .iter()
        .position(|c| *c == name)
        .map_or(0, |i| acc.by_cat[i])
}

impl Detector {
    pub(super) fn stale_optimizer_params(&self, ctx: &Ctx, accs: &[GroupAcc]) -> Option<Finding> {
        let g = accs.iter().position(|a| a.name == GROUP)?;
        let acc = &accs[g];
        if acc.sample.own == 0 {
            return None;
        }
        let ls = ctx.ls;
        let it = ls.iteration;
        let params = acc
            .roots
            .iter()
            .filter(|&&ri| {
                let n = &ls.roots[ri].name;
                !n.ends_with(".grad") && !n.starts_with("optimizer.state")
            })
            .count();
        let (p_bytes, g_bytes, s_bytes) = (
            cat(acc, "parameter"),
            cat(acc, "gradient"),
            cat(acc, "optimizer_state"),
        );
        let since = acc.sample.oldest_storage_iteration.unwrap_or(it);
        let mut f = Finding::new(GROUP, FindingKind::StaleOptimizerParams);
        f.bytes = acc.sample.own;
        f.iterations = it.saturating_sub(since) + 1;
        f.by_category = super::classify::categories(&acc.by_cat);
        f.blocks = blocks_of(ctx, g as u32);
        f.path = vec![format!(
            "optimizer.param_groups[0][\"params\"]: {} parameters the model no longer has ({})",
            format_count(params as u64),
            format_size(p_bytes)
        )];
        if s_bytes > 0 {
            f.path
                .push(format!("their optimizer state ({})", format_size(s_bytes)));
        }
        if g_bytes > 0 {
            f.path
                .push(format!("their .grad ({})", format_size(g_bytes)));
        }
        let how = if self.facts.recreates_model {
            "`model = Net().cuda()` made a new model after the optimizer was built"
        } else {
            "the model was replaced after the optimizer was built"
        };
        let grads = if g_bytes > 0 {
            format!(", their gradients ({})", format_size(g_bytes))
        } else {
            String::new()
        };
        f.fix = fix::RECREATE_OPTIMIZER.into();
        f.evidence = format!(
            "{how}, and `optimizer.param_groups` still holds the old model's {} parameters ({}): \
             they outlive the model, with their optimizer state ({}){grads}, {} of GPU memory \
             that nothing else uses. optimizer.zero_grad() and optimizer.step() act on those, \
             not on the model that trains: its weights are never updated, and its gradients \
             are summed across iterations.",
            format_count(params as u64),
            format_size(p_bytes),
            format_size(s_bytes),
            format_size(acc.sample.own),
        );
        f.severity = Severity::Critical;
        Some(f)
    }
}
