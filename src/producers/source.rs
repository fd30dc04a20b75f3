//! The one message type every producer sends and the receiving end the UI
//! holds. The UI only ever drains a channel without blocking (DESIGN.md "The
//! engine runs on its own thread"): a live scenario, a snapshot rebuilt in
//! the background, a what-if replay and the NVML poller all look the same
//! from here.

use std::sync::Arc;

use super::devices::SnapshotDevices;
use crate::alloc::{Action, MemoryStats, Tag};
use crate::device::nvml::GpuReading;
use crate::device::{GpuUnavailable, PciAddress};
use crate::engine::Category;
use crate::job::nvml_match::{JobPlace, LiveJob};
use crate::leak::Finding;
use crate::scenario::{Conditions, Listing};
use crate::sweep::{Sweep, SweepPoint};
use crate::trace::stack::Stack;
use crate::trace::timeline::TimelinePart;
use crate::trace::{Event, MemoryMap};

/// What the attribution behind a [`Tag`] says, as far as it is known.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TagDescription {
    /// What the block holds (scenario runs); selects the category colour.
    pub category: Option<Category>,
    pub op: Option<String>,
    pub module: Option<String>,
    pub iteration: Option<u32>,
    /// A recorded stack, innermost first, one line each (`file:line name`).
    pub frames: Vec<String>,
    /// A simulated run's step that made it (it has no Python stack).
    pub step: Option<ScenarioStep>,
}

impl TagDescription {
    /// What a recorded stack says of a block: its first user frame's
    /// function as the op, and every frame (`None`: no stack recorded).
    pub fn of_stack(stack: Option<&Stack>) -> TagDescription {
        TagDescription {
            op: stack.and_then(|s| Some(s.frames[s.first_user?].name.to_string())),
            frames: stack
                .map(|s| s.frames.iter().map(|f| f.location()).collect())
                .unwrap_or_default(),
            ..TagDescription::default()
        }
    }
}

/// The scenario step behind a simulated allocation: where the step is
/// written and the PyTorch statement it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioStep {
    /// `scenarios/tour.ron:41:9` (the file alone where the line is unknown).
    pub location: String,
    /// `val_total += vloss`; for what the model's construction allocates,
    /// what happened instead of a statement.
    pub statement: String,
}

/// Where the stack of a block's allocation comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackOrigin {
    /// The trace entry that allocated the block.
    Entry(usize),
    /// The file's final state (`segments[].blocks[]`, or a legacy block's
    /// `history`): a block allocated before the trace began and live at its
    /// end, or any block of a file without a trace.
    FinalState,
    /// Allocated before the trace began and freed within it: neither the
    /// trace nor the final state holds its stack.
    BeforeTrace,
}

/// The recorded stack of a block's allocation, if any, and its origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockStack {
    /// `None`: the origin recorded no frames.
    pub stack: Option<Arc<Stack>>,
    pub origin: StackOrigin,
}

/// The recorded trace entry behind one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryDetail {
    /// Index in the device's trace.
    pub entry: usize,
    pub action: Action,
    /// µs since the Unix epoch, when the file records it.
    pub time_us: Option<i64>,
    /// The earliest time of the trace, for "how far into it".
    pub first_time_us: Option<i64>,
    /// The entry's own stack (for a free: where the free was asked for).
    pub stack: Option<Arc<Stack>>,
}

/// What the sites of a source's blocks are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiteKind {
    /// The first user frame of a recorded stack.
    PythonLine,
    /// A simulated run's op and module (it records no Python stack).
    EngineOp,
}

/// Resolves tags to their attribution. The engine owns the table (it grows
/// while the run goes on), so implementations synchronise internally.
pub trait TagInfo: Send + Sync {
    fn describe(&self, tag: Tag) -> Option<TagDescription>;

    /// The stack a block's allocation recorded. A block without a tag (live
    /// before an open trace began, or any block of a state-only file) is
    /// found by `addr` in the file's final state. `None`: the source records
    /// no stacks (a simulated run).
    fn stack(&self, _tag: Tag, _addr: u64) -> Option<BlockStack> {
        None
    }

