//! `open`, `replay` and `export` of real PyTorch snapshots.

use std::path::Path;
use std::process::ExitCode;

use anyhow::bail;
use vramscope::alloc::{AllocConfig, Tag, TorchVersion};
use vramscope::files::{check_replaceable, same_file, write_replacing};
use vramscope::report::replay::{VerifyReport, WhatIfDevice, WhatIfReport};
use vramscope::report::snapshot::SnapshotReport;
use vramscope::scenario::{builtin, resolve, resolve_under, run as run_scenario, RunOptions};
use vramscope::trace::replay::from_snapshot::{self, DeviceReplay};
use vramscope::trace::replay::replayed;
use vramscope::trace::replay::whatif::{self, Requests};
use vramscope::trace::snapshot::from_run::{snapshot_of_run, DeviceRun};
use vramscope::trace::snapshot::{export_bytes, import_file, Snapshot};
use vramscope::trace::Event;
use vramscope::units::parse_size;

use super::BadInput;

pub fn load(path: &Path) -> anyhow::Result<Snapshot> {
    import_file(path).map_err(|e| BadInput(e.to_string()).into())
}

/// `diff A B`: each file is read, reduced to its live blocks and dropped
/// before the next is read, so two large files never sit in memory together.
pub fn diff(a: &Path, b: &Path, json: bool) -> anyhow::Result<ExitCode> {
    use vramscope::report::diff::LiveSet;
    let baseline = LiveSet::of(&load(a)?);
    let live = LiveSet::of(&load(b)?);
    let report = vramscope::report::diff::diff(
        &a.display().to_string(),
        &baseline,
        &b.display().to_string(),
        &live,
    );
    if json {
        sayjson!(&report);
    } else {
        say!("{}", report.to_text());
    }
    Ok(ExitCode::SUCCESS)
}

pub fn open(
    path: &Path,
    json: bool,
    step_marker: Option<&str>,
    device: Option<usize>,
) -> anyhow::Result<ExitCode> {
    let snap = load(path)?;
    let mut report =
        SnapshotReport::with_step_marker(&path.display().to_string(), &snap, step_marker);
    if let Some(d) = device {
        let holds: Vec<String> = report
            .devices
            .iter()
            .map(|r| format!("device {}", r.device))
            .collect();
        report.devices.retain(|r| r.device == d as i64);
        if report.devices.is_empty() {
            return Err(BadInput(format!(
                "{}: --device {d}: the snapshot has no device {d}; it holds {}",
                path.display(),
                if holds.is_empty() {
                    "none".to_string()
                } else {
                    holds.join(", ")
                }
            ))
            .into());
        }
    }
    if json {
        sayjson!(&report);
    } else {
        say!("{}", report.to_text());
    }
    Ok(ExitCode::SUCCESS)
}

pub struct ReplayArgs {
    pub verify: bool,
    pub confs: Vec<String>,
    pub capacity: Option<String>,
    pub json: bool,
    pub torch: Option<String>,
    pub allowed_memory: Option<String>,
}

fn parse_conf(conf: &str, torch: Option<&str>) -> anyhow::Result<AllocConfig> {
    let version = match torch {
        Some(v) => v
            .parse::<TorchVersion>()
            .map_err(|e| BadInput(format!("--torch: {e}")))?,
        None => TorchVersion::DEFAULT,
    };
    AllocConfig::parse_for(conf, version).map_err(|e| BadInput(format!("--conf: {e}")).into())
}

pub fn replay(path: &Path, args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let snap = load(path)?;
    let allowed = match &args.allowed_memory {
        Some(s) => Some(parse_size(s).map_err(|e| BadInput(format!("--allowed-memory: {e}")))?),
        None => None,
    };
    let replays = from_snapshot::verify_with(&snap, allowed);
    let verify = VerifyReport::new(&replays);
    if !verify.ok
        && !verify.nothing_to_verify
        && allowed.is_none()
        && from_snapshot::config(&snap).garbage_collection_threshold > 0.0
    {
        warn!(
            "note: this run set garbage_collection_threshold, which acts only under a memory \
             fraction, and snapshots do not record the fraction: pass the run's limit with \
             --allowed-memory (e.g. --allowed-memory 4.8GiB)"
        );
    }
    let mut status = ExitCode::SUCCESS;
    if args.verify || args.confs.is_empty() {
        if args.json && args.confs.is_empty() {
            sayjson!(&verify);
        } else {
            say!("{}", verify.to_text());
        }
        if !verify.ok {
            status = ExitCode::from(1);
        }
    }
    if !args.confs.is_empty() {
        let report = what_if_report(&snap, &replays, &args)?;
        if args.json {
            sayjson!(&report);
        } else {
            say!("{}", report.to_text());
        }
    }
    Ok(status)
}

