//! [`Snapshot`] → pickle protocol 4 in the current dict layout, with the
//! keys and key order PyTorch 2.9+ writes. Strings, frame dicts and frames
//! lists are memoised once and referenced with `BINGET`, as PyTorch's files
//! do, so exports stay about the size of the originals.
//!
//! A record equal to one written shortly before (a trace entry or block a
//! crafted file refers to millions of times) is referenced too, so the
//! output stays proportional to the input's distinct content.
//!
//! Legacy inputs come out modernised: blocks get `address` and `frames`
//! instead of `history`, segments get all 12 keys. `allocator_settings` is
//! written only when the snapshot has it, so a re-import keeps `None`.

use std::hash::{BuildHasher, Hash};

use rustc_hash::{FxBuildHasher, FxHashMap};

use super::dict_keys::{self, SegmentHeader};
use crate::trace::pickle::PickleWriter;

use super::frames::{FrameId, FramesId};
use super::types::{
    Action, AllocatorSettings, Annotation, Block, Segment, SettingValue, Snapshot, TraceEntry,
};

/// Serialise `snap` as a `_dump_snapshot`-style pickle.
pub fn export_bytes(snap: &Snapshot) -> Vec<u8> {
    let mut ex = Exporter {
        w: PickleWriter::new(),
        snap,
        stacks: FxHashMap::default(),
        frames: FxHashMap::default(),
        entries: RecentRecords::new(),
        blocks: RecentRecords::new(),
    };
    ex.root();
    ex.w.finish()
}

struct Exporter<'s> {
    w: PickleWriter,
    snap: &'s Snapshot,
    /// Memo index of each stack's list already written.
    stacks: FxHashMap<FramesId, u32>,
    /// Memo index of each frame dict already written.
    frames: FxHashMap<FrameId, u32>,
    entries: RecentRecords<TraceEntry>,
    blocks: RecentRecords<Block>,
}

/// Memo indices of records written recently, in a fixed table (a record
/// seen again while still in it is referenced, not written again): bounded
/// memory, whatever the file's size.
struct RecentRecords<T> {
    slots: Vec<Option<(T, u32)>>,
}

impl<T: Hash + Eq + Clone> RecentRecords<T> {
    const SLOTS: usize = 4096;

    fn new() -> Self {
        RecentRecords {
            slots: vec![None; Self::SLOTS],
        }
    }

    fn slot(r: &T) -> usize {
        FxBuildHasher.hash_one(r) as usize % Self::SLOTS
    }

    fn get(&self, r: &T) -> Option<u32> {
        match &self.slots[Self::slot(r)] {
            Some((seen, memo)) if seen == r => Some(*memo),
            _ => None,
        }
    }

    fn put(&mut self, r: &T, memo: u32) {
        self.slots[Self::slot(r)] = Some((r.clone(), memo));
    }
}

