//! A batch sweep on a thread of its own: each point as it finishes
//! ([`SweepMsg::Point`](super::SweepMsg)), then the search for the largest batch at
//! each sequence length, then the whole sweep with its fit
//! ([`SweepMsg::Swept`](super::SweepMsg)). The UI draws the chart as the points arrive and
//! never waits on them.

use super::source::{Source, SourceMsg, SweepMsg};
use crate::scenario::{Built, Scenario};
use crate::sweep::{find_max_batches, run_points, Sweep, SweepPlan};

pub fn sweep_source(
    scenario: Scenario,
    built: Built,
    plan: SweepPlan,
    find_max: bool,
    threads: usize,
) -> Source {
    let (tx, rx) = flume::unbounded();
    let capacity = crate::sweep::capacity(&built);
    let name = format!("sweep {}", scenario.name);
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let wanted = plan.points();
        let done = std::sync::Mutex::new((Vec::new(), Vec::new()));
        run_points(&scenario, &built, &wanted, threads, &|index, r| {
            let r = r.map_err(|e| e.to_string());
            if let Ok(mut d) = done.lock() {
                match &r {
                    Ok(p) => d.0.push(p.clone()),
                    Err(e) => d.1.push(e.clone()),
                }
            }
            let _ = tx.send(SourceMsg::Sweep(SweepMsg::Point {
                index,
                point: Box::new(r),
            }));
        });
        let (points, failed) = done.into_inner().unwrap_or_else(|e| e.into_inner());
        let mut notes = plan.notes.clone();
        notes.extend(failed.into_iter().map(|e| format!("left out: {e}")));
        let max_batches = if find_max {
            match find_max_batches(&scenario, &built, &plan.seqs, &points, threads) {
                Ok(m) => m,
                Err(e) => {
                    let _ = tx.send(SourceMsg::Sweep(SweepMsg::Failed(e.to_string())));
                    return;
                }
            }
        } else {
            Vec::new()
        };
        let sweep = Sweep::from_points(&scenario, &built, notes, points, max_batches);
        let _ = tx.send(SourceMsg::Sweep(SweepMsg::Swept(Box::new(sweep))));
    });
    let source = match spawned {
        Ok(_) => Source::new(rx, None),
        Err(e) => Source::from_messages([SourceMsg::Sweep(SweepMsg::Failed(format!(
            "could not start the sweep's thread: {e}"
        )))]),
    };
    source.with_capacity(capacity)
}
