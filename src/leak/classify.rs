//! Findings for the scenario-run detector: each group's history classified
//! (retained graph, carried hidden state, stored tensors, …), plus the
//! device-wide ones (fragmentation, missing `zero_grad`, one-off peak), each
//! with its evidence, projection and fix.

use super::detector::{Detector, GroupHistory, GroupKind, GroupSample, MIN_GROWTH_STEPS, NONE};
use super::finding::{settle, Finding, FindingKind, Severity};
use super::fix;
use super::format::signed_size;
use super::reach::{blocks_of, lookup, path_for, Ctx, GroupAcc, CATS, CAT_NAMES};
use crate::alloc::format_size;
use crate::engine::BACKWARD_TWICE;

impl Detector {
    /// Classify every group of this observation, then the device-wide
    /// findings; most severe first.
    pub(super) fn findings_for(&self, ctx: &Ctx, accs: &[GroupAcc]) -> Vec<Finding> {
        let mut findings = Vec::new();
        let mut gpu_leak = false;
        for (g, acc) in accs.iter().enumerate() {
            if acc.kind == GroupKind::Other {
                continue;
            }
            let Some(h) = self.groups.get(acc.name) else {
                continue;
            };
            if self.history_is_anothers(acc) {
                continue;
            }
            // A deque(maxlen=k) grows only until it holds k: a leak only
            // where k items do not fit in the memory.
            if let Some(&maxlen) = self.facts.bounded.get(acc.name) {
                if let Some(f) = self.bounded_overflow(ctx, g as u32, acc, h, maxlen) {
                    gpu_leak = true;
                    findings.push(f);
                }
                continue;
            }
            if let Some(f) = self.classify(ctx, g as u32, acc, h) {
                gpu_leak |= f.growth_per_iter > 0 && f.kind != FindingKind::RetainedGraphHost;
                findings.push(f);
            }
        }
        if let Some(f) = self.fragmentation(gpu_leak) {
            findings.push(f);
        }
        if let Some(f) = self.missing_zero_grad() {
            findings.push(f);
        }
        if let Some(f) = self.stale_autocast_cache(ctx, accs) {
            findings.push(f);
        }
        if let Some(f) = self.stale_optimizer_params(ctx, accs) {
            findings.push(f);
        }
        findings.extend(self.stray_gradients(ctx, accs));
        findings.extend(self.teacher_graphs(ctx, accs));
        if findings.iter().all(|f| !f.kind.is_leak()) {
            if let Some(f) = self.one_off_peak(ctx, accs) {
                findings.push(f);
            }
            findings.extend(self.rebound_buffer_peaks(ctx));
        }
        settle(&mut findings);
        findings
    }

    /// A name the loop rebinds every iteration (`out = model(x)`, `loss =
    /// criterion(...)`) that reaches older graphs only through Nodes another
    /// root reaches too (an LSTM's output through the carried hidden state):
    /// the history is that root's, not this name's.
    fn history_is_anothers(&self, acc: &GroupAcc) -> bool {
        acc.kind == GroupKind::Variable
            && self.facts.rebound_each_iteration(acc.name)
            && acc.alone_span.is_none_or(|(lo, hi)| lo == hi)
    }

