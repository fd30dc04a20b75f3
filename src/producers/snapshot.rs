//! A PyTorch snapshot as a [`Source`]: its recorded trace mirrored into
//! events (`trace::mirror`), or its requests replayed under another
//! `PYTORCH_CUDA_ALLOC_CONF` (`trace::replay::whatif`), whose allocator's own
//! events are what the views show. A worker thread reads the file (saying
//! how far it has got), then makes the events and sends them in chunks, so
//! the UI is drawn from the first moment and a large trace opens at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::alloc::constants::LARGE_BUFFER;
use crate::alloc::AllocConfig;
use crate::report::series::SnapshotSummary;
use crate::trace::mirror::{final_map, start_map, TraceMirror};
use crate::trace::placing_map::{PlaceOn, PlacingMap};
use crate::trace::replay::from_snapshot::EntryReader;
use crate::trace::replay::from_snapshot::{self, DeviceReplay};
use crate::trace::replay::reconstruct;
use crate::trace::replay::replayed::device_capacity;
use crate::trace::replay::whatif::{self, Requests};
use crate::trace::replay::Entry;
use crate::trace::snapshot::{
    import_file_reporting, ConsumedTrace, Snapshot, SnapshotError, TraceEntry,
};
use crate::trace::timeline::TimelinePart;
use crate::trace::{Event, MemoryMap};

use super::devices::{devices_with_oom, snapshot_devices, SnapshotDevices};
use super::snapshot_stream::{stream_file, Streamed};
use super::snapshot_tags::SnapshotTags;
use super::source::{LoadProgress, Opened, RecordedMsg, RunMsg, Source, SourceMsg, TagInfo};
use super::whatif_stream;

/// Parts the UI has recorded, back for the worker to fill again.
pub(super) type Spent = flume::Receiver<TimelinePart>;

/// Parts kept to be filled again, at least: each is a megabyte of peak RSS.
pub(super) const SPARE_PARTS: usize = 2;

/// A part to fill: one the UI gave back, or a new one; of those waiting
/// beyond `keep`, the rest are let go. The UI records parts in bursts (all
/// that came while it drew) and gives every one back: a part let go and
/// made afresh costs page faults, and TLB shootdowns on every thread.
pub(super) fn spare_part(spent: &Spent, keep: usize) -> TimelinePart {
    let part = spent
        .try_recv()
        .unwrap_or_else(|_| TimelinePart::with_capacity(EVENTS_PER_MESSAGE));
    while spent.len() > keep {
        drop(spent.try_recv());
    }
    part
}

/// Where a worker's messages go: the UI's end of the source.
#[derive(Clone)]
pub(super) struct Out(flume::Sender<SourceMsg>);

impl Out {
    /// False once the UI has gone, and nobody needs the rest.
    pub(super) fn send(&self, m: SourceMsg) -> bool {
        self.0.send(m).is_ok()
    }

    pub(super) fn is_gone(&self) -> bool {
        self.0.is_disconnected()
    }
}

/// Events per message while a trace is rebuilt in the background: the UI
/// opens on the first ones while the rest are still being placed (a 1 GB
/// trace takes seconds to rebuild).
pub(super) const EVENTS_PER_MESSAGE: usize = 1 << 14;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("the snapshot has no device {device}; it holds {}", device_list(.holds))]
    NoDevice { device: usize, holds: Vec<usize> },
}

