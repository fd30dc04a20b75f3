//! The allocator state at a trace's first entry, for open traces (recording
//! started late or the ring buffer wrapped): undo the trace backwards from the
//! final segments, then fill in what the trace cannot say.
//!
//! Exact: which segments existed, which allocations were live and — for those
//! still live at the end — their block sizes. Estimated: the block size of an
//! allocation made before the trace and freed during it (rounded by the
//! allocator's rules, and widened over a remainder too small to split off).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::alloc::constants::{SMALL_BUFFER, SMALL_SIZE};
use crate::alloc::{
    round_size, should_split, Action, AdoptBlock, AllocConfig, BlockState, Pool, Tag,
};

use super::{Entry, FinalSegment};

/// A segment to adopt before replaying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialSegment {
    pub addr: u64,
    pub pool: Pool,
    pub stream: u64,
    pub blocks: Vec<AdoptBlock>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconstruction {
    pub segments: Vec<InitialSegment>,
    /// Allocations whose block size had to be estimated.
    pub estimated_blocks: usize,
    /// Why parts of the state could not be placed, in words.
    pub notes: Vec<String>,
    /// The trace uses expandable segments, whose reservations cannot be rebuilt.
    pub expandable: bool,
}

impl Reconstruction {
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }
}

#[derive(Debug, Clone, Copy)]
struct Live {
    size: Option<u64>,
    requested: u64,
    state: BlockState,
}

pub fn initial_state(
    entries: impl IntoIterator<Item = Entry, IntoIter: DoubleEndedIterator + Clone>,
    finals: &[FinalSegment],
    config: &AllocConfig,
) -> Reconstruction {
    let entries = entries.into_iter();
    let mut out = Reconstruction::default();
    if finals.iter().any(|s| s.is_expandable)
        || entries
            .clone()
            .any(|e| matches!(e.action, Action::SegmentMap | Action::SegmentUnmap))
    {
        out.expandable = true;
    }
    let mut segs: BTreeMap<u64, (u64, u64)> = finals
        .iter()
        .filter(|s| !s.is_expandable)
        .map(|s| (s.address, (s.total_size, s.stream)))
        .collect();
    let mut live: FxHashMap<u64, Live> = finals
        .iter()
        .filter(|s| !s.is_expandable)
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state.is_active())
        .map(|b| {
            (
                b.address,
                Live {
                    size: Some(b.size),
                    requested: b.requested_size,
                    state: b.state,
                },
            )
        })
        .collect();
    for e in entries.rev() {
        match e.action {
            Action::SegmentAlloc => {
                segs.remove(&e.addr);
            }
            Action::SegmentFree => {
                segs.insert(e.addr, (e.size, e.stream));
            }
            Action::Alloc => {
                live.remove(&e.addr);
            }
            Action::FreeCompleted => {
                live.insert(
                    e.addr,
                    Live {
                        size: None,
                        requested: e.size,
                        state: BlockState::ActivePendingFree,
                    },
                );
            }
            Action::FreeRequested => {
                live.entry(e.addr)
                    .and_modify(|l| l.state = BlockState::ActiveAllocated)
                    .or_insert(Live {
                        size: None,
                        requested: e.size,
                        state: BlockState::ActiveAllocated,
                    });
            }
            _ => {}
        }
    }
    let live: BTreeMap<u64, Live> = live.into_iter().collect();
    for (&addr, &(size, stream)) in &segs {
        let inside: Vec<(u64, Live)> = live
            .range(addr..addr + size)
            .map(|(a, l)| (*a, *l))
            .collect();
        let pool = if size == SMALL_BUFFER && inside.iter().all(|(_, l)| l.requested <= SMALL_SIZE)
        {
            Pool::Small
        } else {
            Pool::Large
        };
        let blocks = tile(addr, size, pool, &inside, config, &mut out);
        out.segments.push(InitialSegment {
            addr,
            pool,
            stream,
            blocks,
        });
    }
    let placed: usize = out
        .segments
        .iter()
        .map(|s| s.blocks.iter().filter(|b| b.state.is_active()).count())
        .sum();
    if placed < live.len() {
        out.notes.push(format!(
            "{} allocations live at the start lie outside every known segment",
            live.len() - placed
        ));
    }
    out
}

/// Live blocks of one segment with free gaps between them.
fn tile(
    addr: u64,
    size: u64,
    pool: Pool,
    inside: &[(u64, Live)],
    config: &AllocConfig,
    out: &mut Reconstruction,
) -> Vec<AdoptBlock> {
    let end = addr + size;
    let mut blocks = Vec::new();
    let mut at = addr;
    for (k, &(a, l)) in inside.iter().enumerate() {
        if a < at {
            out.notes
                .push(format!("allocation {a:#x} overlaps the one before it"));
            continue;
        }
        if a > at {
            blocks.push(free(a - at));
        }
        let next = inside.get(k + 1).map_or(end, |(n, _)| *n);
        let block = l.size.unwrap_or_else(|| {
            out.estimated_blocks += 1;
            estimate(l.requested, next - a, pool, config)
        });
        let block = block.min(next - a);
        blocks.push(AdoptBlock {
            size: block,
            requested: l.requested,
            state: l.state,
            tag: Tag::NONE,
        });
        at = a + block;
    }
    if at < end {
        blocks.push(free(end - at));
    }
    blocks
}

/// §4.1: a block takes its whole remainder when that is too small to split off.
fn estimate(requested: u64, room: u64, pool: Pool, config: &AllocConfig) -> u64 {
    let rounded = round_size(requested, config);
    let remainder = room.saturating_sub(rounded);
    if should_split(pool, false, remainder, rounded, config) {
        rounded
    } else {
        room
    }
}

fn free(size: u64) -> AdoptBlock {
    AdoptBlock {
        size,
        requested: 0,
        state: BlockState::Inactive,
        tag: Tag::NONE,
    }
}
