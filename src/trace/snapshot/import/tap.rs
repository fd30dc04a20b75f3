//! One device's trace handed out while the file is decoded, batch by
//! batch, instead of kept: a view places the first entries while the rest
//! of a large file is still being read (see `import_file_tapped`).

use super::super::frames::FrameTable;
use super::super::types::{EntryExtras, Segment, Snapshot, TraceEntry};

/// What resolves a tapped entry's stack ([`TraceEntry::frames`]) and rare
/// fields ([`TraceEntry::extra`]) as far as the file has been read.
#[derive(Clone, Copy)]
pub struct Tables<'a> {
    pub frames: &'a FrameTable,
    pub extras: &'a EntryExtras,
}

/// Receives one device's trace while the file is decoded.
pub trait TraceTap {
    /// The first entries of `device`'s trace are about to come (an empty
    /// trace is never offered); `segments` is the file's final state when
    /// the file holds it before its traces (PyTorch writes it first), and
    /// `tables` resolve its stacks. True: hand this list's entries to
    /// [`TraceTap::entries`] instead of keeping them. Asked until one list
    /// is taken.
    fn begin(&mut self, device: usize, segments: Option<&[Segment]>, tables: Tables<'_>) -> bool;

    /// The next entries of the list `begin` took, in order, the first being
    /// entry `first` of the trace. False: stop reading the file (nobody
    /// needs it any more).
    fn entries(&mut self, first: usize, entries: &[TraceEntry], tables: Tables<'_>) -> bool;
}

/// A file read through a [`TraceTap`].
#[derive(Debug)]
pub struct Tapped {
    /// The file, less the tapped trace's entries (its list is left empty).
    pub snapshot: Snapshot,
    /// The device whose trace the tap took, and how many entries it held;
    /// `None` when the tap took none, or when the file had to be decoded
    /// whole (then `snapshot` holds every entry, and what the tap was
    /// given is void).
    pub tapped: Option<(usize, usize)>,
}