    fn classify(&self, ctx: &Ctx, g: u32, acc: &GroupAcc, h: &GroupHistory) -> Option<Finding> {
        let s: Vec<GroupSample> = h.samples.iter().copied().collect();
        let cur = *s.last()?;
        let it = cur.iteration;
        let graph = trend(&s, |x| x.graph_old);
        let own = trend(&s, |x| x.own_old);
        let nodes = trend(&s, |x| x.nodes as u64);
        let chain_span = cur
            .oldest_node_iteration
            .map_or(0, |o| it.saturating_sub(o) as usize + 1);
        let gpu_total = trend(&s, |x| x.own_old + x.graph_old);
        let name = acc.name;
        // The spent Node a failed backward reached, when this group's graph
        // leads to it: the root that carried an old graph into a new one
        // (within one iteration too: two batches per iteration).
        let spent = ctx.ls.spent_reached.and_then(|n| {
            let reached = acc
                .roots
                .iter()
                .any(|&ri| ctx.ls.roots[ri].nodes.contains(&n));
            let p = lookup(ctx.npos, n.0);
            (reached && p != NONE).then(|| &ctx.ls.nodes[p as usize])
        });
        let reaches_spent = spent.is_some();

        let graph_growing = graph.steps >= MIN_GROWTH_STEPS
            || (chain_span >= MIN_GROWTH_STEPS && graph.steps >= MIN_GROWTH_STEPS - 1);
        // Growth that comes every k iterations (once an epoch): never a
        // fall, at least MIN_GROWTH_STEPS rises, the last not long ago.
        // (A run stopped part-way: its last sample is no iteration's end.)
        let whole = match self.error {
            Some(_) => &s[..s.len() - 1],
            None => &s[..],
        };
        let stepwise =
            (graph.steps < MIN_GROWTH_STEPS && own.steps < MIN_GROWTH_STEPS && cur.gpu() > 0)
                .then(|| periodic(whole, |x| x.own_old + x.graph_old))
                .flatten();
        // A container filled within this iteration until the memory ran out.
        let within = self.ran_out
            && acc.kind == GroupKind::List
            && cur.elements as usize >= MIN_GROWTH_STEPS
            && cur.gpu() > 0
            && cur.own_old + cur.graph_old == 0;
        let (kind, per_iter, growth_steps) = if let Some(p) = &stepwise {
            let kind = if cur.graph > 0 {
                FindingKind::RetainedGraphGpu
            } else {
                FindingKind::StoredTensors
            };
            (kind, p.per_iter, p.rises)
        } else if within {
            let kind = if cur.graph > 0 {
                FindingKind::RetainedGraphGpu
            } else {
                FindingKind::StoredTensors
            };
            (kind, 0, 0)
        } else if cur.graph > 0 && graph_growing {
            let kind = if acc.kind == GroupKind::Hidden {
                FindingKind::CarriedHiddenState
            } else {
                FindingKind::RetainedGraphGpu
            };
            let per = gpu_total.per_iter.max(graph.per_iter);
            (kind, per, graph.steps)
        } else if own.steps >= MIN_GROWTH_STEPS && cur.own > 0 {
            // A container (or accumulator) gains GPU storages every iteration.
            let zero_dim = acc.kind == GroupKind::List
                && cur.elements > 0
                && cur.own / cur.elements as u64 <= 512;
            let kind = if zero_dim && nodes.steps >= MIN_GROWTH_STEPS && cur.spent > 0 {
                FindingKind::RetainedGraphHost
            } else {
                FindingKind::StoredTensors
            };
            (kind, own.per_iter, own.steps)
        } else if nodes.steps >= MIN_GROWTH_STEPS && chain_span >= 2 && cur.graph == cur.leaf {
            // No saved tensor kept (a leaf at the chain's start, with its
            // .grad, is what an AccumulateGrad holds, once: not growth).
            (
                FindingKind::RetainedGraphHost,
                gpu_total.per_iter.max(0),
                nodes.steps,
            )
        } else if self.error.as_deref().is_some_and(|e| {
            e.contains(BACKWARD_TWICE)
                || (acc.kind == GroupKind::Hidden && e.contains("RuntimeError"))
        }) && (chain_span >= 2 || reaches_spent)
        {
            // The run stopped: a carried graph reached an already-released one.
            let kind = if acc.kind == GroupKind::Hidden {
                FindingKind::CarriedHiddenState
            } else {
                FindingKind::RetainedGraphHost
            };
            (kind, 0, 0)
        } else {
            return None;
        };

        let mut f = Finding::new(name, kind);
        f.bytes = cur.gpu();
        f.growth_per_iter = per_iter;
        f.iterations = match kind {
            FindingKind::StoredTensors => cur
                .oldest_storage_iteration
                .map_or(1, |o| it.saturating_sub(o) + 1),
            _ => chain_span.max(1) as u32,
        };
        f.by_category = categories(&acc.by_cat);
        f.blocks = blocks_of(ctx, g);
        f.path = path_for(
            ctx,
            g,
            acc,
            kind,
            spent.map(|_| lookup(ctx.npos, ctx.ls.spent_reached.map_or(0, |n| n.0))),
        );
        f.full_at_iteration = self.projection(it, per_iter, kind);
        f.fix = fix::fix_for(&self.facts, name, acc.kind, kind);
        if let (Some(g), false) = (
            self.facts
                .keeps_create_graph_grad(name)
                .filter(|g| !self.facts.penalized_grads.contains(*g)),
            f.fix.contains('#'),
        ) {
            f.fix.push_str(&format!(
                "  # or create_graph=False, where nothing backpropagates through {g}"
            ));
        }
        if let Some(p) = &stepwise {
            if let Some(reset) = fix::reset_on_schedule(&self.facts, name, acc.kind) {
                f.fix = reset;
            }
            f.iterations = it.saturating_sub(p.since) + 1;
            f.evidence = self.periodic_evidence(name, &cur, p);
            f.severity = Severity::Critical;
            return Some(f);
        }
        if within {
            f.iterations = 1;
            f.evidence = self.within_evidence(ctx, acc, name, &cur);
            f.severity = Severity::Critical;
            return Some(f);
        }
        f.evidence = match kind {
            FindingKind::RetainedGraphGpu if self.facts.fed_back(name) => {
                let why = if self.facts.grad_inputs.contains(name) {
                    format!(
                        "torch.autograd.grad(…, {name}) stops at `{name}`: the earlier steps' \
                         Nodes never run again, so nothing raises and nothing frees what they saved"
                    )
                } else {
                    "every backward runs them all again, and retain_graph=True keeps what they \
                     saved"
                        .to_string()
                };
                format!(
                    "`{name}` is fed back as the next input without .detach(): each step's new \
                     `{name}` is computed from the old one, so its history reaches {} autograd \
                     Nodes created over {} iterations; {why}. {} of saved tensors are reachable \
                     only through it, growing by {} per iteration over the last {growth_steps} \
                     iterations.",
                    cur.nodes,
                    f.iterations,
                    graph_bytes(&cur),
                    signed_size(graph.per_iter),
                )
            }
            FindingKind::RetainedGraphGpu if cur.leaf == cur.graph => {
                self.spent_graph_leaves_evidence(name, &cur, &f, growth_steps)
            }
            FindingKind::RetainedGraphGpu if self.facts.keeps_create_graph_grad(name).is_some() => {
                let g = self.facts.keeps_create_graph_grad(name).unwrap_or_default();
                let mut e = format!(
                    "`{name}` keeps `{g}`, a gradient computed with create_graph=True: its own \
                     graph (the double-backward Nodes, which save what the gradient's formulas \
                     read) leads back into the forward graph, which create_graph=True kept \
                     (retain_graph defaults to it). {} autograd Nodes created over {} iterations \
                     are reachable; {} of saved tensors only through `{name}`, growing by {} per \
                     iteration over the last {growth_steps} iterations: each kept `{g}` keeps its \
                     batch's activations.",
                    cur.nodes,
                    f.iterations,
                    graph_bytes(&cur),
                    signed_size(graph.per_iter),
                );
                if let Some((hv, gv)) = self.facts.retained_grad_calls.first() {
                    e.push_str(&format!(
                        " `{hv} = torch.autograd.grad({gv}, model.parameters(), retain_graph=True)` \
                         (a Hessian-vector product) ran back through `{g}`'s graph and kept what \
                         it saved: without retain_graph=True that backward frees it, and a kept \
                         `{g}` holds only itself."
                    ));
                }
                e
            }
            FindingKind::RetainedGraphGpu => format!(
                "`{name}` reaches {} autograd Nodes created over {} iterations whose saved tensors were never \
                 released; {} of saved activations are reachable only through it and grew by {} per \
                 iteration over the last {growth_steps} iterations: each iteration adds the activations \
                 its forward saved for backward.{}",
                cur.nodes,
                f.iterations,
                graph_bytes(&cur),
                signed_size(graph.per_iter),
                self.retained_because(),
            ),
            FindingKind::CarriedHiddenState => {
                if growth_steps == 0 {
                    let reached = match spent {
                        Some(n) => format!(
                            "its graph reaches {} of iteration {}, which an earlier backward already ran \
                             and whose saved tensors it freed",
                            n.name, n.iteration
                        ),
                        None => format!(
                            "its graph reaches Nodes of iteration {}",
                            cur.oldest_node_iteration.unwrap_or(0)
                        ),
                    };
                    format!(
                        "`{name}` is carried into the next batch without detach(): {reached}, so the next \
                         backward ran on into that older graph and the run stopped with \"{}\". `{name}` is \
                         the cause.",
                        first_sentence(self.error.as_deref().unwrap_or("")),
                    )
                } else {
                    format!(
                        "`{name}` carries the graph of every batch since iteration {}: {} Nodes, {} of saved \
                         tensors (reserve, outputs, log-probs) kept alive, growing by {} per iteration; \
                         backward also walks the whole history.",
                        cur.oldest_node_iteration.unwrap_or(0),
                        cur.nodes,
                        format_size(cur.graph),
                        signed_size(graph.per_iter),
                    )
                }
            }
            FindingKind::StoredTensors if acc.kind == GroupKind::Cycle => format!(
                "`{name}` refers to itself and was rebound {} times: each old value is an unreachable \
                 reference cycle, which reference counting never frees. Together they hold {} of GPU \
                 tensors, {} per iteration over the last {growth_steps} iterations, until the cyclic \
                 collector runs (gc.collect(), or CPython's own collection when its thresholds trip).",
                cur.elements.saturating_sub(1),
                format_size(cur.own),
                signed_size(own.per_iter),
            ),
            FindingKind::StoredTensors => {
                let mut e = format!(
                    "`{name}` holds {} GPU tensors ({}) that nothing else references and gains {} per \
                     iteration over the last {growth_steps} iterations; they carry no un-released graph \
                     (a growing {}, not a retained graph).",
                    cur.elements,
                    format_size(cur.own),
                    signed_size(own.per_iter),
                    self.facts.container_noun(name),
                );
                if cur.nodes > 0 {
                    e.push_str(&format!(
                        " They also keep {} spent autograd Nodes on the host.",
                        cur.nodes
                    ));
                }
                match self.facts.hooked_by(name) {
                    Some((m, false)) => e.push_str(&format!(
                        " A forward hook on `{m}` appends its output to it at every forward: \
                         the hook, not the loop, is what keeps them."
                    )),
                    Some((m, true)) => e.push_str(&format!(
                        " A full backward hook on `{m}` appends the gradient of its output to \
                         it at every backward, a gradient backward would have freed once `{m}` \
                         used it: the hook, not the loop, is what keeps them."
                    )),
                    None => {}
                }
                e
            }
            FindingKind::RetainedGraphHost => self.host_graph_evidence(acc, &cur, growth_steps, per_iter),
            _ => String::new(),
        };
        f.severity = match kind {
            FindingKind::RetainedGraphGpu | FindingKind::CarriedHiddenState => Severity::Critical,
            FindingKind::StoredTensors => {
                if f.full_at_iteration.is_some_and(|n| n < it as u64 + 10_000) {
                    Severity::Critical
                } else {
                    Severity::Warning
                }
            }
            _ => Severity::Warning,
        };
        Some(f)
    }

