//! Opening the terminal UI on scenarios and snapshots (and a plain fallback
//! when there is no terminal).

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use vramscope::tui::import::snapshot_source;
use vramscope::tui::open::open_source;
use vramscope::tui::{run_tui, TuiOptions};

use super::BadInput;

/// Playback for scenarios: about two iterations of a small model per second,
/// so memory moves at once and a leak is flagged within seconds.
const SCENARIO_SPEED: f64 = 2000.0;

/// Whether a full-screen UI can run here.
pub fn have_terminal() -> bool {
    std::io::stdout().is_terminal() && std::io::stdin().is_terminal()
}

/// Scenarios (names or files) and snapshots, side by side when more than one.
pub fn open(inputs: &[&str]) -> anyhow::Result<ExitCode> {
    let sources = inputs
        .iter()
        .map(|i| open_source(i).map_err(BadInput))
        .collect::<Result<Vec<_>, _>>()?;
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
