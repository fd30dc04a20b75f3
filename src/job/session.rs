//! A live job as received (PROTOCOL.md "The log"): the server hello, the
//! stacks, the state the log starts from, every entry since, the steps, the
//! stats and the OOMs. It keeps the job as a [`Snapshot`] whose traces are
//! the entries since the last start-over and whose segments are the current
//! map (the start state with every entry mirrored onto it), so the reports
//! and the leak analysis of `open` work on it unchanged.
//!
//! A `lost` starts over from the `state` that follows; a `rebase`, `resync`
//! or `oom` state is checked against the mirrored map and starts over only
//! where they differ. Past [`ENTRY_CAP`] entries the history is dropped and
//! the current map becomes the new start, so memory stays bounded.

use rustc_hash::FxHashMap;

use super::creep::{StepSeries, StepTrend};
use super::error::LiveError;
use super::message::{
    DeviceStats, LostMark, Message, OomMark, ServerHello, StateHeader, StepMark, WireEntry,
};
use crate::alloc::{Action, AllocConfig};
use crate::trace::mirror::{segments_map, TraceMirror};
use crate::trace::replay::Entry;
use crate::trace::snapshot::{
    AllocatorSettings, EntryExtra, EntryExtras, Frame, FrameTable, FramesId, Layout, Segment,
    Snapshot, TraceEntry,
};
use crate::trace::MemoryMap;

/// Entries kept before the history is dropped, by default: with what the
/// views keep of each (about 110 bytes in all: 48 here, the timeline's 40,
/// the stack table's 25), about 1.1 GB; `attach --keep-entries` sets it.
pub const ENTRY_CAP: usize = 10_000_000;
/// PROTOCOL.md: "stacks defined ≤ 4 M".
pub const MAX_STACKS: usize = 4 << 20;
/// Text of the distinct frames a stream defines (file names and function
/// names): a real job's few hundred thousand frames take tens of MB.
pub const MAX_FRAME_TEXT: usize = 256 << 20;
/// Frames over every distinct stack a stream defines, all stacks together
/// (one stack's own bound is `message::MAX_STACK_FRAMES`).
pub const MAX_TABLE_FRAMES: usize = 64 << 20;
/// Steps kept since the last start-over (or the entry cap, when lower):
/// past it the view starts over as it does past the entries kept, so a
/// flood of `step` messages cannot grow memory (it grew by 310 MB/s).
pub const MAX_STEPS_KEPT: usize = 100_000;
/// Bytes of a step's `source` kept: `record_function:NAME` with a long
/// name is cut, with `…`.
pub const MAX_STEP_SOURCE: usize = 256;
/// Blocks (and segments) of one `state`: a real job's map holds thousands
/// to a few hundred thousand; a state that never ends its chunks stops here.
/// It is lowered with `--keep-entries`, down to [`MIN_STATE_BLOCKS`].
pub const MAX_STATE_BLOCKS: usize = 4 << 20;
pub const MIN_STATE_BLOCKS: usize = 1 << 16;

/// What one message changed, for a producer to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    Nothing,
    Hello,
    /// A state became the start of the log: the first one, or a start-over
    /// (`why` says why: entries lost, the job's map differs, the cap).
    Started {
        why: Option<String>,
    },
    /// A state matched the mirrored map.
    Checkpoint,
    Entries,
    Step,
    Stats(u8),
    Oom,
    /// PyTorch's message for the latest OOM came.
    OomMessage,
    /// The helper said which Python names hold the job's tensors.
    Holders,
    Ended(String),
}

/// A `state` whose `segments` messages are still coming.
struct PendingState {
    header: StateHeader,
    segments: Vec<Segment>,
    /// Blocks and segments received, against [`MAX_STATE_BLOCKS`].
    blocks: usize,
}

/// How much the stack table may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackBounds {
    /// Bytes of the distinct frames' file and function names.
    pub text: usize,
    /// Frames over every distinct stack.
    pub frames: usize,
}

