//! `trace`: the user's own PyTorch program, unmodified, on a simulated GPU
//! (issue 38). The program runs under `python/vramscope_trace.py`; its
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
use vramscope::device::{profile, profiles::profile_names};
use vramscope::files::{check_replaceable, write_replacing};
use vramscope::job::recording::write_magic;
use vramscope::job::{FrameReader, ENTRY_CAP};
use vramscope::producers::{job_source_with, JobOptions};
use vramscope::report::job::LiveReport;
use vramscope::traced::{self, ChildOutput, TraceOptions, TraceOutcome};
use vramscope::tui::{run_tui, TuiOptions};
use vramscope::units::format_count;

use super::attach::{print_live, read_session};
use super::pace::PaceArgs;
use super::BadInput;

pub struct TraceArgs {
    pub gpu: String,
    /// 0: until the program ends.
    pub steps: u32,
    pub conf: Option<String>,
    pub json: bool,
    pub record: Option<PathBuf>,
    pub export: Option<PathBuf>,
    pub command: Vec<String>,
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
    let gpu = profile(&args.gpu).ok_or_else(|| {
        BadInput(format!(
            "--gpu {}: unknown GPU; known: {}",
            args.gpu,
            profile_names()
        ))
    })?;
    if let Some(p) = &args.export {
        check_replaceable(p).map_err(|e| BadInput(format!("--export {}: {e}", p.display())))?;
    }
    let file = args.record.as_deref().map(recording).transpose()?;
    let (reader, view) = std::io::pipe()?;
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
    };
    let run =
        traced::start(opts, Box::new(Tee { view, file })).map_err(|e| BadInput(e.to_string()))?;
    let title = format!("trace · {} · {}", gpu.name, args.command.join(" "));
    let frames = FrameReader::new(Box::new(reader) as Box<dyn Read + Send>, title.clone());
    if tui {
        let stop = Arc::new(AtomicBool::new(false));
        let source = job_source_with(frames, None, stop, JobOptions::default());
        let opts = pace.apply(TuiOptions::default(), &[title.as_str()]);
        let shown = run_tui(vec![(title, source)], opts);
        run.stop();
        let output = run.output();
        let joined = run.join();
        std::io::stderr().write_all(&output).ok();
        shown?;
        let (outcome, pickle) = joined.map_err(|e| BadInput(e.to_string()))?;
        export(&args, pickle)?;
        print_outcome(&outcome);
        return Ok(exit_of(&outcome));
    }
    let (mut session, fault) = read_session(frames, None, ENTRY_CAP);
    let (outcome, pickle) = run.join().map_err(|e| BadInput(e.to_string()))?;
    let name = args.command.join(" ");
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
        "{} optimizer steps, {} allocations, {} OOMs",
        o.steps,
        format_count(o.allocations),
        o.ooms
    );
    if let Some(e) = &o.exception {
        sayln!("the program raised {}: {}", e.kind, e.message);
        if let Some(at) = e.at.first() {
            sayln!("  at {at}");
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
    if let Some(e) = &o.ended {
        sayln!("ended: {e}");
    }
}
