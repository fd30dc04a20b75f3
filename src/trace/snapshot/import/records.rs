//! Typed records from decoded dicts: segments, blocks, trace entries and
//! frames, each with the path of a bad field (their small values: `values`).

use crate::units::quote_excerpt;
use rustc_hash::FxHashMap;

use crate::trace::pickle::{Document, SeqId, SharedStr, Value, ValueRef};

use super::super::field::{Fields, Key, Path, Res};
use super::super::frames::{Frame, FrameId, FrameTable, FramesId};
use super::super::types::{
    Action, Block, BlockState, EntryExtra, EntryExtras, ExtraId, Layout, PoolKind, Segment,
    Snapshot, TraceEntry,
};
use super::values::{annotations, block_state, pool_id, settings, user_defined_annotations};
use super::{Claimed, NOT_SEEN, SMALL_SEGMENT};

pub(super) struct Importer {
    frames: FrameTable,
    /// Per pickle container: the `FramesId` of a frames list or the
    /// `FrameId` of a frame dict already converted, so a list or dict shared
    /// through the memo is walked once. Indexed directly (no hashing): this
    /// lookup runs once per frame reference.
    pub(super) converted: Vec<u32>,
    scratch: Vec<FrameId>,
    extras: EntryExtras,
    /// `(action text, compile_context, user_metadata)` handles → row, for
    /// entries without `device_free` (strings are interned, so equal text is
    /// an equal handle).
    extra_cache: FxHashMap<[u32; 3], ExtraId>,
    last_extra: Option<([u32; 3], ExtraId)>,
    /// Per string index: the action it spells, once parsed (one byte each).
    actions: Vec<Option<Action>>,
    /// Streaming: record the containers converted for good in `consumed`.
    pub(super) track: bool,
    pub(super) consumed: Vec<SeqId>,
    /// Streaming: the lists converted while decoding.
    pub(super) claims: FxHashMap<u32, Claimed>,
    /// Trace entries and blocks converted so far, and how many the file may
    /// hold ([`record_budget`]).
    records: u64,
    budget: u64,
    /// Streaming: the list a tap took (its entries are not here).
    pub(super) tapped_list: Option<u32>,
    /// The pickle refers to the tapped list a second time.
    tapped_reused: bool,
}

/// Trace entries and blocks a file of `bytes` may hold. PyTorch writes each
/// as a record of its own, at least ~70 bytes (95 in the real files, 74 in a
/// 1 GB synthetic trace); a pickle can instead refer to one record millions
/// of times, 2 bytes each, and would fill memory. Every such file is refused.
pub(crate) fn record_budget(bytes: usize) -> u64 {
    const MIN_RECORD_BYTES: u64 = 16;
    const FLOOR: u64 = 1_000_000;
    (bytes as u64 / MIN_RECORD_BYTES).max(FLOOR)
}

/// The handle of an absent optional string in `extra_cache` keys (no
/// value has it: misc kind 7 is unused).
const ABSENT: u32 = u32::MAX;

impl Importer {
    pub(super) fn new(containers: usize, track: bool, budget: u64) -> Self {
        Self {
            records: 0,
            budget,
            frames: FrameTable::new(),
            converted: vec![NOT_SEEN; containers],
            scratch: Vec::new(),
            extras: EntryExtras::new(),
            extra_cache: FxHashMap::default(),
            last_extra: None,
            actions: Vec::new(),
            track,
            consumed: Vec::new(),
            claims: FxHashMap::default(),
            tapped_list: None,
            tapped_reused: false,
        }
    }

    /// The stacks converted so far.
    pub(super) fn frames(&self) -> &FrameTable {
        &self.frames
    }

    /// The entries' rare fields converted so far.
    pub(super) fn extras(&self) -> &EntryExtras {
        &self.extras
    }

    /// [`Importer::run`], and whether the pickle refers to the tapped list
    /// more than once.
    pub(super) fn run_tapped(self, doc: &Document) -> Res<(Snapshot, bool)> {
        self.run_inner(doc)
    }

    pub(super) fn run(self, doc: &Document) -> Res<Snapshot> {
        self.run_inner(doc).map(|(s, _)| s)
    }