fn what_if_report(
    snap: &Snapshot,
    replays: &[DeviceReplay],
    args: &ReplayArgs,
) -> anyhow::Result<WhatIfReport> {
    let original = from_snapshot::config(snap);
    let mut configs = vec![original];
    for conf in &args.confs {
        let config = parse_conf(conf, args.torch.as_deref())?;
        // A config already in the table would only repeat its column.
        match configs.iter().position(|c| c.same_rules(&config)) {
            Some(0) => warn!(
                "note: --conf {conf:?} is the snapshot's own config: its column is the recorded run's"
            ),
            Some(_) => warn!("note: --conf {conf:?} repeats an earlier --conf"),
            None => configs.push(config),
        }
    }
    let given = match &args.capacity {
        Some(c) => match parse_size(c).map_err(|e| BadInput(format!("--capacity: {e}")))? {
            0 => bail!(BadInput(format!(
                "--capacity {c}: a device needs more than 0 bytes"
            ))),
            bytes => Some(bytes),
        },
        None => None,
    };
    let devices = replays
        .iter()
        .map(|r| {
            let capacity = replayed::device_capacity(r, given);
            let requests = Requests {
                entries: &r.entries,
                empty_cache_at: &r.outcome.empty_cache_at,
                start: Some(&r.start),
            };
            let mut results = whatif::what_if_all(&requests, configs.clone(), capacity);
            // On the recorded run's own device the first column is that run;
            // on another (--capacity) it is its config replayed there.
            let first_is_recorded = given.is_none();
            if let Some(first) = results.first_mut().filter(|_| first_is_recorded) {
                *first = replayed::recorded_result(r, &first.conf);
            }
            WhatIfDevice {
                device: r.device,
                capacity,
                capacity_from: replayed::capacity_source(r, given),
                configs: results,
                first_is_recorded,
                recorded_matched: r.outcome.all_matched(),
            }
        })
        .collect();
    Ok(WhatIfReport { devices })
}

pub fn export(input: &Path, output: &Path, conf: Option<&str>) -> anyhow::Result<ExitCode> {
    // The same file however it is named (`./x`, an absolute path, a link).
    if input == output || same_file(input, output) {
        bail!(BadInput(format!(
            "refusing to overwrite the input {}: choose another -o",
            input.display()
        )));
    }
    check_replaceable(output).map_err(|e| BadInput(format!("-o {}: {e}", output.display())))?;
    let is_scenario = input.extension().is_some_and(|e| e == "ron")
        || (!input.exists() && input.to_str().and_then(builtin).is_some());
    let out = if is_scenario {
        scenario_snapshot(input, conf)?
    } else {
        let snap = load(input)?;
        match conf {
            None => snap,
            Some(conf) => replayed::replayed_snapshot(&snap, &parse_conf(conf, None)?),
        }
    };
    let bytes = export_bytes(&out);
    write_replacing(output, &bytes).map_err(|e| BadInput(format!("{}: {e}", output.display())))?;
    warn!("wrote {} ({} bytes)", output.display(), bytes.len());
    Ok(ExitCode::SUCCESS)
}

/// A scenario run (under `conf` if given) as a snapshot, each block's frame
/// the scenario step that made it.
fn scenario_snapshot(input: &Path, conf: Option<&str>) -> anyhow::Result<Snapshot> {
    let name = input.to_str().unwrap_or_default();
    let (scenario, built) = match conf {
        Some(conf) => resolve_under(name, conf).map_err(|e| BadInput(e.to_string()))?,
        None => resolve(name).map_err(|e| BadInput(e.to_string()))?,
    };
    let result = run_scenario(
        &scenario,
        &built,
        &RunOptions {
            iterations: None,
            record_events: true,
        },
    );
    let events: Vec<_> = result
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Alloc(a) => Some(*a),
            Event::Marker(_) => None,
        })
        .collect();
    let config = parse_conf(&built.engine.alloc_conf, None)?;
    let tags = &result.tags;
    // One frame, all of it true: the step's line in the scenario file, named
    // by the statement it stands for and the engine's op and module.
    let frames_of = |_: usize, tag: Tag| -> Vec<(String, i64, String)> {
        let Some(t) = tags.info(tag) else {
            return Vec::new();
        };
        let op = if t.module.is_empty() {
            t.op.to_string()
        } else {
            format!("{} in {}", t.op, t.module)
        };
        let (line, what) = match built.steps.get(t.step) {
            Some(site) => (site.line as i64, format!("{} ({op})", site.statement)),
            None => (0, format!("building the model ({op})")),
        };
        vec![(built.steps.file.to_string(), line, what)]
    };
    let devices = [DeviceRun {
        device: 0,
        segments: &result.segments,
        events: &events,
    }];
    Ok(snapshot_of_run(&devices, &config, &frames_of))
}
