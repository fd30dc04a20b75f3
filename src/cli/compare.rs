//! `compare A B` without the terminal UI: each side's figures next to the
//! other's, then each side's own report.

use std::fmt::Write;
use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use serde_json::{json, Value};
use vramscope::alloc::{format_size, AllocConfig};
use vramscope::engine::estimate::format_ms;
use vramscope::producers::{file_title, is_snapshot_path};
use vramscope::report::run as run_report;
use vramscope::report::snapshot::SnapshotReport;
use vramscope::scenario::{
    check, conf_label, resolve, resolve_under, run as run_scenario, RunOptions,
};
use vramscope::trace::replay::replayed::replayed_snapshot;

use super::snapshot::load;
use super::BadInput;

/// The figures both kinds of input have, for the table.
#[derive(Debug, Serialize)]
struct Figures {
    label: String,
    kind: &'static str,
    /// Scenarios only: a snapshot holds the state at its dump.
    peak_allocated: Option<u64>,
    peak_reserved: Option<u64>,
    /// At the end of the run, or at the snapshot's dump.
    allocated: u64,
    reserved: u64,
    ooms: usize,
    /// Leak findings and the others (fragmentation, one-off peaks).
    findings: Vec<String>,
    /// Scenarios on a named GPU: the last iteration's estimated compute
    /// time (ms) and the share of its FLOPs that recompute checkpoints.
    compute_estimate_ms: Option<f64>,
    recompute_share: Option<f64>,
}

struct Side {
    figures: Figures,
    text: String,
    json: Value,
}

/// One side of a comparison: a scenario (built-in name or `.ron` file) or a
/// snapshot, as it is or under another `PYTORCH_CUDA_ALLOC_CONF`.
#[derive(Debug, Clone)]
pub struct CompareSide {
    pub input: String,
    pub conf: Option<String>,
}

/// The two sides from `compare FIRST [SECOND] [--conf C]…`.
pub fn sides(
    first: String,
    second: Option<String>,
    confs: Vec<String>,
) -> Result<[CompareSide; 2], BadInput> {
    let side = |input: &String, conf: Option<&String>| CompareSide {
        input: input.clone(),
        conf: conf.cloned(),
    };
    match (&second, confs.as_slice()) {
        (Some(b), []) => Ok([side(&first, None), side(b, None)]),
        (None, [c]) => Ok([side(&first, None), side(&first, Some(c))]),
        (None, [c1, c2]) => Ok([side(&first, Some(c1)), side(&first, Some(c2))]),
        (Some(_), _) => Err(BadInput(
            "compare: --conf compares one input under allocator configs; with two inputs leave it out"
                .into(),
        )),
        (None, []) => Err(BadInput(
            "compare: give a second input, or --conf to compare the first under another allocator config"
                .into(),
        )),
        (None, _) => Err(BadInput(
            "compare: --conf at most twice (one config against the other)".into(),
        )),
    }
}

fn side(spec: &CompareSide) -> anyhow::Result<Side> {
    let input = spec.input.as_str();
    let conf = spec.conf.as_deref();
    let path = Path::new(input);
    let mut side = if is_snapshot_path(path) {
        snapshot_side(input, path, conf)?
    } else {
        scenario_side(input, conf)?
    };
    if let Some(conf) = conf {
        side.figures.label = format!("{} · {}", side.figures.label, conf_label(conf));
    }
    Ok(side)
}

fn scenario_side(input: &str, conf: Option<&str>) -> anyhow::Result<Side> {
    let (scenario, built) = match conf {
        Some(conf) => resolve_under(input, conf).map_err(|e| BadInput(e.to_string()))?,
        None => resolve(input).map_err(|e| BadInput(e.to_string()))?,
    };
    let result = run_scenario(
        &scenario,
        &built,
        &RunOptions {
            iterations: None,
            record_events: false,
        },
    );
    let checks = check(&scenario.expect, &result);
    let estimate = result.compute_estimate().map(|(_, e)| e);
    let figures = Figures {
        label: scenario.name.clone(),
        kind: "scenario",
        peak_allocated: Some(result.peak_allocated),
        peak_reserved: Some(result.peak_reserved),
        allocated: result.stats.allocated_bytes(),
        reserved: result.stats.reserved_bytes(),
        ooms: usize::from(result.oom.is_some()),
        findings: result
            .findings
            .iter()
            .map(|f| format!("{} ({})", f.root, f.kind.label()))
            .collect(),
        compute_estimate_ms: estimate.as_ref().map(|e| e.milliseconds),
        recompute_share: estimate.as_ref().map(|e| e.recompute_share),
    };
    Ok(Side {
        figures,
        text: run_report::text(&scenario, &result, &checks),
        json: run_report::json(&result, &checks),
    })
}

