//! A snapshot of our own run (a scenario, or a what-if replay) in PyTorch's
//! layout, so `export` writes something PyTorch's viewer loads.

use std::rc::Rc;

use crate::alloc::{Action, AllocConfig, AllocEvent, SegmentInfo, Tag};

use super::types::{
    AllocatorSettings, Block, EntryExtra, EntryExtras, Layout, PoolKind, Segment, Snapshot,
    TraceEntry,
};
use super::{Frame, FrameTable, FramesId};

/// Turns a device's tag into a stack, innermost frame first: `(filename, line, name)`.
pub type FramesOf<'a> = &'a dyn Fn(usize, Tag) -> Vec<(String, i64, String)>;

/// One device's end state and trace.
pub struct DeviceRun<'a> {
    pub device: usize,
    pub segments: &'a [SegmentInfo],
    pub events: &'a [AllocEvent],
}

pub fn snapshot_of_run(
    devices: &[DeviceRun<'_>],
    config: &AllocConfig,
    frames_of: FramesOf<'_>,
) -> Snapshot {
    let mut frames = FrameTable::new();
    let mut stack = |device: usize, tag: Tag| -> FramesId {
        if tag == Tag::NONE {
            return FramesId::EMPTY;
        }
        let ids: Vec<_> = frames_of(device, tag)
            .into_iter()
            .map(|(file, line, name)| {
                frames.intern_frame(Frame {
                    filename: Rc::from(file.as_str()),
                    line,
                    name: Rc::from(name.as_str()),
                })
            })
            .collect();
        frames.intern_stack(&ids)
    };
    let mut segments = Vec::new();
    let mut device_traces = Vec::new();
    let mut entry_extras = EntryExtras::new();
    for run in devices {
        let device = run.device;
        while device_traces.len() < device {
            device_traces.push(Vec::new());
        }
        for s in run.segments {
            segments.push(Segment {
                device: device as i64,
                address: s.address,
                total_size: s.total_size,
                allocated_size: s.allocated_size,
                active_size: s.active_size,
                requested_size: s.requested_size,
                stream: s.stream,
                segment_type: match s.pool {
                    crate::alloc::Pool::Small => PoolKind::Small,
                    crate::alloc::Pool::Large => PoolKind::Large,
                },
                pool_id: (0, 0),
                is_expandable: s.is_expandable,
                frames: stack(device, s.tag),
                blocks: s
                    .blocks
                    .iter()
                    .map(|b| Block {
                        address: b.address,
                        size: b.size,
                        requested_size: b.requested_size,
                        state: b.state,
                        frames: stack(device, b.tag),
                    })
                    .collect(),
            });
        }
        let trace = run
            .events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let mut entry =
                    TraceEntry::new(e.action, e.addr, e.size, e.stream, stack(device, e.tag))
                        // A simulated clock: one microsecond per entry.
                        .with_time_us(Some(i as i64));
                if e.action == Action::Oom {
                    let row = EntryExtra {
                        device_free: Some(e.device_free),
                        ..EntryExtra::default()
                    };
                    if let Some(id) = entry_extras.intern(row) {
                        entry = entry.with_extra(id);
                    }
                }
                entry
            })
            .collect();
        device_traces.push(trace);
    }
    Snapshot {
        segments,
        device_traces,
        allocator_settings: Some(AllocatorSettings::of(config)),
        external_annotations: Vec::new(),
        layout: Layout::CurrentDict,
        frames,
        entry_extras,
    }
}

impl AllocatorSettings {
    /// The settings a snapshot of a run under `config` records.
    pub fn of(config: &AllocConfig) -> AllocatorSettings {
        AllocatorSettings {
            conf: config.raw.clone(),
            max_split_size: config.max_split_size_stat(),
            garbage_collection_threshold: config.garbage_collection_threshold,
            expandable_segments: config.expandable_segments,
            roundup_power2_divisions: (0..16)
                .map(|i| (1u64 << i, config.roundup_power2_divisions[i]))
                .collect(),
            other: Vec::new(),
        }
    }
}
