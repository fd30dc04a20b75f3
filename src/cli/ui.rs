//! Opening the terminal UI on scenarios, snapshots and sweeps (and a plain
//! fallback when there is no terminal).

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use vramscope::device::budget::{held_to, scenario_sized};
use vramscope::device::cuda::CudaDevice;
use vramscope::device::kernels::launcher_for;
use vramscope::device::Device;
use vramscope::producers::{
    file_title, open_source, open_source_under, scenario_source, scenario_source_on,
    snapshot_source, sweep_source, RealGpu, Source, ITERATION_PACE,
};
use vramscope::scenario::{at_point, resolve, LoadError};
use vramscope::sweep::{capacity, default_threads};
use vramscope::tui::sweep::{SweepScreen, SweepState};
use vramscope::tui::theme::{no_color_from_env, Theme, ThemeName};
use vramscope::tui::{run_on_terminal, run_tui, TuiOptions};
use vramscope::units::escape_line;

use super::compare::CompareSide;
use super::pace::PaceArgs;
use super::sweep::{plan, SweepArgs};
use super::{BadInput, EXIT_NO_GPU};

/// Playback for scenarios: about two iterations of a small model per second,
/// so memory moves at once and a leak is flagged within seconds.
const SCENARIO_SPEED: f64 = 2000.0;

/// Whether a full-screen UI can run here.
pub fn have_terminal() -> bool {
    std::io::stdout().is_terminal() && std::io::stdin().is_terminal()
}

/// Scenarios (names or files) and snapshots, side by side when more than one.
pub fn open(inputs: &[&str], pace: &PaceArgs) -> anyhow::Result<ExitCode> {
    let sources = inputs
        .iter()
        .map(|i| open_source(i))
        .collect::<Result<Vec<_>, _>>();
    play(sources, pace)
}

/// `compare`: two sides, each an input as it is or under a config.
pub fn open_compare(sides: &[CompareSide; 2], pace: &PaceArgs) -> anyhow::Result<ExitCode> {
    let sources = sides
        .iter()
        .map(|s| match &s.conf {
            None => open_source(&s.input),
            Some(conf) => open_source_under(&s.input, conf),
        })
        .collect::<Result<Vec<_>, _>>();
    // Two runs are compared from where they start: paused, so a room sees
    // both at event 0 and space sets them going together.
    let pace = PaceArgs {
        paused: true,
        ..pace.clone()
    };
    play(sources, &pace)
}

/// Run the UI on opened sources at scenario pace (unless `pace` says
/// otherwise); an input that did not open, or a file that fails before its
/// first event, is bad input.
fn play(
    sources: Result<Vec<(String, Source)>, LoadError>,
    pace: &PaceArgs,
) -> anyhow::Result<ExitCode> {
    let sources = sources.map_err(|e| BadInput(e.to_string()))?;
    let titles: Vec<&str> = sources.iter().map(|(t, _)| t.as_str()).collect();
    let opts = pace.apply(
        TuiOptions {
            speed: SCENARIO_SPEED,
            stop_on_load_failure: true,
            ..TuiOptions::default()
        },
        &titles,
    );
    let failed = run_tui(sources, opts)?;
    match failed {
        Some(why) => Err(BadInput(why).into()),
        None => Ok(ExitCode::SUCCESS),
    }
}

/// Several sources as tabs (files, or a job's ranks), the first one shown.
pub fn open_tabs(tabs: Vec<(String, Source)>, pace: &PaceArgs) -> anyhow::Result<ExitCode> {
    let titles: Vec<&str> = tabs.iter().map(|(t, _)| t.as_str()).collect();
    let opts = pace.apply(
        TuiOptions {
            tabs: true,
            ..TuiOptions::default()
        },
        &titles,
    );
    run_tui(tabs, opts)?;
    Ok(ExitCode::SUCCESS)
}

