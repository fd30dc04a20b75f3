//! Leak analysis of an imported PyTorch snapshot: from the allocation trace
//! alone, find iteration boundaries, then the call sites whose allocations
//! survive those boundaries and keep accumulating.
//!
//! A trace records allocations, frees and stacks — not tensor references or
//! autograd graphs. It can show *that* memory born at a call site survives
//! and accumulates; it cannot show *which* variable or graph holds it. The
//! report's `conclusion` says so every time.

use rustc_hash::FxHashMap;
use serde::Serialize;

use super::counted_annotations::counted_annotations;
use super::finding::{Finding, FindingKind, Severity};
use super::format::signed_size;
use super::site_series::SiteSeries;
use crate::alloc::format_size;
use crate::trace::snapshot::{Action, FramesId, Snapshot, TraceEntry};
use crate::trace::Phase;

/// Where the iteration boundaries came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundarySource {
    /// The user's marker: a substring of an annotation or frame.
    StepMarker(String),
    /// `external_annotations` such as `Optimizer.step#AdamW.step`, or the
    /// user's numbered ones (`iteration N`).
    Annotation(String),
    /// `snapshot` trace entries (`torch.cuda.memory._snapshot()` calls).
    SnapshotMarker,
    /// Inferred forward → backward → optimizer cycles from the stacks.
    TrainingCycle,
    /// A live job's step markers (`Optimizer.step`, `mark_step`, a named
    /// `record_function`): exact entry positions, sent by the job itself.
    LiveSteps {
        source: String,
    },
    None,
}

impl BoundarySource {
    fn describe(&self) -> String {
        match self {
            BoundarySource::StepMarker(m) => format!("the step marker \"{m}\""),
            BoundarySource::Annotation(a) => format!("the \"{a}\" annotations"),
            BoundarySource::SnapshotMarker => "the trace's `snapshot` markers".into(),
            BoundarySource::TrainingCycle => {
                "inferred forward/backward/optimizer cycles in the stacks".into()
            }
            BoundarySource::LiveSteps { source } => {
                format!("the job's own steps, from {source}")
            }
            BoundarySource::None => "nothing".into(),
        }
    }

    fn confidence(&self) -> f64 {
        match self {
            BoundarySource::StepMarker(_) | BoundarySource::Annotation(_) => 0.9,
            BoundarySource::SnapshotMarker => 0.8,
            BoundarySource::TrainingCycle => 0.6,
            // Exact positions, but a marker placed at the wrong point of the
            // loop still delimits something else than iterations.
            BoundarySource::LiveSteps { .. } => 0.95,
            BoundarySource::None => 0.0,
        }
    }
}

/// One call site whose surviving allocations accumulate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SurvivorGroup {
    /// `file.py:LINE in function` of the first user frame.
    pub site: String,
    /// Live bytes born at this site since the first boundary, at each boundary.
    pub bytes_at_boundary: Vec<u64>,
    pub growth_per_iter: i64,
    /// Allocations from this site live at the last boundary.
    pub allocations: usize,
    /// 0..1: how sure the boundaries are times how regular the growth is.
    pub confidence: f64,
    #[serde(skip)]
    pub addresses: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotLeakReport {
    pub device: usize,
    pub boundary_source: BoundarySource,
    /// Trace entry index of each boundary.
    pub boundaries: Vec<usize>,
    /// Live bytes (all allocations in the trace) at each boundary.
    pub live_at_boundary: Vec<u64>,
    /// Whether backward or optimizer allocations occur between the first and
    /// last boundary (if not, the boundaries may delimit layers of one pass).
    pub backward_seen: bool,
    pub survivors: Vec<SurvivorGroup>,
    pub findings: Vec<Finding>,
    /// What the evidence is, and what cannot be concluded from it.
    pub conclusion: String,
}

const CAVEAT: &str = "A trace records allocations and their stacks, not tensor references: it \
cannot show which variable, container or autograd graph keeps these blocks alive.";

