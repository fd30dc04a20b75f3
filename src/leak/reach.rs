//! Graph reachability for the scenario-run detector: the roots grouped under
//! the names a finding reports (`losses[3]` → `losses`), what each group's
//! nodes and storages are, who holds each storage, and the path from a root
//! to what it keeps alive.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::detector::{GroupKind, GroupSample, NONE, SHARED};
use super::finding::FindingKind;
use super::format::{dtype, shape};
use crate::alloc::format_size;
use crate::engine::{Category, DeviceKind, HeldState, RootKind, StorageInfo};

/// Per-observation scratch for one group.
#[derive(Debug, Clone)]
pub(super) struct GroupAcc<'a> {
    pub(super) name: &'a str,
    pub(super) kind: GroupKind,
    pub(super) roots: Vec<usize>,
    pub(super) sample: GroupSample,
    pub(super) by_cat: [u64; CATS],
    /// Oldest and newest iteration among the Nodes this group alone
    /// reaches; `None` when every Node it reaches another group reaches too.
    pub(super) alone_span: Option<(u32, u32)>,
}

pub(super) const CATS: usize = 14;
pub(super) const CAT_NAMES: [&str; CATS] = [
    "autograd_saved",
    "activation",
    "gradient",
    "parameter",
    "optimizer_state",
    "temporary",
    "input",
    "buffer",
    "workspace",
    "amp_cache",
    "scaler",
    "recompute",
    "cpu",
    "other",
];

pub(super) fn cat_index(c: Category, saved: bool) -> usize {
    if saved {
        return 0;
    }
    match c {
        Category::AutogradSaved => 0,
        Category::Activation => 1,
        Category::Gradient => 2,
        Category::Parameter => 3,
        Category::OptimizerState => 4,
        Category::Temporary => 5,
        Category::Input => 6,
        Category::Buffer => 7,
        Category::Workspace => 8,
        Category::AmpCache => 9,
        Category::Scaler => 10,
        Category::Recompute => 11,
        Category::Cpu => 12,
    }
}

/// One observation's indexes and ownership, for walking the live state.
pub(super) struct Ctx<'a> {
    pub(super) ls: &'a HeldState,
    pub(super) owner: &'a [u32],
    pub(super) is_own: &'a [bool],
    pub(super) spos: &'a [u32],
    pub(super) npos: &'a [u32],
}

pub(super) fn lookup(pos: &[u32], id: u32) -> u32 {
    pos.get(id as usize).copied().unwrap_or(NONE)
}

fn strip_index(name: &str) -> &str {
    // `hist[3][0]` (a kept hidden state in a list) belongs to `hist`.
    match name.find('[') {
        Some(i) if i > 0 && name.ends_with(']') => &name[..i],
        _ => name,
    }
}

/// Position of each storage in `ls.storages`, by storage id (`NONE`:
/// absent); `spos` is a reused buffer.
pub(super) fn index_storages(ls: &HeldState, mut spos: Vec<u32>) -> Vec<u32> {
    let max_sid = ls
        .storages
        .iter()
        .map(|s| s.id.0)
        .max()
        .map_or(0, |m| m as usize + 1);
    spos.clear();
    spos.resize(max_sid, NONE);
    for (i, s) in ls.storages.iter().enumerate() {
        spos[s.id.0 as usize] = i as u32;
    }
    spos
}

/// Position of each node in `ls.nodes`, by node id (`NONE`: absent).
pub(super) fn index_nodes(ls: &HeldState) -> Vec<u32> {
    let max_nid = ls
        .nodes
        .iter()
        .map(|n| n.id.0)
        .max()
        .map_or(0, |m| m as usize + 1);
    let mut npos = vec![NONE; max_nid];
    for (i, n) in ls.nodes.iter().enumerate() {
        npos[n.id.0 as usize] = i as u32;
    }
    npos
}

/// The roots grouped by the name a finding reports.
pub(super) struct Grouping<'a> {
    pub(super) accs: Vec<GroupAcc<'a>>,
    /// Group name → index in `accs`.
    pub(super) index: FxHashMap<&'a str, usize>,
    /// Per root: its group.
    pub(super) root_group: Vec<u32>,
    /// The gradient roots.
    pub(super) grads: Vec<usize>,
}

