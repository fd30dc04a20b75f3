//! `attach`: a running PyTorch job served by `python/vramscope_live`, or
//! `--replay` of a recording. The TUI by default; `--headless`/`--json`
//! read until the job says bye, the stream ends or Ctrl-C, then print the
//! report in `open --json`'s shape with a `live` section.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vramscope::alloc::format_size;
use vramscope::job::address::{expand_ranks, RANK};
use vramscope::job::nvml_match::{read_once, JobPlace, LiveJob};
use vramscope::job::{
    connect, decode, open_recording, Address, FrameReader, LiveError, Message, Requester,
    ServerHello, Session, TOKEN_ENV,
};
use vramscope::producers::{file_title, job_source_with, JobOptions};
use vramscope::report::job::LiveReport;
use vramscope::report::series::{figures, DeviceFigures, SeriesFile, SeriesTable};
use vramscope::tui::{run_tui, TuiOptions};
use vramscope::units::{format_count, signed_size};

use super::pace::PaceArgs;
use super::BadInput;

impl AttachArgs {
    fn live_options(&self, tab: bool, requests: Option<Requester>) -> JobOptions {
        JobOptions {
            device: self.device,
            keep_entries: self.keep_entries,
            tab,
            step_marker: self.step_marker.clone(),
            requests,
        }
    }
}

pub struct AttachArgs {
    /// One per rank; an address with `{rank}` stands for several.
    pub addresses: Vec<String>,
    /// How many ranks a `{rank}` address names.
    pub ranks: Option<u32>,
    pub replay: Option<PathBuf>,
    pub token: Option<String>,
    pub json: bool,
    pub step_marker: Option<String>,
    pub device: Option<usize>,
    /// Trace entries kept (`--keep-entries`).
    pub keep_entries: usize,
}

type Frames = FrameReader<Box<dyn std::io::Read + Send>>;

/// Set by SIGINT while a headless attach reads.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

pub fn run(args: AttachArgs, tui: bool, pace: &PaceArgs) -> anyhow::Result<ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    // A dead address or a refusal ends here, before any screen is drawn.
    let mut inputs = open_inputs(&args, &stop).map_err(|e| BadInput(e.to_string()))?;
    if inputs.len() > 1 {
        return ranks(args, inputs, tui, pace, stop);
    }
    let Some(Input {
        title,
        frames,
        hello,
        place,
        requests,
    }) = inputs.pop()
    else {
        return Err(BadInput("attach: no address".into()).into());
    };
    if tui {
        let source =
            job_source_with(frames, hello, stop, args.live_options(false, requests)).job_at(place);
        let opts = pace.apply(TuiOptions::default(), &[title.as_str()]);
        run_tui(vec![(title, source)], opts)?;
        return Ok(ExitCode::SUCCESS);
    }
    let input = Input {
        title,
        frames,
        hello,
        place,
        requests: None,
    };
    headless(&args, input, stop)
}

/// One connected job (or a recording), before its first frame is read.
struct Input {
    title: String,
    frames: Frames,
    hello: Option<ServerHello>,
    /// Whether NVML here can see the job.
    place: JobPlace,
    /// The way back to the job (none for a recording).
    requests: Option<Requester>,
}

/// The recording, or every address connected: all of them, or an error
/// naming the one that failed.
fn open_inputs(args: &AttachArgs, stop: &Arc<AtomicBool>) -> Result<Vec<Input>, LiveError> {
    if let Some(path) = &args.replay {
        let title = file_title(path, &path.display().to_string());
        return Ok(vec![Input {
            title,
            frames: open_recording(path)?,
            hello: None,
            place: JobPlace::Recording,
            requests: None,
        }]);
    }
    let token = args
        .token
        .clone()
        .or_else(|| std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()));
    let mut inputs = Vec::new();
    let addresses = expand(&args.addresses, args.ranks)?;
    let several = addresses.len() > 1;
    for text in addresses {
        let addr = Address::parse(&text)?;
        let c = connect(&addr, token.as_deref(), stop.clone())?;
        // Several ranks' tabs are told apart by rank first; the address
        // is what the user typed.
        let title = match c.hello.rank {
            Some(rank) if several => format!("rank {rank} · pid {}", c.hello.pid),
            Some(rank) => format!("pid {} · rank {rank} · {addr}", c.hello.pid),
            None => format!("pid {} · {addr}", c.hello.pid),
        };
        inputs.push(Input {
            title,
            frames: c.frames,
            hello: Some(c.hello),
            place: JobPlace::of(&addr),
            requests: Some(c.requests),
        });
    }
    // Tabs and rows in rank order, as the job numbers them.
    inputs.sort_by_key(|i| i.hello.as_ref().and_then(|h| h.rank));
    Ok(inputs)
}

/// The most ranks a `{rank}` address is looked up for without `--ranks`.
const MAX_PROBED_RANKS: u32 = 4096;

