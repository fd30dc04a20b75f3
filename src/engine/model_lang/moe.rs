//! `SparseMoe` (issue 42): a Mixtral / Qwen-MoE style sparse MLP — a
//! router `Linear(hidden, experts)`, softmax, top-k, the weights
//! renormalised (or not), each expert run on the rows routed to it, the
//! results summed back with `index_add`. `kinds.rs` calls what is here, one
//! function per concern; the forward is in `moe/forward.rs`.
//!
//! Which rows reach which expert depends on the data: the scenario says it
//! ([`Routing`]): spread evenly (`Balanced`, an assumption the views name),
//! or the counts per expert given (`Counts`, e.g. read from a capture's
//! request sizes). Nothing here guesses a routing.
//!
//! The ops and what each saves for backward are in `engine/ops/moe.rs`
//! (PyTorch 2.11's derivatives.yaml and generated Functions.h, cited by
//! line); their order is the Python's of
//! tests/fixtures/pytorch/moe_small.py (`Dispatch::Loop`) or of
//! transformers' `MixtralSparseMoeBlock.forward` (`Dispatch::Hf`).

mod forward;
mod grouped;

use std::cell::Cell;

use serde::{Deserialize, Serialize};

use super::build::display;
use super::check::Problem;
use super::count::{params, Counts};
use super::kinds::{Args, Fault};
use super::shape::{last_dim, Sig};
use super::spec::join;
use crate::engine::error::Result;
use crate::engine::modules::Linear;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

/// How the data route rows to experts: data-dependent, so the scenario
/// says it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Routing {
    /// Every expert gets `N·k / E` rows, the first `N·k mod E` one more:
    /// an assumption (a router trained to balance its load comes close).
    Balanced,
    /// The rows each expert gets, one list of `experts` counts per forward
    /// of a `SparseMoe`, in the order the forwards run (layer by layer,
    /// iteration after iteration), used in turn and then again from the
    /// first. Each list sums to `N·k` (every row goes to `top_k` distinct
    /// experts), no count above `N`.
    Counts(Vec<Vec<u64>>),
}

impl Routing {
    /// Whether the routing is the scenario's assumption, not counts given.
    pub fn is_assumed(&self) -> bool {
        matches!(self, Routing::Balanced)
    }

    /// In words, for views and reports.
    pub fn describe(&self) -> String {
        match self {
            Routing::Balanced => {
                "assumed balanced, not measured (each expert the same number of rows; the real routing depends on the data)".into()
            }
            Routing::Counts(c) => format!(
                "as the counts per expert the scenario gives ({} forward{}; the model does not derive them)",
                c.len(),
                if c.len() == 1 { "" } else { "s" }
            ),
        }
    }
}

/// One expert's MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExpertKind {
    /// `down(F.gelu(up(x)))`, `up = Linear(hidden, intermediate)` and
    /// `down` with biases (a hand-written expert).
    Gelu,
    /// `MixtralBlockSparseTop2MLP`: `w2(silu(w1(x)) * w3(x))`, no biases,
    /// registered `w1`, `w2`, `w3`.
    Mixtral,
    /// `Qwen2MoeMLP` / `Qwen3MoeMLP`: `down_proj(silu(gate_proj(x)) *
    /// up_proj(x))`, no biases.
    Qwen,
}

/// How the tokens are dispatched (both loop over the experts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Dispatch {
    /// `token, slot = torch.where(chosen == e)`; `y = expert(
    /// flat.index_select(0, token)) * weights[token, slot].unsqueeze(-1)`;
    /// `out = out.index_add(0, token, y)` (moe_small.py's loop, every expert).
    #[default]
    Loop,
    /// transformers' `MixtralSparseMoeBlock.forward`: `expert_mask =
    /// one_hot(selected, E).permute(2, 1, 0)` kept through the loop; for
    /// each expert some row reaches, `idx, top_x =
    /// torch.where(expert_mask[e])`, `hidden[None, top_x]`,
    /// `routing_weights[top_x, idx, None]`, `final.index_add_(0, top_x, …)`.
    /// Not modelled: `expert_hit`'s few `E`-sized tensors and `one_hot`'s
    /// range checks (tens of bytes), and a half model's fp32 router softmax
    /// and cast back (`hf_config`'s notes say so); the in-place
    /// `routing_weights /=` is modelled out of place. Under transformers
    /// 5.x (the scenario's `transformers:`) a gated expert builds as
    /// `GroupedMm` does, as 5.x's `from_config` builds it.
    Hf,
    /// transformers 5.x (5.16.1 read): a layer's experts as two 3-D
    /// parameters, `experts.gate_up_proj` [E, 2·I, H] and
    /// `experts.down_proj` [E, H, I] (modeling_mixtral.py:65-66,
    /// modeling_qwen2_moe.py:288-289), the router `gate.weight` [E, H], and
    /// the default experts implementation, `grouped_mm`
    /// (modeling_utils.py:1964-1986 picks it; integrations/moe.py:377-478
    /// runs it): the ids sorted, every routed row gathered once, two
    /// `torch._grouped_mm`s, the rows put back and summed over `top_k`
    /// (model_lang/moe/grouped.rs). Gated experts only (Mixtral, Qwen).
    GroupedMm,
}

