//! A traced run: the program started, its connection served on a thread
//! until it ends, and the outcome with the snapshot of the whole run.

use std::io::{BufReader, BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use super::error::TraceError;
use super::launch::{ChildOutput, Launch};
use super::message;
use super::outcome::TraceOutcome;
use super::replay::RequestLog;
use super::simulator::{SimOptions, Simulator};
use crate::device::GpuProfile;
use crate::job::{write_frame, FrameReader, Requester};
use crate::trace::snapshot::export_bytes;

/// The frame that asks the program's helper for a holder walk.
const WALK: &[u8] = b"[\"walk\"]";

/// Bytes read from the program's socket at once.
const READ_BUFFER: usize = 64 << 10;

/// What to trace and how.
#[derive(Debug, Clone)]
pub struct TraceOptions {
    pub gpu: &'static GpuProfile,
    pub steps: Option<u32>,
    pub conf: Option<String>,
    /// The program and its arguments (`python train.py --bs 8`).
    pub command: Vec<String>,
    pub output: ChildOutput,
    /// Keep the whole run as a snapshot pickle (`--export`).
    pub want_snapshot: bool,
    /// Save the program's requests for a replay (`--save-requests`).
    pub save_requests: Option<std::path::PathBuf>,
    /// What one holder walk in the program may take, in ms (0: no walks).
    pub holders_budget_ms: f64,
}

/// The outcome, and the run as a snapshot pickle when one was asked for.
type Finished = Result<(TraceOutcome, Option<Vec<u8>>), TraceError>;

/// A run under way. `join` waits for its end.
pub struct TraceRun {
    handle: JoinHandle<Finished>,
    launch: Arc<Launch>,
    stop: Arc<AtomicBool>,
    /// A holder walk asked for (`requester`), not yet passed to the program.
    walk: Arc<AtomicBool>,
}

/// The view's way back to a traced program (PROTOCOL.md `find_holders`,
/// as a live job's helper takes it): what is written here asks for a walk,
/// which goes to the program ahead of its next answer (`["walk"]`), and
/// its helper walks at its next op boundary.
struct AskWalk(Arc<AtomicBool>);

impl Write for AskWalk {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.store(true, Ordering::Relaxed);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl TraceRun {
    /// Wait for the program's end: the outcome and, if asked, the run as a
    /// snapshot pickle PyTorch's memory_viz opens.
    pub fn join(self) -> Finished {
        self.handle
            .join()
            .map_err(|_| TraceError::Channel("the trace thread stopped unexpectedly".into()))?
    }

    /// End the program now (a closed view).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.launch.kill();
    }

    /// What the program printed (with [`ChildOutput::Capture`]).
    pub fn output(&self) -> Vec<u8> {
        self.launch
            .captured
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.launch.pid
    }

    /// Where the view's `H` goes: a holder walk in the program (the only
    /// request a traced program takes), named `requested` in the stream.
    pub fn requester(&self) -> Requester {
        Requester::new(Box::new(AskWalk(self.walk.clone())))
    }
}

/// Start the program; the live stream goes to `sink` as it runs.
pub fn start(opts: TraceOptions, sink: Box<dyn Write + Send>) -> Result<TraceRun, TraceError> {
    let launch = Arc::new(Launch::spawn(&opts.command, opts.output)?);
    let stop = Arc::new(AtomicBool::new(false));
    let walk = Arc::new(AtomicBool::new(false));
    let (l, s, w) = (launch.clone(), stop.clone(), walk.clone());
    let handle = std::thread::Builder::new()
        .name("trace".into())
        .spawn(move || serve(opts, sink, &l, &s, &w))
        .map_err(|e| TraceError::Channel(format!("could not start the trace thread: {e}")))?;
    Ok(TraceRun {
        handle,
        launch,
        stop,
        walk,
    })
}

fn serve(
    opts: TraceOptions,
    sink: Box<dyn Write + Send>,
    launch: &Launch,
    stop: &AtomicBool,
    walk: &AtomicBool,
) -> Finished {
    let sim_opts = SimOptions {
        gpu: opts.gpu,
        steps: opts.steps,
        conf: opts.conf.clone(),
        holders_budget_ms: opts.holders_budget_ms,
    };
    let mut sim = Simulator::new(sim_opts, sink, opts.command.clone());
    let mut log = match &opts.save_requests {
        Some(p) => Some(RequestLog::create(
            p,
            opts.gpu,
            opts.conf.as_deref(),
            &opts.command,
        )?),
        None => None,
    };
    let served = match accept(launch, stop)? {
        Some(stream) => serve_connection(&mut sim, stream, stop, walk, log.as_mut()),
        None => Ok(false),
    };
    if let Some(log) = log {
        log.finish()?;
    }
    if served.is_err() || stop.load(Ordering::Relaxed) {
        launch.kill();
    }
    let connected = served.as_ref().is_ok_and(|c| *c);
    let status = wait(&launch.child);
    let want = opts.want_snapshot;
    let (mut outcome, snap) = sim.finish(status)?;
    served?;
    outcome.never_connected = !connected;
    Ok((outcome, want.then(|| export_bytes(&snap))))
}

/// The program's connection, or None when it ended (or was stopped)
/// without making one.
fn accept(launch: &Launch, stop: &AtomicBool) -> Result<Option<UnixStream>, TraceError> {
    loop {
        match launch.listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)
                    .map_err(|e| TraceError::Channel(e.to_string()))?;
                return Ok(Some(s));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(TraceError::Channel(e.to_string())),
        }
        let ended = launch
            .child
            .lock()
            .map(|mut c| c.try_wait().ok().flatten().is_some())
            .unwrap_or(true);
        if ended || stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Serve until the program closes its end: true once it connected.
fn serve_connection<W: Write>(
    sim: &mut Simulator<W>,
    stream: UnixStream,
    stop: &AtomicBool,
    walk: &AtomicBool,
    mut log: Option<&mut RequestLog>,
) -> Result<bool, TraceError> {
    let read = stream
        .try_clone()
        .map_err(|e| TraceError::Channel(e.to_string()))?;
    // Buffered: the program sends its messages in batches (`SEND_EVERY` in
    // the helper), which a few reads take in, not two system calls each.
    let mut frames = FrameReader::new(
        BufReader::with_capacity(READ_BUFFER, read),
        "the traced program",
    );
    let mut reply = BufWriter::new(stream);
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(true);
        }
        let (index, bytes) = match frames.next_frame() {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(true),
            Err(e) => return Err(TraceError::Channel(e.to_string())),
        };
        let v: Value = message::decode(index, bytes)?;
        let answer = sim.handle(index, &v)?;
        if let Some(log) = log.as_deref_mut() {
            // Saved as JSON, whichever form the frame had.
            if message::is_binary(bytes) {
                log.write(v.to_string().as_bytes(), answer.as_ref())?;
            } else {
                log.write(bytes, answer.as_ref())?;
            }
        }
        if let Some(answer) = answer {
            let body =
                serde_json::to_vec(&answer).map_err(|e| TraceError::Channel(e.to_string()))?;
            // A walk the view asked for goes first: the helper reads it and
            // then its answer (a frame that is not its answer).
            if walk.swap(false, Ordering::Relaxed) && write_frame(&mut reply, WALK).is_err() {
                return Ok(true);
            }
            // A program that has gone stops reading: its end is the EOF above.
            if write_frame(&mut reply, &body)
                .and_then(|()| reply.flush())
                .is_err()
            {
                return Ok(true);
            }
        }
    }
}

fn wait(child: &Mutex<Child>) -> Option<i32> {
    child
        .lock()
        .ok()
        .and_then(|mut c| c.wait().ok())
        .and_then(|s| s.code())
}

use std::process::Child;