/// Each address, a `{rank}` one as one address per rank: 0 to `ranks` − 1,
/// or, for a unix socket, every rank from 0 whose socket exists.
fn expand(addresses: &[String], ranks: Option<u32>) -> Result<Vec<String>, LiveError> {
    let mut out = Vec::new();
    for text in addresses {
        if !text.contains(RANK) {
            out.push(text.clone());
            continue;
        }
        let listed: Vec<u32> = match ranks {
            Some(0) => {
                return Err(LiveError::Address("--ranks 0: at least one rank".into()));
            }
            Some(n) => (0..n).collect(),
            None => {
                let Address::Unix(_) = Address::parse(&text.replace(RANK, "0"))? else {
                    return Err(LiveError::Address(format!(
                        "address {text:?}: say how many ranks with --ranks N (a TCP address cannot be looked up)"
                    )));
                };
                let exists = |r: &u32| match Address::parse(&text.replace(RANK, &r.to_string())) {
                    Ok(Address::Unix(p)) => std::fs::symlink_metadata(p).is_ok(),
                    _ => false,
                };
                let found: Vec<u32> = (0..MAX_PROBED_RANKS).take_while(|r| exists(r)).collect();
                if found.is_empty() {
                    return Err(LiveError::Address(format!(
                        "address {text:?}: no socket for rank 0 ({} does not exist); is the job running, \
                         and did it call vramscope_live.start() with this address?",
                        text.replace(RANK, "0")
                    )));
                }
                found
            }
        };
        out.extend(expand_ranks(text, &listed));
    }
    Ok(out)
}

