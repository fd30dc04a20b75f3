//! Decoded pickle → typed [`Snapshot`]. Knows every layout in SCHEMA.md:
//! current dict, older dict, bare segment list, legacy blocks with
//! `history`. Keys beyond the few each record needs are optional.

use std::path::Path as FsPath;

use crate::trace::pickle::{self, Document, SeqId, Value, ValueRef};

use super::error::SnapshotError;
use super::field::{Fields, Key, Path, Res};
use super::frames::{Frame, FrameId, FrameTable, FramesId};
use super::types::{
    Action, AllocatorSettings, Annotation, Block, BlockState, Layout, PoolKind, Segment,
    SettingValue, Snapshot, TraceEntry,
};

/// Marks a container not converted yet in `Importer::converted`.
const NOT_SEEN: u32 = u32::MAX;

/// A small segment is exactly 2 MiB (SCHEMA.md §3); used only when
/// `segment_type` is missing.
const SMALL_SEGMENT: u64 = 2 << 20;

/// Decode and import a snapshot pickle held in memory.
pub fn import_bytes(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    let doc = pickle::decode(bytes)?;
    Ok(import_document(&doc)?)
}

/// Read, decode and import a snapshot file; errors name the file.
pub fn import_file(path: &FsPath) -> Result<Snapshot, SnapshotError> {
    let bytes = std::fs::read(path).map_err(|source| SnapshotError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    import_bytes(&bytes).map_err(|e| SnapshotError::File {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

/// Import an already decoded document.
pub fn import_document(doc: &Document) -> Result<Snapshot, super::SchemaError> {
    let mut im = Importer {
        f: Fields::new(doc),
        frames: FrameTable::new(),
        converted: vec![NOT_SEEN; doc.container_count()],
        scratch: Vec::new(),
    };
    let root = Path::ROOT;
    let top = doc.root();
    let snap = match doc.get(top) {
        ValueRef::List(_) => Snapshot {
            segments: im.segments(top, &root)?,
            device_traces: Vec::new(),
            allocator_settings: None,
            external_annotations: Vec::new(),
            layout: Layout::LegacyList,
            frames: FrameTable::new(),
        },
        ValueRef::Dict(d) => im.dict_root(d, &root)?,
        _ => {
            return Err(root.error(format!(
                "expected a dict or a list of segments, got {}",
                doc.type_name(top)
            )))
        }
    };
    Ok(Snapshot {
        frames: im.frames,
        ..snap
    })
}

struct Importer<'d> {
    f: Fields<'d>,
    frames: FrameTable,
    /// Per pickle container: the `FramesId` of a frames list or the
    /// `FrameId` of a frame dict already converted, so a list or dict shared
    /// through the memo is walked once. Indexed directly (no hashing): this
    /// lookup runs once per frame reference.
    converted: Vec<u32>,
    scratch: Vec<FrameId>,
}

impl<'d> Importer<'d> {
    fn dict_root(&mut self, d: SeqId, path: &Path) -> Res<Snapshot> {
        let segments = self.f.req(d, Key::Segments, path)?;
        let segments = self.segments(segments, &path.key("segments"))?;
        let device_traces = match self.f.get(d, Key::DeviceTraces) {
            Some(v) => self.traces(v, &path.key("device_traces"))?,
            None => Vec::new(),
        };
        let settings_v = self.f.get(d, Key::AllocatorSettings);
        let annotations_v = self.f.get(d, Key::ExternalAnnotations);
        let layout = if settings_v.is_some() || annotations_v.is_some() {
            Layout::CurrentDict
        } else {
            Layout::OlderDict
        };
        let allocator_settings = match settings_v {
            Some(v) => Some(self.settings(v, &path.key("allocator_settings"))?),
            None => None,
        };
        let external_annotations = match annotations_v {
            Some(v) => self.annotations(v, &path.key("external_annotations"))?,
            None => Vec::new(),
        };
        Ok(Snapshot {
            segments,
            device_traces,
            allocator_settings,
            external_annotations,
            layout,
            frames: FrameTable::new(),
        })
    }

    fn segments(&mut self, v: Value, path: &Path) -> Res<Vec<Segment>> {
        let items = self.f.list(v, path)?;
        let mut out = Vec::with_capacity(items.len());
        for (i, &s) in items.iter().enumerate() {
            out.push(self.segment(s, &path.index(i))?);
        }
        Ok(out)
    }

    fn segment(&mut self, v: Value, path: &Path) -> Res<Segment> {
        let f = &self.f;
        let d = f.dict(v, path)?;
        let device = f.opt(d, Key::Device, path, Fields::int)?.unwrap_or(0);
        let address = f.field(d, Key::Address, path, Fields::uint)?;
        let total_size = f.field(d, Key::TotalSize, path, Fields::uint)?;
        let stream = f.opt(d, Key::Stream, path, Fields::uint)?.unwrap_or(0);
        let segment_type = match f.opt(d, Key::SegmentType, path, Fields::str)? {
            Some(s) => match &*s {
                "small" => PoolKind::Small,
                "large" => PoolKind::Large,
                other => {
                    return Err(path
                        .key("segment_type")
                        .error(format!("expected \"small\" or \"large\", got {other:?}")))
                }
            },
            None if total_size <= SMALL_SEGMENT => PoolKind::Small,
            None => PoolKind::Large,
        };
        let pool_id = f
            .opt(d, Key::SegmentPoolId, path, pool_id)?
            .unwrap_or((0, 0));
        let is_expandable = f
            .opt(d, Key::IsExpandable, path, Fields::bool)?
            .unwrap_or(false);
        let allocated = f.opt(d, Key::AllocatedSize, path, Fields::uint)?;
        let active = f.opt(d, Key::ActiveSize, path, Fields::uint)?;
        let requested = f.opt(d, Key::RequestedSize, path, Fields::uint)?;
        let frames = self.opt_frames(d, path)?;

        let blocks_path = path.key("blocks");
        let items = self
            .f
            .list(self.f.req(d, Key::Blocks, path)?, &blocks_path)?;
        let mut blocks = Vec::with_capacity(items.len());
        let mut next = address;
        for (i, &b) in items.iter().enumerate() {
            let block = self.block(b, next, &blocks_path.index(i))?;
            next = block.address.saturating_add(block.size);
            blocks.push(block);
        }

        // Older files may lack the sums; they follow from the blocks.
        // Saturating: sizes come from the file and must not overflow.
        let sum = |pick: fn(&Block) -> Option<u64>| {
            blocks
                .iter()
                .filter_map(pick)
                .fold(0u64, u64::saturating_add)
        };
        Ok(Segment {
            device,
            address,
            total_size,
            allocated_size: allocated.unwrap_or_else(|| {
                sum(|b| (b.state == BlockState::ActiveAllocated).then_some(b.size))
            }),
            active_size: active.unwrap_or_else(|| sum(|b| b.state.is_active().then_some(b.size))),
            requested_size: requested
                .unwrap_or_else(|| sum(|b| b.state.is_active().then_some(b.requested_size))),
            stream,
            segment_type,
            pool_id,
            is_expandable,
            frames,
            blocks,
        })
    }

    /// `computed` is the address the block must have if blocks are
    /// contiguous: used for legacy blocks, which have no `address`.
    fn block(&mut self, v: Value, computed: u64, path: &Path) -> Res<Block> {
        let f = &self.f;
        let d = f.dict(v, path)?;
        let size = f.field(d, Key::Size, path, Fields::uint)?;
        let state = f.field(d, Key::State, path, block_state)?;
        let address = f
            .opt(d, Key::Address, path, Fields::uint)?
            .unwrap_or(computed);
        let requested = f.opt(d, Key::RequestedSize, path, Fields::uint)?;
        let mut frames = if f.get(d, Key::Frames).is_some() {
            Some(self.opt_frames(d, path)?)
        } else {
            None
        };

        // Legacy (torch 2.0) blocks: the first history entry stands for
        // the block, as in MemoryViz.
        let mut history_requested = None;
        if let Some(h) = self.f.get(d, Key::History) {
            let hpath = path.key("history");
            let items = self.f.list(h, &hpath)?;
            if let Some(&first) = items.first() {
                let p0 = hpath.index(0);
                let hd = self.f.dict(first, &p0)?;
                history_requested = self.f.opt(hd, Key::RealSize, &p0, Fields::uint)?;
                if frames.is_none() {
                    frames = Some(self.opt_frames(hd, &p0)?);
                }
            }
        }
        Ok(Block {
            address,
            size,
            requested_size: requested.or(history_requested).unwrap_or(size),
            state,
            frames: frames.unwrap_or(FramesId::EMPTY),
        })
    }

    fn traces(&mut self, v: Value, path: &Path) -> Res<Vec<Vec<TraceEntry>>> {
        let devices = self.f.list(v, path)?;
        let mut out = Vec::with_capacity(devices.len());
        for (dev, &t) in devices.iter().enumerate() {
            let dpath = path.index(dev);
            let entries = self.f.list(t, &dpath)?;
            let mut trace = Vec::with_capacity(entries.len());
            for (i, &e) in entries.iter().enumerate() {
                trace.push(self.entry(e, &dpath.index(i))?);
            }
            out.push(trace);
        }
        Ok(out)
    }

    fn entry(&mut self, v: Value, path: &Path) -> Res<TraceEntry> {
        let f = &self.f;
        let d = f.dict(v, path)?;
        let action = Action::parse(&f.field(d, Key::Action, path, Fields::str)?);
        // `oom` has `device_free` instead of `addr`; `annotate` (2.15) has
        // no `size`.
        let addr = match action {
            Action::Oom => f.opt(d, Key::Addr, path, Fields::uint)?.unwrap_or(0),
            _ => f.field(d, Key::Addr, path, Fields::uint)?,
        };
        let size = match action {
            Action::Annotate => f.opt(d, Key::Size, path, Fields::uint)?.unwrap_or(0),
            _ => f.field(d, Key::Size, path, Fields::uint)?,
        };
        let stream = f.opt(d, Key::Stream, path, Fields::uint)?.unwrap_or(0);
        let device_free = f.opt(d, Key::DeviceFree, path, Fields::uint)?;
        let time_us = f.opt(d, Key::TimeUs, path, Fields::int)?;
        let compile_context = f.opt(d, Key::CompileContext, path, Fields::str)?;
        let user_metadata = f.opt(d, Key::UserMetadata, path, Fields::str)?;
        let frames = self.opt_frames(d, path)?;
        Ok(TraceEntry {
            action,
            addr,
            size,
            stream,
            device_free,
            time_us,
            frames,
            compile_context,
            user_metadata,
        })
    }

    fn settings(&mut self, v: Value, path: &Path) -> Res<AllocatorSettings> {
        let f = &self.f;
        let d = f.dict(v, path)?;
        let mut s = AllocatorSettings {
            conf: String::new(),
            max_split_size: -1,
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            roundup_power2_divisions: Vec::new(),
            other: Vec::new(),
        };
        for (k, val) in f.doc.pairs(d) {
            let key = f.str(k, &path.key("<key>"))?;
            match &*key {
                "PYTORCH_CUDA_ALLOC_CONF" => {
                    s.conf = f
                        .str(val, &path.key("PYTORCH_CUDA_ALLOC_CONF"))?
                        .to_string()
                }
                "max_split_size" => s.max_split_size = f.int(val, &path.key("max_split_size"))?,
                "garbage_collection_threshold" => {
                    s.garbage_collection_threshold =
                        f.float(val, &path.key("garbage_collection_threshold"))?
                }
                "expandable_segments" => {
                    s.expandable_segments = f.bool(val, &path.key("expandable_segments"))?
                }
                "roundup_power2_divisions" => {
                    s.roundup_power2_divisions =
                        roundup(f, val, &path.key("roundup_power2_divisions"))?
                }
                _ => s.other.push((key.clone(), setting_value(f, val))),
            }
        }
        Ok(s)
    }

    fn annotations(&mut self, v: Value, path: &Path) -> Res<Vec<Annotation>> {
        let f = &self.f;
        let items = f.list(v, path)?;
        let mut out = Vec::with_capacity(items.len());
        for (i, &a) in items.iter().enumerate() {
            let p = path.index(i);
            let d = f.dict(a, &p)?;
            out.push(Annotation {
                stage: f.field(d, Key::Stage, &p, Fields::str)?,
                name: f.field(d, Key::Name, &p, Fields::str)?,
                device: f.opt(d, Key::Device, &p, Fields::int)?.unwrap_or(0),
                time_us: f.opt(d, Key::TimeUs, &p, Fields::int)?.unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// `d["frames"]` as an interned stack; empty when absent.
    fn opt_frames(&mut self, d: SeqId, path: &Path) -> Res<FramesId> {
        match self.f.get(d, Key::Frames) {
            Some(v) => self.stack(v, &path.key("frames")),
            None => Ok(FramesId::EMPTY),
        }
    }

    fn stack(&mut self, v: Value, path: &Path) -> Res<FramesId> {
        let list = self.f.list_id(v, path)?;
        if let Some(&id) = self.converted.get(list.0 as usize) {
            if id != NOT_SEEN {
                return Ok(FramesId(id));
            }
        }
        let items = self.f.doc.items(list);
        let mut ids = std::mem::take(&mut self.scratch);
        ids.clear();
        for (i, &fv) in items.iter().enumerate() {
            match self.frame(fv, &path.index(i)) {
                Ok(id) => ids.push(id),
                Err(e) => {
                    self.scratch = ids;
                    return Err(e);
                }
            }
        }
        let id = self.frames.intern_stack(&ids);
        self.scratch = ids;
        self.remember(list, id.0);
        Ok(id)
    }

    fn frame(&mut self, v: Value, path: &Path) -> Res<FrameId> {
        let f = &self.f;
        let d = f.dict(v, path)?;
        if let Some(&id) = self.converted.get(d.0 as usize) {
            if id != NOT_SEEN {
                return Ok(FrameId(id));
            }
        }
        let frame = Frame {
            filename: f.field(d, Key::Filename, path, Fields::str)?,
            line: f.opt(d, Key::Line, path, Fields::int)?.unwrap_or(0),
            name: f.field(d, Key::Name, path, Fields::str)?,
        };
        let id = self.frames.intern_frame(frame);
        self.remember(d, id.0);
        Ok(id)
    }

    fn remember(&mut self, container: SeqId, id: u32) {
        if let Some(slot) = self.converted.get_mut(container.0 as usize) {
            *slot = id;
        }
    }
}

fn block_state(f: &Fields, v: Value, path: &Path) -> Res<BlockState> {
    let s = f.str(v, path)?;
    match &*s {
        "active_allocated" => Ok(BlockState::ActiveAllocated),
        "active_pending_free" | "active_awaiting_free" => Ok(BlockState::ActivePendingFree),
        "inactive" => Ok(BlockState::Inactive),
        other => Err(path.error(format!("unknown block state {other:?}"))),
    }
}

fn pool_id(f: &Fields, v: Value, path: &Path) -> Res<(i64, i64)> {
    match f.sequence(v, path)? {
        &[a, b] => Ok((f.int(a, &path.index(0))?, f.int(b, &path.index(1))?)),
        other => Err(path.error(format!("expected a pair, got {} items", other.len()))),
    }
}

/// `{"1": 0, "2": 0, ..., "32768": 0}` → `[(1, 0), (2, 0), ...]`.
fn roundup(f: &Fields, v: Value, path: &Path) -> Res<Vec<(u64, u64)>> {
    let d = f.dict(v, path)?;
    let mut out = Vec::new();
    for (k, val) in f.doc.pairs(d) {
        let key = match f.doc.get(k) {
            ValueRef::Str(s) => s.trim().parse::<u64>().ok(),
            ValueRef::Int(i) => u64::try_from(i).ok(),
            _ => None,
        };
        let Some(key) = key else {
            return Err(path.error(format!("expected a numeric key, got {}", f.repr(k))));
        };
        out.push((key, f.uint(val, &path.key("<value>"))?));
    }
    Ok(out)
}

fn setting_value(f: &Fields, v: Value) -> SettingValue {
    match f.doc.get(v) {
        ValueRef::None => SettingValue::None,
        ValueRef::Bool(b) => SettingValue::Bool(b),
        ValueRef::Int(i) => SettingValue::Int(i),
        ValueRef::Float(x) => SettingValue::Float(x),
        ValueRef::Str(s) => SettingValue::Str(s.clone()),
        _ => SettingValue::Text(f.repr(v)),
    }
}
