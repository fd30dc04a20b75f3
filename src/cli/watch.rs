//! `vramscope watch`: every GPU's memory, utilisation and processes from NVML,
//! with a short history, refreshed by the poller thread. With a terminal it
//! is a live full-screen view (`tui::watch::WatchScreen`); otherwise text or JSON.

use std::collections::VecDeque;
use std::io::Write;
use std::process::ExitCode;

use vramscope::device::nvml::{DeviceReconciliation, GpuReading};
use vramscope::device::GpuUnavailable;
use vramscope::producers::{nvml_source, Source, SourceMsg};
use vramscope::tui::run_on_terminal;
use vramscope::tui::theme::{no_color_from_env, Theme, ThemeName};
use vramscope::tui::watch::{WatchScreen, WatchState};
use vramscope::units::{
    escape_controls, escape_json_controls, format_percent_or_unknown, format_size_or_unknown,
};

use super::EXIT_NO_GPU;

const HISTORY: usize = 40;
const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

fn sparkline(history: &VecDeque<Option<u64>>, total: Option<u64>) -> String {
    history
        .iter()
        .map(|v| match (v, total) {
            (Some(used), Some(total)) if total > 0 => BARS[((used * 7) / total).min(7) as usize],
            _ => '?',
        })
        .collect()
}

fn render(gpus: &[GpuReading], history: &[VecDeque<Option<u64>>]) -> String {
    let mut out = String::new();
    for (g, h) in gpus.iter().zip(history) {
        out.push_str(&format!(
            "GPU {} {}: used {} of {} (free {}), utilisation {} / memory {}\n  history {}\n",
            g.index,
            g.name.as_deref().unwrap_or("(name unknown)"),
            format_size_or_unknown(g.used),
            format_size_or_unknown(g.total),
            format_size_or_unknown(g.free),
            format_percent_or_unknown(g.utilization_gpu),
            format_percent_or_unknown(g.utilization_memory),
            sparkline(h, g.total),
        ));
        let kept = DeviceReconciliation::of(g).driver_reserved;
        if let Some(kept) = kept.filter(|b| *b > 0) {
            out.push_str(&format!(
                "  {} of the total the driver keeps back (neither used nor free)\n",
                vramscope::units::format_size_or_unknown(Some(kept))
            ));
        }
        for p in &g.processes {
            out.push_str(&format!(
                "  pid {:>7}: {} (CUDA context + caching allocator + other: not known for another process)\n",
                p.pid,
                format_size_or_unknown(p.used)
            ));
        }
    }
    out
}

/// The poller's next reading (blocking); `None` once it has stopped.
fn next_reading(rx: &Source) -> Option<Result<Vec<GpuReading>, GpuUnavailable>> {
    std::iter::from_fn(|| rx.recv()).find_map(|m| match m {
        SourceMsg::Gpus(reading) => Some(reading),
        _ => None,
    })
}

pub fn run(once: bool, json: bool) -> anyhow::Result<ExitCode> {
    // NVML is only ever called on the poller's thread; its first message says
    // whether it works here (no driver: a plain message and exit 3).
    let rx = nvml_source();
    let first = match next_reading(&rx) {
        Some(Ok(gpus)) => gpus,
        Some(Err(e)) => {
            warn!("vramscope watch: {e}");
            return Ok(ExitCode::from(EXIT_NO_GPU));
        }
        None => {
            warn!("vramscope watch: the NVML thread stopped before its first reading");
            return Ok(ExitCode::from(EXIT_NO_GPU));
        }
    };
    if !once && !json && super::ui::have_terminal() {
        let theme = Theme::builtin(ThemeName::Dark, no_color_from_env())?;
        let mut state = WatchState::new(theme);
        state.ingest(Ok(first));
        run_on_terminal(&mut WatchScreen {
            state: &mut state,
            source: &rx,
        })?;
        if let Some(e) = state.error {
            warn!("vramscope watch: {e}");
            return Ok(ExitCode::from(EXIT_NO_GPU));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut history: Vec<VecDeque<Option<u64>>> = Vec::new();
    let mut stdout = std::io::stdout();
    for reading in std::iter::once(Ok(first)).chain(std::iter::from_fn(|| next_reading(&rx))) {
        let gpus = match reading {
            Ok(g) => g,
            Err(e) => {
                warn!("vramscope watch: {e}");
                return Ok(ExitCode::from(EXIT_NO_GPU));
            }
        };
        history.resize_with(gpus.len(), VecDeque::new);
        for (h, g) in history.iter_mut().zip(&gpus) {
            h.push_back(g.used);
            if h.len() > HISTORY {
                h.pop_front();
            }
        }
        if json {
            let line = escape_json_controls(serde_json::to_string(&gpus)?);
            writeln!(stdout, "{line}")?;
        } else {
            // Our own clear-screen, then NVML's text (names, too) escaped.
            let text = render(&gpus, &history);
            write!(stdout, "\x1b[2J\x1b[H{}", escape_controls(&text))?;
        }
        stdout.flush()?;
        if once {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}
