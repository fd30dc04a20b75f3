//! `sweep SCENARIO --batch …`: the points to run, and the headless report
//! (the chart is `ui::open_sweep`).

use std::process::ExitCode;

use vramscope::scenario::{resolve, Built, Scenario};
use vramscope::sweep::{default_threads, run, SweepPlan};

use super::BadInput;

pub struct SweepArgs {
    pub batch: Option<String>,
    pub seq: Option<String>,
    pub find_max_batch: bool,
}

/// The scenario and the points to run, or the error naming what to fix.
pub fn plan(name: &str, args: &SweepArgs) -> Result<(Scenario, Built, SweepPlan), BadInput> {
    let (scenario, built) = resolve(name).map_err(|e| BadInput(e.to_string()))?;
    let plan = SweepPlan::new(
        &scenario,
        &built,
        args.batch.as_deref(),
        args.seq.as_deref(),
        args.find_max_batch,
    )
    .map_err(|e| BadInput(e.to_string()))?;
    Ok((scenario, built, plan))
}

pub fn headless(name: &str, args: &SweepArgs, json: bool) -> anyhow::Result<ExitCode> {
    let (scenario, built, plan) = plan(name, args)?;
    let sweep = run(
        &scenario,
        &built,
        &plan,
        args.find_max_batch,
        default_threads(),
    )
    .map_err(|e| BadInput(e.to_string()))?;
    if json {
        sayjson!(&vramscope::report::sweep::json(&sweep));
    } else {
        say!("{}", vramscope::report::sweep::text(&sweep));
    }
    Ok(ExitCode::SUCCESS)
}