/// Several ranks: one tab each with the table across them, or (headless)
/// each rank's report and the table once every job has ended.
fn ranks(
    args: AttachArgs,
    inputs: Vec<Input>,
    tui: bool,
    pace: &PaceArgs,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<ExitCode> {
    if tui {
        let tabs: Vec<(String, _)> = inputs
            .into_iter()
            .map(|i| {
                let opts = args.live_options(true, i.requests);
                let source = job_source_with(i.frames, i.hello, stop.clone(), opts).job_at(i.place);
                (i.title, source)
            })
            .collect();
        return super::ui::open_tabs(tabs, pace);
    }
    on_interrupt(stop);
    let step_marker = args.step_marker.clone();
    let keep = args.keep_entries;
    let readers: Vec<_> = inputs
        .into_iter()
        .map(|i| {
            let marker = step_marker.clone();
            std::thread::spawn(move || {
                // The session holds `Rc` strings: it is made, read and
                // reported on this thread.
                let name = i.frames.at().to_string();
                let (mut session, fault) = read_session(i.frames, i.hello, keep);
                let rank = session.hello().and_then(|h| h.rank);
                let mut report = LiveReport::of(&mut session, &name, marker.as_deref());
                report.live.nvml = read_once(&LiveJob::of_session(&session), &i.place);
                let figures = figures(session.snapshot());
                RankOutcome {
                    name: match rank {
                        Some(r) => format!("{name} (rank-{r})"),
                        None => name,
                    },
                    report,
                    figures,
                    fault,
                }
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for r in readers {
        match r.join() {
            Ok(o) => outcomes.push(o),
            Err(_) => return Err(anyhow::anyhow!("a rank's reader stopped unexpectedly")),
        }
    }
    let rows: Vec<SeriesFile<'_>> = outcomes
        .iter()
        .map(|o| SeriesFile {
            file: &o.name,
            figures: Ok(&o.figures),
        })
        .collect();
    let table = SeriesTable::new(&rows);
    let faults: Vec<&String> = outcomes.iter().filter_map(|o| o.fault.as_ref()).collect();
    if args.json {
        let reports: Vec<&LiveReport> = outcomes.iter().map(|o| &o.report).collect();
        sayjson!(&serde_json::json!({ "ranks": reports, "table": table }));
    } else {
        for o in &outcomes {
            say!("{}", o.report.report.to_text());
            print_live(&o.report, &o.name);
            sayln!("");
        }
        say!("== across ranks ==\n{}", table.to_text());
    }
    for why in &faults {
        warn!("vramscope attach: {why}");
    }
    Ok(if faults.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(super::EXIT_BAD_INPUT)
    })
}

struct RankOutcome {
    /// The address, with the rank the job gave (the table's label).
    name: String,
    report: LiveReport,
    figures: Vec<DeviceFigures>,
    fault: Option<String>,
}

fn headless(args: &AttachArgs, input: Input, stop: Arc<AtomicBool>) -> anyhow::Result<ExitCode> {
    let Input {
        title,
        frames,
        hello,
        place,
        requests: _,
    } = input;
    on_interrupt(stop);
    let name = args.replay.as_deref().map_or_else(
        || frames.at().to_string(),
        |p: &Path| p.display().to_string(),
    );
    let (mut session, fault) = read_session(frames, hello, args.keep_entries);
    let mut report = LiveReport::of(&mut session, &name, args.step_marker.as_deref());
    // NVML once, at the end: what the job's process holds beside its reserved.
    report.live.nvml = read_once(&LiveJob::of_session(&session), &place);
    if let Some(d) = args.device {
        let holds: Vec<String> = report
            .report
            .devices
            .iter()
            .map(|r| format!("device {}", r.device))
            .collect();
        report.report.devices.retain(|r| r.device == d as i64);
        report.live.growth.retain(|g| g.device == d as i64);
        report.live.nvml.retain(|n| usize::from(n.device) == d);
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
        print_live(&report, &title);
    }
    match fault {
        Some(why) => {
            warn!("vramscope attach: {why}");
            Ok(ExitCode::from(super::EXIT_BAD_INPUT))
        }
        None => Ok(ExitCode::SUCCESS),
    }
}

/// Read `frames` into a session until the job ends, the stream ends, a
/// fault, or Ctrl-C; the fault, if one stopped it.
pub(super) fn read_session(
    mut frames: Frames,
    hello: Option<ServerHello>,
    keep_entries: usize,
) -> (Session, Option<String>) {
    let mut session = Session::with_cap(frames.at(), keep_entries);
    if let Some(h) = hello {
        // A hello is always taken: nothing came before it.
        let _ = session.apply(0, Message::Hello(Box::new(h)));
    }
    let at = frames.at().to_string();
    loop {
        if INTERRUPTED.load(Ordering::Relaxed) {
            session.disconnected("stopped by Ctrl-C while the job ran");
            return (session, None);
        }
        let read = match frames.next_frame() {
            Ok(None) => {
                if INTERRUPTED.load(Ordering::Relaxed) {
                    continue;
                }
                session.disconnected("the job disconnected (the stream ended without bye)");
                return (session, None);
            }
            Ok(Some((index, bytes))) => decode(&at, index, bytes).and_then(|m| match m {
                Some(m) => session.apply(index, m).map(Some),
                None => Ok(None),
            }),
            Err(e) => Err(e),
        };
        match read {
            Ok(_) if session.ended().is_some() => return (session, None),
            Ok(_) => {}
            // Ctrl-C can cut a frame in half: that is the stop, not a fault.
            Err(_) if INTERRUPTED.load(Ordering::Relaxed) => {}
            Err(e) => {
                session.disconnected(&format!("stopped reading: {e}"));
                return (session, Some(e.to_string()));
            }
        }
    }
}

/// The live facts after a job's report, as text.
pub(super) fn print_live(report: &LiveReport, title: &str) {
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
        "steps seen {} ({} since the last start-over; from {})",
        format_count(l.steps_seen),
        l.steps_kept,
        l.step_source.as_deref().unwrap_or("none")
    );
    for t in &l.memory_per_step {
        let per_step = |slope: Option<i64>| {
            slope.map_or(String::new(), |b| format!(" ({}/step)", signed_size(b)))
        };
        sayln!(
            "cuda:{} memory at steps {}–{} (the job's memory_stats(), {} readings): allocated {} → {}{}, reserved {} → {}{}",
            t.device,
            t.first_step,
            t.last_step,
            t.readings,
            format_size(t.allocated_first),
            format_size(t.allocated_last),
            per_step(t.allocated_per_step),
            format_size(t.reserved_first),
            format_size(t.reserved_last),
            per_step(t.reserved_per_step),
        );
    }
    for o in &l.ooms {
        // The device's section above places it in the trace ("OOM at entry
        // N"); `seq` counts the stream's steps and stats too, so it is not shown.
        sayln!(
            "OOM on device {}: {}",
            o.device,
            o.pytorch_message.as_deref().unwrap_or(&o.message)
        );
    }
    for h in &l.holders {
        let step = h.step.map_or(String::new(), |s| format!(" at step {s}"));
        let budget = match (h.spent_ms, h.budget_ms) {
            (Some(s), Some(b)) => format!(", {s:.1} ms of a {b:.0} ms budget"),
            _ => String::new(),
        };
        let cut = if h.complete {
            ""
        } else {
            "; stopped at its budget: what it did not reach is not listed"
        };
        sayln!(
            "holders{step} ({}{budget}{cut}):",
            match h.reason.as_str() {
                "requested" => "asked for",
                "oom" => "when the allocation failed: out of memory",
                _ => "memory grew",
            }
        );
        if h.chains.is_empty() {
            match h.reason.as_str() {
                "grew" => sayln!("  none of the job's Python names holds more than before"),
                _ => sayln!("  none of the job's Python names holds a CUDA tensor"),
            }
        }
        for c in &h.chains {
            let grew = c.grew_bytes.filter(|g| *g > 0).map_or(String::new(), |g| {
                format!(" (+{} since the last look)", format_size(g as u64))
            });
            sayln!("  {}{grew}", c.text());
            if let Some(fix) = &c.fix {
                sayln!("    fix: {fix}");
            }
        }
    }
    for why in &l.started_over {
        sayln!("started over: {why}");
    }
    for n in &l.nvml {
        sayln!("{}", n.text_line(l.pid));
    }
    if let Some(e) = &l.ended {
        sayln!("ended: {e}");
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