    /// A spent graph (backward ran through it and freed what it saved)
    /// that still reaches the `AccumulateGrad` of leaves no name holds any
    /// more: the accumulator holds its leaf, and the leaf its `.grad`.
    fn spent_graph_leaves_evidence(
        &self,
        name: &str,
        cur: &GroupSample,
        f: &Finding,
        growth_steps: usize,
    ) -> String {
        let kept = self.facts.keeps_create_graph_grad(name);
        let leaf = kept
            .and_then(|g| self.facts.grad_of.get(g))
            .map_or("a requires_grad leaf".to_string(), |x| format!("`{x}`"));
        let what = match kept {
            Some(g) => format!(
                "`{name}` keeps `{g}`, a gradient computed with create_graph=True. A backward \
                 already ran through its graph and freed what that graph saved, but the graph \
                 still leads to the AccumulateGrad of {leaf}, the leaf `{g}` was taken with \
                 respect to"
            ),
            None => format!(
                "`{name}` reaches graphs a backward already ran (what they saved is freed), \
                 but they still lead to the AccumulateGrad of {leaf}"
            ),
        };
        format!(
            "{what}: the AccumulateGrad holds its leaf and the leaf its .grad, and no name \
             holds either any more. {} autograd Nodes created over {} iterations are \
             reachable; {} of leaves and their gradients only through `{name}`, besides the \
             {} of its own tensors: {} per iteration in all over the last {growth_steps} \
             iterations.",
            cur.nodes,
            f.iterations,
            format_size(cur.leaf),
            format_size(cur.own),
            signed_size(f.growth_per_iter),
        )
    }

