//! `attach`: a running PyTorch job served by `python/vramscope_live.py`, or
//! `--replay` of a recording. The TUI by default; `--headless`/`--json`
//! read until the job says bye, the stream ends or Ctrl-C, then print the
//! report in `open --json`'s shape with a `live` section.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vramscope::live::{
    connect, decode, open_recording, Address, FrameReader, LiveError, Message, ServerHello,
    Session, TOKEN_ENV,
};
use vramscope::producers::{file_title, live_source};
use vramscope::tui::{run_tui, TuiOptions};
use vramscope::units::format_count;

use super::pace::PaceArgs;
use super::BadInput;

pub struct AttachArgs {
    pub address: Option<String>,
    pub replay: Option<PathBuf>,
    pub token: Option<String>,
    pub json: bool,
    pub step_marker: Option<String>,
    pub device: Option<usize>,
}

type Frames = FrameReader<Box<dyn std::io::Read + Send>>;

/// Set by SIGINT while a headless attach reads.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

pub fn run(args: AttachArgs, tui: bool, pace: &PaceArgs) -> anyhow::Result<ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    // A dead address or a refusal ends here, before any screen is drawn.
    let (title, frames, hello) =
        open_input(&args, stop.clone()).map_err(|e| BadInput(e.to_string()))?;
    if tui {
        let source = live_source(frames, hello, args.device, stop);
        let opts = pace.apply(TuiOptions::default(), &[title.as_str()]);
        run_tui(vec![(title, source)], opts)?;
        return Ok(ExitCode::SUCCESS);
    }
    headless(&args, &title, frames, hello, stop)
}

fn open_input(
    args: &AttachArgs,
    stop: Arc<AtomicBool>,
) -> Result<(String, Frames, Option<ServerHello>), LiveError> {
    if let Some(path) = &args.replay {
        let title = file_title(path, &path.display().to_string());
        return Ok((title, open_recording(path)?, None));
    }
    let text = args.address.as_deref().unwrap_or_default();
    if text.contains(vramscope::live::address::RANK) {
        return Err(LiveError::Address(format!(
            "address {text:?}: one address per attach for now; replace {{rank}} with the rank to watch"
        )));
    }
    let addr = Address::parse(text)?;
    let token = args
        .token
        .clone()
        .or_else(|| std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()));
    let c = connect(&addr, token.as_deref(), stop)?;
    let mut title = format!("pid {}", c.hello.pid);
    if let Some(rank) = c.hello.rank {
        title.push_str(&format!(" · rank {rank}"));
    }
    title.push_str(&format!(" · {addr}"));
    Ok((title, c.frames, Some(c.hello)))
}

fn headless(
    args: &AttachArgs,
    title: &str,
    mut frames: Frames,
    hello: Option<ServerHello>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<ExitCode> {
    on_interrupt(stop);
    let name = args.replay.as_deref().map_or_else(
        || frames.at().to_string(),
        |p: &Path| p.display().to_string(),
    );
    let mut session = Session::new(frames.at());
    if let Some(h) = hello {
        session.apply(0, Message::Hello(Box::new(h)))?;
    }
    let mut fault = None;
    let at = frames.at().to_string();
    loop {
        if INTERRUPTED.load(Ordering::Relaxed) {
            session.disconnected("stopped by Ctrl-C while the job ran");
            break;
        }
        let next = frames.next_frame();
        let read = match next {
            Ok(None) => {
                if INTERRUPTED.load(Ordering::Relaxed) {
                    continue;
                }
                session.disconnected("the job disconnected (the stream ended without bye)");
                break;
            }
            Ok(Some((index, bytes))) => decode(&at, index, bytes).and_then(|m| match m {
                Some(m) => session.apply(index, m).map(Some),
                None => Ok(None),
            }),
            Err(e) => Err(e),
        };
        match read {
            Ok(_) if session.ended().is_some() => break,
            Ok(_) => {}
            // Ctrl-C can cut a frame in half: that is the stop, not a fault.
            Err(_) if INTERRUPTED.load(Ordering::Relaxed) => {}
            Err(e) => {
                fault = Some(e.to_string());
                session.disconnected(&format!("stopped reading: {e}"));
                break;
            }
        }
    }
    let mut report = session.report(&name, args.step_marker.as_deref());
    if let Some(d) = args.device {
        let holds: Vec<String> = report
            .report
            .devices
            .iter()
            .map(|r| format!("device {}", r.device))
            .collect();
        report.report.devices.retain(|r| r.device == d as i64);
        report.live.growth.retain(|g| g.device == d as i64);
        if report.report.devices.is_empty() {
            return Err(BadInput(format!(
                "{name}: --device {d}: the job has no device {d}; it has {}",
                if holds.is_empty() {
                    "none".to_string()
                } else {
                    holds.join(", ")
                }
            ))
            .into());
        }
    }
    if args.json {
        sayjson!(&report);
    } else {
        say!("{}", report.report.to_text());
        let l = &report.live;
        sayln!("\n== live: {title} ==");
        if let Some(mode) = &l.mode {
            sayln!(
                "pid {}  rank {}  mode {mode}  stacks {}",
                l.pid.map_or("?".into(), |p| p.to_string()),
                l.rank.map_or("?".into(), |r| r.to_string()),
                l.stacks.map_or("?", |s| if s { "yes" } else { "no" })
            );
        }
        sayln!(
            "steps seen {} ({} since the last start-over; marker {})",
            format_count(l.steps_seen),
            l.steps_kept,
            l.step_source.as_deref().unwrap_or("none")
        );
        for why in &l.started_over {
            sayln!("started over: {why}");
        }
        if let Some(e) = &l.ended {
            sayln!("ended: {e}");
        }
    }
    match fault {
        Some(why) => {
            warn!("vramscope attach: {why}");
            Ok(ExitCode::from(super::EXIT_BAD_INPUT))
        }
        None => Ok(ExitCode::SUCCESS),
    }
}

/// Ctrl-C ends the reading; the report of what came so far is printed.
fn on_interrupt(stop: Arc<AtomicBool>) {
    #[cfg(unix)]
    {
        extern "C" fn handler(_: libc::c_int) {
            INTERRUPTED.store(true, Ordering::Relaxed);
        }
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; the cast is the C signature `signal` expects.
        unsafe {
            libc::signal(
                libc::SIGINT,
                handler as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
    // The socket reader looks at `stop` between its short read timeouts.
    let _ = std::thread::Builder::new()
        .name("ctrl-c".into())
        .spawn(move || loop {
            if INTERRUPTED.load(Ordering::Relaxed) {
                stop.store(true, Ordering::Relaxed);
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        });
}
