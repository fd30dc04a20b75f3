//! A simulated GPU: a capacity, a driver-side overhead, and deterministic addresses.

use super::driver_va::{DriverVa, Placement};
use super::{Device, DeviceError};

/// First `cudaMalloc` address, as in allocator.md §16's examples.
pub const SIM_MALLOC_BASE: u64 = 0x7f00_0000_0000;
/// Expandable reservations come from a separate range, so enabling expandable
/// segments does not move the addresses of plain segments.
pub const SIM_RESERVE_BASE: u64 = 0x7e00_0000_0000;
/// Reservations start on a 2 MiB boundary like the driver's granularity.
const RESERVE_ALIGN: u64 = 2 << 20;

/// A device with `total` bytes of which `overhead` (CUDA context, other
/// processes) is never available to the allocator. `cudaMalloc` succeeds iff
/// the bytes fit; each new segment starts where the previous one ended, or
/// where a model of a GPU driver puts it ([`SimDevice::placed`]).
#[derive(Debug, Clone)]
pub struct SimDevice {
    name: String,
    total: u64,
    overhead: u64,
    used: u64,
    next_malloc: u64,
    next_reserve: u64,
    /// The driver's address allocator, where one is modelled.
    driver: Option<DriverVa>,
}

impl SimDevice {
    pub fn new(name: impl Into<String>, total: u64, overhead: u64) -> SimDevice {
        SimDevice {
            name: name.into(),
            total,
            overhead: overhead.min(total),
            used: 0,
            next_malloc: SIM_MALLOC_BASE,
            next_reserve: SIM_RESERVE_BASE,
            driver: None,
        }
    }

    /// The same device with its segments laid out by `placement`.
    pub fn placed(mut self, placement: Placement) -> SimDevice {
        self.driver = match placement {
            Placement::InOrder => None,
            Placement::H100Driver => Some(DriverVa::new(SIM_MALLOC_BASE)),
        };
        self
    }

    /// Bytes the allocator holds on this device right now.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Count memory that was already held when the simulation began (an
    /// open trace's adopted segments).
    pub fn claim(&mut self, bytes: u64) {
        self.used = (self.used + bytes).min(self.total - self.overhead);
    }

    pub fn overhead(&self) -> u64 {
        self.overhead
    }

    fn free_bytes(&self) -> u64 {
        self.total - self.overhead - self.used
    }

    fn take(&mut self, size: u64) -> Result<(), DeviceError> {
        let free = self.free_bytes();
        if size > free {
            return Err(DeviceError::OutOfMemory {
                requested: size,
                free,
            });
        }
        self.used += size;
        Ok(())
    }
}

impl Device for SimDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn total_memory(&self) -> u64 {
        self.total
    }
    fn mem_get_info(&self) -> (u64, u64) {
        (self.free_bytes(), self.total)
    }
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.take(size)?;
        if let Some(d) = &mut self.driver {
            return Ok(d.malloc(size));
        }
        let addr = self.next_malloc;
        self.next_malloc += size;
        Ok(addr)
    }
    fn free(&mut self, addr: u64, size: u64) {
        self.used = self.used.saturating_sub(size);
        if let Some(d) = &mut self.driver {
            d.free(addr, size);
        }
    }
    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        let addr = self.next_reserve;
        self.next_reserve = addr
            .checked_add(size.div_ceil(RESERVE_ALIGN) * RESERVE_ALIGN)
            .ok_or(DeviceError::AddressSpace(size))?;
        Ok(addr)
    }
    fn release_reservation(&mut self, _addr: u64, _size: u64) {}
    fn map(&mut self, _addr: u64, size: u64) -> Result<(), DeviceError> {
        self.take(size)
    }
    fn unmap(&mut self, _addr: u64, size: u64) {
        self.used = self.used.saturating_sub(size);
    }
    fn kernels_started(&mut self) {
        if let Some(d) = &mut self.driver {
            d.kernels_started();
        }
    }
}