    /// Why a kept graph still has its saved tensors, where the program says:
    /// a backward with `retain_graph=True` kept them, and a second model's
    /// output the model ran on without `.detach()` is why it was needed.
    fn retained_because(&self) -> String {
        let Some(loss) = self.facts.retained_losses.first() else {
            return String::new();
        };
        let mut s = format!(
            " `{loss}.backward(retain_graph=True)` kept the saved tensors that backward would \
             have freed."
        );
        if let Some((out, model)) = self.facts.undetached_twice() {
            s.push_str(&format!(
                " It was needed only because `model({out})` runs without .detach(): that \
                 backward runs on into `{model}`'s graph, which the next backward through \
                 `{out}` needs again (\"Trying to backward through the graph a second time\" \
                 without it). `model({out}.detach())` stops there and needs no retain_graph."
            ));
        }
        s
    }

    /// Graphs kept on the host. Whether backward freed their saved tensors
    /// is said only where it did: with `retain_graph=True` it kept them, and
    /// they are held here through other roots.
    fn host_graph_evidence(
        &self,
        acc: &GroupAcc,
        cur: &GroupSample,
        growth_steps: usize,
        per_iter: i64,
    ) -> String {
        let name = acc.name;
        let since = cur.oldest_node_iteration.unwrap_or(0);
        if growth_steps == 0 {
            return format!(
                "`{name}` links graphs of iterations {since}..{}; the run stopped with \"{}\".",
                cur.iteration,
                first_sentence(self.error.as_deref().unwrap_or("")),
            );
        }
        let saved = if cur.spent == cur.nodes && !self.facts.retain_graph {
            "backward already freed every saved tensor they had"
        } else {
            "none of the saved tensors they reach is held by it alone"
        };
        if self.facts.ema_with_grad(name) {
            return format!(
                "`{name}` is updated outside torch.no_grad(): adding a parameter (which requires \
                 grad) in place gives each of its tensors a history, rebased at every update onto \
                 the last one, so {} Nodes now hang from it on the host and more each iteration. \
                 Nothing ever runs backward through them; the GPU does not grow from this ({} \
                 per iteration), the host does, and every update records more.",
                cur.nodes,
                signed_size(per_iter),
            );
        }
        let again = match acc.kind {
            _ if self.facts.fed_back(name) && self.facts.grad_inputs.contains(name) => format!(
                "`{name}` is fed back as the next input without .detach(); torch.autograd.grad \
                 stops at it, so the history is never run again: it only grows."
            ),
            _ if self.facts.fed_back(name) => format!(
                "`{name}` is fed back as the next input without .detach(): every backward from it \
                 runs that whole history again, and backward's time grows with it."
            ),
            GroupKind::List => format!(
                "A later backward through any element of `{name}` would fail: those graphs were \
                 already backpropagated."
            ),
            _ => format!(
                "A later `{name}.backward()` would fail: those graphs were already backpropagated."
            ),
        };
        format!(
            "`{name}` keeps every iteration's spent graph linked since iteration {since}: {} Nodes on \
             the host, and {saved}. GPU growth is {} per iteration ({} now): host memory grows, the \
             GPU does not run out from this. {again}",
            cur.nodes,
            signed_size(per_iter),
            format_size(cur.gpu()),
        )
    }