impl Default for StackBounds {
    fn default() -> Self {
        StackBounds {
            text: MAX_FRAME_TEXT,
            frames: MAX_TABLE_FRAMES,
        }
    }
}

/// The job, as far as the stream has told it.
pub struct Session {
    at: String,
    hello: Option<ServerHello>,
    config: AllocConfig,
    /// Traces since the last start-over; `segments` filled on demand.
    snap: Snapshot,
    /// The wire's stack ids, as interned in `snap.frames`.
    stack_ids: FxHashMap<u32, FramesId>,
    /// What the stack table holds, against [`MAX_FRAME_TEXT`] and
    /// [`MAX_TABLE_FRAMES`]: a hostile stream cannot grow it without bound.
    frame_text: usize,
    stack_frames: usize,
    bounds: StackBounds,
    pending: Option<PendingState>,
    /// The state the traces start from (blocks' stacks and pool ids).
    base: Vec<Segment>,
    base_frames: FxHashMap<(u8, u64), FramesId>,
    base_pools: FxHashMap<(u8, u64), (i64, i64)>,
    /// Per device: the map now, and each trace entry's `seq`.
    maps: Vec<MemoryMap>,
    seqs: Vec<Vec<u64>>,
    next_seq: Option<u64>,
    steps: Vec<StepMark>,
    steps_seen: u64,
    stats: Vec<DeviceStats>,
    ooms: Vec<OomMark>,
    /// The job's memory at each step, kept across start-overs.
    step_series: StepSeries,
    /// An OOM came since the last step: the stats that follow it were read
    /// mid-step, at the OOM, and are no step's figures.
    oom_since_step: bool,
    lost: Vec<LostMark>,
    start_overs: Vec<String>,
    ended: Option<String>,
    cap: usize,
    /// The helper's walks for holders (the newest [`KEPT_REPORTS`]), kept
    /// across start-overs.
    ///
    /// [`KEPT_REPORTS`]: super::holders::KEPT_REPORTS
    holders: Vec<super::holders::HoldersReport>,
}

impl Session {
    /// A session reading from `at` (an address or a file, for errors).
    pub fn new(at: impl Into<String>) -> Session {
        Session::with_cap(at, ENTRY_CAP)
    }

    /// With another entry cap (tests).
    pub fn with_cap(at: impl Into<String>, cap: usize) -> Session {
        Session {
            at: at.into(),
            hello: None,
            config: AllocConfig::default(),
            snap: Snapshot {
                segments: Vec::new(),
                device_traces: Vec::new(),
                allocator_settings: None,
                external_annotations: Vec::new(),
                layout: Layout::CurrentDict,
                frames: FrameTable::new(),
                entry_extras: EntryExtras::new(),
            },
            stack_ids: FxHashMap::default(),
            frame_text: 0,
            stack_frames: 0,
            bounds: StackBounds::default(),
            pending: None,
            base: Vec::new(),
            base_frames: FxHashMap::default(),
            base_pools: FxHashMap::default(),
            maps: Vec::new(),
            seqs: Vec::new(),
            next_seq: None,
            steps: Vec::new(),
            steps_seen: 0,
            stats: Vec::new(),
            ooms: Vec::new(),
            step_series: StepSeries::default(),
            oom_since_step: false,
            lost: Vec::new(),
            start_overs: Vec::new(),
            ended: None,
            cap: cap.max(1),
            holders: Vec::new(),
        }
    }

    /// Keep why the view started over: the first 100 reasons, then how
    /// many more (a stream can start over without end).
    fn note_start_over(&mut self, why: &str) {
        const KEPT: usize = 100;
        match self.start_overs.len() {
            n if n < KEPT => self.start_overs.push(why.to_string()),
            KEPT => self
                .start_overs
                .push("… and more start-overs after these".to_string()),
            _ => {}
        }
    }

    /// The same session with other stack-table bounds (tests).
    pub fn with_stack_bounds(mut self, bounds: StackBounds) -> Session {
        self.bounds = bounds;
        self
    }