fn device_list(devices: &[usize]) -> String {
    match devices {
        [] => "none".to_string(),
        _ => devices
            .iter()
            .map(|d| format!("device {d}"))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The view of `path` on `device` (the first device it holds when `None`):
/// a source at once, fed by a worker that reads the file and then makes the
/// events. What goes wrong arrives as [`RunMsg::Failed`](super::RunMsg), naming the file.
pub fn snapshot_source(path: &Path, device: Option<usize>) -> Source {
    file_source(path.to_path_buf(), device, None, false)
}

/// [`snapshot_source`] for a view among several files (a tab): it also
/// sends the file's [`SnapshotSummary`] (figures and live blocks) for the
/// views across files, made once the file is read and before its events
/// (it rebuilds the trace once more for the peaks: a view of one file
/// spares that).
pub fn snapshot_tab_source(path: &Path, device: Option<usize>) -> Source {
    file_source(path.to_path_buf(), device, None, true)
}

/// [`snapshot_source`] with the requests replayed under `config`.
pub fn what_if_file_source(path: &Path, device: Option<usize>, config: AllocConfig) -> Source {
    file_source(path.to_path_buf(), device, Some(config), false)
}

/// The same view of the same file on `device`: the recorded trace, or the
/// what-if replay under the same config.
pub fn reopen_on(d: &SnapshotDevices, device: usize) -> Result<Source, String> {
    let path = d
        .path
        .as_ref()
        .ok_or("this view cannot reopen its snapshot on another device")?;
    Ok(file_source(
        path.clone(),
        Some(device),
        d.under.clone(),
        false,
    ))
}

/// Progress messages while reading: one per this share of the file at most.
pub(super) const PROGRESS_STEPS: u64 = 200;

fn file_source(
    path: PathBuf,
    device: Option<usize>,
    under: Option<AllocConfig>,
    summary: bool,
) -> Source {
    large_blocks_from_the_system();
    let total = std::fs::metadata(&path).map_or(0, |m| m.len());
    let source = stream_events("vramscope-snapshot", move |out, spent| {
        // A view of one file is made as the file is read: its recorded
        // trace, or its requests under another config.
        let streamed = match (&under, summary) {
            (None, false) => Some(stream_file(&path, total, device, out, spent)),
            (Some(config), false) if whatif_stream::streams(config) => {
                Some(whatif_stream::stream_what_if(&path, device, config, out))
            }
            _ => None,
        };
        let snap = match streamed {
            Some(Streamed::Done(done)) => return done,
            Some(Streamed::Whole(snap)) => Some(snap),
            None => None,
        };
        let send = &mut |m| out.send(m);
        let snap = match snap {
            Some(snap) => Ok(*snap),
            None => read_whole(&path, total, send),
        };
        let snap = match snap {
            Ok(snap) => snap,
            Err(None) => return false,
            Err(Some(e)) => {
                send(SourceMsg::Run(RunMsg::Failed(e.to_string())));
                return false;
            }
        };
        if summary
            && !send(SourceMsg::Recorded(RecordedMsg::Summary(Arc::new(
                SnapshotSummary::of(&snap),
            ))))
        {
            return false;
        }
        // A view of the recorded run (not a what-if) answers its OOM.
        let answer = match (&under, pick_device(&snap, device)) {
            (None, Ok(d)) => oom_answer(&snap, d),
            _ => None,
        };
        match plan(Snap::Owned(Box::new(snap)), device, under) {
            Ok((mut opened, work)) => {
                opened.devices.path = Some(path);
                send(SourceMsg::Recorded(RecordedMsg::Opened(Box::new(opened))))
                    && work.run(send, spent)
                    && answer.is_none_or(|a| send(SourceMsg::Recorded(RecordedMsg::OomAnswer(a))))
            }
            Err(e) => {
                send(SourceMsg::Run(RunMsg::Failed(format!(
                    "{}: {e}",
                    path.display()
                ))));
                false
            }
        }
    });
    // It says it is reading from its first frame (never `event 0/0 LIVE`).
    source.reading(total)
}

/// The whole file, saying how far it has got; `Err(None)`: the UI has gone.
fn read_whole(
    path: &Path,
    total: u64,
    send: &mut dyn FnMut(SourceMsg) -> bool,
) -> Result<Snapshot, Option<SnapshotError>> {
    let reading =
        |done| SourceMsg::Recorded(RecordedMsg::Loading(LoadProgress::Reading { done, total }));
    if !send(reading(0)) {
        return Err(None);
    }
    let step = (total / PROGRESS_STEPS).max(1);
    let mut told = 0;
    let mut gone = false;
    let snap = import_file_reporting(path, &mut |done| {
        if done >= told + step && !gone {
            told = done;
            gone = !send(reading(done));
        }
    })
    .map_err(Some)?;
    if gone || !send(reading(total)) {
        return Err(None);
    }
    Ok(snap)
}

/// Blocks of 1 MiB and more come straight from the system and go back to
/// it when freed. glibc would otherwise raise that bar to the largest block
/// freed so far, and keep the chunks of events this worker hands to the UI
/// (megabytes each) in its heap once the UI is done with them: a fifth of
/// the peak memory on a 100 MB file.
fn large_blocks_from_the_system() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable of glibc's allocator, under its
    // own lock; no allocation is touched.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// A worker thread named `name`, [behind the UI](behind_the_ui). When it
/// cannot start, the UI is told that the thread that `does` could not, and
/// `failed` is set.
pub(super) fn spawn_worker<T: Send + 'static>(
    name: &str,
    does: &str,
    out: &Out,
    failed: &std::sync::atomic::AtomicBool,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<std::thread::JoinHandle<T>> {
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            behind_the_ui();
            work()
        });
    if let Err(e) = &handle {
        out.send(SourceMsg::Run(RunMsg::Failed(format!(
            "could not start the thread that {does}: {e}"
        ))));
        failed.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    handle.ok()
}

/// A worker that reads or places a file's events yields the CPU to the UI
/// thread: while a large file is read the two workers and the UI want
/// more than two cores, and a key must not wait behind them. (On Linux a
/// thread's nice value is its own; elsewhere this does nothing.)
pub(super) fn behind_the_ui() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid has no preconditions; setpriority on the calling
    // thread's own id changes only its scheduling weight.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, WORKER_NICE);
    }
}

