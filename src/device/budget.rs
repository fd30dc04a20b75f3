//! A real GPU held to a scenario's device: the scenario says "a 1 GiB GPU
//! with 200 MiB taken by the context", and a run on an 80 GiB card must make
//! the allocator decisions (OOMs, cache frees and retries included) that the
//! smaller card would. Memory still comes from the real device; only what the
//! allocator may hold and what `cudaMemGetInfo` reports are the scenario's,
//! exactly as [`super::SimDevice`] computes them.

use super::{Device, DeviceError};

pub struct Budgeted<D> {
    inner: D,
    /// The scenario's device capacity.
    total: u64,
    /// Of which never available to the allocator (context, other processes).
    overhead: u64,
    used: u64,
}

impl<D: Device> Budgeted<D> {
    pub fn new(inner: D, total: u64, overhead: u64) -> Budgeted<D> {
        Budgeted {
            inner,
            total,
            overhead: overhead.min(total),
            used: 0,
        }
    }

    /// Bytes the allocator may hold: the scenario's capacity less its overhead.
    pub fn budget(&self) -> u64 {
        self.total - self.overhead
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    fn free_bytes(&self) -> u64 {
        self.budget() - self.used
    }

    fn within(&self, size: u64) -> Result<(), DeviceError> {
        let free = self.free_bytes();
        if size > free {
            return Err(DeviceError::OutOfMemory {
                requested: size,
                free,
            });
        }
        Ok(())
    }
}

impl<D: Device> Device for Budgeted<D> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn total_memory(&self) -> u64 {
        self.total
    }
    fn mem_get_info(&self) -> (u64, u64) {
        (self.free_bytes(), self.total)
    }
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.within(size)?;
        let addr = self.inner.malloc(size)?;
        self.used += size;
        Ok(addr)
    }
    fn free(&mut self, addr: u64, size: u64) {
        self.inner.free(addr, size);
        self.used = self.used.saturating_sub(size);
    }
    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.inner.reserve(size)
    }
    fn release_reservation(&mut self, addr: u64, size: u64) {
        self.inner.release_reservation(addr, size)
    }
    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        self.within(size)?;
        self.inner.map(addr, size)?;
        self.used += size;
        Ok(())
    }
    fn unmap(&mut self, addr: u64, size: u64) {
        self.inner.unmap(addr, size);
        self.used = self.used.saturating_sub(size);
    }
    fn kernels_started(&mut self) {
        self.inner.kernels_started()
    }
}

/// The capacity a scenario's run on a card of `card_total` bytes is held to:
/// the scenario's own when the card is larger, none otherwise (then the
/// driver itself refuses what does not fit).
pub fn held_to(scenario_total: u64, card_total: u64) -> Option<u64> {
    (scenario_total <= card_total).then_some(scenario_total)
}

/// A real device as a scenario's run sees it: held to the scenario's
/// capacity and overhead when [`held_to`] says so, as it is otherwise.
pub fn scenario_sized<D: Device + Send + 'static>(
    dev: D,
    total: u64,
    overhead: u64,
) -> super::AnyDevice {
    match held_to(total, dev.total_memory()) {
        Some(total) => Box::new(Budgeted::new(dev, total, overhead)),
        None => Box::new(dev),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::SimDevice;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_big_device_held_to_a_small_budget_refuses_what_the_small_one_would() {
        let mut small = SimDevice::new("small", 100 * MIB, 20 * MIB);
        let mut big = Budgeted::new(SimDevice::new("big", 80 << 30, 0), 100 * MIB, 20 * MIB);
        for (i, size) in [40 * MIB, 30 * MIB, 20 * MIB, 10 * MIB]
            .into_iter()
            .enumerate()
        {
            let a = small.malloc(size).map(|_| ());
            let b = big.malloc(size).map(|_| ());
            assert_eq!(a, b, "malloc {i} of {size}");
            assert_eq!(small.mem_get_info(), big.mem_get_info(), "after malloc {i}");
        }
        // 40 + 30 fit in 80 MiB, 20 does not (10 left), 10 does.
        assert_eq!(big.mem_get_info(), (0, 100 * MIB));
        big.free(0, 30 * MIB);
        assert_eq!(big.mem_get_info().0, 30 * MIB);
        assert!(big.map(0, 32 * MIB).is_err(), "expandable pages count too");
        assert!(big.map(0, 30 * MIB).is_ok());
        big.unmap(0, 30 * MIB);
        assert_eq!(big.mem_get_info().0, 30 * MIB);
    }

    #[test]
    fn the_real_device_can_still_refuse_inside_the_budget() {
        let mut b = Budgeted::new(SimDevice::new("tiny", 10 * MIB, 0), 1 << 30, 0);
        assert!(matches!(
            b.malloc(20 * MIB),
            Err(DeviceError::OutOfMemory { .. })
        ));
        assert_eq!(
            b.mem_get_info().0,
            1 << 30,
            "a refused malloc holds nothing"
        );
    }
}
