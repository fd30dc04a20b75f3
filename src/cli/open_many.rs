//! `open a.pickle b.pickle …`: several snapshots of one job (a series of
//! dumps, or one per rank). Headless: each file's report, then the table
//! across them (`report::series`); in the terminal, one tab per file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;
use vramscope::producers::{file_title, snapshot_tab_source};
use vramscope::report::series::{figures, sort_series, DeviceFigures, SeriesFile, SeriesTable};
use vramscope::report::snapshot::SnapshotReport;

use super::pace::PaceArgs;
use super::snapshot::load;
use super::EXIT_BAD_INPUT;

/// The files in the order their tabs and rows take: by rank where every
/// name says one (`oom_rank-0.pickle` …), else by step where every name
/// says one (`memory_at_step100.pickle` …), else as given.
pub fn ordered(mut paths: Vec<PathBuf>) -> Vec<PathBuf> {
    sort_series(&mut paths, |p| p.to_str().unwrap_or_default());
    paths
}

/// One file's report, or why it has none.
#[derive(Serialize)]
#[serde(untagged)]
enum FileReport {
    Report(Box<SnapshotReport>),
    Failed { file: String, error: String },
}

#[derive(Serialize)]
struct ManyReport {
    files: Vec<FileReport>,
    table: SeriesTable,
}

/// Each file is read, reported on and dropped before the next is read. A
/// file that fails is said in its place, the others still reported; the
/// exit status is then 2.
pub fn headless(
    paths: &[PathBuf],
    json: bool,
    step_marker: Option<&str>,
    device: Option<usize>,
) -> anyhow::Result<ExitCode> {
    let mut files = Vec::new();
    let mut figs: Vec<Result<Vec<DeviceFigures>, String>> = Vec::new();
    for path in paths {
        let name = path.display().to_string();
        match one(path, step_marker, device) {
            Ok((report, f)) => {
                files.push(FileReport::Report(Box::new(report)));
                figs.push(Ok(f));
            }
            Err(error) => {
                files.push(FileReport::Failed {
                    file: name,
                    error: error.clone(),
                });
                figs.push(Err(error));
            }
        }
    }
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let rows: Vec<SeriesFile<'_>> = names
        .iter()
        .zip(&figs)
        .map(|(file, f)| SeriesFile {
            file,
            figures: f.as_deref().map_err(String::as_str),
        })
        .collect();
    let table = SeriesTable::new(&rows);
    let failed = figs.iter().any(Result::is_err);
    let report = ManyReport { files, table };
    if json {
        sayjson!(&report);
    } else {
        for f in &report.files {
            match f {
                FileReport::Report(r) => say!("{}\n", r.to_text()),
                FileReport::Failed { error, .. } => say!("{error}\n\n"),
            }
        }
        say!("== across files ==\n{}", report.table.to_text());
    }
    Ok(if failed {
        ExitCode::from(EXIT_BAD_INPUT)
    } else {
        ExitCode::SUCCESS
    })
}

fn one(
    path: &Path,
    step_marker: Option<&str>,
    device: Option<usize>,
) -> Result<(SnapshotReport, Vec<DeviceFigures>), String> {
    let snap = load(path).map_err(|e| e.to_string())?;
    let mut report =
        SnapshotReport::with_step_marker(&path.display().to_string(), &snap, step_marker);
    let mut figs = figures(&snap);
    if let Some(d) = device {
        report.devices.retain(|r| r.device == d as i64);
        figs.retain(|f| f.device == d as i64);
        if report.devices.is_empty() {
            return Err(format!(
                "{}: --device {d}: the snapshot has no device {d}",
                path.display()
            ));
        }
    }
    Ok((report, figs))
}

/// One tab per file, each the full view of that file, read in the
/// background; a file that fails shows its error in its tab.
pub fn open(paths: &[PathBuf], device: Option<usize>, pace: &PaceArgs) -> anyhow::Result<ExitCode> {
    let tabs: Vec<_> = paths
        .iter()
        .map(|p| {
            let title = file_title(p, &p.display().to_string());
            (title, snapshot_tab_source(p, device))
        })
        .collect();
    super::ui::open_tabs(tabs, pace)
}