/// How much a worker yields to the UI thread (a nice value).
const WORKER_NICE: libc::c_int = 10;

/// The view of an imported snapshot's `device`: the recorded trace.
pub fn snapshot_to_source(snap: &Snapshot, device: Option<usize>) -> Result<Source, ImportError> {
    planned_source(snap, device, None)
}

/// The view of an imported snapshot's `device`: its requests replayed under
/// `config`, from the state the trace started in (an open trace's rebuilt
/// start), on the device size the trace tells or else the recorded run's peak.
pub fn what_if_source(
    snap: &Snapshot,
    device: Option<usize>,
    config: AllocConfig,
) -> Result<Source, ImportError> {
    planned_source(snap, device, Some(config))
}

fn planned_source(
    snap: &Snapshot,
    device: Option<usize>,
    under: Option<AllocConfig>,
) -> Result<Source, ImportError> {
    let (opened, work) = plan(Snap::Borrowed(snap), device, under)?;
    Ok(stream_events(
        "vramscope-snapshot-events",
        move |out, spent| {
            let send = &mut |m| out.send(m);
            send(SourceMsg::Recorded(RecordedMsg::Opened(Box::new(opened))))
                && work.run(send, spent)
        },
    ))
}

/// What a view's worker does once the file is read.
enum Work {
    /// A state-only snapshot (or a device without a trace): its recorded state.
    State(MemoryMap),
    /// The recorded trace, from the state its first entry found.
    Mirror {
        start: MemoryMap,
        trace: Vec<TraceEntry>,
        reader: Box<EntryReader>,
        device_free: Vec<(usize, u64)>,
        config: AllocConfig,
    },
    /// The requests replayed under another config.
    WhatIf {
        replay: Box<DeviceReplay>,
        config: AllocConfig,
        capacity: u64,
    },
}

impl Work {
    fn run(self, send: &mut dyn FnMut(SourceMsg) -> bool, spent: &Spent) -> bool {
        match self {
            Work::State(map) => send(SourceMsg::Run(RunMsg::Start(Box::new(map)))),
            Work::Mirror {
                start,
                trace,
                reader,
                device_free,
                config,
            } => mirror_events(
                start,
                ConsumedTrace::new(trace),
                &reader,
                &device_free,
                &config,
                send,
                spent,
            ),
            Work::WhatIf {
                replay,
                config,
                capacity,
            } => replayed_events(&replay, config, capacity, send),
        }
    }
}

/// A snapshot a view is planned from: one the view may take apart (its
/// trace is kept, the rest let go), or one it must copy from.
enum Snap<'a> {
    Owned(Box<Snapshot>),
    Borrowed(&'a Snapshot),
}

