//! What a run shows, for checking the sizes a lesson's text states.
//!
//! Two kinds of figure. The program's own sizes hold at any moment (a
//! narration may say what a tensor or a segment will be before it exists):
//! every block's size and request, every segment, the blocks of the final
//! layout, the growth of allocated from one iteration's end to the next,
//! the device and the allocator settings. The state holds only at its
//! moment: allocated, reserved, their peaks so far, what each kind of
//! tensor holds (parameters, gradients, optimizer state, …) and its
//! highest so far, the iteration ends so far, an OOM's message once
//! raised. A run has one moment per narration, at the narration's own
//! event, and one at its end.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::alloc::{format_size, Action, Family, Level};
use crate::engine::Category;
use crate::scenario::RunResult;
use crate::trace::event::{Event, Marker, Phase};

use super::figure::{figures_in, StatedFigure};

/// A figure of a run, named for a reader.
#[derive(Debug, Clone)]
pub struct Fact {
    pub what: String,
    pub bytes: u64,
}

fn fact(what: impl Into<String>, bytes: u64) -> Fact {
    Fact {
        what: what.into(),
        bytes,
    }
}

/// A run's state at one moment.
#[derive(Debug, Clone, Default)]
pub struct Moment {
    /// The narration shown at this moment; None at the run's end.
    pub narration: Option<Arc<str>>,
    pub allocated: u64,
    pub reserved: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// The highest allocated in each phase so far.
    pub phase_peaks: Vec<(Phase, u64)>,
    /// What each kind of tensor holds now, and its highest so far.
    pub by_category: Vec<(Category, u64, u64)>,
    /// Iteration ends so far: (allocated, reserved).
    pub step_ends: Vec<(u64, u64)>,
    /// The OOM's message, once raised.
    pub oom: Option<String>,
}

/// A run read for its figures: its moments (one per narration, in order,
/// then its end) and the program's sizes.
#[derive(Debug, Clone, Default)]
pub struct RunFacts {
    pub moments: Vec<Moment>,
    /// Every block's size and request, every segment's size, the final
    /// layout's blocks and segments.
    sizes: BTreeSet<u64>,
    /// The device, the allocator settings, allocated's growth per iteration.
    program: Vec<Fact>,
}

/// The figures `PYTORCH_CUDA_ALLOC_CONF` sets: the largest block split
/// (`max_split_size_mb`), the memory a fraction allows and where its
/// garbage-collection threshold acts.
fn conf_facts(alloc_conf: &str, capacity: u64) -> Vec<Fact> {
    let setting = |key: &str| -> Option<f64> {
        alloc_conf
            .split(',')
            .filter_map(|kv| kv.split_once(':'))
            .find(|(k, _)| k.trim() == key)
            .and_then(|(_, v)| v.trim().parse().ok())
    };
    let mut out = Vec::new();
    if let Some(mb) = setting("max_split_size_mb") {
        out.push(fact("max_split_size_mb", (mb * 1_048_576.0) as u64));
    }
    let allowed = setting("per_process_memory_fraction").map(|f| (capacity as f64 * f) as u64);
    if let Some(a) = allowed {
        out.push(fact("the memory the fraction allows", a));
    }
    if let Some(t) = setting("garbage_collection_threshold") {
        let of = allowed.unwrap_or(capacity);
        out.push(fact(
            "where the garbage-collection threshold acts",
            (of as f64 * t) as u64,
        ));
    }
    out
}

/// The caching allocator's own sizes, which any run follows: the smallest
/// block, the small-pool limit, the small and large segment sizes, where a
/// request gets a segment of its own, and what large requests round to.
fn rule_facts() -> Vec<Fact> {
    use crate::alloc::constants::*;
    vec![
        fact("the smallest block", MIN_BLOCK_SIZE),
        fact("the small pool's largest request", SMALL_SIZE),
        fact("a small-pool segment", SMALL_BUFFER),
        fact(
            "a large-pool segment for requests up to 10 MiB",
            LARGE_BUFFER,
        ),
        fact(
            "the smallest request with a segment of its own",
            MIN_LARGE_ALLOC,
        ),
        fact("what a large request rounds up to", ROUND_LARGE),
    ]
}

