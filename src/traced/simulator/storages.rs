//! The program's storages and the cached workspaces on the allocator model:
//! each storage a `malloc` (waited on, or posted within the headroom), each
//! one that dies a `free`, and the stacks the requests point to.

use std::io::Write;

use serde_json::{json, Value};

use super::super::args::{bad, stack_at, str_at, u64_at};
use super::super::error::TraceError;
use super::super::outcome::Untraced;
use super::super::wire::tag_of;
use super::{Frames, Reply, Simulator, HEADROOM_SEGMENT};
use crate::alloc::AllocError;
use crate::device::Device;
use crate::trace::snapshot::is_module_conversion;

impl<W: Write> Simulator<W> {
    /// One block for the program or a workspace: its address, or the OOM
    /// message PyTorch would raise (the OOM is out on the stream too).
    pub(in crate::traced) fn malloc(
        &mut self,
        bytes: u64,
        stack: Option<u32>,
    ) -> Result<Result<u64, String>, TraceError> {
        if !self.kernels_started && !self.converting(stack) {
            self.kernels_started = true;
            self.allocator()?.device_mut().kernels_started();
        }
        let r = self.allocator()?.malloc(bytes, 0, tag_of(stack));
        self.emit()?;
        match r {
            Ok(addr) => Ok(Ok(addr)),
            Err(AllocError::OutOfMemory(info)) => {
                self.outcome.ooms += 1;
                let stats = self.stats_value();
                self.out.oom(
                    &info.message,
                    info.device_free,
                    info.device_total,
                    info.alloc_size,
                    &stats,
                )?;
                Ok(Err(info.message))
            }
            Err(e) => Ok(Err(e.to_string())),
        }
    }

    /// Whether a request from `stack` is a module's `.to()` (`nn.Module._apply`).
    fn converting(&self, stack: Option<u32>) -> bool {
        stack
            .and_then(|s| self.stacks.get(s as usize))
            .is_some_and(|frames| {
                frames
                    .iter()
                    .any(|(file, _, name)| is_module_conversion(file, name))
            })
    }

    /// `m`: a storage the program waits on (it may not fit), answered with
    /// the headroom for the ones it may then send without waiting (`ma`).
    pub(super) fn malloc_request(&mut self, index: u64, v: &Value) -> Result<Reply, TraceError> {
        let cd = u64_at(v, 1, index)?;
        let bytes = u64_at(v, 2, index)?;
        let stack = stack_at(v, 3);
        Ok(Some(match self.malloc(bytes, stack)? {
            Ok(addr) => {
                self.outcome.allocations += 1;
                self.storages.insert(cd, addr);
                let (room, count) = self.headroom()?;
                json!(["ok", room, count])
            }
            Err(message) => json!(["oom", message]),
        }))
    }

    /// `ma`: a storage sent within the headroom, which cannot run out of
    /// memory; should it (a fault of the headroom), the trace says so.
    pub(super) fn malloc_posted(&mut self, index: u64, v: &Value) -> Result<Reply, TraceError> {
        let cd = u64_at(v, 1, index)?;
        let bytes = u64_at(v, 2, index)?;
        match self.malloc(bytes, stack_at(v, 3))? {
            Ok(addr) => {
                self.outcome.allocations += 1;
                self.storages.insert(cd, addr);
            }
            Err(_) if self.replaying => {}
            Err(message) => self.outcome.untraced.push(Untraced {
                what: format!("a {bytes} B storage sent without waiting"),
                why: message,
                at: None,
                instead: "the program did not get its OOM: vramscope's headroom was wrong (a bug)"
                    .into(),
            }),
        }
        Ok(None)
    }

    /// How much the program may allocate before it must wait again: storages
    /// of at most `room` bytes in all and `count` in number cannot run out of
    /// memory, whatever the cache holds. Each takes at most a segment of
    /// 2·size + 20 MiB (size rounding, `roundup_power2_divisions` at most
    /// doubling, a 20 MiB segment for a mid-size request; allocator.md §3),
    /// and 2·room + 20 MiB·count stays within half the memory the device and
    /// the fraction leave.
    pub(super) fn headroom(&mut self) -> Result<(u64, u64), TraceError> {
        let a = self.allocator()?;
        let (device_free, _) = a.device().mem_get_info();
        let free = match a.memory_fraction_limit() {
            Some(limit) => device_free.min(limit.saturating_sub(a.reserved_total())),
            None => device_free,
        };
        let half = free / 2;
        Ok((half / 4, half / 2 / HEADROOM_SEGMENT))
    }

    pub(super) fn free(&mut self, cd: u64) -> Result<(), TraceError> {
        if let Some(addr) = self.storages.remove(&cd) {
            self.free_block(addr)?;
        }
        Ok(())
    }

    pub(in crate::traced) fn free_block(&mut self, addr: u64) -> Result<(), TraceError> {
        let r = self.allocator()?.free(addr);
        self.emit()?;
        r.map_err(|e| TraceError::Channel(format!("the allocator refused a free: {e}")))
    }

    pub(super) fn define_stack(&mut self, index: u64, v: &Value) -> Result<Reply, TraceError> {
        let id = u64_at(v, 1, index)?;
        let id32 = u32::try_from(id).map_err(|_| bad(index, "stack id past 2^32"))?;
        let raw = v.get(2).cloned().unwrap_or(Value::Array(Vec::new()));
        let frames: Frames = raw
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|f| {
                        (
                            str_at(f, 0),
                            f.get(1).and_then(Value::as_i64).unwrap_or(0),
                            str_at(f, 2),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let slot = usize::try_from(id).map_err(|_| bad(index, "stack id"))?;
        if self.stacks.len() <= slot {
            self.stacks.resize(slot + 1, Vec::new());
        }
        self.stacks[slot] = frames;
        self.out.stack(id32, &raw)?;
        Ok(None)
    }

    pub(super) fn clear_workspaces(&mut self) -> Result<(), TraceError> {
        let held: Vec<u64> = self
            .ws
            .cublas
            .iter_mut()
            .chain(self.ws.lt.iter_mut())
            .filter_map(Option::take)
            .collect();
        for a in held {
            self.free_block(a)?;
        }
        Ok(())
    }
}