    pub fn hello(&self) -> Option<&ServerHello> {
        self.hello.as_ref()
    }

    /// The allocator config the mirror rounds with (the job's
    /// `PYTORCH_CUDA_ALLOC_CONF` when it said and it parses).
    pub fn config(&self) -> &AllocConfig {
        &self.config
    }

    /// Whether a state has arrived: there is a map to show.
    pub fn started(&self) -> bool {
        self.next_seq.is_some()
    }

    /// Device `d`'s entries since the last start-over.
    pub fn trace(&self, device: usize) -> &[TraceEntry] {
        self.snap
            .device_traces
            .get(device)
            .map_or(&[], Vec::as_slice)
    }

    /// The snapshot the traces belong to (its stacks and extras; its
    /// segments are those of the last [`Session::snapshot`]).
    pub fn snap(&self) -> &Snapshot {
        &self.snap
    }

    /// Device `d`'s map as the state and the entries since built it.
    pub fn map(&self, device: usize) -> Option<&MemoryMap> {
        self.maps.get(device)
    }

    /// The state the current traces start from, as a map of `device`.
    pub fn start_map(&self, device: usize) -> MemoryMap {
        segments_map(self.base.iter().filter(|s| s.device == device as i64))
    }

    /// The stack a block of the start state recorded.
    pub fn start_frames(&self, device: usize, addr: u64) -> Option<FramesId> {
        let d = u8::try_from(device).ok()?;
        self.base_frames.get(&(d, addr)).copied()
    }

