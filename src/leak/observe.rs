//! Ingest for the scenario-run detector: live states and errors in; the device and per-group history kept; each observation run
//! through grouping (`reach.rs`) and classification (`classify.rs`).

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::detector::{Detector, GroupHistory, GroupKind, IterationSample, HISTORY, NONE};
use super::finding::{settle, Finding};
use super::holders::holders;
use super::oom::{what_ifs, Grew, OomAnswer, LISTED_HOLDERS};
use super::reach::{
    assign_owners, charge_bytes, count_nodes, group_roots, index_nodes, index_storages, lookup,
    Ctx, GroupAcc, Grouping,
};
use crate::engine::{EngineError, HeldState};

impl Detector {
    /// Feed one observation. A second observation of the same iteration (an
    /// on-demand query at a frame) replaces that iteration's sample.
    pub fn observe(&mut self, ls: &HeldState, allocated: u64, reserved: u64) -> &[Finding] {
        let it = ls.iteration;
        // A running maximum: peaks reset by reset_peak_memory_stats() still
        // count as demand the cache once had to meet.
        let peak_allocated = self
            .iterations
            .back()
            .map_or(0, |s| s.peak_allocated)
            .max(ls.peak_allocated)
            .max(allocated);
        let sample = IterationSample {
            iteration: it,
            allocated,
            reserved,
            peak_allocated,
            host_graph_nodes: ls.host_graph_nodes,
        };
        push_sample(&mut self.iterations, sample, |s| s.iteration);
        let complete = self.error.is_none() && it > 0;
        if complete && self.first_sample.is_none() {
            self.first_sample = Some(sample);
        }
        self.analyze(ls);
        if complete {
            for h in &self.holders {
                self.first_bytes
                    .entry(h.name.clone())
                    .or_insert((it, h.bytes));
            }
        }
        &self.findings
    }

    /// Feed an engine error that stopped the run (e.g. the backward-twice
    /// error of a hidden state carried without `detach`, §8.3).
    pub fn observe_error(&mut self, err: &EngineError, ls: &HeldState) -> &[Finding] {
        self.error = Some(err.to_string());
        self.ran_out = matches!(err, EngineError::OutOfMemory { .. });
        let before = self.findings.clone();
        let (a, r) = (ls.allocated, ls.reserved);
        self.observe(ls, a, r);
        // The failing iteration stopped part-way, so it cannot show growth;
        // what the complete iterations before it showed still stands.
        for f in before {
            if !self.findings.iter().any(|n| n.root == f.root) {
                self.findings.push(f);
            }
        }
        settle(&mut self.findings);
        if let EngineError::OutOfMemory { requested, .. } = err {
            // The run did run out: that fact, not a projection of when it would.
            for f in &mut self.findings {
                f.full_at_iteration = None;
                f.ran_out_at_iteration = Some(u64::from(ls.iteration));
            }
            self.oom_answer = Some(self.answer_oom(ls, *requested));
        }
        &self.findings
    }

    /// The answer at an OOM (see `oom.rs`): the holders of this
    /// observation, the growth since the first completed iteration, and the
    /// what-ifs replayed on the run's own requests.
    fn answer_oom(&self, ls: &HeldState, requested: u64) -> OomAnswer {
        let (at_request, what_if) = match self.requests.last_oom() {
            Some(at) => what_ifs(&self.requests, at, &self.device),
            None => (None, Vec::new()),
        };
        let allocated_now = at_request.map_or(ls.allocated, |a| a.allocated);
        let first = self.first_sample.filter(|f| f.iteration < ls.iteration);
        let mut by: Vec<(String, u64, u64)> = match first {
            Some(f) => self
                .holders
                .iter()
                .filter_map(|h| {
                    let then = match self.first_bytes.get(&h.name) {
                        Some((it, b)) if *it == f.iteration => *b,
                        _ => 0,
                    };
                    (h.bytes > then).then(|| (h.name.clone(), then, h.bytes))
                })
                .collect(),
            None => Vec::new(),
        };
        by.sort_by_key(|(_, a, b)| std::cmp::Reverse(b - a));
        by.truncate(4);
        let within_iteration = self
            .holders
            .iter()
            .filter(|h| h.named && h.items >= 2 && h.bytes > 0 && h.this_iteration == h.bytes)
            .take(3)
            .map(|h| (h.name.clone(), h.bytes, h.items))
            .collect();
        OomAnswer {
            iteration: ls.iteration,
            place: format!("iteration {}", ls.iteration),
            requested,
            at_request,
            holders: self.holders.iter().take(LISTED_HOLDERS).cloned().collect(),
            temporaries: at_request.map(|a| a.allocated.saturating_sub(ls.allocated)),
            grew: Grew {
                since_iteration: first.map(|f| f.iteration),
                allocated_then: first.map_or(0, |f| f.allocated),
                allocated_now,
                by,
                within_iteration,
                unknown: None,
            },
            what_if,
        }
    }

