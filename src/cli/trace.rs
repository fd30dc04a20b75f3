//! `trace`: the user's own PyTorch program, unmodified, on a simulated GPU
//! (issue 38). The program runs under `python/vramscope_trace/`; its
//! requests are placed by the allocator model as it runs, and the stream is
//! read as `attach` reads a live job: the same TUI, or the same report with
//! the trace's own figures (`--json`: `peak_allocated` and `peak_reserved`
//! at the top, as `run --json` has them).

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use vramscope::alloc::format_size;
use vramscope::device::GpuProfile;
use vramscope::device::{profile, profiles::profile_names};
use vramscope::files::{check_replaceable, write_replacing};
use vramscope::job::recording::write_magic;
use vramscope::job::{FrameReader, ENTRY_CAP};
use vramscope::producers::{job_source_with, JobOptions};
use vramscope::report::job::LiveReport;
use vramscope::sweep::{default_threads, MAX_SEARCH_BATCH};
use vramscope::traced::{
    self, parse_sweep, ChildOutput, ReplayOptions, TraceOptions, TraceOutcome, TraceRun, TraceSweep,
};
use vramscope::tui::{run_tui, TuiOptions};
use vramscope::units::format_count;

use super::attach::{print_live, read_session};
use super::pace::PaceArgs;
use super::BadInput;

pub struct TraceArgs {
    /// None: H100-SXM-80GB, or the recorded GPU with `--from`.
    pub gpu: Option<String>,
    /// 0: until the program ends.
    pub steps: u32,
    pub conf: Option<String>,
    pub json: bool,
    pub record: Option<PathBuf>,
    pub export: Option<PathBuf>,
    pub save_requests: Option<PathBuf>,
    pub from: Option<PathBuf>,
    pub sweep: Option<String>,
    pub find_max_batch: bool,
    /// What one holder walk may take, in ms (0: no walks).
    pub holders_budget_ms: f64,
    pub command: Vec<String>,
}

/// The GPU a trace runs on when `--gpu` says none.
pub const DEFAULT_GPU: &str = "H100-SXM-80GB";

fn gpu_named(name: &str) -> Result<&'static GpuProfile, BadInput> {
    profile(name).ok_or_else(|| {
        BadInput(format!(
            "--gpu {name}: unknown GPU; known: {}",
            profile_names()
        ))
    })
}

/// What feeds the view: a program running, or saved requests replayed.
enum Producer {
    Live(TraceRun),
    Replay(std::thread::JoinHandle<Finished>),
}

type Finished = Result<(TraceOutcome, Option<Vec<u8>>), vramscope::traced::TraceError>;

impl Producer {
    fn stop(&self) {
        if let Producer::Live(r) = self {
            r.stop();
        }
    }

    /// The way back to the program for the view's `H` (a replay has none).
    fn requests(&self) -> Option<vramscope::job::Requester> {
        match self {
            Producer::Live(r) => Some(r.requester()),
            Producer::Replay(_) => None,
        }
    }

    fn output(&self) -> Vec<u8> {
        match self {
            Producer::Live(r) => r.output(),
            Producer::Replay(_) => Vec::new(),
        }
    }

    fn join(self) -> Finished {
        match self {
            Producer::Live(r) => r.join(),
            Producer::Replay(h) => h.join().map_err(|_| {
                vramscope::traced::TraceError::Channel("the replay stopped unexpectedly".into())
            })?,
        }
    }
}

/// The stream to the reader, and to a recording when `--record` asks.
struct Tee {
    view: std::io::PipeWriter,
    file: Option<BufWriter<File>>,
}

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(f) = &mut self.file {
            f.write_all(buf)?;
        }
        self.view.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if let Some(f) = &mut self.file {
            f.flush()?;
        }
        self.view.flush()
    }
}

fn recording(path: &Path) -> anyhow::Result<BufWriter<File>> {
    check_replaceable(path).map_err(|e| BadInput(format!("--record {}: {e}", path.display())))?;
    let f =
        File::create(path).map_err(|e| BadInput(format!("--record {}: {e}", path.display())))?;
    let mut w = BufWriter::new(f);
    write_magic(&mut w).map_err(|e| BadInput(format!("--record {}: {e}", path.display())))?;
    Ok(w)
}