/// Concern 1: `SparseMoe`'s arguments.
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_args(
    hidden: u64,
    intermediate: u64,
    experts: u64,
    top_k: u64,
    expert: ExpertKind,
    shared_expert: Option<u64>,
) -> Args {
    let per_expert = expert_params(hidden, intermediate, expert);
    let mut n = hidden
        .saturating_mul(experts)
        .saturating_add(experts.saturating_mul(per_expert));
    let mut dims = vec![
        ("hidden", hidden, 1),
        ("intermediate", intermediate, 1),
        ("experts", experts, 1),
        ("top_k", top_k, 1),
    ];
    if let Some(s) = shared_expert {
        dims.push(("shared_expert", s, 1));
        // The shared expert (Qwen's MLP) and its sigmoid gate Linear(hidden, 1).
        n = n
            .saturating_add(expert_params(hidden, s, ExpertKind::Qwen))
            .saturating_add(hidden);
    }
    let modules = experts
        .saturating_mul(if expert == ExpertKind::Gelu { 3 } else { 5 })
        .saturating_add(2);
    Args {
        dims,
        probabilities: Vec::new(),
        counts: params(n),
        modules,
    }
}

fn expert_params(h: u64, i: u64, kind: ExpertKind) -> u64 {
    match kind {
        ExpertKind::Gelu => h
            .saturating_mul(i)
            .saturating_mul(2)
            .saturating_add(i)
            .saturating_add(h),
        ExpertKind::Mixtral | ExpertKind::Qwen => h.saturating_mul(i).saturating_mul(3),
    }
}

/// Concern 2: `SparseMoe`'s rules and shape: `[…, hidden]` in and out;
/// `top_k` at most `experts`; counts that fit the rows.
pub(crate) fn moe_out_shape(
    hidden: u64,
    experts: u64,
    top_k: u64,
    routing: &Routing,
    x: &Sig,
) -> std::result::Result<Sig, Fault> {
    if top_k > experts {
        return Err((Some("top_k"), Problem::MoeTopK { top_k, experts }));
    }
    let s = last_dim("SparseMoe", hidden, x).map_err(|e| (None, Problem::Shape(e)))?;
    let rows = s.dims[..s.dims.len().saturating_sub(1)]
        .iter()
        .fold(1u64, |n, &d| n.saturating_mul(d));
    if let Routing::Counts(lists) = routing {
        if let Err(why) = check_counts(lists, experts, rows, top_k) {
            return Err((
                Some("routing"),
                Problem::MoeRouting(format!(
                    "{why} (counts hold for the batch and sequence they were measured at)"
                )),
            ));
        }
    }
    Ok(s)
}

/// `Dispatch::GroupedMm` is 5.x's gated experts: a `Gelu` expert has no
/// such form.
pub(crate) fn grouped_needs_gate(
    expert: ExpertKind,
    dispatch: Dispatch,
) -> std::result::Result<(), Fault> {
    if dispatch == Dispatch::GroupedMm && expert == ExpertKind::Gelu {
        return Err((Some("dispatch"), Problem::MoeGroupedGelu));
    }
    Ok(())
}

/// Why `lists` cannot be the routing of `rows` rows to `top_k` of
/// `experts` experts.
fn check_counts(
    lists: &[Vec<u64>],
    experts: u64,
    rows: u64,
    top_k: u64,
) -> std::result::Result<(), String> {
    if lists.is_empty() {
        return Err("Counts needs at least one list of counts".into());
    }
    let want = rows.saturating_mul(top_k);
    for (i, l) in lists.iter().enumerate() {
        if u64::try_from(l.len()).ok() != Some(experts) {
            return Err(format!(
                "list {i} has {} counts for {experts} experts",
                l.len()
            ));
        }
        let sum = l.iter().fold(0u64, |a, &c| a.saturating_add(c));
        if sum != want {
            return Err(format!(
                "list {i} routes {sum} rows; {rows} rows × top_k {top_k} is {want}"
            ));
        }
        if let Some(c) = l.iter().find(|&&c| c > rows) {
            return Err(format!(
                "list {i} sends {c} rows to one expert, more than the {rows} rows there are (each row goes to an expert once)"
            ));
        }
    }
    Ok(())
}