    fn run_inner(mut self, doc: &Document) -> Res<(Snapshot, bool)> {
        let f = Fields::new(doc);
        let root = Path::ROOT;
        let top = doc.root();
        let snap = match doc.get(top) {
            ValueRef::List(_) => Snapshot {
                segments: self.segments(&f, top, &root)?,
                device_traces: Vec::new(),
                allocator_settings: None,
                external_annotations: Vec::new(),
                layout: Layout::LegacyList,
                frames: FrameTable::new(),
                entry_extras: EntryExtras::new(),
            },
            ValueRef::Dict(d) => self.dict_root(&f, d, &root)?,
            _ => {
                return Err(root.error(format!(
                    "expected a dict or a list of segments, got {}",
                    doc.type_name(top)
                )))
            }
        };
        let mut snap = Snapshot {
            frames: self.frames,
            entry_extras: self.extras,
            ..snap
        };
        if snap.external_annotations.is_empty() {
            snap.external_annotations = user_defined_annotations(&snap);
        }
        Ok((snap, self.tapped_reused))
    }

    fn dict_root(&mut self, f: &Fields, d: SeqId, path: &Path) -> Res<Snapshot> {
        let segments = f.req(d, Key::Segments, path)?;
        let segments = self.segments(f, segments, &path.key("segments"))?;
        let device_traces = match f.get(d, Key::DeviceTraces) {
            Some(v) => self.traces(f, v, &path.key("device_traces"))?,
            None => Vec::new(),
        };
        let settings_v = f.get_some(d, Key::AllocatorSettings);
        let annotations_v = f.get_some(d, Key::ExternalAnnotations);
        let layout = if settings_v.is_some() || annotations_v.is_some() {
            Layout::CurrentDict
        } else {
            Layout::OlderDict
        };
        let allocator_settings = match settings_v {
            Some(v) => Some(settings(f, v, &path.key("allocator_settings"))?),
            None => None,
        };
        let external_annotations = match annotations_v {
            Some(v) => annotations(f, v, &path.key("external_annotations"))?,
            None => Vec::new(),
        };
        Ok(Snapshot {
            segments,
            device_traces,
            allocator_settings,
            external_annotations,
            layout,
            frames: FrameTable::new(),
            entry_extras: EntryExtras::new(),
        })
    }

    /// A claimed list's converted items, if `v` is one.
    fn take_claimed(&mut self, v: Value) -> Option<Claimed> {
        let id = Document::list_id(v)?;
        let slot = self.claims.get_mut(&id.0)?;
        Some(std::mem::replace(slot, Claimed::Taken))
    }

    fn consume(&mut self, id: SeqId) {
        if self.track {
            self.consumed.push(id);
        }
    }

    fn segments(&mut self, f: &Fields, v: Value, path: &Path) -> Res<Vec<Segment>> {
        match self.take_claimed(v) {
            Some(Claimed::Segments(s)) => return Ok(s),
            Some(Claimed::Taken) => {
                return Err(path.error("the segments list is used twice"));
            }
            _ => {}
        }
        let items = f.list(v, path)?;
        let mut out = Vec::with_capacity(items.len());
        for (i, &s) in items.iter().enumerate() {
            out.push(self.segment(f, s, &path.index(i))?);
        }
        Ok(out)
    }