fn snapshot_side(input: &str, path: &Path, conf: Option<&str>) -> anyhow::Result<Side> {
    let mut snap = load(path)?;
    if let Some(conf) = conf {
        let config = AllocConfig::parse(conf).map_err(|e| BadInput(format!("--conf: {e}")))?;
        snap = replayed_snapshot(&snap, &config);
    }
    let report = SnapshotReport::new(input, &snap);
    let sum = |f: fn(&vramscope::report::snapshot::DeviceReport) -> u64| -> u64 {
        report.devices.iter().map(f).sum()
    };
    // The trace's peaks, as `open` finds them; a file of several devices has
    // one per device (their sum was never held at once), and none without a
    // trace.
    let per_device = vramscope::report::series::figures(&snap);
    let only = match per_device.as_slice() {
        [one] => Some(one),
        _ => None,
    };
    let figures = Figures {
        label: file_title(path, input),
        kind: "snapshot",
        peak_allocated: only.and_then(|d| d.peak_allocated),
        peak_reserved: only.and_then(|d| d.peak_reserved),
        allocated: sum(|d| d.allocated),
        reserved: sum(|d| d.reserved),
        ooms: report.devices.iter().map(|d| d.oom_count).sum(),
        findings: report
            .devices
            .iter()
            .filter_map(|d| d.leaks.as_ref())
            .flat_map(|l| &l.findings)
            .map(|f| format!("{} ({})", f.root, f.kind.label()))
            .collect(),
        compute_estimate_ms: None,
        recompute_share: None,
    };
    Ok(Side {
        figures,
        text: report.to_text(),
        json: serde_json::to_value(&report)?,
    })
}

fn size_or_dash(v: Option<u64>) -> String {
    v.map_or_else(|| "—".to_string(), format_size)
}

/// `second − first`, signed, in PyTorch's size units.
fn delta(a: Option<u64>, b: Option<u64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a == b => "same".to_string(),
        (Some(a), Some(b)) if b > a => format!("+{}", format_size(b - a)),
        (Some(a), Some(b)) => format!("-{}", format_size(a - b)),
        _ => String::new(),
    }
}

fn table(a: &Figures, b: &Figures) -> String {
    let heads = [a, b].map(|f| format!("{} ({})", f.label, f.kind));
    let w = heads
        .iter()
        .map(|h| h.chars().count())
        .max()
        .unwrap_or(0)
        .max(12);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16}  {:>w$}  {:>w$}  {:>14}",
        "", heads[0], heads[1], "change"
    );
    let rows: [(&str, Option<u64>, Option<u64>); 4] = [
        ("peak allocated", a.peak_allocated, b.peak_allocated),
        ("peak reserved", a.peak_reserved, b.peak_reserved),
        ("allocated (end)", Some(a.allocated), Some(b.allocated)),
        ("reserved (end)", Some(a.reserved), Some(b.reserved)),
    ];
    for (name, x, y) in rows {
        let _ = writeln!(
            out,
            "{name:<16}  {:>w$}  {:>w$}  {:>14}",
            size_or_dash(x),
            size_or_dash(y),
            delta(x, y)
        );
    }
    if a.compute_estimate_ms.is_some() || b.compute_estimate_ms.is_some() {
        let cell = |f: &Figures| match (f.compute_estimate_ms, f.recompute_share) {
            (Some(ms), Some(r)) if r > 0.0 => {
                format!("~{} ({:.0}% recompute)", format_ms(ms), r * 100.0)
            }
            (Some(ms), _) => format!("~{}", format_ms(ms)),
            _ => "—".to_string(),
        };
        let change = match (a.compute_estimate_ms, b.compute_estimate_ms) {
            (Some(x), Some(y)) if x > 0.0 => format!("{:+.0}%", (y / x - 1.0) * 100.0),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{:<16}  {:>w$}  {:>w$}  {:>14}",
            "compute (est.)",
            cell(a),
            cell(b),
            change
        );
    }
    let _ = writeln!(out, "{:<16}  {:>w$}  {:>w$}", "OOMs", a.ooms, b.ooms);
    let _ = writeln!(
        out,
        "{:<16}  {:>w$}  {:>w$}",
        "findings",
        a.findings.len(),
        b.findings.len()
    );
    for f in [a, b] {
        for finding in &f.findings {
            let _ = writeln!(out, "  {}: {finding}", f.label);
        }
    }
    if a.compute_estimate_ms.is_some() || b.compute_estimate_ms.is_some() {
        let _ = writeln!(
            out,
            "compute (est.): the last iteration's kernels, {}",
            vramscope::engine::estimate::ESTIMATE_LABEL
        );
    }
    out
}

pub fn compare(sides: &[CompareSide; 2], json: bool) -> anyhow::Result<ExitCode> {
    let a = side(&sides[0])?;
    let b = side(&sides[1])?;
    if json {
        let out = json!({
            "first": { "figures": a.figures, "report": a.json },
            "second": { "figures": b.figures, "report": b.json },
        });
        sayjson!(&out);
    } else {
        say!("{}", table(&a.figures, &b.figures));
        for (title, s) in [("first", &a), ("second", &b)] {
            sayln!("\n── {title}: {} ──\n{}", s.figures.label, s.text);
        }
    }
    Ok(ExitCode::SUCCESS)
}