pub fn run(args: TraceArgs, tui: bool, pace: &PaceArgs) -> anyhow::Result<ExitCode> {
    let budget = args.holders_budget_ms;
    if !(budget.is_finite() && budget >= 0.0) {
        return Err(BadInput(format!(
            "--holders-budget {budget}: milliseconds, 0 or more (0: no walks)"
        ))
        .into());
    }
    if args.sweep.is_some() || args.find_max_batch {
        return sweep(&args);
    }
    let gpu = match (&args.gpu, &args.from) {
        (Some(name), _) => Some(gpu_named(name)?),
        (None, Some(_)) => None,
        (None, None) => Some(gpu_named(DEFAULT_GPU)?),
    };
    for (flag, p) in [
        ("--export", &args.export),
        ("--save-requests", &args.save_requests),
    ] {
        if let Some(p) = p {
            check_replaceable(p).map_err(|e| BadInput(format!("{flag} {}: {e}", p.display())))?;
        }
    }
    let file = args.record.as_deref().map(recording).transpose()?;
    let (reader, view) = std::io::pipe()?;
    let sink = Box::new(Tee { view, file });
    let (producer, title) = match &args.from {
        Some(from) => {
            if args.save_requests.is_some() {
                return Err(BadInput("--save-requests saves a program's requests; --from replays saved ones: give one".into()).into());
            }
            let opts = ReplayOptions {
                from: from.clone(),
                gpu,
                conf: args.conf.clone(),
                want_snapshot: args.export.is_some(),
            };
            let title = format!(
                "trace replay · {} · {}",
                gpu.map_or("the recorded GPU", |g| g.name),
                from.display()
            );
            let handle = std::thread::Builder::new()
                .name("trace replay".into())
                .spawn(move || traced::replay(&opts, sink))?;
            (Producer::Replay(handle), title)
        }
        None => {
            let gpu = match gpu {
                Some(g) => g,
                None => gpu_named(DEFAULT_GPU)?,
            };
            let opts = TraceOptions {
                gpu,
                steps: (args.steps > 0).then_some(args.steps),
                conf: args.conf.clone(),
                command: args.command.clone(),
                output: if tui {
                    ChildOutput::Capture
                } else {
                    ChildOutput::ToStderr
                },
                want_snapshot: args.export.is_some(),
                save_requests: args.save_requests.clone(),
                holders_budget_ms: args.holders_budget_ms,
            };
            let run = traced::start(opts, sink).map_err(|e| BadInput(e.to_string()))?;
            let title = format!("trace · {} · {}", gpu.name, args.command.join(" "));
            (Producer::Live(run), title)
        }
    };
    let frames = FrameReader::new(Box::new(reader) as Box<dyn Read + Send>, title.clone());
    if tui {
        let stop = Arc::new(AtomicBool::new(false));
        let live = JobOptions {
            requests: producer.requests(),
            ..JobOptions::default()
        };
        let mut source = job_source_with(frames, None, stop, live);
        if matches!(producer, Producer::Live(_)) {
            // The program runs here: `H` asks its helper for a walk.
            source = source.job_at(vramscope::job::nvml_match::JobPlace::Here);
        }
        let opts = pace.apply(TuiOptions::default(), &[title.as_str()]);
        let shown = run_tui(vec![(title, source)], opts);
        producer.stop();
        let output = producer.output();
        let joined = producer.join();
        std::io::stderr().write_all(&output).ok();
        shown?;
        let (outcome, pickle) = joined.map_err(|e| BadInput(e.to_string()))?;
        export(&args, pickle)?;
        print_outcome(&outcome);
        return Ok(exit_of(&outcome));
    }
    let (mut session, fault) = read_session(frames, None, ENTRY_CAP);
    let (outcome, pickle) = producer.join().map_err(|e| BadInput(e.to_string()))?;
    let name = outcome.command.join(" ");
    let report = LiveReport::of(&mut session, &name, None);
    export(&args, pickle)?;
    if args.json {
        sayjson!(&json_of(&outcome, &report)?);
    } else {
        say!("{}", report.report.to_text());
        print_live(&report, &name);
        sayln!("");
        print_outcome(&outcome);
    }
    if let Some(why) = fault {
        warn!("vramscope trace: {why}");
        return Ok(ExitCode::from(super::EXIT_BAD_INPUT));
    }
    Ok(exit_of(&outcome))
}

