//! Where two maps of one device differ, in words: a job's `rebase`/`resync`
//! state against the map its entries built.

use crate::alloc::BlockState;
use crate::trace::MemoryMap;

/// The first segment or block where two maps differ (address, size, state).
pub(super) fn map_difference(ours: &MemoryMap, theirs: &MemoryMap) -> Option<String> {
    let segs = |m: &MemoryMap| -> Vec<(u64, u64)> {
        m.segments.iter().map(|(a, s)| (*a, s.size)).collect()
    };
    let (a, b) = (segs(ours), segs(theirs));
    if a != b {
        let at = a.iter().zip(&b).find(|(x, y)| x != y);
        return Some(match at {
            Some((x, y)) => format!(
                "segment {:#x} ({} bytes) here, {:#x} ({} bytes) in the job",
                x.0, x.1, y.0, y.1
            ),
            None => format!("{} segments here, {} in the job", a.len(), b.len()),
        });
    }
    let blocks = |m: &MemoryMap| -> Vec<(u64, u64, BlockState)> {
        m.blocks
            .iter()
            .map(|(a, b)| (*a, b.size, b.state))
            .collect()
    };
    let (a, b) = (blocks(ours), blocks(theirs));
    if a == b {
        return None;
    }
    Some(match a.iter().zip(&b).find(|(x, y)| x != y) {
        Some((x, y)) => format!(
            "block {:#x}: {} bytes {} here, {:#x}: {} bytes {} in the job",
            x.0,
            x.1,
            x.2.as_str(),
            y.0,
            y.1,
            y.2.as_str()
        ),
        None => format!("{} blocks here, {} in the job", a.len(), b.len()),
    })
}
