//! The answer at an OOM of a recorded trace (a snapshot, a live job): the
//! lines that held the memory when the request came (live blocks by first
//! user frame, from the allocator's replay of the trace up to it), what grew
//! since the first iteration boundary the trace marks, and whether the
//! request would have fitted after `empty_cache()` or with expandable
//! segments — the trace's own requests replayed, as for a scenario run.

use rustc_hash::FxHashMap;

use super::holders::Holder;
use super::oom::{what_ifs_with, Grew, OomAnswer, LISTED_HOLDERS};
use super::snapshot::SnapshotLeakReport;
use crate::alloc::Action;
use crate::device::SimDevice;
use crate::trace::replay::from_snapshot::{config, verify_device};
use crate::trace::replay::replayed::{device_capacity, recorded_peak_reserved};
use crate::trace::replay::whatif::{live_at, retry_at, Requests};
use crate::trace::snapshot::Snapshot;

/// The answer at the last OOM of `device`'s trace; None without one.
/// `leaks`: the trace's own leak analysis, for what grew between boundaries.
pub fn answer_trace_oom(
    snap: &Snapshot,
    device: usize,
    leaks: Option<&SnapshotLeakReport>,
) -> Option<OomAnswer> {
    let trace = snap.device_traces.get(device)?;
    let at = trace.iter().rposition(|e| e.action == Action::Oom)?;
    let replay = verify_device(snap, device, None)?;
    let requests = Requests {
        entries: &replay.entries,
        empty_cache_at: &replay.outcome.empty_cache_at,
        start: Some(&replay.start),
    };
    let config = config(snap);
    let request = trace[at].size;
    // The device the run had: the size the trace tells, else (a run held
    // to less, e.g. by set_per_process_memory_fraction) the most it
    // reserved. The first on which the request fails, as it did, is the
    // run's; on neither, the what-ifs say they cannot tell.
    let mut capacities = vec![device_capacity(&replay, None)];
    capacities.extend(recorded_peak_reserved(&replay));
    let capacity = capacities
        .iter()
        .copied()
        .find(|&c| {
            let o = retry_at(&requests, config.clone(), sim(c), at, false);
            !o.fits && o.earlier_ooms == 0
        })
        .unwrap_or(capacities[0]);
    let retry = |c: crate::alloc::AllocConfig, empty: bool| {
        retry_at(&requests, c, sim(capacity), at, empty)
    };
    let when = |i: usize| format!("at trace entry {}", crate::units::format_count(i as u64));
    let (at_request, what_if) = what_ifs_with(&retry, &config, request, &when);
    let holders = by_line(
        snap,
        trace,
        live_at(&requests, config.clone(), sim(capacity), at),
    );
    let allocated_now = at_request.map_or(0, |a| a.allocated);
    let grew = match leaks.filter(|l| !l.live_at_boundary.is_empty()) {
        Some(l) => Grew {
            since_iteration: Some(1),
            allocated_then: l.live_at_boundary[0],
            allocated_now,
            by: l
                .survivors
                .iter()
                .filter(|g| g.growth_per_iter > 0)
                .take(4)
                .map(|g| {
                    let then = g.bytes_at_boundary.first().copied().unwrap_or(0);
                    let now = g.bytes_at_boundary.last().copied().unwrap_or(then);
                    (g.site.clone(), then, now)
                })
                .collect(),
            within_iteration: Vec::new(),
            unknown: None,
        },
        None => Grew {
            since_iteration: None,
            allocated_then: 0,
            allocated_now,
            by: Vec::new(),
            within_iteration: Vec::new(),
            unknown: Some(
                "the trace marks no iteration boundary before the OOM, so what grew between \
                 iterations cannot be told (a step marker would: --step-marker)"
                    .into(),
            ),
        },
    };
    Some(OomAnswer {
        iteration: 0,
        place: format!("trace entry {}", crate::units::format_count(at as u64)),
        requested: request,
        at_request,
        holders,
        temporaries: None,
        grew,
        what_if,
    })
}

fn sim(capacity: u64) -> SimDevice {
    SimDevice::new("what-if", capacity, 0)
}

/// Live blocks by the first user frame of the entry that made them, largest
/// first (a block from before the trace began has no entry).
fn by_line(
    snap: &Snapshot,
    trace: &[crate::trace::snapshot::TraceEntry],
    live: Vec<(Option<usize>, u64)>,
) -> Vec<Holder> {
    let mut sites: FxHashMap<String, (u64, u32)> = FxHashMap::default();
    for (entry, bytes) in live {
        let site = match entry.and_then(|i| trace.get(i)) {
            Some(e) => snap
                .user_site(e.frames)
                .unwrap_or_else(|| "no Python frame recorded".to_string()),
            None => "live before the trace began".to_string(),
        };
        let s = sites.entry(site).or_default();
        s.0 += bytes;
        s.1 += 1;
    }
    let mut out: Vec<Holder> = sites
        .into_iter()
        .map(|(site, (bytes, blocks))| Holder {
            name: site,
            what: crate::units::counted(u64::from(blocks), "block"),
            bytes,
            this_iteration: 0,
            items: blocks,
            named: false,
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    out.truncate(LISTED_HOLDERS);
    out
}