/// The UI opens at once and shows the file being read; a file that does not
/// open ends it, and the error goes to the shell (exit 2).
pub fn open_snapshot(
    path: &Path,
    device: Option<usize>,
    pace: &PaceArgs,
) -> anyhow::Result<ExitCode> {
    let source = snapshot_source(path, device);
    let title = file_title(path, &path.display().to_string());
    let opts = pace.apply(
        TuiOptions {
            stop_on_load_failure: true,
            ..TuiOptions::default()
        },
        &[title.as_str()],
    );
    match run_tui(vec![(title, source)], opts)? {
        Some(why) => Err(BadInput(why).into()),
        None => Ok(ExitCode::SUCCESS),
    }
}

/// A scenario on a real GPU in the UI: the device is checked here (no
/// driver: a plain message, exit 3), then opened afresh by each run.
pub fn open_cuda(name: &str, ordinal: usize, pace: &PaceArgs) -> anyhow::Result<ExitCode> {
    let (scenario, built) = resolve(name).map_err(|e| BadInput(e.to_string()))?;
    let index = u32::try_from(ordinal)
        .map_err(|_| BadInput(format!("--device cuda:{ordinal}: no such device")))?;
    let (total, pci) = match CudaDevice::open(ordinal) {
        Ok(dev) => (dev.total_memory(), dev.pci()),
        Err(e) => {
            warn!("vramscope: --device cuda:{ordinal}: {e}");
            return Ok(ExitCode::from(EXIT_NO_GPU));
        }
    };
    let (cap, overhead) = (built.engine.device_bytes, built.engine.device_overhead);
    let gpu = RealGpu {
        ordinal: index,
        pci,
        open: Arc::new(move || {
            let dev = CudaDevice::open(ordinal)?;
            // As headless runs do: kernels when NVRTC can build them, and the
            // allocator held to the scenario's device.
            let launcher = launcher_for(&dev).ok();
            Ok((scenario_sized(dev, cap, overhead), launcher))
        }),
    };
    let title = format!("{} · cuda:{ordinal}", scenario.name);
    let name = scenario.name.clone();
    let source = scenario_source_on(scenario, built, ITERATION_PACE, Some(gpu))
        .with_capacity(held_to(cap, total).unwrap_or(total));
    let opts = pace.apply(
        TuiOptions {
            speed: SCENARIO_SPEED,
            ..TuiOptions::default()
        },
        &[name.as_str()],
    );
    run_tui(vec![(title, source)], opts)?;
    Ok(ExitCode::SUCCESS)
}

/// `sweep` in the terminal: the chart fills in as the points finish; Enter
/// on a point opens its full run in the run view, and quitting that comes
/// back to the chart.
pub fn open_sweep(name: &str, args: &SweepArgs, pace: &PaceArgs) -> anyhow::Result<ExitCode> {
    let (scenario, built, plan) = plan(name, args)?;
    let theme = Theme::builtin(ThemeName::from(pace.theme), no_color_from_env())?;
    let title = escape_line(&scenario.name).into_owned();
    let mut state = SweepState::new(
        title.clone(),
        capacity(&built),
        plan.points(),
        args.find_max_batch,
        theme,
    );
    let source = sweep_source(
        scenario.clone(),
        built.clone(),
        plan,
        args.find_max_batch,
        default_threads(),
    );
    loop {
        run_on_terminal(&mut SweepScreen {
            state: &mut state,
            source: &source,
        })?;
        let Some((batch, seq)) = state
            .open
            .take()
            .and_then(|i| state.planned.get(i).copied())
        else {
            return Ok(ExitCode::SUCCESS);
        };
        let (point, point_built) =
            at_point(&scenario, &built, batch, seq).map_err(|e| BadInput(e.to_string()))?;
        let run_title = match seq {
            Some(t) => format!("{title} · batch {batch} · seq {t}"),
            None => format!("{title} · batch {batch}"),
        };
        let opts = pace.apply(
            TuiOptions {
                speed: SCENARIO_SPEED,
                ..TuiOptions::default()
            },
            &[run_title.as_str()],
        );
        let run = scenario_source(point, point_built, ITERATION_PACE);
        run_tui(vec![(run_title, run)], opts)?;
    }
}