/// `--sweep NAME=V1,V2,…` and `--find-max-batch`: the program traced once
/// per value, fitted and reported as `vramscope sweep` reports a scenario.
fn sweep(args: &TraceArgs) -> anyhow::Result<ExitCode> {
    let gpu = gpu_named(args.gpu.as_deref().unwrap_or(DEFAULT_GPU))?;
    if args.from.is_some() {
        return Err(BadInput(
            "--sweep runs the program at each value; it cannot replay --from saved requests".into(),
        )
        .into());
    }
    let Some(spec) = &args.sweep else {
        return Err(BadInput(
            "--find-max-batch needs --sweep NAME=… to know which argument to vary (e.g. --sweep BATCH= --find-max-batch -- python train.py --batch-size {BATCH})".into(),
        )
        .into());
    };
    let (name, values) = parse_sweep(spec).map_err(BadInput)?;
    let hole = format!("{{{name}}}");
    if !args.command.iter().any(|a| a.contains(&hole)) {
        return Err(BadInput(format!(
            "--sweep {spec}: no argument of the program holds {hole}, where each value goes"
        ))
        .into());
    }
    if values.is_empty() && !args.find_max_batch {
        return Err(BadInput(format!(
            "--sweep {spec}: no values (give NAME=1,2,4 or --find-max-batch)"
        ))
        .into());
    }
    let plan = TraceSweep {
        gpu,
        steps: (args.steps > 0).then_some(args.steps),
        conf: args.conf.clone(),
        command: args.command.clone(),
        name,
        values,
        find_max: args.find_max_batch,
        limit: MAX_SEARCH_BATCH,
        threads: default_threads(),
    };
    let found = plan.run().map_err(|e| BadInput(e.to_string()))?;
    if args.json {
        sayjson!(&vramscope::report::sweep::json(&found));
    } else {
        say!("{}", vramscope::report::sweep::text(&found));
    }
    Ok(ExitCode::SUCCESS)
}

fn export(args: &TraceArgs, pickle: Option<Vec<u8>>) -> anyhow::Result<()> {
    if let (Some(path), Some(bytes)) = (&args.export, pickle) {
        write_replacing(path, &bytes)
            .map_err(|e| BadInput(format!("--export {}: {e}", path.display())))?;
        warn!("wrote {} ({} bytes)", path.display(), bytes.len());
    }
    Ok(())
}

/// `run --json`'s top-level peaks, the trace's own facts, then `attach --json`'s sections.
fn json_of(outcome: &TraceOutcome, report: &LiveReport) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::json!({
        "peak_allocated": outcome.peak_allocated,
        "peak_reserved": outcome.peak_reserved,
        "trace": outcome,
    });
    if let (Some(map), serde_json::Value::Object(rest)) =
        (v.as_object_mut(), serde_json::to_value(report)?)
    {
        for (k, val) in rest {
            map.entry(k).or_insert(val);
        }
    }
    Ok(v)
}

