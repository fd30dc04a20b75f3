//! The fixed keys of `_snapshot()` segment and block dicts, written the same
//! way by the export of a snapshot and by the synthesis of one from a run.

use crate::trace::pickle::PickleWriter;

/// A segment's scalar fields, in the order PyTorch's dict has them.
pub(super) struct SegmentHeader<'a> {
    pub device: i64,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: u64,
    pub segment_type: &'a str,
    pub pool_id: (i64, i64),
    pub is_expandable: bool,
}

/// Write the header's keys and values into the open dict (up to, not
/// including, `frames` and `blocks`).
pub(super) fn segment(w: &mut PickleWriter, h: &SegmentHeader) {
    w.str("device");
    w.int(h.device);
    for (key, value) in [
        ("address", h.address),
        ("total_size", h.total_size),
        ("allocated_size", h.allocated_size),
        ("active_size", h.active_size),
        ("requested_size", h.requested_size),
        ("stream", h.stream),
    ] {
        w.str(key);
        w.uint(value);
    }
    w.str("segment_type");
    w.str(h.segment_type);
    w.str("segment_pool_id");
    w.int(h.pool_id.0);
    w.int(h.pool_id.1);
    w.tuple2();
    w.memoize();
    w.str("is_expandable");
    w.bool(h.is_expandable);
}

/// Write a block dict's keys and values into the open dict, up to (not
/// including) `frames`.
pub(super) fn block(w: &mut PickleWriter, address: u64, size: u64, requested: u64, state: &str) {
    w.str("address");
    w.uint(address);
    w.str("size");
    w.uint(size);
    w.str("requested_size");
    w.uint(requested);
    w.str("state");
    w.str(state);
}