    fn analyze(&mut self, ls: &HeldState) {
        // Index storages and nodes by id.
        let spos = index_storages(ls, std::mem::take(&mut self.node_pos));
        let npos = index_nodes(ls);

        // Group the roots.
        let Grouping {
            mut accs,
            index,
            root_group,
            grads,
        } = group_roots(ls);

        // Nodes per group (deduplicated: a hidden pair shares one graph).
        let mut mark = std::mem::take(&mut self.node_mark);
        count_nodes(ls, &mut accs, &npos, &mut mark);

        // Who holds each storage.
        let mut owner = std::mem::take(&mut self.owner);
        let mut is_own = std::mem::take(&mut self.is_own);
        assign_owners(ls, &accs, &root_group, &spos, &mut owner, &mut is_own);

        // Bytes per group.
        charge_bytes(ls, &mut accs, &owner, &is_own);

        // Gradients that persist across iterations (never zeroed with set_to_none).
        self.track_gradients(ls, &spos, &grads);

        // Record the history and forget groups that are gone.
        self.record_history(ls.iteration, &accs, &index);

        // Classify.
        let ctx = Ctx {
            ls,
            owner: &owner,
            is_own: &is_own,
            spos: &spos,
            npos: &npos,
        };
        self.findings = self.findings_for(&ctx, &accs);
        self.holders = holders(ls, &accs, &owner, &self.facts);
        self.owner = owner;
        self.is_own = is_own;
        self.node_pos = spos;
        self.node_mark = mark;
    }

    /// Gradients that persist across iterations (never zeroed with set_to_none).
    fn track_gradients(&mut self, ls: &HeldState, spos: &[u32], grads: &[usize]) {
        let it = ls.iteration;
        let mut grad_bytes = 0;
        let mut grad_blocks = Vec::new();
        let mut persisted = !grads.is_empty();
        let mut grad_storages: Vec<u32> = grads
            .iter()
            .map(|&ri| lookup(spos, ls.roots[ri].storage.0))
            .filter(|p| *p != NONE)
            .collect();
        grad_storages.sort_unstable();
        grad_storages.dedup();
        for p in grad_storages {
            let s = &ls.storages[p as usize];
            persisted &= s.iteration < it;
            grad_bytes += s.block;
            if let Some(a) = s.addr {
                grad_blocks.push(a);
            }
        }
        let last_it = self.iterations.iter().rev().nth(1).map(|s| s.iteration);
        if persisted {
            if last_it != Some(it) {
                self.grad_persist_streak += 1;
            }
        } else {
            self.grad_persist_streak = 0;
        }
        self.grad_bytes = grad_bytes;
        self.grad_blocks = grad_blocks;
    }

    /// Record the history and forget groups that are gone.
    fn record_history(&mut self, it: u32, accs: &[GroupAcc], index: &FxHashMap<&str, usize>) {
        for acc in accs {
            if acc.kind == GroupKind::Other {
                continue;
            }
            match self.groups.get_mut(acc.name) {
                Some(h) => {
                    if h.samples.back().is_some_and(|s| s.iteration + 1 < it) {
                        h.samples.clear();
                    }
                    push_sample(&mut h.samples, acc.sample, |s| s.iteration);
                }
                None => {
                    // Most groups never grow: room for the one sample (a history
                    // of 8 for every name was half the memory of a run of 100,000).
                    let mut samples = VecDeque::with_capacity(1);
                    samples.push_back(acc.sample);
                    self.groups
                        .insert(acc.name.to_string(), GroupHistory { samples });
                }
            }
        }
        if self.groups.len() > accs.len() {
            self.groups.retain(|k, _| index.contains_key(k.as_str()));
        }
    }
}

fn push_sample<T: Copy>(q: &mut VecDeque<T>, s: T, it: impl Fn(&T) -> u32) {
    if q.back().is_some_and(|b| it(b) == it(&s)) {
        q.pop_back();
    }
    if q.len() == HISTORY {
        q.pop_front();
    }
    q.push_back(s);
}