/// The rows each expert gets in this forward (`vramscope trace` asks it
/// for `Balanced` where the program routes with `torch.where(chosen == e)`).
pub fn counts_for(routing: &Routing, call: usize, experts: u64, rows: u64, top_k: u64) -> Vec<u64> {
    match routing {
        Routing::Balanced => {
            let total = rows.saturating_mul(top_k);
            let e = experts.max(1);
            (0..e)
                .map(|i| total / e + u64::from(i < total % e))
                .collect()
        }
        Routing::Counts(lists) => lists
            .get(call % lists.len().max(1))
            .cloned()
            .unwrap_or_default(),
    }
}

/// A built expert.
#[derive(Debug)]
pub(crate) struct Expert {
    pub module: u32,
    pub kind: ExpertKind,
    /// `up` (Gelu), `w1` (Mixtral), `gate_proj` (Qwen).
    pub first: Linear,
    /// `w3` / `up_proj` (gated kinds).
    pub gate_up: Option<Linear>,
    pub down: Linear,
}

/// A built `SparseMoe`.
#[derive(Debug)]
pub(crate) struct MoeLeaf {
    pub module: u32,
    pub router: Linear,
    pub experts: Vec<Expert>,
    /// Qwen2-MoE's shared expert and its `shared_expert_gate`.
    pub shared: Option<(Expert, Linear)>,
    /// `GroupedMm`: the 3-D expert weights (then `experts` is empty).
    pub stacked: Option<grouped::Stacked>,
    pub n_experts: u64,
    pub kind: ExpertKind,
    pub top_k: u64,
    pub norm_topk_prob: bool,
    pub routing: Routing,
    pub dispatch: Dispatch,
}

/// Per-run state: how many `SparseMoe` forwards have run (which list of
/// `Routing::Counts` is next).
#[derive(Debug, Default)]
pub(crate) struct MoeRun {
    pub calls: Cell<usize>,
}

/// What a `SparseMoe` is built from.
pub(crate) struct MoeBuild<'a> {
    pub hidden: u64,
    pub intermediate: u64,
    pub experts: u64,
    pub top_k: u64,
    pub expert: ExpertKind,
    pub norm_topk_prob: bool,
    pub shared_expert: Option<u64>,
    pub routing: &'a Routing,
    pub dispatch: Dispatch,
    pub router: &'a str,
    /// `GroupedMm`: the experts registered before the router (Qwen3-MoE
    /// under 5.x, modeling_qwen3_moe.py:273-274).
    pub experts_first: bool,
}

/// Concern 3: the parameters in `named_parameters()` order: the router,
/// then each expert's, then the shared expert's and its gate.
pub(crate) fn build_moe(
    e: &mut Engine,
    path: &str,
    b: &MoeBuild<'_>,
    params: &mut Vec<TensorId>,
) -> Result<MoeLeaf> {
    let module = e.tags.module(path);
    let grouped = match b.dispatch {
        Dispatch::GroupedMm => true,
        Dispatch::Hf => e.cfg.hf_v5() && b.expert != ExpertKind::Gelu,
        Dispatch::Loop => false,
    };
    if grouped {
        return grouped::build_grouped(e, path, module, b, params);
    }
    let router = e.new_linear(&join(path, b.router), b.hidden, b.experts, false, params)?;
    let list = join(path, "experts");
    let mut experts = Vec::new();
    for i in 0..b.experts {
        let at = join(&list, &i.to_string());
        experts.push(build_expert(
            e,
            &at,
            b.expert,
            b.hidden,
            b.intermediate,
            params,
        )?);
    }
    let shared = build_shared(e, path, b, params)?;
    Ok(MoeLeaf {
        module,
        router,
        experts,
        shared,
        stacked: None,
        n_experts: b.experts,
        kind: b.expert,
        top_k: b.top_k,
        norm_topk_prob: b.norm_topk_prob,
        routing: b.routing.clone(),
        dispatch: b.dispatch,
    })
}

/// Qwen2-MoE's shared expert and its `shared_expert_gate`, registered
/// after the routed experts under either release.
fn build_shared(
    e: &mut Engine,
    path: &str,
    b: &MoeBuild<'_>,
    params: &mut Vec<TensorId>,
) -> Result<Option<(Expert, Linear)>> {
    let Some(width) = b.shared_expert else {
        return Ok(None);
    };
    let ex = build_expert(
        e,
        &join(path, "shared_expert"),
        ExpertKind::Qwen,
        b.hidden,
        width,
        params,
    )?;
    let gate = e.new_linear(
        &join(path, "shared_expert_gate"),
        b.hidden,
        1,
        false,
        params,
    )?;
    Ok(Some((ex, gate)))
}