/// Forward, backward or optimizer, as far as a stack tells.
fn phase_of(snap: &Snapshot, frames: FramesId) -> Phase {
    let mut ph = Phase::Forward;
    for f in snap.frames.resolve(frames) {
        let (file, name) = (&*f.filename, &*f.name);
        if file.contains("torch/optim")
            || file.contains("torch\\optim")
            || name.contains("Optimizer")
        {
            return Phase::Optimizer;
        }
        if name.contains("autograd::Engine")
            || name == "backward"
            || name.contains("_engine_run_backward")
            || name.contains("run_backward")
        {
            ph = Phase::Backward;
        }
    }
    ph
}

/// `phase_of` and `frame_matches` asked once per distinct stack: a trace of
/// millions of entries repeats a few thousand stacks, and each answer scans
/// every frame's strings.
struct StackFacts<'s> {
    snap: &'s Snapshot,
    phases: FxHashMap<FramesId, Phase>,
    marker_hits: FxHashMap<FramesId, bool>,
}

impl<'s> StackFacts<'s> {
    fn new(snap: &'s Snapshot) -> Self {
        StackFacts {
            snap,
            phases: FxHashMap::default(),
            marker_hits: FxHashMap::default(),
        }
    }

    fn phase(&mut self, frames: FramesId) -> Phase {
        let snap = self.snap;
        *self
            .phases
            .entry(frames)
            .or_insert_with(|| phase_of(snap, frames))
    }

    /// The same `marker` on every call.
    fn matches(&mut self, frames: FramesId, marker: &str) -> bool {
        let snap = self.snap;
        *self
            .marker_hits
            .entry(frames)
            .or_insert_with(|| frame_matches(snap, frames, marker))
    }
}

fn frame_matches(snap: &Snapshot, frames: FramesId, marker: &str) -> bool {
    snap.frames
        .resolve(frames)
        .any(|f| f.name.contains(marker) || format!("{}:{}", f.filename, f.line).contains(marker))
}

/// The first frame of the user's own Python code (`*.py`, not torch).
fn site_of(snap: &Snapshot, frames: FramesId) -> String {
    let f = snap
        .frames
        .resolve(frames)
        .find(|f| f.is_user_code() && f.filename.ends_with(".py"))
        .or_else(|| snap.first_user_frame(frames));
    match f {
        Some(f) => {
            let base = f.filename.rsplit(['/', '\\']).next().unwrap_or(&f.filename);
            format!("{base}:{} in {}", f.line, f.name)
        }
        None => "<no Python frame recorded>".into(),
    }
}

/// The first entry at or after time `t`; `timed`: some entry has a time.
fn index_at_time(trace: &[TraceEntry], timed: bool, t: i64) -> Option<usize> {
    let i = trace.partition_point(|e| e.time_us().is_some_and(|x| x < t));
    (timed && i < trace.len()).then_some(i)
}