    fn projection(&self, it: u32, per_iter: i64, kind: FindingKind) -> Option<u64> {
        if per_iter <= 0 || self.capacity == 0 || kind == FindingKind::RetainedGraphHost {
            return None;
        }
        // The iteration's own peak reaches the capacity first, not its end.
        let peak = self
            .iterations
            .back()
            .map_or(0, |s| s.peak_allocated.max(s.allocated));
        let free = self.capacity.saturating_sub(peak);
        Some(it as u64 + free.div_ceil(per_iter as u64))
    }
}

/// Growth in steps: the trailing run of samples that never falls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Periodic {
    /// Iterations at which the measure rose, oldest first.
    pub(super) at: Vec<u32>,
    pub(super) rises: usize,
    /// The iteration the run starts at (before its first rise).
    pub(super) since: u32,
    /// Mean growth per iteration since then.
    pub(super) per_iter: i64,
    /// The mean rise.
    pub(super) per_rise: u64,
}

/// The trailing run of samples in which `f` never falls, when it rose at
/// least [`MIN_GROWTH_STEPS`] times and not longer ago than twice the
/// longest gap between rises (growth that stopped is a cache filling, not a
/// leak).
pub(super) fn periodic(s: &[GroupSample], f: impl Fn(&GroupSample) -> u64) -> Option<Periodic> {
    let n = s.len();
    if n < 2 {
        return None;
    }
    let mut start = n - 1;
    let mut at = Vec::new();
    while start > 0 {
        let (a, b) = (&s[start - 1], &s[start]);
        if f(b) < f(a) {
            break;
        }
        if f(b) > f(a) {
            at.push(b.iteration);
        }
        start -= 1;
    }
    at.reverse();
    if at.len() < MIN_GROWTH_STEPS {
        return None;
    }
    let gap = at.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(1);
    if gap == 1 {
        // Growth every iteration is the trend's to judge, not a schedule.
        return None;
    }
    let last = s[n - 1].iteration;
    if last - at[at.len() - 1] > 2 * gap {
        return None;
    }
    let first = &s[start];
    let span = i64::from((last - first.iteration).max(1));
    let grown = f(&s[n - 1]).saturating_sub(f(first));
    Some(Periodic {
        rises: at.len(),
        since: first.iteration,
        per_iter: grown as i64 / span,
        per_rise: grown / at.len() as u64,
        at,
    })
}

