//! The producer for an input as a user names it (on the command line or at
//! the UI's `:` prompt): a built-in scenario, a scenario file, or a PyTorch
//! snapshot, as it is or under another `PYTORCH_CUDA_ALLOC_CONF`.

use std::path::Path;

use super::scenario::{scenario_source, ITERATION_PACE};
use super::snapshot::{snapshot_source, what_if_file_source};
use super::source::Source;
use crate::alloc::AllocConfig;
use crate::scenario::{conf_label, resolve, resolve_under, LoadError};
use crate::units::escape_line;

/// Whether `input` names a snapshot: an existing file that is not `.ron`.
pub fn is_snapshot_path(path: &Path) -> bool {
    path.is_file() && path.extension().is_none_or(|e| e != "ron")
}

/// The file name of `path` for a title, or `input` as given, control
/// characters escaped.
pub fn file_title(path: &Path, input: &str) -> String {
    let name = path
        .file_name()
        .map_or_else(|| input.to_string(), |n| n.to_string_lossy().into_owned());
    escape_line(&name).into_owned()
}

/// A source for `input`: a snapshot (see [`is_snapshot_path`]), else a
/// scenario name or file. The error says what went wrong.
pub fn open_source(input: &str) -> Result<(String, Source), LoadError> {
    let input = input.trim();
    let path = Path::new(input);
    if is_snapshot_path(path) {
        return Ok((file_title(path, input), snapshot_source(path, None)));
    }
    let (scenario, built) = resolve(input)?;
    let title = escape_line(&scenario.name).into_owned();
    Ok((title, scenario_source(scenario, built, ITERATION_PACE)))
}

/// `input` under another `PYTORCH_CUDA_ALLOC_CONF`: a scenario runs with it,
/// a snapshot's requests are replayed through the model with it. The title
/// names the config.
pub fn open_source_under(input: &str, conf: &str) -> Result<(String, Source), LoadError> {
    let input = input.trim();
    let path = Path::new(input);
    let label = |name: &str| format!("{name} · {}", conf_label(conf));
    if is_snapshot_path(path) {
        let config = AllocConfig::parse(conf).map_err(|e| LoadError::Conf(Box::new(e)))?;
        let source = what_if_file_source(path, None, config);
        return Ok((label(&file_title(path, input)), source));
    }
    let (scenario, built) = resolve_under(input, conf)?;
    let title = label(&escape_line(&scenario.name));
    Ok((title, scenario_source(scenario, built, ITERATION_PACE)))
}