/// Boundaries as entry indices, deduplicated and sorted.
fn boundaries(
    snap: &Snapshot,
    facts: &mut StackFacts,
    trace: &[TraceEntry],
    device: usize,
    marker: Option<&str>,
) -> (BoundarySource, Vec<usize>) {
    // Asked once here, not once per annotation: a trace can be millions long.
    let timed = trace.iter().any(|e| e.time_us().is_some());
    let anns = |pred: &dyn Fn(&str) -> bool| -> Vec<usize> {
        snap.external_annotations
            .iter()
            .filter(|a| a.device == device as i64 && &*a.stage == "START" && pred(&a.name))
            .filter_map(|a| index_at_time(trace, timed, a.time_us))
            .collect()
    };
    let finish = |mut v: Vec<usize>| {
        v.sort_unstable();
        v.dedup();
        v
    };
    if let Some(m) = marker {
        let mut v = anns(&|n: &str| n.contains(m));
        let mut prev_match = false;
        for (i, e) in trace.iter().enumerate() {
            if e.action != Action::Alloc {
                continue;
            }
            let hit = facts.matches(e.frames, m);
            if hit && !prev_match {
                v.push(i);
            }
            prev_match = hit;
        }
        return (BoundarySource::StepMarker(m.to_string()), finish(v));
    }
    for prefix in ["Optimizer.step", "Optimizer.zero_grad"] {
        let v = anns(&|n: &str| n.starts_with(prefix));
        if v.len() >= 2 {
            let name = snap
                .external_annotations
                .iter()
                .find(|a| a.name.starts_with(prefix))
                .map(|a| a.name.to_string())
                .unwrap_or_default();
            return (BoundarySource::Annotation(name), finish(v));
        }
    }
    if let Some((pattern, starts)) = counted_annotations(&snap.external_annotations, device as i64)
    {
        let v: Vec<usize> = starts
            .iter()
            .filter_map(|t| index_at_time(trace, timed, *t))
            .collect();
        if v.len() >= 2 {
            return (BoundarySource::Annotation(pattern), finish(v));
        }
    }
    let v: Vec<usize> = trace
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action == Action::Snapshot)
        .map(|(i, _)| i)
        .collect();
    if v.len() >= 2 {
        return (BoundarySource::SnapshotMarker, v);
    }
    // forward after backward/optimizer = a new iteration.
    let mut v = Vec::new();
    let mut after_bwd = false;
    for (i, e) in trace.iter().enumerate() {
        if e.action != Action::Alloc {
            continue;
        }
        match facts.phase(e.frames) {
            Phase::Backward | Phase::Optimizer => after_bwd = true,
            Phase::Forward => {
                if after_bwd {
                    v.push(i);
                }
                after_bwd = false;
            }
            // A stack tells forward, backward and optimizer apart, no more.
            Phase::Setup | Phase::Eval | Phase::User => {}
        }
    }
    if v.len() >= 2 {
        return (BoundarySource::TrainingCycle, v);
    }
    (BoundarySource::None, Vec::new())
}

/// Where [`analyze_snapshot_with`] takes iteration boundaries from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Boundaries<'a> {
    /// Found in the trace: from `step_marker` when given (see
    /// [`analyze_snapshot`]), else annotations, markers or cycles.
    Find { step_marker: Option<&'a str> },
    /// Given: entry indices into the device's trace, and where they came from.
    Given {
        source: BoundarySource,
        entries: Vec<usize>,
    },
}

/// Analyse device `device`'s trace. `step_marker`: a substring of an
/// annotation name, of a frame's function name, or of `file:line`, that marks
/// each iteration.
pub fn analyze_snapshot(
    snap: &Snapshot,
    device: usize,
    step_marker: Option<&str>,
) -> SnapshotLeakReport {
    analyze_snapshot_with(snap, device, Boundaries::Find { step_marker })
}