#[derive(Debug, Clone, Copy)]
struct Trend {
    /// Trailing consecutive iteration boundaries with strict growth.
    steps: usize,
    /// Mean growth per iteration over that run (at most the last 8 steps).
    per_iter: i64,
}

fn trend(s: &[GroupSample], f: impl Fn(&GroupSample) -> u64) -> Trend {
    let mut steps = 0;
    for w in s.windows(2).rev() {
        if w[1].iteration == w[0].iteration + 1 && f(&w[1]) > f(&w[0]) {
            steps += 1;
        } else {
            break;
        }
    }
    let k = steps.min(8);
    let per_iter = if k == 0 {
        0
    } else {
        let n = s.len();
        (f(&s[n - 1]) as i64 - f(&s[n - 1 - k]) as i64) / k as i64
    };
    Trend { steps, per_iter }
}

pub(super) fn categories(by_cat: &[u64; CATS]) -> Vec<(&'static str, u64)> {
    let mut v: Vec<(&'static str, u64)> = CAT_NAMES
        .iter()
        .zip(by_cat.iter())
        .filter(|(_, b)| **b > 0)
        .map(|(n, b)| (*n, *b))
        .collect();
    v.sort_by_key(|c| std::cmp::Reverse(c.1));
    v
}

/// A group's graph bytes, saying how much of it is leaves an
/// `AccumulateGrad` alone keeps (with their `.grad`), where some is.
fn graph_bytes(cur: &GroupSample) -> String {
    match cur.leaf {
        0 => format_size(cur.graph),
        l => format!(
            "{} ({} of it leaves no name holds and their .grad, kept by their AccumulateGrad)",
            format_size(cur.graph),
            format_size(l)
        ),
    }
}

/// An error message's first sentence, without its full stop (PyTorch's
/// go on with advice).
fn first_sentence(message: &str) -> &str {
    let first = message.find(". ").map_or(message, |i| &message[..i]);
    first.trim_end_matches('.')
}