    /// Devices the job has: its hello's, and any a state or entry named.
    pub fn devices(&self) -> Vec<usize> {
        let mut d: Vec<usize> = self
            .hello
            .iter()
            .flat_map(|h| h.devices.iter().map(|d| usize::from(d.device)))
            .chain(self.base.iter().map(|s| s.device as usize))
            .chain((0..self.snap.device_traces.len()).filter(|d| !self.trace(*d).is_empty()))
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// Steps since the last start-over.
    pub fn steps(&self) -> &[StepMark] {
        &self.steps
    }

    /// Entry positions in device `d`'s trace where the steps since the last
    /// start-over ended: entries before the position belong to the step.
    pub fn step_positions(&self, device: usize) -> Vec<usize> {
        let seqs = self.seqs.get(device).map_or(&[][..], Vec::as_slice);
        let mut v: Vec<usize> = self
            .steps
            .iter()
            .map(|s| seqs.partition_point(|q| *q < s.seq))
            .collect();
        v.dedup();
        v
    }

    /// The latest `memory_stats()` of each device that sent them.
    pub fn stats(&self) -> &[DeviceStats] {
        &self.stats
    }

    /// Why the stream ended, once it has (`bye`'s reason, or a disconnect).
    /// The job's memory at each step over the whole attach.
    pub fn step_trends(&self) -> Vec<StepTrend> {
        self.step_series.summaries()
    }

    /// The OOMs the job reported (the first 100).
    pub fn ooms(&self) -> &[OomMark] {
        &self.ooms
    }

    pub fn ended(&self) -> Option<&str> {
        self.ended.as_deref()
    }

    /// The helper's walks for what holds the job's tensors, oldest first.
    pub fn holders(&self) -> &[super::holders::HoldersReport] {
        &self.holders
    }

    /// The latest walk's chains as leak findings (none before a walk).
    pub fn holder_findings(&self) -> Vec<crate::leak::Finding> {
        let n = self.holders.len();
        let last_walk_step = n.checked_sub(2).and_then(|i| self.holders[i].step);
        self.holders
            .last()
            .map(|h| h.findings_since(last_walk_step))
            .unwrap_or_default()
    }

    /// The stream stopped without `bye`.
    pub fn disconnected(&mut self, why: &str) {
        if self.ended.is_none() {
            self.ended = Some(why.to_string());
        }
    }

    /// Apply message `index`.
    pub fn apply(&mut self, index: u64, msg: Message) -> Result<Applied, LiveError> {
        if self.pending.is_some() && !matches!(msg, Message::Segments(_)) {
            let want = self.pending.as_ref().map_or(0, |p| p.header.chunks);
            return Err(self.err(
                index,
                kind_name(&msg),
                format!("the state still awaits its segments ({want} chunks were announced)"),
            ));
        }
        match msg {
            Message::Hello(h) => {
                if let Some(conf) = h.alloc_conf() {
                    if let Ok(c) = AllocConfig::parse(conf) {
                        // The snapshot's replays (the OOM's answer) read the job's settings from it.
                        self.snap.allocator_settings = Some(AllocatorSettings::of(&c));
                        self.config = c;
                    }
                }
                self.hello = Some(*h);
                Ok(Applied::Hello)
            }
            Message::Refused { reason } => Err(LiveError::Refused {
                at: self.at.clone(),
                reason,
            }),
            Message::State(header) => {
                self.pending = Some(PendingState {
                    header,
                    segments: Vec::new(),
                    blocks: 0,
                });
                self.state_if_complete(index)
            }
            Message::Segments(segs) => {
                if self.pending.is_none() {
                    return Err(self.err(index, "segments", "segments without a state".into()));
                }
                let held = self.pending.as_ref().map_or(0, |p| p.blocks);
                let more: usize = segs.iter().map(|s| 1 + s.blocks.len()).sum();
                let bound = MAX_STATE_BLOCKS.min(self.cap.max(MIN_STATE_BLOCKS));
                if held + more > bound {
                    return Err(self.err(
                        index,
                        "segments",
                        format!(
                            "the state's segments hold more than {} blocks (the bound)",
                            crate::units::format_count(bound as u64)
                        ),
                    ));
                }
                let mut out = Vec::with_capacity(segs.len());
                for (i, s) in segs.into_iter().enumerate() {
                    out.push(self.segment(index, i, s)?);
                }
                if let Some(p) = self.pending.as_mut() {
                    p.blocks += more;
                    p.segments.extend(out);
                    p.header.chunks = p.header.chunks.saturating_sub(1);
                }
                self.state_if_complete(index)
            }
            Message::Stack { id, frames } => {
                if self.stack_ids.contains_key(&id) {
                    return Err(self.err(index, "stack", format!("stack {id} is defined twice")));
                }
                if self.stack_ids.len() >= MAX_STACKS {
                    return Err(self.err(
                        index,
                        "stack",
                        format!("more than {MAX_STACKS} stacks defined (the bound)"),
                    ));
                }
                self.stack_frames += frames.len();
                if self.stack_frames > self.bounds.frames {
                    let bound = self.bounds.frames;
                    return Err(self.err(
                        index,
                        "stack",
                        format!("more than {bound} frames over its stacks (the bound)"),
                    ));
                }
                let mut ids = Vec::with_capacity(frames.len());
                for f in frames {
                    let known = self.snap.frames.frame_count();
                    ids.push(self.snap.frames.intern_frame(Frame {
                        filename: f.filename.as_str().into(),
                        line: f.line,
                        name: f.name.as_str().into(),
                    }));
                    if self.snap.frames.frame_count() > known {
                        self.frame_text += f.filename.len() + f.name.len();
                    }
                }
                if self.frame_text > self.bounds.text {
                    let bound = crate::alloc::format_size(self.bounds.text as u64);
                    return Err(self.err(
                        index,
                        "stack",
                        format!("its distinct frames' names take more than {bound} (the bound)"),
                    ));
                }
                let stack = self.snap.frames.intern_stack(&ids);
                self.stack_ids.insert(id, stack);
                Ok(Applied::Nothing)
            }
            Message::Entries { first, entries } => self.entries(index, first, entries),
            Message::Step(mut s) => {
                self.steps_seen += 1;
                self.oom_since_step = false;
                s.source = cut_source(s.source);
                self.steps.push(s);
                Ok(self.steps_within_bound())
            }
            Message::Stats(s) => {
                if !self.oom_since_step {
                    self.step_series.push(self.steps_seen, &s);
                }
                let d = s.device;
                match self.stats.iter_mut().find(|x| x.device == d) {
                    Some(x) => *x = s,
                    None => self.stats.push(s),
                }
                Ok(Applied::Stats(d))
            }
            Message::Oom(o) => {
                self.oom_since_step = true;
                if let Some(free) = o.device_free {
                    self.note_oom_free(o.device, o.seq, free);
                }
                // Bounded: a stream can repeat OOMs without end.
                if self.ooms.len() < 100 {
                    self.ooms.push(o);
                }
                Ok(Applied::Oom)
            }
            Message::OomMessage {
                seq,
                device,
                message,
            } => {
                match self.ooms.last_mut() {
                    Some(last) => last.pytorch_message = Some(message),
                    // No observer record came (the observer could not be
                    // attached): the message is the OOM's only trace.
                    None => self.ooms.push(OomMark {
                        device: device.unwrap_or(0),
                        seq,
                        message: message.clone(),
                        device_free: None,
                        device_total: None,
                        alloc_size: None,
                        pytorch_message: Some(message),
                    }),
                }
                Ok(Applied::OomMessage)
            }
            Message::Lost(l) => {
                if self.lost.len() < 100 {
                    self.lost.push(l);
                }
                Ok(Applied::Nothing)
            }
            Message::Holders(h) => {
                if self.holders.len() == super::holders::KEPT_REPORTS {
                    self.holders.remove(0);
                }
                self.holders.push(*h);
                Ok(Applied::Holders)
            }
            Message::Bye { reason } => {
                let why = reason.unwrap_or_else(|| "the job said bye".into());
                self.ended = Some(why.clone());
                Ok(Applied::Ended(why))
            }
        }
    }

    fn err(&self, index: u64, kind: &str, problem: String) -> LiveError {
        LiveError::protocol(&self.at, index, kind, problem)
    }

    fn stack_of(
        &self,
        index: u64,
        kind: &str,
        field: &str,
        id: Option<u32>,
    ) -> Result<FramesId, LiveError> {
        match id {
            None => Ok(FramesId::EMPTY),
            Some(id) => self.stack_ids.get(&id).copied().ok_or_else(|| {
                LiveError::field(
                    &self.at,
                    index,
                    kind,
                    field,
                    format!("stack {id} is used before it is defined"),
                )
            }),
        }
    }

    fn ensure_device(&mut self, d: usize) {
        if self.maps.len() <= d {
            self.maps.resize_with(d + 1, MemoryMap::default);
            self.seqs.resize_with(d + 1, Vec::new);
            self.snap.device_traces.resize_with(d + 1, Vec::new);
        }
    }

    fn entries(
        &mut self,
        index: u64,
        first: u64,
        entries: Vec<WireEntry>,
    ) -> Result<Applied, LiveError> {
        let Some(next) = self.next_seq else {
            return Err(self.err(index, "entries", "entries before any state".into()));
        };
        if first != next {
            return Err(LiveError::field(
                &self.at,
                index,
                "entries",
                "first",
                format!(
                    "{first}, where the next entry is seq {next} (a gap or a repeat in the log)"
                ),
            ));
        }
        // Decode every entry before applying any: a bad one leaves the session as it was.
        let mut typed = Vec::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            let frames = self.stack_of(index, "entries", &format!("entries[{i}][6]"), e.stack)?;
            let mut t =
                TraceEntry::new(e.action, e.addr, e.size, e.stream, frames).with_time_us(e.time_us);
            if let Some(name) = &e.other {
                let row = EntryExtra {
                    action: Some(name.as_str().into()),
                    ..EntryExtra::default()
                };
                if let Some(id) = self.snap.entry_extras.intern(row) {
                    t = t.with_extra(id);
                }
            }
            if e.action == Action::Oom {
                // The C++ tracker's OOM entry holds the driver's free bytes in `addr`.
                t.addr = 0;
                let row = EntryExtra {
                    device_free: Some(e.addr),
                    ..EntryExtra::default()
                };
                if let Some(id) = self.snap.entry_extras.intern(row) {
                    t = t.with_extra(id);
                }
            }
            typed.push((usize::from(e.device), t));
        }
        let mut seq = next;
        for (d, t) in typed {
            self.ensure_device(d);
            let i = self.snap.device_traces[d].len();
            let entry = Entry::recorded(&t);
            // One entry at a time keeps the borrow of the config apart from the map.
            let map = std::mem::take(&mut self.maps[d]);
            let mut mirror = TraceMirror::starting_from(map, &self.config);
            mirror.event(i, &entry, None);
            self.maps[d] = mirror.into_map();
            self.snap.device_traces[d].push(t);
            self.seqs[d].push(seq);
            seq += 1;
        }
        self.next_seq = Some(seq);
        let kept: usize = self.seqs.iter().map(Vec::len).sum();
        if kept > self.cap {
            let why = format!(
                "kept {kept} entries, over the {} kept (attach --keep-entries): dropped the history and started over from the current map",
                self.cap
            );
            let segments = self.current_segments();
            self.start_from(seq, segments);
            self.note_start_over(&why);
            return Ok(Applied::Started { why: Some(why) });
        }
        Ok(Applied::Entries)
    }