impl Exporter<'_> {
    /// `EMPTY_DICT MEMOIZE MARK <body> SETITEMS`; returns the dict's memo index.
    fn dict(&mut self, body: impl FnOnce(&mut Self)) -> u32 {
        self.w.empty_dict();
        let memo = self.w.memoize();
        self.w.mark();
        body(self);
        self.w.setitems();
        memo
    }

    fn root(&mut self) {
        let snap = self.snap;
        self.dict(|ex| {
            ex.w.str("segments");
            ex.list(&snap.segments, Self::segment);
            ex.w.str("device_traces");
            ex.list(&snap.device_traces, |ex, trace| ex.list(trace, Self::entry));
            if let Some(s) = &snap.allocator_settings {
                ex.w.str("allocator_settings");
                ex.settings(s);
            }
            ex.w.str("external_annotations");
            ex.list(&snap.external_annotations, Self::annotation);
        });
    }

    /// A list written through the writer, with the exporter available to
    /// the item callback.
    fn list<T>(&mut self, items: &[T], mut item: impl FnMut(&mut Self, &T)) {
        self.w.empty_list();
        self.w.memoize();
        for chunk in items.chunks(crate::trace::pickle::BATCH) {
            self.w.mark();
            for x in chunk {
                item(self, x);
            }
            self.w.appends();
        }
    }

    fn segment(&mut self, s: &Segment) {
        self.dict(|ex| {
            let header = SegmentHeader {
                device: s.device,
                address: s.address,
                total_size: s.total_size,
                allocated_size: s.allocated_size,
                active_size: s.active_size,
                requested_size: s.requested_size,
                stream: s.stream,
                segment_type: s.segment_type.as_str(),
                pool_id: s.pool_id,
                is_expandable: s.is_expandable,
            };
            dict_keys::segment(&mut ex.w, &header);
            ex.w.str("frames");
            ex.stack(s.frames);
            ex.w.str("blocks");
            ex.list(&s.blocks, Self::block);
        });
    }

    fn block(&mut self, b: &Block) {
        if let Some(memo) = self.blocks.get(b) {
            self.w.get(memo);
            return;
        }
        let memo = self.dict(|ex| {
            dict_keys::block(
                &mut ex.w,
                b.address,
                b.size,
                b.requested_size,
                b.state.as_str(),
            );
            ex.w.str("frames");
            ex.stack(b.frames);
        });
        self.blocks.put(b, memo);
    }

    fn entry(&mut self, e: &TraceEntry) {
        if let Some(memo) = self.entries.get(e) {
            self.w.get(memo);
            return;
        }
        let snap = self.snap;
        let extra = snap.extra(e);
        let memo = self.dict(|ex| {
            let w = &mut ex.w;
            w.str("action");
            w.str(snap.action_name(e));
            // PyTorch writes `device_free` in place of `addr` for an oom.
            if e.action != Action::Oom {
                w.str("addr");
                w.uint(e.addr);
            }
            if let Some(free) = extra.device_free {
                w.str("device_free");
                w.uint(free);
            }
            w.str("size");
            w.uint(e.size);
            w.str("stream");
            w.uint(e.stream);
            if let Some(t) = e.time_us() {
                w.str("time_us");
                w.int(t);
            }
            if let Some(c) = &extra.compile_context {
                w.str("compile_context");
                w.str(c);
            }
            if let Some(m) = &extra.user_metadata {
                w.str("user_metadata");
                w.str(m);
            }
            // `snapshot` markers carry no stack in PyTorch's files.
            if e.action != Action::Snapshot || e.frames != FramesId::EMPTY {
                w.str("frames");
                ex.stack(e.frames);
            }
        });
        self.entries.put(e, memo);
    }

    fn settings(&mut self, s: &AllocatorSettings) {
        self.dict(|ex| {
            let w = &mut ex.w;
            w.str("PYTORCH_CUDA_ALLOC_CONF");
            w.str(&s.conf);
            w.str("max_split_size");
            w.int(s.max_split_size);
            w.str("garbage_collection_threshold");
            w.float(s.garbage_collection_threshold);
            w.str("expandable_segments");
            w.bool(s.expandable_segments);
            for (k, v) in &s.other {
                w.str(k);
                match v {
                    SettingValue::None => w.none(),
                    SettingValue::Bool(b) => w.bool(*b),
                    SettingValue::Int(i) => w.int(*i),
                    SettingValue::Float(f) => w.float(*f),
                    SettingValue::Str(x) => w.str(x),
                    SettingValue::Text(x) => w.str(x),
                }
            }
            w.str("roundup_power2_divisions");
            ex.dict(|ex| {
                for &(interval, divisions) in &s.roundup_power2_divisions {
                    ex.w.str(&interval.to_string());
                    ex.w.uint(divisions);
                }
            });
        });
    }

    fn annotation(&mut self, a: &Annotation) {
        self.dict(|ex| {
            let w = &mut ex.w;
            w.str("stage");
            w.str(&a.stage);
            w.str("name");
            w.str(&a.name);
            w.str("device");
            w.int(a.device);
            w.str("time_us");
            w.int(a.time_us);
        });
    }

    /// A frames list: written once, then `BINGET` for every other use.
    fn stack(&mut self, id: FramesId) {
        if let Some(&memo) = self.stacks.get(&id) {
            self.w.get(memo);
            return;
        }
        let table = &self.snap.frames;
        let ids = table.stack(id);
        self.w.empty_list();
        let memo = self.w.memoize();
        for chunk in ids.chunks(crate::trace::pickle::BATCH) {
            self.w.mark();
            for &f in chunk {
                self.frame(f);
            }
            self.w.appends();
        }
        self.stacks.insert(id, memo);
    }

    fn frame(&mut self, id: FrameId) {
        if let Some(&memo) = self.frames.get(&id) {
            self.w.get(memo);
            return;
        }
        let Some(frame) = self.snap.frames.frame(id) else {
            self.w.none();
            return;
        };
        self.w.empty_dict();
        let memo = self.w.memoize();
        self.w.mark();
        self.w.str("filename");
        self.w.str(&frame.filename);
        self.w.str("name");
        self.w.str(&frame.name);
        self.w.str("line");
        self.w.int(frame.line);
        self.w.setitems();
        self.frames.insert(id, memo);
    }
}