/// Everything the view of `device` needs from the snapshot, so that the
/// snapshot can go before the events are made.
fn plan(
    from: Snap<'_>,
    device: Option<usize>,
    under: Option<AllocConfig>,
) -> Result<(Opened, Work), ImportError> {
    let snap = match &from {
        Snap::Owned(s) => s,
        Snap::Borrowed(s) => *s,
    };
    let device = pick_device(snap, device)?;
    let devices = SnapshotDevices {
        path: None,
        devices: snapshot_devices(snap),
        current: device,
        with_oom: devices_with_oom(snap),
        under: under.clone(),
    };
    let replay = match &under {
        Some(_) => from_snapshot::verify_device(snap, device, None),
        None => None,
    };
    let trace = snap
        .device_traces
        .get(device)
        .map_or(&[][..], Vec::as_slice);
    // A mirrored trace's events are its own, one per allocator entry.
    let mirrored = under.is_none() && !trace.is_empty();
    // The stacks and times are gathered beside the rebuild where there is
    // one (below), here otherwise.
    let (mut work, capacity, events, tags) = match (under, replay) {
        (Some(config), Some(replay)) => {
            let capacity = device_capacity(&replay, None);
            let work = Work::WhatIf {
                replay: Box::new(replay),
                config,
                capacity,
            };
            (work, Some(capacity), None, None)
        }
        // Nothing was traced: no request to replay, the recorded state stands.
        (Some(_), None) => (Work::State(final_map(snap, device)), None, Some(0), None),
        (None, _) if trace.is_empty() => {
            (Work::State(final_map(snap, device)), None, Some(0), None)
        }
        (None, _) => {
            let reader = EntryReader::new(snap, trace);
            let config = from_snapshot::config(snap);
            let finals = from_snapshot::final_segments(snap, device);
            // The start state and the device size read the whole trace: on
            // a thread of their own while the stacks and times are gathered
            // here (the snapshot itself cannot cross threads).
            let (start, capacity, events, device_free, tags) = std::thread::scope(|s| {
                let rebuilt = s.spawn(|| {
                    let entries = trace.iter().map(|e| reader.entry(e));
                    let capacity = from_snapshot::infer_device_total(entries.clone(), LARGE_BUFFER);
                    let start = start_map(&reconstruct::initial_state(entries, &finals, &config));
                    let events = trace.iter().filter(|e| e.action.is_allocator()).count();
                    (start, capacity, events)
                });
                // Only `oom` entries record it: a short list, searched by entry index.
                let device_free: Vec<(usize, u64)> = trace
                    .iter()
                    .enumerate()
                    .filter_map(|(i, e)| snap.extra(e).device_free.map(|f| (i, f)))
                    .collect();
                let tags = entry_tags(snap, device, mirrored);
                let (start, capacity, events) = match rebuilt.join() {
                    Ok(rebuilt) => rebuilt,
                    Err(panic) => std::panic::resume_unwind(panic),
                };
                (start, capacity, events, device_free, tags)
            });
            let work = Work::Mirror {
                start,
                trace: Vec::new(),
                reader: Box::new(reader),
                device_free,
                config,
            };
            (work, capacity, Some(events), Some(tags))
        }
    };
    let tags: Arc<dyn TagInfo> = tags.unwrap_or_else(|| entry_tags(snap, device, mirrored));
    let opened = Opened {
        tags: Some(tags),
        capacity,
        devices,
        events,
        since_step: false,
        assumed_empty_start: false,
    };
    // The trace itself goes last, once nothing reads the snapshot any more.
    if let Work::Mirror { trace, .. } = &mut work {
        *trace = match from {
            Snap::Owned(mut s) => std::mem::take(&mut s.device_traces[device]),
            Snap::Borrowed(s) => s.device_traces[device].clone(),
        };
    }
    Ok((opened, work))
}

/// The device a source shows: `device`, else the first the snapshot holds.
pub(super) fn pick_device(snap: &Snapshot, device: Option<usize>) -> Result<usize, ImportError> {
    let devices = snapshot_devices(snap);
    match device {
        Some(d) if devices.contains(&d) => Ok(d),
        Some(d) => Err(ImportError::NoDevice {
            device: d,
            holds: devices,
        }),
        None => Ok(devices.first().copied().unwrap_or(0)),
    }
}

/// The stacks of `device`'s trace entries and final blocks, for tags from
/// `entry_tag` and for blocks without one; `mirrored`: the events are the
/// trace's own, one per allocator entry.
fn entry_tags(snap: &Snapshot, device: usize, mirrored: bool) -> Arc<SnapshotTags> {
    Arc::new(SnapshotTags::new(snap, device, mirrored))
}

