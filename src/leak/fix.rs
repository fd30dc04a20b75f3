//! The one-line fix each finding suggests: valid Python for that root, built
//! from the statement that binds it (`val_total += vloss` → `val_total +=
//! vloss.item()`), never a guess at names the program does not have.

use super::detector::GroupKind;
use super::finding::FindingKind;
use super::program::{Binder, ProgramFacts};

const NO_GRAD: &str = "with torch.no_grad(): ";

/// The hidden state detached at the top of each batch (`repackage_hidden`).
pub(super) const DETACH_HIDDEN: &str =
    "hidden = tuple(h.detach() for h in hidden)  # at the top of each batch";

pub(super) const ZERO_GRAD: &str = "optimizer.zero_grad()  # every iteration, before backward";

pub(super) const EXPANDABLE: &str = "os.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \
     \"expandable_segments:True\"  # before the first CUDA allocation";

/// The optimizer re-created over the new model's parameters.
pub(super) const RECREATE_OPTIMIZER: &str = "optimizer = type(optimizer)(model.parameters(), \
     **optimizer.defaults)  # right after model = Net().cuda(): it steps the new model, and the \
     old optimizer goes with the old model";

/// Evaluation under `no_grad`: the program's own eval forward when known.
pub(super) fn no_grad_eval(facts: &ProgramFacts) -> String {
    match &facts.eval_forward {
        Some((input, output)) => format!("{NO_GRAD}{output} = model({input})"),
        None => "torch.set_grad_enabled(False)  # while evaluating".into(),
    }
}

/// A buffer re-created in the loop while the last one is still bound.
pub(super) fn rebound_buffer(name: &str) -> String {
    format!("del {name}  # before {name} = torch.empty(...) in the loop")
}

/// The fix for a root of `group` kind found to be `kind`.
pub(super) fn fix_for(
    facts: &ProgramFacts,
    name: &str,
    group: GroupKind,
    kind: FindingKind,
) -> String {
    if group == GroupKind::Hidden || kind == FindingKind::CarriedHiddenState {
        return DETACH_HIDDEN.into();
    }
    if let Some((b, eval_grad)) = facts.binder(name) {
        let pre = if eval_grad && kind == FindingKind::RetainedGraphGpu {
            NO_GRAD
        } else {
            ""
        };
        // `.item()` only on a loss: a 0-dim tensor; a tuple of gradients
        // element by element; anything else detaches.
        let plain = |from: &str| {
            if facts.is_loss(from) {
                format!("{from}.item()")
            } else if facts.tuples.contains(from) {
                format!("[t.detach() for t in {from}]")
            } else {
                format!("{from}.detach()")
            }
        };
        // A detached GPU tensor still holds its memory: keep a host copy.
        let host = |from: &str| match facts.is_loss(from) {
            true => format!("{from}.item()"),
            false if facts.tuples.contains(from) => {
                format!("[t.detach().cpu() for t in {from}]")
            }
            false => format!("{from}.detach().cpu()"),
        };
        match b {
            Binder::Accumulate { from, .. } => return format!("{pre}{name} += {}", plain(from)),
            Binder::Append { from, .. } => return format!("{pre}{name}.append({})", host(from)),
            Binder::SetItem { from, key, .. } => {
                return format!("{pre}{name}[{key}] = {}", host(from))
            }
            Binder::Keep { from, .. } => return format!("{pre}{name} = {}", plain(from)),
            Binder::Hook {
                module,
                backward: false,
                ..
            } => {
                let handle = module.replace('.', "_");
                return format!(
                    "handle_{handle}.remove()  # once the activations are collected; or in the \
                     hook: {name}.append(o.detach().cpu())"
                );
            }
            Binder::Hook { module, .. } => {
                let handle = module.replace('.', "_");
                return format!(
                    "bhandle_{handle}.remove()  # once the gradients are collected; or in the \
                     hook: {name}.append(go[0].detach().cpu())"
                );
            }
            Binder::SignStep { grad, clamp } => {
                let g = grad.clone().unwrap_or_else(|| format!("{name}.grad"));
                let clamp = if *clamp { ".clamp(0, 1)" } else { "" };
                let retain = if facts.retain_graph {
                    "; and no retain_graph=True"
                } else {
                    ""
                };
                return format!(
                    "{name} = ({name} + eps * {g}.sign()){clamp}.detach().requires_grad_()  \
                     # a fresh leaf each step{retain}"
                );
            }
            Binder::Ema { .. } => {
                return format!(
                    "with torch.no_grad(): for e, p in zip({name}, model.parameters()): \
                     e.mul_(0.999).add_(p, alpha=0.001)"
                )
            }
            Binder::Forward | Binder::Loss => {}
        }
    }
    match group {
        GroupKind::List => format!("{name} = [t.detach() for t in {name}]"),
        GroupKind::Cycle => cycle_fix(name),
        _ => format!("{name} = {name}.detach()"),
    }
}

/// An object in a reference cycle: break the cycle before the name is
/// rebound, so reference counting frees it at once.
pub(super) fn cycle_fix(name: &str) -> String {
    format!(
        "del {name}[\"self\"]  # before {name} is rebound (or a weakref back-reference, or gc.collect())"
    )
}

/// A container filled on a schedule (once an epoch, every k iterations) and
/// never emptied: a metric's state. The fix that fits it empties it once
/// its value is computed.
pub(super) fn reset_on_schedule(
    facts: &ProgramFacts,
    name: &str,
    group: GroupKind,
) -> Option<String> {
    if group != GroupKind::List || !facts.scheduled.contains_key(name) {
        return None;
    }
    Some(format!(
        "{name}.clear()  # once the epoch's metric is computed from it (a torchmetrics Metric: metric.reset())"
    ))
}
