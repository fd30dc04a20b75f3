//! Opening a run by name from inside the UI: a built-in scenario, a scenario
//! file, or a PyTorch snapshot, typed at the `:` prompt.

use std::path::Path;

use super::import::snapshot_source;
use super::scenario_source::{scenario_source, ITERATION_PACE};
use super::source::Source;
use crate::scenario::resolve;

/// A source for `input`: an existing file that is not `.ron` is a snapshot;
/// anything else is a scenario name or file. The error says what went wrong.
pub fn open_source(input: &str) -> Result<(String, Source), String> {
    let input = input.trim();
    let path = Path::new(input);
    if path.is_file() && path.extension().is_none_or(|e| e != "ron") {
        let source = snapshot_source(path, None).map_err(|e| format!("{input}: {e}"))?;
        let title = path
            .file_name()
            .map_or_else(|| input.to_string(), |n| n.to_string_lossy().into_owned());
        return Ok((title, source));
    }
    let (scenario, built) = resolve(input).map_err(|e| e.to_string())?;
    let title = scenario.name.clone();
    Ok((title, scenario_source(scenario, built, ITERATION_PACE)))
}