impl RunFacts {
    pub fn read(r: &RunResult, alloc_conf: &str) -> RunFacts {
        let mut sizes = BTreeSet::new();
        let mut now = Moment::default();
        let mut phase: Option<Phase> = None;
        let mut live: HashMap<u64, (Category, u64)> = HashMap::new();
        let mut moments = Vec::new();
        for e in &r.events {
            match e {
                Event::Alloc(a) => match a.action {
                    Action::Alloc => {
                        now.allocated += a.block_size;
                        sizes.insert(a.block_size);
                        sizes.insert(a.size);
                        if let Some(info) = r.tags.info(a.tag) {
                            live.insert(a.addr, (info.category, a.block_size));
                            add(&mut now.by_category, info.category, a.block_size as i64);
                        }
                    }
                    Action::FreeRequested => {
                        now.allocated = now.allocated.saturating_sub(a.block_size);
                        if let Some((cat, size)) = live.remove(&a.addr) {
                            add(&mut now.by_category, cat, -(size as i64));
                        }
                    }
                    Action::SegmentAlloc | Action::SegmentMap => {
                        now.reserved += a.size;
                        sizes.insert(a.size);
                    }
                    Action::SegmentFree | Action::SegmentUnmap => {
                        now.reserved = now.reserved.saturating_sub(a.size)
                    }
                    Action::Oom => {
                        // The request that failed is a size of the program.
                        sizes.insert(a.size);
                        now.oom = r.oom.as_ref().map(|o| o.message.clone());
                    }
                    _ => {}
                },
                Event::Marker(Marker::PhaseBegin(p)) => phase = Some(*p),
                Event::Marker(Marker::PhaseEnd(_)) => phase = None,
                Event::Marker(Marker::IterationEnd(i)) => {
                    if let Some(p) = r.per_iteration.iter().find(|p| p.iteration == *i) {
                        now.step_ends.push((p.allocated, p.reserved));
                    }
                }
                Event::Marker(Marker::Narration(text)) => {
                    let mut m = now.clone();
                    m.narration = Some(text.clone());
                    moments.push(m);
                }
                Event::Marker(_) => {}
            }
            now.peak_allocated = now.peak_allocated.max(now.allocated);
            now.peak_reserved = now.peak_reserved.max(now.reserved);
            if let Some(p) = phase {
                match now.phase_peaks.iter_mut().find(|(q, _)| *q == p) {
                    Some((_, peak)) => *peak = (*peak).max(now.allocated),
                    None => now.phase_peaks.push((p, now.allocated)),
                }
            }
        }
        // The run's own figures where they are kept apart from the events.
        now.peak_allocated = now.peak_allocated.max(r.peak_allocated);
        now.peak_reserved = now.peak_reserved.max(r.peak_reserved);
        if now.oom.is_none() {
            now.oom = r.oom.as_ref().map(|o| o.message.clone());
        }
        let by_category = now.by_category.clone();
        moments.push(now);
        for s in &r.segments {
            sizes.insert(s.total_size);
            sizes.extend(s.blocks.iter().map(|b| b.size));
        }
        let c = &r.conditions;
        let mut program = vec![
            fact("the device's capacity", c.capacity),
            fact("the memory never the allocator's (the context)", c.overhead),
            fact(
                "the capacity less the context",
                c.capacity.saturating_sub(c.overhead),
            ),
        ];
        program.extend(conf_facts(alloc_conf, c.capacity));
        program.extend(rule_facts());
        // The model's own sizes: its weights, and its state with gradients
        // and optimizer state, at their largest.
        let most = |cats: &[Category]| {
            by_category
                .iter()
                .filter(|(c, _, _)| cats.contains(c))
                .map(|(_, _, most)| *most)
                .sum::<u64>()
        };
        program.push(fact("the model's parameters", most(&[Category::Parameter])));
        program.push(fact(
            "the model state at its largest (parameters, gradients, optimizer state)",
            most(&[
                Category::Parameter,
                Category::Gradient,
                Category::OptimizerState,
            ]),
        ));
        for w in r.per_iteration.windows(2) {
            if w[1].allocated > w[0].allocated {
                program.push(fact(
                    format!("allocated's growth in iteration {}", w[1].iteration),
                    w[1].allocated - w[0].allocated,
                ));
            }
        }
        RunFacts {
            moments,
            sizes,
            program,
        }
    }

    /// The run's end.
    pub fn end(&self) -> Moment {
        self.moments.last().cloned().unwrap_or_default()
    }

