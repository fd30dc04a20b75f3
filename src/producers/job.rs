//! A live job (or a recording of one) as a [`Source`]: a thread reads the
//! frames into a [`Session`], sends `Opened` and `Start` once the job's state
//! is known, then each batch of entries mirrored onto the map as a timeline
//! part (as `snapshot` streams a file's trace), and the leak findings when
//! steps end — at most about once a second, and less often when an analysis
//! takes long, so a large job never spends its reading time analysing.
//!
//! When the job loses entries, or its map differs from the one its entries
//! built, the view starts over (`Restarted`, a `Note` saying why, a new
//! `Start`). When the stream ends the view stays, and a `Note` says how.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::devices::SnapshotDevices;
use super::job_tags::JobTags;
use super::source::{JobMsg, Opened, RecordedMsg, RunMsg, Source, SourceMsg};
use crate::alloc::{AllocConfig, MemoryStats};
use crate::job::message::Message;
use crate::job::nvml_match::LiveJob;
use crate::job::{decode, Applied, FrameReader, ServerHello, Session, ENTRY_CAP};
use crate::leak::analyze_snapshot_with;
use crate::report::series::SnapshotSummary;
use crate::trace::mirror::TraceMirror;
use crate::trace::replay::Entry;
use crate::trace::timeline::TimelinePart;
use crate::trace::{Marker, MemoryMap};

/// The least time between two leak analyses while the job runs.
pub const ANALYSIS_EVERY: Duration = Duration::from_secs(1);
/// The least time between two [`JobMsg::Place`](super::JobMsg)s as entries come: NVML's
/// process reading behind the GPU panel comes once a second.
pub const JOB_EVERY: Duration = Duration::from_millis(250);

/// Messages queued for the view before the reader waits for it to draw.
pub const LIVE_QUEUE: usize = 4096;

/// How a live source reads its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobOptions {
    /// The CUDA device the view shows (default: the first the job has).
    pub device: Option<usize>,
    /// Trace entries kept for the timeline and the leak analysis; past it
    /// the view starts over from the job's map (and says so).
    pub keep_entries: usize,
    /// A tab among several (one per rank): it also sends the job's
    /// [`SnapshotSummary`] as steps end, for the table across tabs and the
    /// diff between them.
    pub tab: bool,
    /// Iterations for the leak analysis from a frame name or `file:line`
    /// (as `open --step-marker`), instead of the job's own steps.
    pub step_marker: Option<String>,
    /// The way back to the job (a connection; a recording has none): the
    /// view's [`EngineCommand::FindHolders`] goes there.
    pub requests: Option<crate::job::Requester>,
}

impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            device: None,
            keep_entries: ENTRY_CAP,
            tab: false,
            step_marker: None,
            requests: None,
        }
    }
}

/// A source fed from `frames` (a connection after its hello, or a
/// recording), on the job's first device. `stop` is set once nobody reads
/// any more.
pub fn job_source(
    frames: FrameReader<Box<dyn Read + Send>>,
    hello: Option<ServerHello>,
    device: Option<usize>,
    stop: Arc<AtomicBool>,
) -> Source {
    let opts = JobOptions {
        device,
        ..JobOptions::default()
    };
    job_source_with(frames, hello, stop, opts)
}

/// [`job_source`] as `opts` say.
pub fn job_source_with(
    frames: FrameReader<Box<dyn Read + Send>>,
    hello: Option<ServerHello>,
    stop: Arc<AtomicBool>,
    opts: JobOptions,
) -> Source {
    // Bounded: a job that sends faster than the view draws waits for it
    // (its socket backs up) instead of queueing without end.
    let (tx, rx) = flume::bounded(LIVE_QUEUE);
    let (spent_tx, spent) = flume::bounded(1);
    let cmd = opts.requests.clone().and_then(forward_requests);
    let spawned = std::thread::Builder::new()
        .name("live job".into())
        .spawn(move || {
            let mut send = |m: SourceMsg| {
                let ok = tx.send(m).is_ok();
                if !ok {
                    stop.store(true, Ordering::Relaxed);
                }
                ok
            };
            let mut reader = Reader {
                frames,
                session: None,
                hello,
                device: opts.device,
                keep_entries: opts.keep_entries,
                tags: Arc::new(JobTags::default()),
                view: None,
                spent,
                last_analysis: None,
                analysis_took: Duration::ZERO,
                last_job: None,
                summaries: opts.tab,
                step_marker: opts.step_marker,
                findings: Vec::new(),
            };
            reader.run(&mut send);
        });
    match spawned {
        Ok(_) => Source::new(rx, cmd).reusing_parts(spent_tx),
        Err(e) => Source::from_messages([SourceMsg::Run(RunMsg::Failed(format!(
            "could not start the thread that reads the job: {e}"
        )))]),
    }
}