/// The state the trace began in, then the recorded entries as events, a
/// chunk at a time; false once the UI has gone.
fn mirror_events(
    start: MemoryMap,
    trace: ConsumedTrace,
    reader: &EntryReader,
    device_free: &[(usize, u64)],
    config: &AllocConfig,
    send: &mut dyn FnMut(SourceMsg) -> bool,
    spent: &Spent,
) -> bool {
    let free_at = |i: usize| {
        device_free
            .binary_search_by_key(&i, |(at, _)| *at)
            .ok()
            .map(|k| device_free[k].1)
    };
    if !start.segments.is_empty() && !send(SourceMsg::Run(RunMsg::Start(Box::new(start.clone())))) {
        return false;
    }
    match PlacingMap::tiled(start) {
        Ok(map) => {
            let mirror = TraceMirror::starting_from(map, config);
            mirror_chunks(mirror, trace, reader, &free_at, send, spent)
        }
        Err(map) => {
            let mirror = TraceMirror::starting_from(*map, config);
            mirror_chunks(mirror, trace, reader, &free_at, send, spent)
        }
    }
}

/// The entries of `trace` placed by `mirror`, a part a chunk.
fn mirror_chunks<M: PlaceOn>(
    mut mirror: TraceMirror<'_, M>,
    mut trace: ConsumedTrace,
    reader: &EntryReader,
    free_at: &dyn Fn(usize) -> Option<u64>,
    send: &mut dyn FnMut(SourceMsg) -> bool,
    spent: &Spent,
) -> bool {
    let mut entries: Vec<Entry> = Vec::with_capacity(EVENTS_PER_MESSAGE);
    loop {
        let first = trace.position();
        let Some(chunk) = trace.next_chunk(EVENTS_PER_MESSAGE) else {
            break;
        };
        entries.clear();
        entries.extend(chunk.iter().map(|e| reader.entry(e)));
        // Each chunk goes as soon as it is placed, in a part the UI has
        // given back where there is one.
        let mut part = spare_part(spent, SPARE_PARTS);
        mirror.fill_part(first, &entries, free_at, &mut part);
        if !send(SourceMsg::Run(RunMsg::Part(part))) {
            return false;
        }
    }
    let last = TimelinePart {
        head: Some(Box::new(mirror.into_map().into_memory_map())),
        ..TimelinePart::default()
    };
    send(SourceMsg::Run(RunMsg::Part(last)))
}

fn replayed_events(
    replay: &DeviceReplay,
    config: AllocConfig,
    capacity: u64,
    send: &mut dyn FnMut(SourceMsg) -> bool,
) -> bool {
    let requests = Requests {
        entries: &replay.entries,
        empty_cache_at: &replay.outcome.empty_cache_at,
        start: Some(&replay.start),
    };
    let mut run = whatif::run(&requests, config, capacity, true);
    if !run.start.is_empty()
        && !send(SourceMsg::Run(RunMsg::Start(Box::new(
            MemoryMap::from_segments(&run.start),
        ))))
    {
        return false;
    }
    let events = run.allocator.take_events();
    events.chunks(EVENTS_PER_MESSAGE).all(|chunk| {
        send(SourceMsg::Run(RunMsg::Events(
            chunk.iter().copied().map(Event::Alloc).collect(),
        )))
    })
}

/// A source fed by `produce` on a worker thread of its own, then
/// `Finished` (unless `produce` says it stopped). Its `send` returns false
/// once the UI has gone, and nobody needs the rest.
fn stream_events(
    name: &str,
    produce: impl FnOnce(&Out, &Spent) -> bool + Send + 'static,
) -> Source {
    let (tx, rx) = flume::unbounded();
    // Every recorded part comes back; how many wait to be filled again is
    // the producer's to bound (`spare_part`).
    let (spent_tx, spent) = flume::unbounded();
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            behind_the_ui();
            let out = Out(tx);
            if produce(&out, &spent) {
                out.send(SourceMsg::Run(RunMsg::Finished));
            }
        });
    match spawned {
        Ok(_) => Source::new(rx, None).reusing_parts(spent_tx),
        Err(e) => Source::from_messages([SourceMsg::Run(RunMsg::Failed(format!(
            "could not start the thread that makes the events: {e}"
        )))]),
    }
}

/// What the report says at `device`'s last OOM (`devices[].oom_answer`),
/// where its trace records one.
pub(super) fn oom_answer(snap: &Snapshot, device: usize) -> Option<Box<crate::leak::OomAnswer>> {
    let trace = snap.device_traces.get(device)?;
    if !trace.iter().any(|e| e.action == crate::alloc::Action::Oom) {
        return None;
    }
    let leaks = crate::leak::analyze_snapshot(snap, device, None);
    crate::leak::answer_trace_oom(snap, device, Some(&leaks)).map(Box::new)
}
