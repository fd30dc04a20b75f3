//! A device that hands the allocator what a recorded trace says the real device
//! did: the addresses of `segment_alloc`/`segment_map`, and a failure where the
//! trace shows the allocator had to release memory (or gave up with an OOM).

use std::collections::VecDeque;

use crate::alloc::Action;
use crate::device::{Device, DeviceError};

/// One segment event the trace recorded for the request being replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expected {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
}

/// Addresses for allocations the trace did not record (open traces) start here.
const UNSCRIPTED_BASE: u64 = 0x6000_0000_0000;

#[derive(Debug, Clone)]
pub struct ScriptedDevice {
    total: u64,
    used: u64,
    script: VecDeque<Expected>,
    /// The request ends in an OOM: every device call beyond the script fails.
    fail_unscripted: bool,
    next_unscripted: u64,
    /// Device calls the trace did not show, in words.
    pub surprises: Vec<String>,
}

impl ScriptedDevice {
    pub fn new(total: u64) -> ScriptedDevice {
        ScriptedDevice {
            total,
            used: 0,
            script: VecDeque::new(),
            fail_unscripted: false,
            next_unscripted: UNSCRIPTED_BASE,
            surprises: Vec::new(),
        }
    }

    /// The segment events of the next request, and whether it ended in an OOM.
    pub fn set_script(&mut self, script: impl IntoIterator<Item = Expected>, ends_in_oom: bool) {
        self.script.clear();
        self.script.extend(script);
        self.fail_unscripted = ends_in_oom;
    }

    /// Forget what is left of the script (the request is over).
    pub fn clear_script(&mut self) {
        self.script.clear();
    }

    /// Count memory that existed before the trace started (open traces).
    pub fn adopt(&mut self, bytes: u64) {
        self.used += bytes;
    }

    fn is_release(action: Action) -> bool {
        matches!(action, Action::SegmentFree | Action::SegmentUnmap)
    }

    fn obtain(&mut self, action: Action, addr: Option<u64>, size: u64) -> Result<u64, DeviceError> {
        let refuse = DeviceError::OutOfMemory {
            requested: size,
            free: 0,
        };
        match self.script.front().copied() {
            Some(e) if e.action == action && addr.is_none_or(|a| a == e.addr) => {
                self.script.pop_front();
                if e.size != size {
                    self.surprises.push(format!(
                        "{} of {size} bytes where the trace has {}",
                        action.name(),
                        e.size
                    ));
                }
                self.used += size;
                Ok(e.addr)
            }
            // The trace released memory first: the real device said no.
            Some(e) if Self::is_release(e.action) => Err(refuse),
            Some(e) => {
                self.surprises.push(format!(
                    "{} of {size} bytes where the trace has {} {:#x} of {} bytes",
                    action.name(),
                    e.action.name(),
                    e.addr,
                    e.size
                ));
                Err(refuse)
            }
            None if self.fail_unscripted => Err(refuse),
            None => {
                self.surprises.push(format!(
                    "{} of {size} bytes the trace does not show",
                    action.name()
                ));
                self.used += size;
                let a = addr.unwrap_or(self.next_unscripted);
                if addr.is_none() {
                    self.next_unscripted += size;
                }
                Ok(a)
            }
        }
    }

    fn give_back(&mut self, action: Action, addr: u64, size: u64) {
        self.used = self.used.saturating_sub(size);
        match self.script.front().copied() {
            Some(e) if e.action == action && e.addr == addr && e.size == size => {
                self.script.pop_front();
            }
            _ => self.surprises.push(format!(
                "{} {addr:#x} of {size} bytes the trace does not show here",
                action.name()
            )),
        }
    }
}

impl Device for ScriptedDevice {
    fn name(&self) -> &str {
        "replay"
    }
    fn total_memory(&self) -> u64 {
        self.total
    }
    fn mem_get_info(&self) -> (u64, u64) {
        (self.total.saturating_sub(self.used), self.total)
    }
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.obtain(Action::SegmentAlloc, None, size)
    }
    fn free(&mut self, addr: u64, size: u64) {
        self.give_back(Action::SegmentFree, addr, size);
    }
    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        // A new reservation is mapped from its start: its base is the next map's address.
        match self.script.iter().find(|e| e.action == Action::SegmentMap) {
            Some(e) => Ok(e.addr),
            None => {
                let a = self.next_unscripted;
                self.next_unscripted += size;
                Ok(a)
            }
        }
    }
    fn release_reservation(&mut self, _addr: u64, _size: u64) {}
    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        self.obtain(Action::SegmentMap, Some(addr), size)
            .map(|_| ())
    }
    fn unmap(&mut self, addr: u64, size: u64) {
        self.give_back(Action::SegmentUnmap, addr, size);
    }
}
