//! A PyTorch snapshot as a [`Source`]: its recorded trace mirrored into
//! events (`trace::mirror`), or its requests replayed under another
//! `PYTORCH_CUDA_ALLOC_CONF` (`trace::replay::whatif`), whose allocator's own
//! events are what the views show. Either way a worker thread makes the
//! events and sends them in chunks, so a large trace opens at once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::alloc::constants::LARGE_BUFFER;
use crate::alloc::{AllocConfig, Tag};
use crate::trace::mirror::{final_map, start_map, TraceMirror};
use crate::trace::replay::from_snapshot::{self, DeviceReplay};
use crate::trace::replay::reconstruct;
use crate::trace::replay::replayed::device_capacity;
use crate::trace::replay::whatif::{self, Requests};
use crate::trace::replay::{tag_entry, Entry};
use crate::trace::snapshot::{import_file, FrameTable, FramesId, Snapshot, SnapshotError};
use crate::trace::{Event, MemoryMap};

use super::source::{Source, SourceMsg, TagDescription, TagInfo};
use crate::units::escape_line;

/// Frames shown per block in the detail pane.
const MAX_FRAMES: usize = 12;

/// Events per message while a trace is rebuilt in the background: the UI
/// opens on the first ones while the rest are still being placed (a 1 GB
/// trace takes seconds to rebuild).
const EVENTS_PER_MESSAGE: usize = 1 << 16;

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

/// Open `path` and turn the trace of `device` (the first device it holds
/// when `None`) into a source, which can reopen the file on another device.
pub fn snapshot_source(path: &Path, device: Option<usize>) -> Result<Source, ImportError> {
    let snap = import_file(path)?;
    let mut source = snapshot_to_source(&snap, device)?;
    if let Some(d) = source.devices.as_mut() {
        d.path = Some(path.to_path_buf());
    }
    Ok(source)
}

/// The devices a snapshot holds, which one a view shows, and where its
/// trace has OOMs: what a view needs to switch devices.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotDevices {
    /// The file, to reopen on another device (None: not reopenable).
    pub path: Option<PathBuf>,
    pub devices: Vec<usize>,
    pub current: usize,
    /// Devices whose trace records an OOM.
    pub with_oom: Vec<usize>,
    /// The config a what-if view replays the requests under.
    pub under: Option<AllocConfig>,
}

impl SnapshotDevices {
    /// The device `step` places from the current one, wrapping around.
    pub fn step(&self, step: isize) -> Option<usize> {
        let n = self.devices.len() as isize;
        let at = self.devices.iter().position(|d| *d == self.current)? as isize;
        (n > 1).then(|| self.devices[(at + step).rem_euclid(n) as usize])
    }

    /// The next device after the current one (wrapping) whose trace has an OOM.
    pub fn next_with_oom(&self) -> Option<usize> {
        let after = self
            .with_oom
            .iter()
            .find(|d| **d > self.current)
            .or_else(|| self.with_oom.first())?;
        (*after != self.current).then_some(*after)
    }

    /// `device 1 of 3`.
    pub fn label(&self) -> String {
        let at = self
            .devices
            .iter()
            .position(|d| *d == self.current)
            .map_or(0, |i| i + 1);
        if self.devices.len() > 1 {
            format!("device {} ({at} of {})", self.current, self.devices.len())
        } else {
            format!("device {}", self.current)
        }
    }
}

fn devices_with_oom(snap: &Snapshot) -> Vec<usize> {
    (0..snap.device_traces.len())
        .filter(|d| {
            snap.device_traces[*d]
                .iter()
                .any(|e| e.action == crate::alloc::Action::Oom)
        })
        .collect()
}

/// The devices a snapshot holds memory or a trace for, in order.
pub fn snapshot_devices(snap: &Snapshot) -> Vec<usize> {
    let mut devices: Vec<usize> = from_snapshot::traced_devices(snap);
    devices.extend(
        snap.segments
            .iter()
            .filter_map(|s| usize::try_from(s.device).ok()),
    );
    devices.sort_unstable();
    devices.dedup();
    devices
}