    /// The site a block's live bytes are grouped under; `None`: none recorded.
    fn site(&self, tag: Tag, addr: u64) -> Option<Arc<str>> {
        self.stack(tag, addr)?.stack?.site.clone()
    }

    fn site_kind(&self) -> SiteKind {
        SiteKind::PythonLine
    }

    /// The trace entry behind event `index` of the run, for sources whose
    /// events mirror a recorded trace one for one.
    fn event_entry(&self, _index: usize) -> Option<EntryDetail> {
        None
    }

    /// The time of trace entry `entry` (µs since the Unix epoch), when the
    /// file records it.
    fn entry_time(&self, _entry: usize) -> Option<i64> {
        None
    }
}

/// One message from a producer to the UI, grouped by who sends it: a
/// screen takes the groups it shows and leaves the others.
#[derive(Debug, Clone)]
pub enum SourceMsg {
    /// What every producer of a run view sends (a scenario, a file, a job).
    Run(RunMsg),
    /// What only a simulated scenario says (`producers::scenario`).
    Scenario(ScenarioMsg),
    /// What a recorded trace says before and after its events: a file's
    /// (`producers::snapshot`) or an attached job's.
    Recorded(RecordedMsg),
    /// What only an attached job says (`producers::job`).
    Job(JobMsg),
    /// NVML's reading of every GPU (`producers::nvml`), or why there is none.
    Gpus(Result<Vec<GpuReading>, GpuUnavailable>),
    /// A batch sweep's points and fit (`producers::sweep`).
    Sweep(SweepMsg),
}

/// A run view's feed: its events and how the run goes.
#[derive(Debug, Clone)]
pub enum RunMsg {
    /// The state before the first event, for traces that start mid-run (an
    /// open snapshot trace, a state-only snapshot). Only meaningful first.
    Start(Box<MemoryMap>),
    Events(Vec<Event>),
    /// Events already placed on the map by their producer (a recorded
    /// trace), with what placing them gave.
    Part(TimelinePart),
    /// The detector's current findings: replaces the previous list.
    Findings(Vec<Finding>),
    /// The detector's findings as of the events received so far (a live run):
    /// the leak panel shows, at each cursor position, the latest such list.
    FindingsNow(Vec<Finding>),
    /// `memory_stats()` of the run's allocator (boxed: it is large).
    Stats(Box<MemoryStats>),
    /// The producer started over after [`EngineCommand::Restart`]: forget
    /// everything received so far.
    Restarted,
    /// The producer found that only the first this many events hold (a
    /// what-if replayed before the device size was known, which needed
    /// more than the device holds after them): forget the later ones; the
    /// right ones follow.
    KeepFirst(usize),
    Finished,
    Failed(String),
}

/// A simulated scenario's own messages.
#[derive(Debug, Clone)]
pub enum ScenarioMsg {
    /// The estimated compute time of the iteration that just ended (its
    /// number), on the scenario's GPU.
    Compute(Box<(u32, crate::engine::estimate::ComputeEstimate)>),
    /// A run on a real GPU: what NVML said this process held right after the
    /// device was opened, before the first allocation (the CUDA context).
    /// `None` when NVML could not say.
    ContextBaseline(Option<u64>),
}

/// A recorded trace's messages around its events.
#[derive(Debug, Clone)]
pub enum RecordedMsg {
    /// How far a producer has got before its events (reading a file).
    Loading(LoadProgress),
    /// What a view of a file knows: sent before its first event, in place
    /// of what other sources say up front; sent again, complete, once the
    /// file is read when the first came while it was being read.
    Opened(Box<Opened>),
    /// A snapshot's figures and live blocks, for the views across files
    /// (the table, the diff against another tab): sent by a view of a file
    /// once the file is read.
    Summary(Arc<crate::report::series::SnapshotSummary>),
    /// The answer at the shown device's last out-of-memory (what held the
    /// memory, what grew, the what-ifs), as the report gives it: sent once
    /// the view's events are, where the trace records an OOM.
    OomAnswer(Box<crate::leak::OomAnswer>),
}

