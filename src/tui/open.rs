//! Opening a run by name from inside the UI: a built-in scenario, a scenario
//! file, or a PyTorch snapshot, typed at the `:` prompt.

use std::path::Path;

use super::import::{snapshot_source, snapshot_to_source};
use super::scenario_source::{scenario_source, ITERATION_PACE};
use super::source::Source;
use crate::alloc::AllocConfig;
use crate::scenario::{conf_label, resolve, resolve_under};
use crate::trace::replay::replayed::replayed_snapshot;
use crate::trace::snapshot::import_file;

/// Whether `input` names a snapshot: an existing file that is not `.ron`.
pub fn is_snapshot_path(path: &Path) -> bool {
    path.is_file() && path.extension().is_none_or(|e| e != "ron")
}

/// The file name of `path` for a title, or `input` as given.
fn file_title(path: &Path, input: &str) -> String {
    path.file_name()
        .map_or_else(|| input.to_string(), |n| n.to_string_lossy().into_owned())
}

/// A source for `input`: a snapshot (see [`is_snapshot_path`]), else a
/// scenario name or file. The error says what went wrong.
pub fn open_source(input: &str) -> Result<(String, Source), String> {
    let input = input.trim();
    let path = Path::new(input);
    if is_snapshot_path(path) {
        let source = snapshot_source(path, None).map_err(|e| format!("{input}: {e}"))?;
        return Ok((file_title(path, input), source));
    }
    let (scenario, built) = resolve(input).map_err(|e| e.to_string())?;
    let title = scenario.name.clone();
    Ok((title, scenario_source(scenario, built, ITERATION_PACE)))
}

/// `input` under another `PYTORCH_CUDA_ALLOC_CONF`: a scenario runs with it,
/// a snapshot's requests are replayed through the model with it. The title
/// names the config.
pub fn open_source_under(input: &str, conf: &str) -> Result<(String, Source), String> {
    let input = input.trim();
    let path = Path::new(input);
    let label = |name: &str| format!("{name} · {}", conf_label(conf));
    if is_snapshot_path(path) {
        let config = AllocConfig::parse(conf).map_err(|e| format!("--conf: {e}"))?;
        let snap = import_file(path).map_err(|e| e.to_string())?;
        let replayed = replayed_snapshot(&snap, &config);
        let source = snapshot_to_source(&replayed, None).map_err(|e| format!("{input}: {e}"))?;
        return Ok((label(&file_title(path, input)), source));
    }
    let (scenario, built) = resolve_under(input, conf)?;
    let title = label(&scenario.name);
    Ok((title, scenario_source(scenario, built, ITERATION_PACE)))
}