fn build_expert(
    e: &mut Engine,
    at: &str,
    kind: ExpertKind,
    h: u64,
    i: u64,
    params: &mut Vec<TensorId>,
) -> Result<Expert> {
    let module = e.tags.module(at);
    let lin = |e: &mut Engine, name: &str, fin, fout, bias, ps: &mut Vec<TensorId>| {
        e.new_linear(&join(at, name), fin, fout, bias, ps)
    };
    Ok(match kind {
        ExpertKind::Gelu => Expert {
            module,
            kind,
            first: lin(e, "up", h, i, true, params)?,
            gate_up: None,
            down: lin(e, "down", i, h, true, params)?,
        },
        ExpertKind::Mixtral => {
            let w1 = lin(e, "w1", h, i, false, params)?;
            let w2 = lin(e, "w2", i, h, false, params)?;
            let w3 = lin(e, "w3", h, i, false, params)?;
            Expert {
                module,
                kind,
                first: w1,
                gate_up: Some(w3),
                down: w2,
            }
        }
        ExpertKind::Qwen => Expert {
            module,
            kind,
            first: lin(e, "gate_proj", h, i, false, params)?,
            gate_up: Some(lin(e, "up_proj", h, i, false, params)?),
            down: lin(e, "down_proj", i, h, false, params)?,
        },
    })
}

/// Concern 5: the projections LoRA may adapt: none (an expert's Linears
/// are not offered to PEFT here).
pub(crate) fn moe_projection_names() -> Vec<String> {
    Vec::new()
}

/// Runs `f`, releasing `held` whatever it returns.
fn releasing<T>(
    e: &mut Engine,
    held: &[TensorId],
    f: impl FnOnce(&mut Engine) -> Result<T>,
) -> Result<T> {
    let r = f(e);
    for &t in held {
        e.release(t);
    }
    r
}

/// What `m`'s modules assume where the data decide, each after the module
/// path it is written at (a `Repeat`'s copies as `N`, with their range), in
/// words.
pub fn assumptions(m: &super::Module) -> Vec<String> {
    let mut out = Vec::new();
    walk_assumptions(m, "", "", &mut out);
    out
}

fn walk_assumptions(m: &super::Module, path: &str, copies: &str, out: &mut Vec<String>) {
    use super::Module;
    match m {
        Module::Sequential(children) => {
            for (name, c) in children {
                walk_assumptions(c, &join(path, name), copies, out);
            }
        }
        Module::Repeat { n, block } => {
            let range = format!("{copies} (N = 0…{})", n.saturating_sub(1));
            walk_assumptions(block, &join(path, "N"), &range, out);
        }
        Module::Residual(inner)
        | Module::Frame(inner)
        | Module::Registered { module: inner, .. }
        | Module::HfModel(inner) => walk_assumptions(inner, path, copies, out),
        Module::Checkpoint { module, .. } => walk_assumptions(module, path, copies, out),
        leaf => {
            if let Some(a) = leaf.assumption() {
                out.push(format!("{}{copies}: {a}", display(path)));
            }
        }
    }
}

/// The counts of an expert layer, for tests and views.
pub fn expert_layer_counts(
    hidden: u64,
    intermediate: u64,
    experts: u64,
    expert: ExpertKind,
    shared: Option<u64>,
) -> Counts {
    moe_args(hidden, intermediate, experts, 1, expert, shared).counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_routing_spreads_every_row_k_times() {
        let c = counts_for(&Routing::Balanced, 0, 8, 2049, 2);
        assert_eq!(c.iter().sum::<u64>(), 4098);
        assert_eq!(c[0], 513);
        assert_eq!(c[1], 513);
        assert_eq!(c[2], 512);
        assert!(Routing::Balanced.is_assumed());
    }

    #[test]
    fn counts_are_used_in_turn_and_checked() {
        let r = Routing::Counts(vec![vec![3, 1], vec![2, 2]]);
        assert_eq!(counts_for(&r, 0, 2, 2, 2), vec![3, 1]);
        assert_eq!(counts_for(&r, 3, 2, 2, 2), vec![2, 2]);
        // 3 rows to one expert of 2 rows: refused.
        assert!(check_counts(&[vec![3, 1]], 2, 2, 2).is_err());
        assert!(check_counts(&[vec![2, 2]], 2, 2, 2).is_ok());
        assert!(check_counts(&[vec![2, 1]], 2, 2, 2)
            .err()
            .is_some_and(|w| w.contains("routes 3 rows")));
        assert!(check_counts(&[vec![4]], 2, 2, 2)
            .err()
            .is_some_and(|w| w.contains("1 counts for 2 experts")));
    }
}