/// The view's commands to the job: a thread that writes each request to
/// the helper, so the key never waits on the socket. None when the thread
/// cannot start (then the view simply has no way to ask).
fn forward_requests(
    requests: crate::job::Requester,
) -> Option<flume::Sender<super::source::EngineCommand>> {
    let (tx, rx) = flume::unbounded();
    std::thread::Builder::new()
        .name("live requests".into())
        .spawn(move || {
            for cmd in rx {
                if cmd == super::source::EngineCommand::FindHolders
                    && requests.find_holders().is_err()
                {
                    return;
                }
            }
        })
        .ok()?;
    Some(tx)
}

/// What the view has been sent of the shown device.
struct View {
    device: usize,
    config: AllocConfig,
    map: Option<MemoryMap>,
    progress: (usize, Option<usize>),
    /// Entries of the device's trace mirrored so far.
    done: usize,
}

struct Reader {
    frames: FrameReader<Box<dyn Read + Send>>,
    session: Option<Session>,
    hello: Option<ServerHello>,
    device: Option<usize>,
    keep_entries: usize,
    tags: Arc<JobTags>,
    view: Option<View>,
    spent: flume::Receiver<TimelinePart>,
    last_analysis: Option<Instant>,
    analysis_took: Duration,
    last_job: Option<Instant>,
    /// Send the job's summary with each analysis (a tab among several).
    summaries: bool,
    step_marker: Option<String>,
    /// The last analysis's findings, which the helper's holders join.
    findings: Vec<crate::leak::Finding>,
}

type Sender<'a> = dyn FnMut(SourceMsg) -> bool + 'a;

impl Reader {
    fn run(&mut self, send: &mut Sender) {
        // The session holds `Rc` strings: it is made on this thread.
        let mut session = Session::with_cap(self.frames.at(), self.keep_entries);
        if let Some(h) = self.hello.take() {
            let _ = session.apply(0, Message::Hello(Box::new(h)));
        }
        let said_hello = session.hello().is_some();
        self.session = Some(session);
        if said_hello && !self.job(send, true) {
            return;
        }
        let outcome = self.read_all(send);
        let Some(session) = self.session.as_mut() else {
            return;
        };
        let msg = match outcome {
            Ok(true) => {
                let why = session.ended().unwrap_or("the job said bye").to_string();
                SourceMsg::Job(JobMsg::Note(format!("the job ended: {why}")))
            }
            Ok(false) => {
                session.disconnected("the job disconnected");
                SourceMsg::Job(JobMsg::Note(
                    "the job disconnected (the stream ended without bye)".into(),
                ))
            }
            Err(e) => SourceMsg::Run(RunMsg::Failed(format!("{e} (the view keeps what it had)"))),
        };
        if !send(msg) || !self.job(send, true) {
            return;
        }
        self.analyse(send, true);
        send(SourceMsg::Run(RunMsg::Finished));
    }

    /// Ok(true): the job said bye; Ok(false): the stream ended.
    fn read_all(&mut self, send: &mut Sender) -> Result<bool, crate::job::LiveError> {
        let at = self.frames.at().to_string();
        loop {
            let Some((index, bytes)) = self.frames.next_frame()? else {
                return Ok(false);
            };
            let Some(msg) = decode(&at, index, bytes)? else {
                continue;
            };
            let Some(session) = self.session.as_mut() else {
                return Ok(false);
            };
            let applied = session.apply(index, msg)?;
            let alive = match applied {
                // A tab's figures are in the table from the job's first state.
                Applied::Started { why } => {
                    self.start(why, send)
                        && self.job(send, true)
                        && (!self.summaries || self.analyse(send, true))
                }
                // Without step markers the analysis finds its iterations in
                // the trace, so it runs as entries come (debounced).
                Applied::Entries => {
                    let stepless = self.session.as_ref().is_some_and(|s| s.steps().is_empty());
                    self.entries(send)
                        && self.job(send, false)
                        && (!stepless || self.analyse(send, false))
                }
                Applied::Step => {
                    self.step(send) && self.job(send, true) && self.analyse(send, false)
                }
                Applied::Stats(d) => self.stats(d, send) && self.job(send, false),
                Applied::Hello => self.job(send, true),
                Applied::Oom | Applied::OomMessage => self.oom(send),
                // The helper named what holds the tensors: with the findings at once.
                Applied::Holders => self.send_findings(send),
                Applied::Ended(_) => return Ok(true),
                _ => true,
            };
            if !alive {
                return Ok(false);
            }
        }
    }

