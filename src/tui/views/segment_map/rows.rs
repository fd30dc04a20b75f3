//! The map's rows: segments (an expandable reservation's mapped and
//! unmapped ranges joined) in pool and address order, and the orders they give.

use super::RowSpan;
use crate::alloc::Pool;
use crate::trace::MemoryMap;

/// A contiguous range the map draws as one row.
#[derive(Debug, Clone, Copy)]
struct Piece {
    start: u64,
    size: u64,
    /// Bytes of the piece that are mapped (reserved).
    mapped: u64,
    pool: Option<Pool>,
    expandable: bool,
}

/// Rows of `map`: large pool first, then small; within a pool by address.
pub fn row_spans(map: &MemoryMap) -> Vec<RowSpan> {
    let mut pieces: Vec<Piece> = map
        .segments
        .iter()
        .map(|(a, s)| Piece {
            start: *a,
            size: s.size,
            mapped: s.size,
            pool: Some(s.pool),
            expandable: s.expandable,
        })
        .chain(map.unmapped.iter().map(|(a, (size, _))| Piece {
            start: *a,
            size: *size,
            mapped: 0,
            pool: None,
            expandable: true,
        }))
        .collect();
    pieces.sort_by_key(|p| p.start);
    // An expandable reservation is split into segments by unmapping; draw it
    // whole, with the unmapped ranges in place.
    let mut rows: Vec<Piece> = Vec::new();
    for p in pieces {
        if let Some(last) = rows.last_mut() {
            let touches = last.start + last.size == p.start;
            let same_pool = last.pool.is_none() || p.pool.is_none() || last.pool == p.pool;
            if touches && last.expandable && p.expandable && same_pool {
                last.size += p.size;
                last.mapped += p.mapped;
                last.pool = last.pool.or(p.pool);
                continue;
            }
        }
        rows.push(p);
    }
    let mut out = Vec::with_capacity(rows.len() + 2);
    for pool in [Pool::Large, Pool::Small] {
        // The unmapped-only rows have no pool on record; they are shown with
        // the large pool, where expandable segments mostly live.
        let of_pool: Vec<&Piece> = rows
            .iter()
            .filter(|r| r.pool.unwrap_or(Pool::Large) == pool)
            .collect();
        if of_pool.is_empty() {
            continue;
        }
        let bytes = of_pool.iter().map(|r| r.mapped).sum();
        out.push(RowSpan::Header {
            pool,
            segments: of_pool.len(),
            bytes,
        });
        out.extend(of_pool.iter().map(|r| RowSpan::Segment {
            start: r.start,
            size: r.size,
            pool,
            expandable: r.expandable,
        }));
    }
    out
}

/// Row ranges `(start, size)` in display order.
pub fn segment_order(spans: &[RowSpan]) -> Vec<(u64, u64)> {
    spans
        .iter()
        .filter_map(|r| match *r {
            RowSpan::Segment { start, size, .. } => Some((start, size)),
            RowSpan::Header { .. } => None,
        })
        .collect()
}

/// Block addresses in display order (what j/k walk through).
pub fn block_order(map: &MemoryMap, spans: &[RowSpan]) -> Vec<u64> {
    segment_order(spans)
        .into_iter()
        .flat_map(|(s, size)| map.blocks.range(s..s + size).map(|(a, _)| *a))
        .collect()
}