/// Group the roots.
pub(super) fn group_roots(ls: &HeldState) -> Grouping<'_> {
    let it = ls.iteration;
    let mut accs: Vec<GroupAcc> = Vec::new();
    let mut index: FxHashMap<&str, usize> = FxHashMap::default();
    let mut root_group = vec![NONE; ls.roots.len()];
    let mut grads: Vec<usize> = Vec::new();
    for (ri, r) in ls.roots.iter().enumerate() {
        let (name, kind) = match r.kind {
            RootKind::Variable => (r.name.as_str(), GroupKind::Variable),
            RootKind::ListElement { .. } => (strip_index(&r.name), GroupKind::List),
            RootKind::HiddenState => (strip_index(&r.name), GroupKind::Hidden),
            RootKind::Gradient => {
                grads.push(ri);
                ("gradients", GroupKind::Other)
            }
            RootKind::Parameter => ("parameters", GroupKind::Other),
            RootKind::ModuleBuffer => ("module buffers", GroupKind::Other),
            RootKind::AmpCache => ("autocast cache", GroupKind::Other),
            RootKind::OptimizerState => ("optimizer state", GroupKind::Other),
            RootKind::StaleOptimizerParam => ("optimizer", GroupKind::Other),
            // `teacher.param[3].grad` → `teacher`.
            RootKind::NamedModelGradient => (
                r.name.split('.').next().unwrap_or(&r.name),
                GroupKind::Other,
            ),
            RootKind::ScalerState => ("grad scaler", GroupKind::Other),
            RootKind::CheckpointInput => ("checkpoint inputs", GroupKind::Other),
            // `rec["out"]`, `rec["out"] (unreachable cycle 2)` → `rec`.
            RootKind::Cycle { .. } => (
                r.name.split('[').next().unwrap_or(&r.name),
                GroupKind::Cycle,
            ),
        };
        let g = *index.entry(name).or_insert_with(|| {
            accs.push(GroupAcc {
                name,
                kind,
                roots: Vec::new(),
                sample: GroupSample {
                    iteration: it,
                    ..GroupSample::default()
                },
                by_cat: [0; CATS],
                alone_span: None,
            });
            accs.len() - 1
        });
        accs[g].roots.push(ri);
        root_group[ri] = g as u32;
    }
    Grouping {
        accs,
        index,
        root_group,
        grads,
    }
}

/// Nodes per group (deduplicated: a hidden pair shares one graph), and
/// the iterations of the Nodes each group alone reaches; `mark` is a reused
/// buffer.
pub(super) fn count_nodes(
    ls: &HeldState,
    accs: &mut [GroupAcc],
    npos: &[u32],
    mark: &mut Vec<u32>,
) {
    let max_nid = npos.len();
    mark.clear();
    mark.resize(max_nid, NONE);
    // Per node: the one group that reaches it, or SHARED.
    let mut reached_by = vec![NONE; max_nid];
    for (g, acc) in accs.iter_mut().enumerate() {
        if acc.kind == GroupKind::Other {
            continue;
        }
        acc.sample.elements = acc.roots.len() as u32;
        for &ri in &acc.roots {
            let r = &ls.roots[ri];
            if let Some(o) = r.oldest_node_iteration {
                acc.sample.oldest_node_iteration =
                    Some(acc.sample.oldest_node_iteration.map_or(o, |x| x.min(o)));
            }
            for n in &r.nodes {
                let i = n.0 as usize;
                if i >= mark.len() || mark[i] == g as u32 {
                    continue;
                }
                mark[i] = g as u32;
                reached_by[i] = if reached_by[i] == NONE {
                    g as u32
                } else {
                    SHARED
                };
                acc.sample.nodes += 1;
                let p = npos[i];
                if p != NONE && ls.nodes[p as usize].released {
                    acc.sample.spent += 1;
                }
            }
        }
    }
    for (i, &g) in reached_by.iter().enumerate() {
        let p = npos[i];
        if g == NONE || g == SHARED || p == NONE {
            continue;
        }
        let node = &ls.nodes[p as usize];
        // A parameter's AccumulateGrad lives as long as the model, not a graph.
        if node.name == "AccumulateGrad" {
            continue;
        }
        let it = node.iteration;
        let span = &mut accs[g as usize].alone_span;
        *span = Some(span.map_or((it, it), |(lo, hi)| (lo.min(it), hi.max(it))));
    }
}