    fn start(&mut self, why: Option<String>, send: &mut Sender) -> bool {
        let Some(session) = self.session.as_ref() else {
            return false;
        };
        let devices = session.devices();
        let device = self
            .device
            .or_else(|| devices.first().copied())
            .unwrap_or(0);
        let first = self.view.is_none();
        if first {
            let capacity = session.hello().and_then(|h| {
                h.devices
                    .iter()
                    .find(|d| usize::from(d.device) == device)
                    .and_then(|d| d.total_memory)
            });
            let opened = Opened {
                tags: Some(self.tags.clone()),
                capacity,
                devices: SnapshotDevices {
                    path: None,
                    devices: devices.clone(),
                    current: device,
                    with_oom: Vec::new(),
                    under: None,
                },
                events: None,
                since_step: true,
                assumed_empty_start: false,
            };
            if !send(SourceMsg::Recorded(RecordedMsg::Opened(Box::new(opened)))) {
                return false;
            }
        } else {
            if !send(SourceMsg::Run(RunMsg::Restarted)) {
                return false;
            }
            if let Some(why) = why {
                if !send(SourceMsg::Job(JobMsg::Note(why))) {
                    return false;
                }
            }
        }
        let map = session.start_map(device);
        let untagged = map
            .blocks
            .keys()
            .filter_map(|a| Some((*a, session.start_frames(device, *a)?)))
            .collect();
        self.tags.restart(session.snap(), untagged);
        self.view = Some(View {
            device,
            config: session.config().clone(),
            map: Some(map.clone()),
            progress: (0, None),
            done: 0,
        });
        send(SourceMsg::Run(RunMsg::Start(Box::new(map))))
    }

    fn entries(&mut self, send: &mut Sender) -> bool {
        let (Some(session), Some(view)) = (self.session.as_ref(), self.view.as_mut()) else {
            return true;
        };
        let trace = session.trace(view.device);
        let new = trace.get(view.done..).unwrap_or(&[]);
        if new.is_empty() {
            return true;
        }
        self.tags.extend(session.snap(), new);
        let entries: Vec<Entry> = new.iter().map(Entry::recorded).collect();
        let snap = session.snap();
        let free_at = |i: usize| trace.get(i).and_then(|e| snap.extra(e).device_free);
        let mut part = self
            .spent
            .try_recv()
            .unwrap_or_else(|_| TimelinePart::with_capacity(entries.len()));
        let map = view.map.take().unwrap_or_default();
        let mut mirror = TraceMirror::resume(map, &view.config, view.progress);
        mirror.fill_part(view.done, &entries, free_at, &mut part);
        view.progress = mirror.progress();
        view.map = Some(mirror.into_map());
        view.done = trace.len();
        send(SourceMsg::Run(RunMsg::Part(part)))
    }

    /// An OOM, in the status: PyTorch's own first line once the job sent
    /// it, else what the OOM observer saw.
    fn oom(&mut self, send: &mut Sender) -> bool {
        let Some(session) = self.session.as_mut() else {
            return true;
        };
        let Some(o) = session.ooms().last().cloned() else {
            return true;
        };
        let text = o.pytorch_message.as_deref().unwrap_or(&o.message);
        let first = text.lines().next().unwrap_or_default();
        // The answer at it, once its trace entry has come: the trace's
        // requests replayed up to it (what held the memory, the what-ifs).
        let device = usize::from(o.device);
        session.snapshot();
        // What grew is told between the job's own steps (or the marker's).
        let boundaries = session.boundaries_by(device, self.step_marker.as_deref());
        let leaks = analyze_snapshot_with(session.snap(), device, boundaries);
        let answer = crate::leak::answer_trace_oom(session.snap(), device, Some(&leaks));
        let summary = answer
            .as_ref()
            .map_or(String::new(), |a| format!(" — {}", a.summary()));
        let shown = self
            .view
            .as_ref()
            .is_some_and(|v| v.device == usize::from(o.device));
        send(SourceMsg::Job(JobMsg::Note(format!(
            "OOM on device {}: {first}{summary}",
            o.device
        )))) && match answer {
            // The leak panel answers it in full, for the device it shows.
            Some(a) if shown => send(SourceMsg::Recorded(RecordedMsg::OomAnswer(Box::new(a)))),
            _ => true,
        }
    }

