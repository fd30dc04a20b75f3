//! The run's allocator requests, kept compact as they go by, so that an OOM
//! (or the cache's growth) can be replayed under other allocator settings:
//! the what-if comes from the allocator itself, never from a rule of thumb.

use crate::alloc::{Action, AllocConfig};
use crate::device::SimDevice;
use crate::trace::replay::whatif::{retry_at, RetryOutcome};
use crate::trace::replay::Entry;
use crate::trace::{Event, Marker};

/// The device and allocator settings the run's requests were made under.
#[derive(Debug, Clone, Default)]
pub struct RunDevice {
    pub name: String,
    /// The device's memory, and what of it is never the allocator's.
    pub total: u64,
    pub overhead: u64,
    /// How its segments were laid out (a what-if replays them the same way).
    pub placement: crate::device::Placement,
    pub config: AllocConfig,
}

/// Every `alloc`, `free_requested` and `oom` of a run, and where it called
/// `empty_cache()`.
#[derive(Debug, Clone, Default)]
pub struct RequestLog {
    pub(super) entries: Vec<Entry>,
    pub(super) empty_cache_at: Vec<usize>,
    /// Where each iteration's requests begin, by iteration (from 1).
    pub(super) iteration_starts: Vec<(u32, usize)>,
    /// The run left its `Setup` phase: the engine told its device that the
    /// program's kernels started (the entries after are not
    /// [`Entry::before_kernels`]).
    past_setup: bool,
}

impl RequestLog {
    /// Take what a run's event says about its requests.
    pub fn record(&mut self, e: &Event) {
        match e {
            Event::Alloc(a) => {
                if matches!(
                    a.action,
                    Action::Alloc | Action::FreeRequested | Action::Oom
                ) {
                    self.entries.push(Entry {
                        action: a.action,
                        addr: a.addr,
                        size: a.size,
                        stream: a.stream,
                        in_empty_cache: false,
                        before_kernels: !self.past_setup,
                    });
                }
            }
            Event::Marker(Marker::EmptyCache) => self.empty_cache_at.push(self.entries.len()),
            Event::Marker(Marker::IterationBegin(i)) => {
                self.iteration_starts.push((*i, self.entries.len()))
            }
            Event::Marker(Marker::PhaseBegin(p)) if *p != crate::trace::Phase::Setup => {
                self.past_setup = true
            }
            _ => {}
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The iteration request `i` was made in (0: before the first).
    pub fn iteration_of(&self, i: usize) -> u32 {
        let k = self.iteration_starts.partition_point(|(_, at)| *at <= i);
        k.checked_sub(1).map_or(0, |k| self.iteration_starts[k].0)
    }

    /// The last request that did not fit, by its index.
    pub fn last_oom(&self) -> Option<usize> {
        self.entries.iter().rposition(|e| e.action == Action::Oom)
    }

    /// The failing request `at` tried again under `config` on the run's
    /// device: every request before it replayed, then (optionally after
    /// `empty_cache()`) the request itself.
    pub fn retry(
        &self,
        at: usize,
        device: &RunDevice,
        config: AllocConfig,
        empty_cache_first: bool,
    ) -> RetryOutcome {
        let requests = crate::trace::replay::whatif::Requests {
            entries: &self.entries,
            empty_cache_at: &self.empty_cache_at,
            start: None,
        };
        let sim = SimDevice::new(device.name.clone(), device.total, device.overhead)
            .placed(device.placement);
        retry_at(&requests, config, sim, at, empty_cache_first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocEvent, Pool, Tag};
    use crate::trace::Phase;

    fn alloc(addr: u64) -> Event {
        Event::Alloc(AllocEvent {
            action: Action::Alloc,
            addr,
            size: 512,
            block_size: 512,
            stream: 0,
            pool: Pool::Small,
            device_free: 0,
            tag: Tag::NONE,
        })
    }

    #[test]
    fn requests_before_the_first_phase_past_setup_are_before_kernels() {
        let mut log = RequestLog::default();
        for e in [
            alloc(1),
            Event::Marker(Marker::PhaseBegin(Phase::Setup)),
            alloc(2),
            Event::Marker(Marker::PhaseEnd(Phase::Setup)),
            Event::Marker(Marker::PhaseBegin(Phase::Forward)),
            alloc(3),
            Event::Marker(Marker::PhaseBegin(Phase::Setup)),
            alloc(4),
        ] {
            log.record(&e);
        }
        let before: Vec<bool> = log.entries.iter().map(|e| e.before_kernels).collect();
        // Once started, kernels stay started (the engine tells its device once).
        assert_eq!(before, [true, true, false, false]);
    }
}