/// The device a source shows: `device`, else the first the snapshot holds.
fn pick_device(snap: &Snapshot, device: Option<usize>) -> Result<usize, ImportError> {
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

/// The frames of every trace entry of `device`, for tags from `entry_tag`.
fn entry_tags(snap: &Snapshot, device: usize) -> Arc<SnapshotTags> {
    let trace = snap
        .device_traces
        .get(device)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let entry_frames = trace.iter().map(|e| e.frames).collect();
    Arc::new(SnapshotTags::new(&snap.frames, entry_frames))
}

pub fn snapshot_to_source(snap: &Snapshot, device: Option<usize>) -> Result<Source, ImportError> {
    let device = pick_device(snap, device)?;
    let entries = from_snapshot::entries(snap, device);
    let capacity = from_snapshot::infer_device_total(&entries, LARGE_BUFFER);
    let config = from_snapshot::config(snap);
    let mut source = if entries.is_empty() {
        // State-only file: the map is the recorded final state.
        Source::from_messages([
            SourceMsg::Start(Box::new(final_map(snap, device))),
            SourceMsg::Finished,
        ])
    } else {
        // Only `oom` entries record it: a short list, searched by entry index.
        let device_free: Vec<(usize, u64)> = snap.device_traces[device]
            .iter()
            .enumerate()
            .filter_map(|(i, e)| snap.extra(e).device_free.map(|f| (i, f)))
            .collect();
        let finals = from_snapshot::final_segments(snap, device);
        let start = start_map(&reconstruct::initial_state(&entries, &finals, &config));
        stream_events("vramscope-snapshot-events", move |send| {
            mirror_events(start, &entries, &device_free, &config, send)
        })
    };
    source = source.with_tags(entry_tags(snap, device));
    source.capacity = capacity;
    source.devices = Some(SnapshotDevices {
        path: None,
        devices: snapshot_devices(snap),
        current: device,
        with_oom: devices_with_oom(snap),
        under: None,
    });
    Ok(source)
}

/// The state the trace began in, then the recorded entries as events, a
/// chunk at a time; false once the UI has gone.
fn mirror_events(
    start: MemoryMap,
    entries: &[Entry],
    device_free: &[(usize, u64)],
    config: &AllocConfig,
    send: &mut dyn FnMut(SourceMsg) -> bool,
) -> bool {
    let free_at = |i: usize| {
        device_free
            .binary_search_by_key(&i, |(at, _)| *at)
            .ok()
            .map(|k| device_free[k].1)
    };
    if !start.segments.is_empty() && !send(SourceMsg::Start(Box::new(start.clone()))) {
        return false;
    }
    let mut mirror = TraceMirror::starting_from(start, config);
    for (k, chunk) in entries.chunks(EVENTS_PER_MESSAGE).enumerate() {
        let first = k * EVENTS_PER_MESSAGE;
        let mut events = Vec::with_capacity(chunk.len());
        events.extend(
            chunk
                .iter()
                .enumerate()
                .filter_map(|(j, e)| mirror.event(first + j, e, free_at(first + j))),
        );
        if !send(SourceMsg::Events(events)) {
            return false;
        }
    }
    true
}

/// `device`'s requests of `snap` replayed under `config`: the what-if
/// allocator's own events (its blocks, its segments), from the state the
/// trace started in (an open trace's rebuilt start), on the device size the
/// trace tells or else the recorded run's peak.
pub fn what_if_source(
    snap: &Snapshot,
    device: Option<usize>,
    config: AllocConfig,
) -> Result<Source, ImportError> {
    let device = pick_device(snap, device)?;
    let Some(replay) = from_snapshot::verify_device(snap, device, None) else {
        // Nothing was traced: no request to replay, the recorded state stands.
        return snapshot_to_source(snap, Some(device));
    };
    let capacity = device_capacity(&replay, None);
    let devices = SnapshotDevices {
        path: None,
        devices: snapshot_devices(snap),
        current: device,
        with_oom: devices_with_oom(snap),
        under: Some(config.clone()),
    };
    let mut source = stream_events("vramscope-what-if", move |send| {
        replayed_events(&replay, config, capacity, send)
    });
    source = source.with_tags(entry_tags(snap, device));
    source.capacity = Some(capacity);
    source.devices = Some(devices);
    Ok(source)
}

/// The same view of the same file on `device`: the recorded trace, or the
/// what-if replay under the same config.
pub fn reopen_on(d: &SnapshotDevices, device: usize) -> Result<Source, String> {
    let path = d
        .path
        .as_ref()
        .ok_or("this view cannot reopen its snapshot on another device")?;
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let mut source = match &d.under {
        None => snapshot_source(path, Some(device)).map_err(|e| at(&e))?,
        Some(config) => {
            let snap = import_file(path).map_err(|e| at(&e))?;
            what_if_source(&snap, Some(device), config.clone()).map_err(|e| at(&e))?
        }
    };
    if let Some(new) = source.devices.as_mut() {
        new.path = Some(path.clone());
    }
    Ok(source)
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
        && !send(SourceMsg::Start(Box::new(MemoryMap::from_segments(
            &run.start,
        ))))
    {
        return false;
    }
    let events = run.allocator.take_events();
    events.chunks(EVENTS_PER_MESSAGE).all(|chunk| {
        send(SourceMsg::Events(
            chunk.iter().copied().map(Event::Alloc).collect(),
        ))
    })
}

/// A source fed by `produce` on a worker thread of its own, then
/// `Finished`. The snapshot itself stays on the caller's thread (its strings
/// are not `Send`); `produce` gets only plain data. Its `send` returns false
/// once the UI has gone, and nobody needs the rest.
fn stream_events(
    name: &str,
    produce: impl FnOnce(&mut dyn FnMut(SourceMsg) -> bool) -> bool + Send + 'static,
) -> Source {
    let (tx, rx) = flume::unbounded();
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let mut send = |m: SourceMsg| tx.send(m).is_ok();
            if produce(&mut send) {
                send(SourceMsg::Finished);
            }
        });
    match spawned {
        Ok(_) => Source::new(rx, None),
        Err(e) => Source::from_messages([SourceMsg::Failed(format!(
            "could not start the thread that makes the events: {e}"
        ))]),
    }
}