/// An attached job's own messages.
#[derive(Debug, Clone)]
pub enum JobMsg {
    /// What the user should know about the job that is neither an event
    /// nor a failure: its view started over (and why), or it disconnected.
    /// Replaces the previous note; the view stays.
    Note(String),
    /// The job's memory at each step over the whole attach (its own
    /// `memory_stats()`): replaces the previous one.
    StepTrends(Vec<crate::job::creep::StepTrend>),
    /// The job's pid and devices (ids, reserved bytes), for the GPU
    /// panel's NVML reconciliation: replaces the previous one.
    Place(Box<LiveJob>),
}

/// A batch sweep's messages.
#[derive(Debug, Clone)]
pub enum SweepMsg {
    /// One point, by its index in the plan, or why it could not run.
    Point {
        index: usize,
        point: Box<Result<SweepPoint, String>>,
    },
    /// The whole sweep once every point (and the search) has run.
    Swept(Box<Sweep>),
    /// The sweep could not go on.
    Failed(String),
}

impl From<RunMsg> for SourceMsg {
    fn from(m: RunMsg) -> SourceMsg {
        SourceMsg::Run(m)
    }
}

impl From<ScenarioMsg> for SourceMsg {
    fn from(m: ScenarioMsg) -> SourceMsg {
        SourceMsg::Scenario(m)
    }
}

impl From<RecordedMsg> for SourceMsg {
    fn from(m: RecordedMsg) -> SourceMsg {
        SourceMsg::Recorded(m)
    }
}

impl From<JobMsg> for SourceMsg {
    fn from(m: JobMsg) -> SourceMsg {
        SourceMsg::Job(m)
    }
}

impl From<SweepMsg> for SourceMsg {
    fn from(m: SweepMsg) -> SourceMsg {
        SourceMsg::Sweep(m)
    }
}

/// How far the reading of a file has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadProgress {
    /// `done` of `total` bytes decoded (`total` 0: unknown).
    Reading { done: u64, total: u64 },
}

/// See [`RecordedMsg::Opened`].
#[derive(Clone)]
pub struct Opened {
    pub tags: Option<Arc<dyn TagInfo>>,
    /// `totalGlobalMem` where the trace tells it.
    pub capacity: Option<u64>,
    pub devices: SnapshotDevices,
    /// The events the view will hold, where known before they are made.
    pub events: Option<usize>,
    /// Open the by-line pane on what grew since the last step (a live job:
    /// the question people ask of one that runs).
    pub since_step: bool,
    /// The events so far were placed as if the trace began with nothing
    /// reserved, which is known only once the file is read (then another
    /// `Opened` says so, or the view starts over from the state the trace
    /// began in).
    pub assumed_empty_start: bool,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("capacity", &self.capacity)
            .field("devices", &self.devices)
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

/// Control going back to a live producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineCommand {
    Restart,
    /// A live job: ask its helper which Python names hold its tensors.
    FindHolders,
}

/// A producer as the UI sees it: a receiving end, an optional command
/// channel, and what is known up front about the device and the tags.
pub struct Source {
    rx: flume::Receiver<SourceMsg>,
    cmd: Option<flume::Sender<EngineCommand>>,
    /// Where parts go back once recorded, for their producer to fill again.
    spent_parts: Option<flume::Sender<TimelinePart>>,
    /// `totalGlobalMem` of the device, when known (drawn as the capacity line).
    pub capacity: Option<u64>,
    /// A simulated device's driver/context overhead, when the run sets one.
    pub overhead: Option<u64>,
    /// The CUDA ordinal when the run's memory comes from a real GPU.
    pub cuda: Option<u32>,
    /// That GPU's PCI address, when CUDA gave it.
    pub cuda_pci: Option<PciAddress>,
    pub tags: Option<Arc<dyn TagInfo>>,
    /// What a scenario run is under (its GPU profile, release, environment).
    pub conditions: Option<Conditions>,
    /// A snapshot's devices, for a view that switches between them.
    pub devices: Option<SnapshotDevices>,
    /// A scenario's program as code (the code pane); `None` for a trace.
    pub listing: Option<Arc<Listing>>,
    /// Where a live job runs (`None`: not a live job).
    pub job_place: Option<JobPlace>,
    /// The bytes of the file the source reads before its events, where
    /// it reads one: the view says so from its first frame.
    pub reads: Option<u64>,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("pending", &self.rx.len())
            .field("has_cmd", &self.cmd.is_some())
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

/// Result of one non-blocking look at the channel.
#[derive(Debug)]
pub enum Polled {
    Msg(SourceMsg),
    Empty,
    /// The producer went away (it finished, or its thread died).
    Closed,
}

impl Source {
    pub fn new(
        rx: flume::Receiver<SourceMsg>,
        cmd: Option<flume::Sender<EngineCommand>>,
    ) -> Source {
        Source {
            rx,
            cmd,
            spent_parts: None,
            capacity: None,
            overhead: None,
            cuda: None,
            cuda_pci: None,
            tags: None,
            conditions: None,
            devices: None,
            listing: None,
            job_place: None,
            reads: None,
        }
    }