    pub(super) fn segment(&mut self, f: &Fields, v: Value, path: &Path) -> Res<Segment> {
        let d = f.dict(v, path)?;
        self.consume(d);
        let device = f.opt(d, Key::Device, path, Fields::int)?.unwrap_or(0);
        let address = f.field(d, Key::Address, path, Fields::uint)?;
        let total_size = f.field(d, Key::TotalSize, path, Fields::uint)?;
        let stream = f.opt(d, Key::Stream, path, Fields::uint)?.unwrap_or(0);
        let segment_type = match f.opt(d, Key::SegmentType, path, Fields::str)? {
            Some(s) => match &*s {
                "small" => PoolKind::Small,
                "large" => PoolKind::Large,
                other => {
                    return Err(path.key("segment_type").error(format!(
                        "expected \"small\" or \"large\", got {}",
                        quote_excerpt(other)
                    )))
                }
            },
            None if total_size <= SMALL_SEGMENT => PoolKind::Small,
            None => PoolKind::Large,
        };
        if let Some(t) = f
            .get(d, Key::SegmentPoolId)
            .and_then(Document::container_id)
        {
            self.consume(t);
        }
        let pool_id = f
            .opt(d, Key::SegmentPoolId, path, pool_id)?
            .unwrap_or((0, 0));
        let is_expandable = f
            .opt(d, Key::IsExpandable, path, Fields::bool)?
            .unwrap_or(false);
        let allocated = f.opt(d, Key::AllocatedSize, path, Fields::uint)?;
        let active = f.opt(d, Key::ActiveSize, path, Fields::uint)?;
        let requested = f.opt(d, Key::RequestedSize, path, Fields::uint)?;
        let frames = self.opt_frames(f, d, path)?;

        let blocks_path = path.key("blocks");
        let blocks_v = f.req(d, Key::Blocks, path)?;
        let items = f.list(blocks_v, &blocks_path)?;
        if let Some(id) = Document::list_id(blocks_v) {
            self.consume(id);
        }
        let mut blocks = Vec::with_capacity(items.len());
        let mut next = address;
        for (i, &b) in items.iter().enumerate() {
            let block = self.block(f, b, next, &blocks_path.index(i))?;
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
    fn block(&mut self, f: &Fields, v: Value, computed: u64, path: &Path) -> Res<Block> {
        self.count(1, path)?;
        let d = f.dict(v, path)?;
        self.consume(d);
        let size = f.field(d, Key::Size, path, Fields::uint)?;
        let state = f.field(d, Key::State, path, block_state)?;
        let address = f
            .opt(d, Key::Address, path, Fields::uint)?
            .unwrap_or(computed);
        let requested = f.opt(d, Key::RequestedSize, path, Fields::uint)?;
        let mut frames = if f.get_some(d, Key::Frames).is_some() {
            Some(self.opt_frames(f, d, path)?)
        } else {
            None
        };

        // Legacy (torch 2.0) blocks: the first history entry stands for
        // the block, as in MemoryViz.
        let mut history_requested = None;
        if let Some(h) = f.get_some(d, Key::History) {
            let hpath = path.key("history");
            let items = f.list(h, &hpath)?;
            if let Some(first) = Document::list_id(h) {
                self.consume(first);
            }
            if let Some(&first) = items.first() {
                let p0 = hpath.index(0);
                let hd = f.dict(first, &p0)?;
                history_requested = f.opt(hd, Key::RealSize, &p0, Fields::uint)?;
                if frames.is_none() {
                    frames = Some(self.opt_frames(f, hd, &p0)?);
                }
            }
            for &x in items {
                if let Some(id) = Document::dict_id(x) {
                    self.consume(id);
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

    fn traces(&mut self, f: &Fields, v: Value, path: &Path) -> Res<Vec<Vec<TraceEntry>>> {
        let devices = f.list(v, path)?;
        let mut out: Vec<Vec<TraceEntry>> = Vec::with_capacity(devices.len());
        // Claimed lists already moved out, by list id → device index.
        let mut moved: FxHashMap<u32, usize> = FxHashMap::default();
        for (dev, &t) in devices.iter().enumerate() {
            let dpath = path.index(dev);
            match self.take_claimed(t) {
                Some(Claimed::Trace { entries, .. }) => {
                    if let Some(id) = Document::list_id(t) {
                        moved.insert(id.0, dev);
                    }
                    out.push(entries);
                    continue;
                }
                Some(Claimed::Taken) => {
                    if Document::list_id(t).is_some_and(|id| Some(id.0) == self.tapped_list) {
                        self.tapped_reused = true;
                    }
                    let again = Document::list_id(t)
                        .and_then(|id| moved.get(&id.0))
                        .and_then(|&i| out.get(i))
                        .cloned();
                    match again {
                        Some(entries) => {
                            self.count(entries.len() as u64, &dpath)?;
                            out.push(entries);
                            continue;
                        }
                        None => return Err(dpath.error("a trace list is used twice")),
                    }
                }
                _ => {}
            }
            let entries = f.list(t, &dpath)?;
            let mut trace = Vec::with_capacity(entries.len());
            for (i, &e) in entries.iter().enumerate() {
                trace.push(self.entry(f, e, &dpath.index(i))?);
            }
            out.push(trace);
        }
        Ok(out)
    }

    /// Count `n` more records against the budget.
    fn count(&mut self, n: u64, path: &Path) -> Res<()> {
        self.records = self.records.saturating_add(n);
        if self.records > self.budget {
            return Err(path.error(format!(
                "more than {} trace entries and blocks: the file refers to the same records over \
                 and over (a file PyTorch writes holds each one once)",
                crate::units::format_count(self.budget)
            )));
        }
        Ok(())
    }

    pub(super) fn entry(&mut self, f: &Fields, v: Value, path: &Path) -> Res<TraceEntry> {
        self.count(1, path)?;
        let d = f.dict(v, path)?;
        self.consume(d);
        // One pass over the dict instead of a lookup per key; a later
        // duplicate key wins, as in Python.
        const N: usize = 9;
        const KEYS: [Key; N] = [
            Key::Action,
            Key::Addr,
            Key::Size,
            Key::Stream,
            Key::DeviceFree,
            Key::TimeUs,
            Key::CompileContext,
            Key::UserMetadata,
            Key::Frames,
        ];
        let wanted = KEYS.map(|k| f.key(k).map_or(ABSENT, Value::raw));
        let mut got: [Option<Value>; N] = [None; N];
        for (k, val) in f.doc.pairs(d) {
            let k = k.raw();
            if let Some(i) = wanted.iter().position(|&w| w == k) {
                got[i] = Some(val);
            }
        }
        // Optional fields written as `None` read as absent.
        for v in &mut got[3..] {
            if *v == Some(Value::NONE) {
                *v = None;
            }
        }
        let [action_v, addr_v, size_v, stream_v, free_v, time_v, cc_v, um_v, frames_v] = got;
        let typed = |v: Option<Value>, key: Key| -> Res<Option<u64>> {
            v.map(|v| f.uint(v, &path.key(key.name()))).transpose()
        };
        let missing = |key: Key| path.error(format!("missing key {:?}", key.name()));

        let action_v = action_v.ok_or_else(|| missing(Key::Action))?;
        // An action string seen before is known by its handle: its text
        // (a cache miss per entry on a large trace) is read once.
        let action = match self.known_action(action_v) {
            Some(a) => a,
            None => {
                let action_text = match f.doc.get(action_v) {
                    ValueRef::Str(s) => s,
                    _ => return Err(f.expected(action_v, "str", &path.key("action"))),
                };
                self.action(action_v, action_text)
            }
        };
        // `oom` has `device_free` instead of `addr`; `annotate` (2.15) has
        // no `size`.
        let addr = match action {
            Action::Oom => typed(addr_v, Key::Addr)?.unwrap_or(0),
            _ => typed(addr_v, Key::Addr)?.ok_or_else(|| missing(Key::Addr))?,
        };
        let size = match action {
            Action::Annotate => typed(size_v, Key::Size)?.unwrap_or(0),
            _ => typed(size_v, Key::Size)?.ok_or_else(|| missing(Key::Size))?,
        };
        let stream = typed(stream_v, Key::Stream)?.unwrap_or(0);
        let device_free = typed(free_v, Key::DeviceFree)?;
        let time_us = time_v.map(|v| f.int(v, &path.key("time_us"))).transpose()?;
        let text = |v: Option<Value>, key: Key| -> Res<u32> {
            match v {
                None => Ok(ABSENT),
                Some(v) => match f.doc.get(v) {
                    ValueRef::Str(_) => Ok(v.raw()),
                    _ => Err(f.expected(v, "str", &path.key(key.name()))),
                },
            }
        };
        let cc = text(cc_v, Key::CompileContext)?;
        let um = text(um_v, Key::UserMetadata)?;
        let frames = match frames_v {
            Some(fv) => self.stack(f, fv, &path.key("frames"))?,
            None => FramesId::EMPTY,
        };
        let other = if action == Action::Other {
            action_v.raw()
        } else {
            ABSENT
        };
        let extra = self.extra(
            f,
            [other, cc, um],
            [Some(action_v), cc_v, um_v],
            device_free,
            path,
        )?;
        Ok(TraceEntry::new(action, addr, size, stream, frames)
            .with_time_us(time_us)
            .with_extra(extra))
    }

    /// The action of a string handle [`Importer::action`] parsed before.
    fn known_action(&self, v: Value) -> Option<Action> {
        let i = v.str_index()? as usize;
        self.actions.get(i).copied().flatten()
    }

    /// `Action::parse` of a string [`Importer::known_action`] did not know,
    /// remembered per interned string.
    fn action(&mut self, v: Value, text: &str) -> Action {
        let Some(i) = v.str_index().map(|i| i as usize) else {
            return Action::parse(text);
        };
        let action = Action::parse(text);
        if i >= self.actions.len() {
            self.actions.resize(i + 1, None);
        }
        self.actions[i] = Some(action);
        action
    }

    /// The [`ExtraId`] of an entry's rare fields; `key` holds the string
    /// handles (or [`ABSENT`]) of action text, compile context, user
    /// metadata, `vals` the values themselves.
    fn extra(
        &mut self,
        f: &Fields,
        key: [u32; 3],
        vals: [Option<Value>; 3],
        device_free: Option<u64>,
        path: &Path,
    ) -> Res<ExtraId> {
        if key == [ABSENT; 3] && device_free.is_none() {
            return Ok(ExtraId::NONE);
        }
        if device_free.is_none() {
            if let Some((k, id)) = self.last_extra {
                if k == key {
                    return Ok(id);
                }
            }
            if let Some(&id) = self.extra_cache.get(&key) {
                self.last_extra = Some((key, id));
                return Ok(id);
            }
        }
        let s = |i: usize| -> Option<crate::trace::pickle::SharedStr> {
            if key[i] == ABSENT {
                return None;
            }
            match f.doc.get(vals[i]?) {
                ValueRef::Str(s) => Some(s.clone()),
                _ => None,
            }
        };
        let row = EntryExtra {
            action: s(0),
            compile_context: s(1),
            user_metadata: s(2),
            device_free,
        };
        let id = self.extras.intern(row).ok_or_else(|| {
            path.error(format!(
                "more than {} distinct (compile_context, user_metadata, device_free) values",
                ExtraId::LIMIT - 1
            ))
        })?;
        if device_free.is_none() {
            self.extra_cache.insert(key, id);
            self.last_extra = Some((key, id));
        }
        Ok(id)
    }

    /// `d["frames"]` as an interned stack; empty when absent.
    fn opt_frames(&mut self, f: &Fields, d: SeqId, path: &Path) -> Res<FramesId> {
        match f.get_some(d, Key::Frames) {
            Some(v) => self.stack(f, v, &path.key("frames")),
            None => Ok(FramesId::EMPTY),
        }
    }

    fn stack(&mut self, f: &Fields, v: Value, path: &Path) -> Res<FramesId> {
        let list = f.list_id(v, path)?;
        if let Some(&id) = self.converted.get(list.0 as usize) {
            if id != NOT_SEEN {
                return Ok(FramesId(id));
            }
        }
        let items = f.doc.items(list);
        let mut ids = std::mem::take(&mut self.scratch);
        ids.clear();
        for (i, &fv) in items.iter().enumerate() {
            match self.frame(f, fv, &path.index(i)) {
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

    fn frame(&mut self, f: &Fields, v: Value, path: &Path) -> Res<FrameId> {
        let d = f.dict(v, path)?;
        if let Some(&id) = self.converted.get(d.0 as usize) {
            if id != NOT_SEEN {
                return Ok(FrameId(id));
            }
        }
        // PyTorch writes all three; "??" is its own word for what a frame
        // could not tell, used here for a frame that leaves one out.
        let unknown = || SharedStr::from("??");
        let frame = Frame {
            filename: f
                .opt(d, Key::Filename, path, Fields::str)?
                .unwrap_or_else(unknown),
            line: f.opt(d, Key::Line, path, Fields::int)?.unwrap_or(0),
            name: f
                .opt(d, Key::Name, path, Fields::str)?
                .unwrap_or_else(unknown),
        };
        let id = self.frames.intern_frame(frame);
        self.remember(d, id.0);
        Ok(id)
    }

    fn remember(&mut self, container: SeqId, id: u32) {
        let i = container.0 as usize;
        if i >= self.converted.len() {
            // Streaming: the arena grows as it decodes.
            self.converted.resize(i + 1, NOT_SEEN);
        }
        self.converted[i] = id;
    }
}