/// [`analyze_snapshot`] with the boundaries found or given.
pub fn analyze_snapshot_with(
    snap: &Snapshot,
    device: usize,
    given: Boundaries,
) -> SnapshotLeakReport {
    let empty: &[TraceEntry] = &[];
    let trace = snap
        .device_traces
        .get(device)
        .map_or(empty, |t| t.as_slice());
    let mut report = SnapshotLeakReport {
        device,
        boundary_source: BoundarySource::None,
        boundaries: Vec::new(),
        live_at_boundary: Vec::new(),
        backward_seen: false,
        survivors: Vec::new(),
        findings: Vec::new(),
        conclusion: String::new(),
    };
    if trace.is_empty() {
        report.conclusion = format!(
            "Device {device} has no allocation trace (a state-only snapshot): one point in time cannot \
             show allocations surviving iterations, so nothing is concluded about leaks. Record with \
             torch.cuda.memory._record_memory_history() over several steps."
        );
        return report;
    }
    let mut facts = StackFacts::new(snap);
    let (source, bounds) = match given {
        Boundaries::Find { step_marker } => {
            boundaries(snap, &mut facts, trace, device, step_marker)
        }
        Boundaries::Given {
            source,
            mut entries,
        } => {
            // A step that ended after the last entry so far is a boundary too.
            entries.retain(|i| *i <= trace.len());
            entries.sort_unstable();
            entries.dedup();
            (source, entries)
        }
    };
    report.boundary_source = source.clone();
    report.boundaries = bounds.clone();
    let intervals = bounds.len().saturating_sub(1);
    let free_action = if trace.iter().any(|e| e.action == Action::FreeCompleted) {
        Action::FreeCompleted
    } else {
        Action::FreeRequested
    };

    // Replay: per-site live bytes of allocations born since the first boundary.
    let mut site_ids: FxHashMap<FramesId, u32> = FxHashMap::default();
    let mut sites: Vec<String> = Vec::new();
    let mut live: FxHashMap<u64, (u64, u32, bool)> = FxHashMap::default(); // addr → (size, site, tracked)
    let mut total_live: u64 = 0;
    let mut site_live: Vec<u64> = Vec::new();
    let mut series = SiteSeries::default();
    let mut next_b = 0;
    let first = bounds.first().copied().unwrap_or(usize::MAX);
    let last = bounds.last().copied().unwrap_or(0);
    for (i, e) in trace.iter().enumerate() {
        while next_b < bounds.len() && bounds[next_b] == i {
            series.boundary(&site_live);
            report.live_at_boundary.push(total_live);
            next_b += 1;
        }
        if e.action == Action::Alloc {
            let site = *site_ids.entry(e.frames).or_insert_with(|| {
                sites.push(site_of(snap, e.frames));
                site_live.push(0);
                series.add_site();
                (sites.len() - 1) as u32
            });
            let tracked = i >= first;
            // Saturating throughout: sizes and addresses come from the file,
            // which may repeat an address or claim any size.
            if tracked {
                let live_here = &mut site_live[site as usize];
                *live_here = live_here.saturating_add(e.size);
                series.touch(site);
                if i < last && !report.backward_seen {
                    report.backward_seen = facts.phase(e.frames) != Phase::Forward;
                }
            }
            total_live = total_live.saturating_add(e.size);
            live.insert(e.addr, (e.size, site, tracked));
        } else if e.action == free_action {
            if let Some((sz, site, tracked)) = live.remove(&e.addr) {
                total_live = total_live.saturating_sub(sz);
                if tracked {
                    let live_here = &mut site_live[site as usize];
                    *live_here = live_here.saturating_sub(sz);
                    series.touch(site);
                }
            }
        }
    }

    while next_b < bounds.len() && bounds[next_b] == trace.len() {
        series.boundary(&site_live);
        report.live_at_boundary.push(total_live);
        next_b += 1;
    }

    let base = source.confidence();
    if intervals >= 3 {
        for (s, name) in sites.iter().enumerate() {
            let Some(shape) = series.shape(s) else {
                continue;
            };
            let ups = shape.ups;
            // What accumulates does not fall back on the way: a site whose
            // survivors drop by more than a tenth between two boundaries
            // (a batch size schedule starting over) is reused, not leaking.
            if ups < 3
                || shape.last <= shape.first
                || shape.last * 10 < shape.max * 9
                || ups * 2 < intervals
                || shape.falls_back
            {
                continue;
            }
            let v = series.values(s);
            let growth = (shape.last as i64 - shape.first as i64) / intervals as i64;
            let confidence = (base * ups as f64 / intervals as f64 * 100.0).round() / 100.0;
            report.survivors.push(SurvivorGroup {
                site: name.clone(),
                bytes_at_boundary: v,
                growth_per_iter: growth,
                allocations: 0,
                confidence,
                addresses: Vec::new(),
            });
        }
        // Which allocations are alive at the last boundary, per growing site.
        if !report.survivors.is_empty() {
            let idx: FxHashMap<&str, usize> = report
                .survivors
                .iter()
                .enumerate()
                .map(|(i, g)| (g.site.as_str(), i))
                .collect();
            let mut alive: FxHashMap<u64, (u32, bool)> = FxHashMap::default();
            for (i, e) in trace.iter().enumerate().take(last) {
                if e.action == Action::Alloc {
                    alive.insert(e.addr, (site_ids[&e.frames], i >= first));
                } else if e.action == free_action {
                    alive.remove(&e.addr);
                }
            }
            let mut addrs: Vec<Vec<u64>> = vec![Vec::new(); report.survivors.len()];
            for (a, (site, tracked)) in alive {
                if let (true, Some(&g)) = (tracked, idx.get(sites[site as usize].as_str())) {
                    addrs[g].push(a);
                }
            }
            for (g, mut a) in report.survivors.iter_mut().zip(addrs) {
                a.sort_unstable();
                g.allocations = a.len();
                g.addresses = a;
            }
        }
        report
            .survivors
            .sort_by_key(|g| std::cmp::Reverse(g.growth_per_iter));
    }

    let described = source.describe();
    // A live job's steps are its own optimizer steps or markers: they
    // delimit training iterations whatever its stacks show.
    let forward_only = !report.backward_seen && !matches!(source, BoundarySource::LiveSteps { .. });
    for g in &report.survivors {
        let mut f = Finding::new(g.site.clone(), FindingKind::SurvivingAllocations);
        f.bytes = *g.bytes_at_boundary.last().unwrap_or(&0);
        f.growth_per_iter = g.growth_per_iter;
        f.iterations = intervals as u32;
        f.blocks = g.addresses.clone();
        f.by_category = vec![("unknown (trace)", f.bytes)];
        f.path = vec![
            g.site.clone(),
            format!("{} allocations alive at the last boundary", g.allocations),
            format!("{} born since the first boundary", format_size(f.bytes)),
        ];
        f.fix = if forward_only {
            "if these are activations of one forward pass, run it under torch.no_grad() when no backward follows".into()
        } else {
            format!("find what keeps tensors from {} alive across steps; store .item() / .detach().cpu(), not the tensor", g.site)
        };
        f.severity = if g.confidence >= 0.7 && !forward_only {
            Severity::Warning
        } else {
            Severity::Info
        };
        f.evidence = format!(
            "Allocations made at {} are still live at {} of the {} boundaries after they were made, \
             growing by {} per iteration ({}; confidence {:.2}).{} {CAVEAT}",
            g.site,
            g.bytes_at_boundary.windows(2).filter(|w| w[1] > w[0]).count(),
            intervals,
            signed_size(g.growth_per_iter),
            described,
            g.confidence,
            if forward_only {
                " No backward or optimizer allocation occurs between the boundaries, so they may \
                 delimit layers of one forward pass rather than training iterations."
            } else {
                ""
            }
        );
        report.findings.push(f);
    }

    report.conclusion = if bounds.len() < 4 {
        // A live job's steps are its own: more come as it runs.
        let advice = match source {
            BoundarySource::LiveSteps { .. } => {
                "The job sent too few steps for that: a longer run shows more."
            }
            _ => {
                "Pass a step marker (an annotation or a function called once per step) to \
                 delimit iterations."
            }
        };
        format!(
            "Found {} iteration boundar{} on device {device} ({}); at least 4 are needed to see growth \
             over 3 iterations, so no leak is claimed. {advice} {CAVEAT}",
            bounds.len(),
            if bounds.len() == 1 { "y" } else { "ies" },
            described,
        )
    } else if report.survivors.is_empty() {
        let (a, b) = (
            report.live_at_boundary.first().copied().unwrap_or(0),
            report.live_at_boundary.last().copied().unwrap_or(0),
        );
        format!(
            "Across {intervals} iterations delimited by {described}, no call site's surviving allocations \
             accumulate: live memory at the boundaries went {} → {}. No GPU leak is visible in this \
             trace (host-side growth, such as spent autograd graphs, never shows in a GPU trace).",
            format_size(a),
            format_size(b),
        )
    } else {
        let total: i64 = report.survivors.iter().map(|g| g.growth_per_iter).sum();
        let mut s = format!(
            "{} call site(s) keep allocations alive across {intervals} iterations delimited by {described}, \
             together {} per iteration; largest: {}. {CAVEAT}",
            report.survivors.len(),
            signed_size(total),
            report.survivors[0].site,
        );
        if forward_only {
            s.push_str(
                " No backward or optimizer allocations occur between the boundaries: if they mark layers \
                 of a single forward pass, this is what autograd saves for backward, not a leak.",
            );
        }
        s
    };
    report
}
