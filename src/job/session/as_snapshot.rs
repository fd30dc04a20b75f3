//! The session as a [`Snapshot`]: the mirrored maps as segments (each
//! block's stack from the entry that allocated it, or the start state), the
//! job's steps as boundaries, and the facts only a live job tells.

use super::Session;
use crate::alloc::{BlockState, Pool};
use crate::job::facts::LiveFacts;
use crate::leak::{Boundaries, BoundarySource};
use crate::trace::replay::tag_entry;
use crate::trace::snapshot::{Block, FramesId, PoolKind, Segment, Snapshot};

impl Session {
    /// Every device's map now, as snapshot segments.
    pub(super) fn current_segments(&self) -> Vec<Segment> {
        (0..self.maps.len())
            .flat_map(|d| self.device_segments(d))
            .collect()
    }

    fn device_segments(&self, d: usize) -> Vec<Segment> {
        let map = &self.maps[d];
        let trace = self.trace(d);
        let dev = d as u8;
        map.segments
            .iter()
            .map(|(&addr, seg)| {
                let blocks: Vec<Block> = map
                    .blocks_of(addr)
                    .map(|(a, b)| Block {
                        address: a,
                        size: b.size,
                        requested_size: b.requested,
                        state: b.state,
                        frames: match tag_entry(b.tag).and_then(|i| trace.get(i)) {
                            Some(e) => e.frames,
                            None => self
                                .base_frames
                                .get(&(dev, a))
                                .copied()
                                .unwrap_or(FramesId::EMPTY),
                        },
                    })
                    .collect();
                let sum = |f: &dyn Fn(&Block) -> bool, size: &dyn Fn(&Block) -> u64| {
                    blocks
                        .iter()
                        .filter(|b| f(b))
                        .map(size)
                        .fold(0u64, u64::saturating_add)
                };
                Segment {
                    device: d as i64,
                    address: addr,
                    total_size: seg.size,
                    allocated_size: sum(&|b| b.state == BlockState::ActiveAllocated, &|b| b.size),
                    active_size: sum(&|b| b.state.is_active(), &|b| b.size),
                    requested_size: sum(&|b| b.state.is_active(), &|b| b.requested_size),
                    stream: seg.stream,
                    segment_type: match seg.pool {
                        Pool::Small => PoolKind::Small,
                        Pool::Large => PoolKind::Large,
                    },
                    pool_id: self.base_pools.get(&(dev, addr)).copied().unwrap_or((0, 0)),
                    is_expandable: seg.expandable,
                    frames: FramesId::EMPTY,
                    blocks,
                }
            })
            .collect()
    }

    /// The job as a snapshot: the traces since the last start-over and the
    /// segments of the map now.
    pub fn snapshot(&mut self) -> &Snapshot {
        self.snap.segments = self.current_segments();
        &self.snap
    }

    /// Where the job's steps came from, each once in the order first seen
    /// (`mark_step, Optimizer.step`); `None` before the first step.
    fn step_sources(&self) -> Option<String> {
        let mut seen: Vec<&str> = Vec::new();
        for s in &self.steps {
            if !seen.contains(&s.source.as_str()) {
                seen.push(&s.source);
            }
        }
        (!seen.is_empty()).then(|| seen.join(", "))
    }

    /// Iteration boundaries of device `d` from the job's own step markers.
    pub fn boundaries(&self, device: usize) -> Boundaries<'static> {
        let source = self
            .step_sources()
            .unwrap_or_else(|| "none yet".to_string());
        Boundaries::Given {
            source: BoundarySource::LiveSteps { source },
            entries: self.step_positions(device),
        }
    }

    /// Iteration boundaries of device `d`: where frames named by
    /// `step_marker` run (as `open --step-marker` finds them), else the
    /// job's own steps.
    pub fn boundaries_by<'m>(&self, device: usize, step_marker: Option<&'m str>) -> Boundaries<'m> {
        match step_marker {
            Some(m) => Boundaries::Find {
                step_marker: Some(m),
            },
            None => self.boundaries(device),
        }
    }

    /// What only a live job tells, as it stands; `growth` (from the
    /// report's leak analysis) and `nvml` (read by the caller) are left empty.
    pub fn facts(&self) -> LiveFacts {
        let h = self.hello.clone().unwrap_or_default();
        LiveFacts {
            address: self.at.clone(),
            pid: self.hello.as_ref().map(|h| h.pid),
            rank: h.rank,
            world_size: h.world_size,
            hostname: h.hostname,
            argv: h.argv,
            torch: h.torch,
            mode: self.hello.as_ref().map(|h| h.mode.clone()),
            stacks: self.hello.as_ref().map(|h| h.stacks),
            steps_seen: self.steps_seen,
            steps_kept: self.steps.len(),
            step_source: self.step_sources(),
            growth: Vec::new(),
            memory_per_step: self.step_trends(),
            ooms: self.ooms.clone(),
            lost: self.lost.clone(),
            started_over: self.start_overs.clone(),
            nvml: Vec::new(),
            holders: self.holders.clone(),
            ended: self.ended.clone(),
        }
    }
}