/// Who holds each storage. Own storages: the group whose tensor it is
/// (two groups' tensors on one storage: shared, nobody's alone). Saved
/// storages no tensor holds: charged to the most direct holder, the
/// group with the smallest graph that reaches them (a hidden state's
/// chain is also reached by the `loss` computed from it).
pub(super) fn assign_owners(
    ls: &HeldState,
    accs: &[GroupAcc],
    root_group: &[u32],
    spos: &[u32],
    owner: &mut Vec<u32>,
    is_own: &mut Vec<bool>,
) {
    owner.clear();
    owner.resize(ls.storages.len(), NONE);
    is_own.clear();
    is_own.resize(ls.storages.len(), false);
    for (ri, r) in ls.roots.iter().enumerate() {
        let g = root_group[ri];
        let p = lookup(spos, r.storage.0);
        if p == NONE {
            continue;
        }
        let p = p as usize;
        owner[p] = match owner[p] {
            NONE => g,
            x if x == g => g,
            _ => SHARED,
        };
        is_own[p] = true;
    }
    let weight = |g: u32| -> u32 {
        let a = &accs[g as usize];
        if a.kind == GroupKind::Other {
            u32::MAX
        } else {
            a.sample.nodes
        }
    };
    for (ri, r) in ls.roots.iter().enumerate() {
        let g = root_group[ri];
        for sid in r.saved_storages.iter().chain(&r.leaf_storages) {
            let p = lookup(spos, sid.0);
            if p == NONE || is_own[p as usize] {
                continue;
            }
            let p = p as usize;
            owner[p] = match owner[p] {
                NONE => g,
                x if x == g || x == SHARED => x,
                x => match weight(g).cmp(&weight(x)) {
                    std::cmp::Ordering::Less => g,
                    std::cmp::Ordering::Greater => x,
                    std::cmp::Ordering::Equal => SHARED,
                },
            };
        }
    }
}

/// Bytes per group.
pub(super) fn charge_bytes(ls: &HeldState, accs: &mut [GroupAcc], owner: &[u32], is_own: &[bool]) {
    let it = ls.iteration;
    for (p, s) in ls.storages.iter().enumerate() {
        let g = owner[p];
        if g == NONE || g == SHARED || s.device != DeviceKind::Cuda {
            continue;
        }
        let acc = &mut accs[g as usize];
        let b = s.block;
        let old = s.iteration < it;
        if is_own[p] {
            acc.sample.own += b;
            acc.sample.own_old += if old { b } else { 0 };
            acc.by_cat[cat_index(s.category, s.saved_by > 0)] += b;
        } else if graph_held(s) {
            acc.sample.graph += b;
            acc.sample.graph_old += if old { b } else { 0 };
            // A leaf an AccumulateGrad keeps is what it is (an input, its
            // gradient), saved or not.
            acc.by_cat[cat_index(s.category, !s.graph_leaf || s.saved_by > 0)] += b;
            acc.sample.leaf += if s.graph_leaf { b } else { 0 };
        } else {
            continue;
        }
        acc.sample.oldest_storage_iteration = Some(
            acc.sample
                .oldest_storage_iteration
                .map_or(s.iteration, |o| o.min(s.iteration)),
        );
    }
}

/// A storage only graphs keep alive: saved by their Nodes with no tensor
/// on it, or a leaf (or its `.grad`) only an `AccumulateGrad` holds.
fn graph_held(s: &StorageInfo) -> bool {
    (s.tensor_refs == 0 || s.graph_leaf) && !s.engine_held
}

pub(super) fn blocks_of(ctx: &Ctx, g: u32) -> Vec<u64> {
    ctx.ls
        .storages
        .iter()
        .enumerate()
        .filter(|(p, s)| {
            ctx.owner[*p] == g && s.device == DeviceKind::Cuda && (ctx.is_own[*p] || graph_held(s))
        })
        .filter_map(|(_, s)| s.addr)
        .collect()
}

