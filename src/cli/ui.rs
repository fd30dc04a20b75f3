//! Opening the terminal UI on scenarios and snapshots (and a plain fallback
//! when there is no terminal).

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use vramscope::scenario::resolve;
use vramscope::tui::import::snapshot_source;
use vramscope::tui::{run_tui, scenario_source, Source, TuiOptions};

use super::BadInput;

/// Whether a full-screen UI can run here.
pub fn have_terminal() -> bool {
    std::io::stdout().is_terminal() && std::io::stdin().is_terminal()
}

/// A built-in scenario name, a scenario file, or a snapshot, as a UI source.
pub fn source_for(input: &str) -> anyhow::Result<(String, Source)> {
    let path = Path::new(input);
    let is_snapshot = path.exists() && path.extension().is_none_or(|e| e != "ron");
    if is_snapshot {
        let source = snapshot_source(path, None).map_err(|e| BadInput(e.to_string()))?;
        return Ok((
            path.file_name()
                .map_or(input.to_string(), |n| n.to_string_lossy().into_owned()),
            source,
        ));
    }
    let (scenario, built) = resolve(input).map_err(|e| BadInput(e.to_string()))?;
    let title = scenario.name.clone();
    Ok((
        title,
        scenario_source(
            scenario,
            built,
            vramscope::tui::scenario_source::ITERATION_PACE,
        ),
    ))
}

/// Playback for scenarios: about two iterations of a small model per second,
/// so memory moves at once and a leak is flagged within seconds.
const SCENARIO_SPEED: f64 = 2000.0;

pub fn open(inputs: &[&str]) -> anyhow::Result<ExitCode> {
    let sources = inputs
        .iter()
        .map(|i| source_for(i))
        .collect::<anyhow::Result<Vec<_>>>()?;
    run_tui(
        sources,
        TuiOptions {
            speed: SCENARIO_SPEED,
            ..TuiOptions::default()
        },
    )?;
    Ok(ExitCode::SUCCESS)
}

pub fn open_snapshot(path: &Path) -> anyhow::Result<ExitCode> {
    let source =
        snapshot_source(path, None).map_err(|e| BadInput(format!("{}: {e}", path.display())))?;
    let title = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    run_tui(vec![(title, source)], TuiOptions::default())?;
    Ok(ExitCode::SUCCESS)
}
