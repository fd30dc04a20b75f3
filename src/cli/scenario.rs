//! `scenarios`, `check` and `run` of scenario files.

use std::process::ExitCode;

use vramscope::device::cuda::CudaDevice;
use vramscope::device::kernels::launcher_for;
use vramscope::scenario::{
    builtins, check, load_file, resolve, run as run_scenario, run_launching, RunOptions,
};

use super::BadInput;

pub fn list() -> anyhow::Result<ExitCode> {
    for b in builtins() {
        let description = resolve(b.name)
            .map(|(s, _)| s.description)
            .unwrap_or_else(|e| format!("(invalid: {e})"));
        println!("{:<34} {description}", b.name);
    }
    Ok(ExitCode::SUCCESS)
}

pub fn check_file(path: &std::path::Path) -> anyhow::Result<ExitCode> {
    match load_file(path) {
        Ok((s, built)) => {
            println!(
                "{}: valid scenario \"{}\" ({} steps, {} iterations)",
                path.display(),
                s.name,
                s.steps.len(),
                built.program.iterations
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Err(BadInput(e.to_string()).into()),
    }
}

pub struct RunArgs {
    pub json: bool,
    pub iterations: Option<u32>,
    /// `Some(n)`: run on CUDA device n.
    pub cuda: Option<usize>,
}

/// `sim`, `cuda` or `cuda:N` → the CUDA ordinal, if any.
pub fn parse_device(text: &str) -> Result<Option<usize>, BadInput> {
    match text {
        "sim" => Ok(None),
        "cuda" => Ok(Some(0)),
        _ => text
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Some)
            .ok_or_else(|| BadInput(format!("--device {text}: expected sim, cuda or cuda:N"))),
    }
}

pub fn run_headless(name: &str, args: RunArgs) -> anyhow::Result<ExitCode> {
    let (scenario, built) = resolve(name).map_err(|e| BadInput(e.to_string()))?;
    let opts = RunOptions {
        iterations: args.iterations,
        record_events: false,
    };
    let result = match args.cuda {
        None => run_scenario(&scenario, &built, &opts),
        Some(n) => match CudaDevice::open(n) {
            Ok(dev) => {
                // kernels/ compiled for this device; the run still measures
                // memory without them, and says so.
                let (launcher, unavailable) = match launcher_for(&dev) {
                    Ok(l) => (Some(l), None),
                    Err(e) => {
                        eprintln!("vramscope: --device cuda:{n}: no kernels launched: {e}");
                        (None, Some(e.to_string()))
                    }
                };
                let mut r = run_launching(&scenario, &built, &opts, Box::new(dev), launcher);
                r.kernels_unavailable = unavailable;
                r
            }
            Err(e) => {
                eprintln!("vramscope: --device cuda:{n}: {e}");
                return Ok(ExitCode::from(super::EXIT_NO_GPU));
            }
        },
    };
    let checks = check(&scenario.expect, &result);
    let ok = checks.iter().all(|c| c.passed);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&vramscope::report::run::json(&result, &checks))?
        );
    } else {
        print!(
            "{}",
            vramscope::report::run::text(&scenario, &result, &checks)
        );
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
