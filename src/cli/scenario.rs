//! `scenarios`, `check` and `run` of scenario files.

use std::process::ExitCode;

use vramscope::device::budget::{held_to, scenario_sized};
use vramscope::device::cuda::CudaDevice;
use vramscope::device::kernels::launcher_for;
use vramscope::device::nvml::{self, Reconciliation};
use vramscope::device::{Device, GpuUnavailable};
use vramscope::scenario::{
    buffers_allocated, builtins, check, resolve, run as run_scenario, run_launching_with,
    steps_executed, Built, GpuRun, RunOptions, RunResult, Scenario, MAX_BUFFERS, MAX_STEPS,
};
use vramscope::units::format_count;

use super::BadInput;

pub fn list() -> anyhow::Result<ExitCode> {
    for b in builtins() {
        let description = resolve(b.name)
            .map(|(s, _)| s.description)
            .unwrap_or_else(|e| format!("(invalid: {e})"));
        sayln!("{:<34} {description}", b.name);
    }
    Ok(ExitCode::SUCCESS)
}

/// `check NAME|FILE`: a built-in by name, as `run` takes it, or a file.
pub fn check_scenario(name_or_path: &str) -> anyhow::Result<ExitCode> {
    match resolve(name_or_path) {
        Ok((s, built)) => {
            sayln!(
                "{}: valid scenario \"{}\" ({}, {})",
                vramscope::units::escape_controls(name_or_path),
                s.name,
                vramscope::units::counted(s.steps.len() as u64, "step"),
                vramscope::units::counted(built.program.iterations, "iteration")
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

/// The scenario on CUDA device `n`: segments from the real device, held to
/// the scenario's capacity, `kernels/` launched on them when NVRTC can build
/// them, and NVML read at the end while the memory is still held.
fn run_on_cuda(
    scenario: &Scenario,
    built: &Built,
    opts: &RunOptions,
    n: usize,
) -> Result<RunResult, GpuUnavailable> {
    let dev = CudaDevice::open(n)?;
    // The context exists now and no tensor does: NVML's reading for this
    // process is the context's share (None where NVML lists no processes).
    let pci = dev.pci();
    let own_used = || nvml::own_process_used(pci).ok().flatten();
    let context = own_used();
    // The run still measures memory without kernels, and says why.
    let (launcher, unavailable) = match launcher_for(&dev) {
        Ok(l) => (Some(l), None),
        Err(e) => {
            warn!("vramscope: --device cuda:{n}: no kernels launched: {e}");
            (None, Some(e.to_string()))
        }
    };
    let (name, total) = (dev.name().to_string(), dev.total_memory());
    let (cap, overhead) = (built.engine.device_bytes, built.engine.device_overhead);
    let device = scenario_sized(dev, cap, overhead);
    let mut at_end = None;
    let mut r = run_launching_with(scenario, built, opts, device, launcher, &mut |engine| {
        at_end = Some(Reconciliation::own(
            own_used(),
            context,
            engine.reserved_bytes(),
        ));
    });
    r.kernels_unavailable = unavailable;
    r.gpu = at_end.map(|at_end| GpuRun {
        device: name,
        device_total: total,
        held_to: held_to(cap, total),
        at_end,
    });
    Ok(r)
}

pub fn run_headless(name: &str, args: RunArgs) -> anyhow::Result<ExitCode> {
    let (scenario, built) = resolve(name).map_err(|e| BadInput(e.to_string()))?;
    if let Some(n) = args.iterations {
        let steps = steps_executed(&scenario, u64::from(n));
        if steps > MAX_STEPS {
            return Err(BadInput(format!(
                "--iterations {n}: the run would execute {} steps, more than the {} a run may",
                format_count(steps),
                format_count(MAX_STEPS)
            ))
            .into());
        }
        let buffers = buffers_allocated(&scenario, u64::from(n));
        if buffers > MAX_BUFFERS {
            return Err(BadInput(format!(
                "--iterations {n}: the run would allocate {} buffers (AllocateBuffers), more than the {} a run may",
                format_count(buffers),
                format_count(MAX_BUFFERS)
            ))
            .into());
        }
    }
    let opts = RunOptions {
        iterations: args.iterations,
        record_events: false,
    };
    let result = match args.cuda {
        None => run_scenario(&scenario, &built, &opts),
        Some(n) => match run_on_cuda(&scenario, &built, &opts, n) {
            Ok(r) => r,
            Err(e) => {
                warn!("vramscope: --device cuda:{n}: {e}");
                return Ok(ExitCode::from(super::EXIT_NO_GPU));
            }
        },
    };
    let checks = check(&scenario.expect, &result);
    let ok = checks.iter().all(|c| c.passed);
    if args.json {
        sayjson!(&vramscope::report::run::json(&result, &checks));
    } else {
        say!(
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