    /// The figures of the run's end, each named as `name`'s: what a part
    /// that compares with that run may state.
    pub fn end_facts(&self, r: &RunResult, name: &str) -> Vec<Fact> {
        let end = self.moments.len().saturating_sub(1);
        self.facts(r, end)
            .into_iter()
            .map(|f| fact(format!("{} in {name}", f.what), f.bytes))
            .collect()
    }

    /// The figures a reader could see at moment `i`, named.
    fn facts(&self, r: &RunResult, i: usize) -> Vec<Fact> {
        let Some(m) = self.moments.get(i) else {
            return Vec::new();
        };
        let c = &r.conditions;
        let usable = c.capacity.saturating_sub(c.overhead);
        let mut f = vec![
            fact("allocated", m.allocated),
            fact("reserved", m.reserved),
            fact(
                "reserved − allocated (cached free)",
                m.reserved.saturating_sub(m.allocated),
            ),
            fact("peak allocated", m.peak_allocated),
            fact("peak reserved", m.peak_reserved),
            fact("free on the device", usable.saturating_sub(m.reserved)),
            fact(
                "reserved + the context (nvidia-smi)",
                m.reserved + c.overhead,
            ),
            fact("peak reserved + the context", m.peak_reserved + c.overhead),
        ];
        f.extend(self.program.iter().cloned());
        for (p, peak) in &m.phase_peaks {
            f.push(fact(format!("the {} peak", p.name()), *peak));
        }
        let mut state = 0;
        for (cat, held, most) in &m.by_category {
            f.push(fact(format!("{} held", cat.name()), *held));
            f.push(fact(format!("the most {} held", cat.name()), *most));
            if matches!(
                cat,
                Category::Parameter | Category::Gradient | Category::OptimizerState
            ) {
                state += held;
            }
        }
        f.push(fact(
            "parameters + gradients + optimizer state (model state)",
            state,
        ));
        for (k, (allocated, reserved)) in m.step_ends.iter().enumerate() {
            f.push(fact(
                format!("allocated at iteration {}'s end", k + 1),
                *allocated,
            ));
            f.push(fact(
                format!("reserved at iteration {}'s end", k + 1),
                *reserved,
            ));
        }
        if i + 1 == self.moments.len() {
            let split = r.stats.get(Family::InactiveSplitBytes, Level::All).current as u64;
            f.push(fact("inactive split bytes", split));
        }
        f
    }

    /// What at moment `i` `figure` states, if anything: a named figure,
    /// then one of the program's sizes, then a figure of the OOM message.
    pub fn shows(&self, r: &RunResult, i: usize, figure: &StatedFigure) -> Option<String> {
        if let Some(f) = self.facts(r, i).iter().find(|f| figure.holds_for(f.bytes)) {
            return Some(format!("{}, {}", f.what, format_size(f.bytes)));
        }
        if let Some(size) = self.has_size(figure) {
            return Some(format!("a block or segment of {}", format_size(size)));
        }
        let oom = self.moments.get(i)?.oom.as_deref()?;
        figures_in(oom)
            .iter()
            .find(|f| (f.bytes - figure.bytes).abs() <= figure.tolerance.max(f.tolerance))
            .map(|f| format!("the OOM message's {}", f.text))
    }

    /// The named figure at moment `i` nearest to what `figure` states.
    pub fn nearest(&self, r: &RunResult, i: usize, figure: &StatedFigure) -> Option<Fact> {
        self.facts(r, i)
            .into_iter()
            .filter(|f| f.bytes > 0)
            .min_by(|a, b| {
                let d = |f: &Fact| (f.bytes as f64 - figure.bytes).abs();
                d(a).total_cmp(&d(b))
            })
    }

    /// Any block or segment size of the run that `figure` states.
    pub fn has_size(&self, figure: &StatedFigure) -> Option<u64> {
        let lo = (figure.bytes - figure.tolerance).max(0.0).ceil() as u64;
        let hi = (figure.bytes + figure.tolerance).floor() as u64;
        self.sizes.range(lo..=hi.max(lo)).next().copied()
    }
}

/// Add `delta` to a kind's holding, keeping its highest.
fn add(by: &mut Vec<(Category, u64, u64)>, cat: Category, delta: i64) {
    let entry = match by.iter_mut().position(|(c, _, _)| *c == cat) {
        Some(i) => &mut by[i],
        None => {
            by.push((cat, 0, 0));
            let last = by.len() - 1;
            &mut by[last]
        }
    };
    entry.1 = (entry.1 as i64 + delta).max(0) as u64;
    entry.2 = entry.2.max(entry.1);
}