    /// The job's pid and devices for the GPU panel, when due (`now`: whatever the time).
    fn job(&mut self, send: &mut Sender, now: bool) -> bool {
        let Some(session) = self.session.as_ref() else {
            return true;
        };
        if !now && self.last_job.is_some_and(|t| t.elapsed() < JOB_EVERY) {
            return true;
        }
        self.last_job = Some(Instant::now());
        send(SourceMsg::Job(JobMsg::Place(Box::new(
            LiveJob::of_session(session),
        ))))
    }

    /// The job's own `memory_stats()` of the shown device, for the stats panel.
    fn stats(&self, device: u8, send: &mut Sender) -> bool {
        let (Some(session), Some(view)) = (self.session.as_ref(), self.view.as_ref()) else {
            return true;
        };
        if usize::from(device) != view.device {
            return true;
        }
        let Some(s) = session.stats().iter().find(|s| s.device == device) else {
            return true;
        };
        let stats = MemoryStats::from_map(|k| s.get(k));
        send(SourceMsg::Run(RunMsg::Stats(Box::new(stats))))
            && send(SourceMsg::Job(JobMsg::StepTrends(session.step_trends())))
    }

    /// A step ended: its boundary on the timeline, where the entries so far end.
    fn step(&mut self, send: &mut Sender) -> bool {
        let (Some(session), Some(view)) = (self.session.as_ref(), self.view.as_mut()) else {
            return true;
        };
        let Some(step) = session.steps().last() else {
            return true;
        };
        let k = u32::try_from(step.step).unwrap_or(u32::MAX);
        let mut part = self
            .spent
            .try_recv()
            .unwrap_or_else(|_| TimelinePart::with_capacity(2));
        part.clear();
        let map = view.map.take().unwrap_or_default();
        let mut mirror = TraceMirror::resume(map, &view.config, view.progress);
        mirror.push_marker(Marker::IterationEnd(k), &mut part);
        mirror.push_marker(Marker::IterationBegin(k.saturating_add(1)), &mut part);
        view.progress = mirror.progress();
        view.map = Some(mirror.into_map());
        self.tags.markers(2);
        send(SourceMsg::Run(RunMsg::Part(part)))
    }

    /// The leak findings from the steps so far, when one is due (`now`: at
    /// the end, whatever the time).
    fn analyse(&mut self, send: &mut Sender, now: bool) -> bool {
        let (Some(session), Some(view)) = (self.session.as_mut(), self.view.as_ref()) else {
            return true;
        };
        let wait = ANALYSIS_EVERY.max(self.analysis_took * 4);
        if !now && self.last_analysis.is_some_and(|t| t.elapsed() < wait) {
            return true;
        }
        let t = Instant::now();
        let boundaries = session.boundaries_by(view.device, self.step_marker.as_deref());
        let report = analyze_snapshot_with(session.snap(), view.device, boundaries);
        let summary = self
            .summaries
            .then(|| Arc::new(SnapshotSummary::of(session.snapshot())));
        self.analysis_took = t.elapsed();
        self.last_analysis = Some(Instant::now());
        if let Some(s) = summary {
            if !send(SourceMsg::Recorded(RecordedMsg::Summary(s))) {
                return false;
            }
        }
        self.findings = report.findings;
        self.send_findings(send)
    }

    /// The analysis's findings and, first, the Python names the helper
    /// found holding what grew (its latest walk).
    fn send_findings(&self, send: &mut Sender) -> bool {
        let Some(session) = self.session.as_ref() else {
            return true;
        };
        let mut all = session.holder_findings();
        all.extend(self.findings.iter().cloned());
        send(SourceMsg::Run(RunMsg::FindingsNow(all)))
    }
}