/// 0: traced to the end (or to `--steps`); 1: the program failed (an
/// exception, a non-zero exit); 2: it could not be traced at all.
fn exit_of(o: &TraceOutcome) -> ExitCode {
    if o.never_connected {
        ExitCode::from(super::EXIT_BAD_INPUT)
    } else if o.exception.is_some() || o.exit_status.is_some_and(|c| c != 0) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn print_outcome(o: &TraceOutcome) {
    sayln!("== trace: {} ==", o.command.join(" "));
    if o.never_connected {
        sayln!(
            "the program never reached vramscope: it did not import torch, or Python skipped \
             sitecustomize (`python -I`, `-S`, or `-E` with PYTHONPATH); nothing was traced"
        );
    }
    sayln!(
        "simulated GPU {}; {}; allocator config {:?} ({})",
        o.gpu,
        o.rules.as_deref().unwrap_or("rules of the default release"),
        o.alloc_conf,
        if o.alloc_conf_from.is_empty() {
            "CUDA never started"
        } else {
            &o.alloc_conf_from
        }
    );
    sayln!(
        "peak allocated {} ({} B), peak reserved {} ({} B); at the end {} allocated, {} reserved",
        format_size(o.peak_allocated),
        format_count(o.peak_allocated),
        format_size(o.peak_reserved),
        format_count(o.peak_reserved),
        format_size(o.allocated),
        format_size(o.reserved)
    );
    sayln!(
        "{} optimizer steps, {} allocations, {} OOMs; {} of the program's messages waited for vramscope, {} did not",
        o.steps,
        format_count(o.allocations),
        o.ooms,
        format_count(o.waited),
        format_count(o.posted)
    );
    if let Some(e) = &o.exception {
        sayln!("the program raised {}: {}", e.kind, e.message);
        // The program's own line first (the innermost frame is often
        // inside torch), then where it was raised if that is elsewhere.
        let user = e.at.iter().find(|f| is_user_line(f));
        if let Some(at) = user.or(e.at.first()) {
            sayln!("  at {at}");
        }
        if let (Some(_), Some(inner)) = (user, e.at.first()) {
            if Some(inner) != user {
                sayln!("  (raised in {inner})");
            }
        }
    }
    for u in &o.untraced {
        sayln!(
            "not traced: {} at {} ({}); vramscope did {}",
            u.what,
            u.at.as_deref().unwrap_or("an unknown line"),
            u.why,
            u.instead
        );
    }
    for a in &o.assumed {
        sayln!(
            "assumed, not traced: {} at {} ({} call{}): {}",
            a.what,
            a.at.as_deref().unwrap_or("an unknown line"),
            a.calls,
            if a.calls == 1 { "" } else { "s" },
            a.assumption
        );
    }
    for k in &o.known {
        sayln!(
            "sized from the program's own values: {} at {} ({} call{})",
            k.what,
            k.at.as_deref().unwrap_or("an unknown line"),
            k.calls,
            if k.calls == 1 { "" } else { "s" }
        );
    }
    for e in &o.estimates {
        sayln!(
            "estimated, not measured: {} ({}, {} call{})",
            e.what,
            format_size(e.bytes),
            e.calls,
            if e.calls == 1 { "" } else { "s" }
        );
    }
    if let Some(r) = &o.replay {
        sayln!(
            "replayed {} requests from {} (traced on {}, allocator config {:?})",
            format_count(r.requests),
            r.from,
            r.recorded_gpu,
            r.recorded_conf.as_deref().unwrap_or("the program's own")
        );
        if r.answers_differ > 0 {
            sayln!(
                "{} of the program's memory questions get other answers here; the replay follows what it did with the recorded ones",
                format_count(r.answers_differ)
            );
        }
        for n in &r.notes {
            sayln!("note: {n}");
        }
        if let Some(s) = &r.stopped {
            sayln!("stopped {s}");
        }
    }
    if let Some(e) = &o.ended {
        sayln!("ended: {e}");
    }
}

/// Whether a frame written `FILE:LINE in NAME` is the user's own code (not
/// torch's, not native, not the interpreter's), as a snapshot's frames are
/// told apart.
fn is_user_line(frame: &str) -> bool {
    let file = frame
        .rsplit_once(" in ")
        .map_or(frame, |(at, _)| at)
        .rsplit_once(':')
        .map_or(frame, |(file, _)| file);
    vramscope::trace::snapshot::Frame {
        filename: file.into(),
        line: 0,
        name: "".into(),
    }
    .is_user_code()
}

#[cfg(test)]
mod tests {
    use super::is_user_line;

    #[test]
    fn the_programs_line_is_told_from_torchs_and_natives() {
        assert!(is_user_line("/home/me/train.py:42 in train"));
        assert!(is_user_line("train.py:7 in <module>"));
        assert!(!is_user_line(
            "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py:125 in forward"
        ));
        assert!(!is_user_line("<frozen runpy>:88 in _run_code"));
        assert!(!is_user_line("??:0 in at::native::empty_cuda"));
    }
}
