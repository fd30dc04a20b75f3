//! A job's `state` messages: their segments read (stacks resolved), a
//! complete state taken as the start, a start-over, or a checkpoint checked
//! against the mirrored maps.

use super::{Applied, PendingState, Session};
use crate::alloc::BlockState;
use crate::job::error::LiveError;
use crate::job::map_diff::map_difference;
use crate::job::message::{StateReason, WireSegment};
use crate::trace::mirror::segments_map;
use crate::trace::snapshot::{Block, FramesId, Segment};

impl Session {
    pub(super) fn segment(
        &self,
        index: u64,
        i: usize,
        s: WireSegment,
    ) -> Result<Segment, LiveError> {
        let mut blocks = Vec::with_capacity(s.blocks.len());
        let (mut allocated, mut active, mut requested) = (0u64, 0u64, 0u64);
        for (j, b) in s.blocks.into_iter().enumerate() {
            let field = format!("segments[{i}].blocks[{j}].stack");
            let frames = self.stack_of(index, "segments", &field, b.stack)?;
            if b.state == BlockState::ActiveAllocated {
                allocated = allocated.saturating_add(b.size);
            }
            if b.state.is_active() {
                active = active.saturating_add(b.size);
                requested = requested.saturating_add(b.requested_size);
            }
            blocks.push(Block {
                address: b.address,
                size: b.size,
                requested_size: b.requested_size,
                state: b.state,
                frames,
            });
        }
        Ok(Segment {
            device: i64::from(s.device),
            address: s.address,
            total_size: s.total_size,
            allocated_size: allocated,
            active_size: active,
            requested_size: requested,
            stream: s.stream,
            segment_type: s.segment_type,
            pool_id: s.pool_id,
            is_expandable: s.is_expandable,
            frames: FramesId::EMPTY,
            blocks,
        })
    }

    pub(super) fn state_if_complete(&mut self, index: u64) -> Result<Applied, LiveError> {
        if self.pending.as_ref().is_some_and(|p| p.header.chunks > 0) {
            return Ok(Applied::Nothing);
        }
        let Some(PendingState {
            header, segments, ..
        }) = self.pending.take()
        else {
            return Ok(Applied::Nothing);
        };
        let Some(next) = self.next_seq else {
            self.start_from(header.seq, segments);
            return Ok(Applied::Started { why: None });
        };
        if header.reason == StateReason::Lost || header.reason == StateReason::Start {
            let lost = self.lost.last().filter(|l| l.seq >= next.min(header.seq));
            let why = match (&header.reason, lost) {
                (StateReason::Lost, Some(l)) => format!(
                    "the job lost {} entries from seq {} ({}): started over from its state at seq {}",
                    l.count.map_or("some".to_string(), |c| c.to_string()),
                    l.seq,
                    l.why,
                    header.seq
                ),
                (StateReason::Lost, None) => format!(
                    "the job lost entries: started over from its state at seq {}",
                    header.seq
                ),
                _ => format!("the job started its log again at seq {}", header.seq),
            };
            self.start_from(header.seq, segments);
            self.note_start_over(&why);
            return Ok(Applied::Started { why: Some(why) });
        }
        if header.seq != next {
            return Err(self.err(
                index,
                "state",
                format!(
                    "a {} state at seq {} where the next entry is seq {next}",
                    header.reason.as_str(),
                    header.seq
                ),
            ));
        }
        match self.first_difference(&segments) {
            None => {
                // The trace does not say which pool a segment made since
                // the start belongs to; a state does.
                for seg in &segments {
                    self.base_pools
                        .insert((seg.device as u8, seg.address), seg.pool_id);
                }
                Ok(Applied::Checkpoint)
            }
            Some(diff) => {
                let why = format!(
                    "the job's {} state at seq {} differs from the map its entries built ({diff}): started over from it",
                    header.reason.as_str(),
                    header.seq
                );
                self.start_from(header.seq, segments);
                self.note_start_over(&why);
                Ok(Applied::Started { why: Some(why) })
            }
        }
    }

    /// Forget the traces and start from `segments` at `seq`.
    pub(super) fn start_from(&mut self, seq: u64, segments: Vec<Segment>) {
        self.base_frames.clear();
        self.base_pools.clear();
        for s in &segments {
            let d = s.device as u8;
            self.base_pools.insert((d, s.address), s.pool_id);
            for b in &s.blocks {
                if b.frames != FramesId::EMPTY {
                    self.base_frames.insert((d, b.address), b.frames);
                }
            }
        }
        self.base = segments;
        let devices = self
            .base
            .iter()
            .map(|s| s.device as usize + 1)
            .max()
            .unwrap_or(0)
            .max(self.maps.len());
        self.maps = (0..devices).map(|d| self.start_map(d)).collect();
        self.seqs = vec![Vec::new(); devices];
        self.snap.device_traces = vec![Vec::new(); devices];
        self.steps.clear();
        self.next_seq = Some(seq);
    }

    /// Where the job's `segments` differ from the mirrored maps, in words.
    pub(super) fn first_difference(&self, segments: &[Segment]) -> Option<String> {
        let mut devices: Vec<usize> = segments.iter().map(|s| s.device as usize).collect();
        devices.extend((0..self.maps.len()).filter(|d| !self.maps[*d].segments.is_empty()));
        devices.sort_unstable();
        devices.dedup();
        for d in devices {
            let theirs = segments_map(segments.iter().filter(|s| s.device == d as i64));
            let ours = self.maps.get(d).cloned().unwrap_or_default();
            if let Some(diff) = map_difference(&ours, &theirs) {
                return Some(format!("device {d}: {diff}"));
            }
        }
        None
    }
}