/// Frames of the trace entry behind each tag, resolved to text up front
/// (the snapshot's strings are not shareable across threads).
struct SnapshotTags {
    /// Per distinct stack: the first user frame's name, and the frames.
    stacks: HashMap<FramesId, (Option<String>, Vec<String>)>,
    entry_frames: Vec<FramesId>,
}

impl SnapshotTags {
    fn new(table: &FrameTable, entry_frames: Vec<FramesId>) -> SnapshotTags {
        let mut stacks = HashMap::new();
        for id in &entry_frames {
            stacks.entry(*id).or_insert_with(|| {
                let frames = table
                    .resolve(*id)
                    .take(MAX_FRAMES)
                    .map(|f| escape_line(&format!("{}:{} {}", f.filename, f.line, f.name)).into())
                    .collect();
                (
                    table
                        .first_user_frame(*id)
                        .map(|f| escape_line(&f.name).into_owned()),
                    frames,
                )
            });
        }
        SnapshotTags {
            stacks,
            entry_frames,
        }
    }
}

impl TagInfo for SnapshotTags {
    fn describe(&self, tag: Tag) -> Option<TagDescription> {
        let id = self.entry_frames.get(tag_entry(tag)?)?;
        let (op, frames) = self.stacks.get(id)?;
        Some(TagDescription {
            op: op.clone(),
            frames: frames.clone(),
            ..TagDescription::default()
        })
    }
}
