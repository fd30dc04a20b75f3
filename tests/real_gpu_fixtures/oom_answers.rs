//! The answer at an OOM, twice: from a built-in's simulated run and from
//! the H100's capture of the same program. Both replay their own requests
//! up to the failing one; where they agree on the request, they must agree
//! on what `empty_cache()` and expandable segments would have done, and on
//! what was allocated when the request came (both on addresses in request
//! order).

use vramscope::leak::answer_trace_oom;
use vramscope::scenario::{builtins, resolve, run, RunOptions};
use vramscope::trace::snapshot::import_file;

use crate::harness::captured;

#[test]
fn a_capture_and_its_scenario_answer_an_oom_alike() {
    let mut compared = Vec::new();
    for b in builtins() {
        let (s, mut built) = resolve(b.name).unwrap_or_else(|e| panic!("{}: {e}", b.name));
        // On the addresses the capture's answer replays on: a snapshot does
        // not say its driver, so its what-ifs lay segments in request order.
        built.engine.placement = vramscope::device::Placement::InOrder;
        let Some(stem) = built.conditions.capture.clone() else {
            continue;
        };
        let r = run(&s, &built, &RunOptions::default());
        let Some(sim) = r.oom.as_ref().and_then(|o| o.answer.clone()) else {
            continue;
        };
        let snap = import_file(&captured(&stem, "pickle")).expect("the capture");
        let real = answer_trace_oom(&snap, 0, None)
            .unwrap_or_else(|| panic!("{stem}: the capture ends in an OOM too"));
        if sim.requested != real.requested {
            continue; // another request failed first (adam-first-step-oom-bug in request order: README)
        }
        let verdicts = |a: &vramscope::leak::OomAnswer| {
            a.what_if
                .iter()
                .map(|w| (w.setting.clone(), w.fits))
                .collect::<Vec<_>>()
        };
        assert_eq!(verdicts(&sim), verdicts(&real), "{}", b.name);
        let (s_at, r_at) = (
            sim.at_request
                .expect("the scenario's replay reproduces its OOM"),
            real.at_request
                .expect("the capture's replay reproduces its OOM"),
        );
        assert_eq!(s_at.allocated, r_at.allocated, "{}: allocated", b.name);
        compared.push(b.name);
    }
    assert!(compared.len() >= 6, "{compared:?}");
}