/// From the root to what it holds, e.g. `total_loss → AddBackward0 → … →
/// AddmmBackward0 (iter 12) → saved mat1 [256×1024 fp32, 1.0 MiB]`.
///
/// With `spent` (the Node a failed backward reached after an earlier one
/// had run it), the path leads there instead: what the error is about.
pub(super) fn path_for(
    ctx: &Ctx,
    g: u32,
    acc: &GroupAcc,
    kind: FindingKind,
    spent: Option<u32>,
) -> Vec<String> {
    let ls = ctx.ls;
    if kind == FindingKind::StoredTensors {
        let mut v = vec![format!("{} ({} entries)", acc.name, acc.roots.len())];
        if let Some(&ri) = acc.roots.last() {
            let r = &ls.roots[ri];
            let p = lookup(ctx.spos, r.storage.0);
            let what = if p == NONE {
                String::new()
            } else {
                let s = &ls.storages[p as usize];
                format!(
                    " [{}, {}, iter {}]",
                    format_size(s.bytes),
                    s.category.name(),
                    s.iteration
                )
            };
            v.push(format!("{}{what}", r.name));
        }
        return v;
    }
    // The root whose graph is largest; its grad_fn is nodes[0].
    let Some(&ri) = acc
        .roots
        .iter()
        .max_by_key(|&&ri| (ls.roots[ri].nodes.len(), std::cmp::Reverse(ri)))
    else {
        return Vec::new();
    };
    let r = &ls.roots[ri];
    let Some(start) = r.nodes.first() else {
        return vec![r.name.clone()];
    };
    // BFS with parents over `next` edges.
    let n = ls.nodes.len();
    let mut parent = vec![NONE; n];
    let mut seen = vec![false; n];
    let sp = lookup(ctx.npos, start.0);
    if sp == NONE {
        return vec![r.name.clone()];
    }
    let mut queue = VecDeque::from([sp]);
    seen[sp as usize] = true;
    // Target: the largest saved slot held only by this group; ties → oldest.
    let mut best: Option<(u64, std::cmp::Reverse<u32>, u32, usize)> = None;
    let mut oldest: (u32, u32) = (u32::MAX, sp);
    while let Some(p) = queue.pop_front() {
        let node = &ls.nodes[p as usize];
        if node.iteration < oldest.0 && node.name != "AccumulateGrad" {
            oldest = (node.iteration, p);
        }
        // Saved slots, then what an AccumulateGrad alone holds (its leaf).
        for (si, s) in node.saved.iter().chain(&node.held).enumerate() {
            let Some(sid) = s.storage else { continue };
            let sp = lookup(ctx.spos, sid.0);
            if sp == NONE || ctx.owner[sp as usize] != g {
                continue;
            }
            let key = (s.bytes, std::cmp::Reverse(node.iteration), p, si);
            if best.is_none_or(|b| (key.0, key.1) > (b.0, b.1)) {
                best = Some(key);
            }
        }
        for nx in &node.next {
            let q = lookup(ctx.npos, nx.0);
            if q != NONE && !seen[q as usize] {
                seen[q as usize] = true;
                parent[q as usize] = p;
                queue.push_back(q);
            }
        }
    }
    let spent = spent.filter(|&p| seen.get(p as usize).copied().unwrap_or(false));
    let best = if spent.is_some() { None } else { best };
    let target = spent.unwrap_or_else(|| best.map_or(oldest.1, |b| b.2));
    let mut chain = vec![target];
    while let Some(&c) = chain.last() {
        let p = parent[c as usize];
        if p == NONE {
            break;
        }
        chain.push(p);
    }
    chain.reverse();
    let label = |p: u32, last: bool| {
        let node = &ls.nodes[p as usize];
        if last || node.iteration != ls.iteration {
            format!("{} (iter {})", node.name, node.iteration)
        } else {
            node.name.to_string()
        }
    };
    let mut out = vec![r.name.clone()];
    let k = chain.len();
    for (i, &p) in chain.iter().enumerate() {
        if k > 6 && i == 3 {
            out.push("…".into());
        }
        if k > 6 && (3..k - 2).contains(&i) {
            continue;
        }
        out.push(label(p, i + 1 == k));
    }
    match best {
        _ if spent.is_some() => {
            out.push("already run by an earlier backward: its saved tensors are freed".into())
        }
        Some((_, _, p, si)) => {
            let node = &ls.nodes[p as usize];
            let slot = |s: &crate::engine::SavedInfo| {
                format!(
                    "{} [{} {}, {}]",
                    s.name,
                    shape(&s.shape),
                    dtype(s.dtype),
                    format_size(s.bytes)
                )
            };
            match node.saved.get(si) {
                Some(s) => out.push(format!("saved {}", slot(s))),
                None => out.push(format!(
                    "holds {}: a leaf no name holds any more",
                    node.held.iter().map(slot).collect::<Vec<_>>().join(" and ")
                )),
            }
        }
        None => out.push(format!(
            "(no saved tensor of its own left on the GPU; {} Nodes on the host)",
            r.nodes.len()
        )),
    }
    out
}