    /// A source that reads a file of `bytes` before its events.
    pub fn reading(mut self, bytes: u64) -> Source {
        self.reads = Some(bytes);
        self
    }

    pub fn with_capacity(mut self, bytes: u64) -> Source {
        self.capacity = Some(bytes);
        self
    }

    pub fn with_overhead(mut self, bytes: u64) -> Source {
        self.overhead = Some(bytes);
        self
    }

    pub fn with_conditions(mut self, conditions: Conditions) -> Source {
        self.conditions = Some(conditions);
        self
    }

    pub fn with_listing(mut self, listing: Arc<Listing>) -> Source {
        self.listing = Some(listing);
        self
    }

    pub fn on_cuda(mut self, ordinal: u32, pci: Option<PciAddress>) -> Source {
        self.cuda = Some(ordinal);
        self.cuda_pci = pci;
        self
    }

    /// A live job's source, and where the job runs.
    pub fn job_at(mut self, place: JobPlace) -> Source {
        self.job_place = Some(place);
        self
    }

    pub fn with_tags(mut self, tags: Arc<dyn TagInfo>) -> Source {
        self.tags = Some(tags);
        self
    }

    /// A run whose events are all known: a pre-built timeline's events and
    /// findings, delivered at once and finished.
    pub fn from_events(events: Vec<Event>, findings: Vec<Finding>) -> Source {
        let (tx, rx) = flume::unbounded();
        // The receiver is alive, so these sends cannot fail.
        let _ = tx.send(SourceMsg::Run(RunMsg::Events(events)));
        if !findings.is_empty() {
            let _ = tx.send(SourceMsg::Run(RunMsg::Findings(findings)));
        }
        let _ = tx.send(SourceMsg::Run(RunMsg::Finished));
        Source::new(rx, None)
    }

    /// A source from already-queued messages (tests, importers).
    pub fn from_messages(msgs: impl IntoIterator<Item = SourceMsg>) -> Source {
        let (tx, rx) = flume::unbounded();
        for m in msgs {
            let _ = tx.send(m);
        }
        Source::new(rx, None)
    }

    pub fn poll(&self) -> Polled {
        match self.rx.try_recv() {
            Ok(m) => Polled::Msg(m),
            Err(flume::TryRecvError::Empty) => Polled::Empty,
            Err(flume::TryRecvError::Disconnected) => Polled::Closed,
        }
    }

    /// Block until the next message; `None` once the producer is gone.
    /// For the CLI's plain loops only: the UI never waits on a producer.
    pub fn recv(&self) -> Option<SourceMsg> {
        self.rx.recv().ok()
    }

    /// A source whose producer takes its recorded parts back.
    pub fn reusing_parts(mut self, spent: flume::Sender<TimelinePart>) -> Source {
        self.spent_parts = Some(spent);
        self
    }

    /// Hand a recorded (emptied) part back to the producer: its buffers are
    /// megabytes, and reusing them spares asking the system for fresh,
    /// zeroed memory per chunk (or keeping freed chunks in the heap).
    pub fn give_back(&self, part: TimelinePart) {
        if let Some(spent) = &self.spent_parts {
            let _ = spent.try_send(part);
        }
    }

    pub fn can_restart(&self) -> bool {
        self.cmd.is_some()
    }

    /// Send a command; false when there is no command channel or the producer is gone.
    pub fn send(&self, cmd: EngineCommand) -> bool {
        self.cmd.as_ref().is_some_and(|tx| tx.send(cmd).is_ok())
    }
}
