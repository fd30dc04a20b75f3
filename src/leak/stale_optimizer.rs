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

impl Detector {
    /// A second model (`BuildModel`: a teacher) whose parameters have a
    /// `.grad`: its forward ran with grad enabled and a loss backpropagated
    /// into it. No optimizer zeroes or steps those gradients; every
    /// backward adds into them.
    pub(super) fn stray_gradients(&self, ctx: &Ctx, accs: &[GroupAcc]) -> Vec<Finding> {
        let mut out = Vec::new();
        let mut models: Vec<&str> = self
            .facts
            .named_forwards
            .iter()
            .map(|f| f.model.as_str())
            .filter(|m| !self.facts.trained_models.contains(*m))
            .collect();
        models.dedup();
        for model in models {
            let Some(g) = accs.iter().position(|a| a.name == model) else {
                continue;
            };
            let acc = &accs[g];
            if acc.sample.own == 0 {
                continue;
            }
            let grads = acc.roots.len();
            let forward = self
                .facts
                .named_forwards
                .iter()
                .find(|f| f.model == model && f.grad);
            let mut f = Finding::new(model, FindingKind::StrayGradients);
            f.bytes = acc.sample.own;
            f.iterations = ctx
                .ls
                .iteration
                .saturating_sub(acc.sample.oldest_storage_iteration.unwrap_or(0))
                + 1;
            f.by_category = super::classify::categories(&acc.by_cat);
            f.blocks = blocks_of(ctx, g as u32);
            f.path = vec![format!(
                "{model}.parameters(): {} of them with a .grad ({})",
                format_count(grads as u64),
                format_size(acc.sample.own)
            )];
            match forward {
                Some(fw) => {
                    f.path.push(format!(
                        "{} = {model}({}) ran with grad enabled",
                        fw.output, fw.input
                    ));
                    f.fix = format!(
                        "with torch.no_grad(): {} = {model}({})",
                        fw.output, fw.input
                    );
                }
                None => {
                    f.fix = format!("{model}.requires_grad_(False)  # once, after it is built");
                }
            }
            let why = match forward {
                Some(fw) => format!(
                    "`{} = {model}({})` runs with grad enabled, so it records a graph (saving its \
                     activations until the backward) and the loss backpropagates into `{model}`",
                    fw.output, fw.input
                ),
                None => format!("a loss backpropagates into `{model}`"),
            };
            f.evidence = format!(
                "{why}: {} of its parameters have a .grad, {} that no optimizer zeroes or steps \
                 (the optimizer holds the model's). Every backward adds into them, and every \
                 forward saves what its backward would need: memory held for gradients nobody \
                 uses, and a higher peak.",
                format_count(grads as u64),
                format_size(acc.sample.own),
            );
            f.severity = Severity::Warning;
            out.push(f);
        }
        out
    }
}

impl Detector {
    /// A second model's forward with grad enabled (a teacher without
    /// `torch.no_grad()`) whose output still holds the graph's saved
    /// activations at the iteration's end: no backward ran through them,
    /// and they stay until the name is rebound. A higher peak, not a leak.
    pub(super) fn teacher_graphs(&self, ctx: &Ctx, accs: &[GroupAcc]) -> Vec<Finding> {
        let mut out = Vec::new();
        // A model an optimizer of its own trains records its graph to
        // backpropagate it (a GAN's generator).
        let forwards = self.facts.named_forwards.iter();
        for fw in forwards.filter(|f| f.grad && !self.facts.trained_models.contains(&f.model)) {
            let Some(g) = accs.iter().position(|a| a.name == fw.output) else {
                continue;
            };
            let acc = &accs[g];
            if acc.sample.graph == 0 {
                continue;
            }
            let (model, input, output) = (&fw.model, &fw.input, &fw.output);
            let mut f = Finding::new(output.as_str(), FindingKind::OneOffPeak);
            f.bytes = acc.sample.graph;
            f.iterations = 1;
            f.by_category = vec![("autograd_saved", acc.sample.graph)];
            f.blocks = blocks_of(ctx, g as u32);
            f.path = vec![
                format!("{output} = {model}({input}) ran with grad enabled"),
                format!(
                    "`{output}` holds {model}'s graph: {} Nodes, {} of saved activations",
                    format_count(u64::from(acc.sample.nodes)),
                    format_size(acc.sample.graph)
                ),
            ];
            f.fix = format!("with torch.no_grad(): {output} = {model}({input})");
            f.evidence = format!(
                "`{output} = {model}({input})` runs with grad enabled ({model}'s parameters \
                 require grad), so it records a graph that saves its activations for a backward \
                 that never runs through it: at the iteration's end `{output}` still holds {} of \
                 them, until it is rebound in the next iteration. Flat across iterations: a \
                 higher peak, not a leak.",
                format_size(acc.sample.graph)
            );
            f.severity = Severity::Info;
            out.push(f);
        }
        out
    }
}