    /// Past the steps kept, start over from the current map (before any
    /// state, the older half of the steps goes).
    fn steps_within_bound(&mut self) -> Applied {
        let bound = MAX_STEPS_KEPT.min(self.cap);
        if self.steps.len() <= bound {
            return Applied::Step;
        }
        let Some(seq) = self.next_seq else {
            self.steps.drain(..self.steps.len() / 2);
            return Applied::Step;
        };
        let why = format!(
            "kept {} steps, over the {bound} kept: dropped the history and started over from the current map",
            self.steps.len()
        );
        let segments = self.current_segments();
        self.start_from(seq, segments);
        self.note_start_over(&why);
        Applied::Started { why: Some(why) }
    }

    fn note_oom_free(&mut self, device: u8, seq: u64, free: u64) {
        let d = usize::from(device);
        let Some(seqs) = self.seqs.get(d) else { return };
        let Some(k) = seqs.iter().rposition(|s| *s < seq.saturating_add(1)) else {
            return;
        };
        let e = self.snap.device_traces[d][k];
        if e.action != Action::Oom || self.snap.extra(&e).device_free.is_some() {
            return;
        }
        let row = EntryExtra {
            device_free: Some(free),
            ..self.snap.extra(&e).clone()
        };
        if let Some(id) = self.snap.entry_extras.intern(row) {
            self.snap.device_traces[d][k] = e.with_extra(id);
        }
    }
}

/// A step's source, at most [`MAX_STEP_SOURCE`] bytes.
/// A new string: a truncated one would keep its whole allocation.
fn cut_source(source: String) -> String {
    if source.len() <= MAX_STEP_SOURCE {
        return source;
    }
    let mut cut = MAX_STEP_SOURCE;
    while !source.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut short = String::with_capacity(cut + '…'.len_utf8());
    short.push_str(&source[..cut]);
    short.push('…');
    short
}

fn kind_name(m: &Message) -> &'static str {
    match m {
        Message::Hello(_) => "hello",
        Message::Refused { .. } => "refused",
        Message::State(_) => "state",
        Message::Segments(_) => "segments",
        Message::Stack { .. } => "stack",
        Message::Entries { .. } => "entries",
        Message::Step(_) => "step",
        Message::Stats(_) => "stats",
        Message::Oom(_) => "oom",
        Message::OomMessage { .. } => "oom_message",
        Message::Lost(_) => "lost",
        Message::Holders(_) => "holders",
        Message::Bye { .. } => "bye",
    }
}

mod as_snapshot;
mod states;

#[cfg(test)]
mod tests;
