//! Where a GPU's `used` bytes go: the arithmetic behind the reconciliation
//! bars. For our own CUDA runs every term is known (NVML's reading, the
//! context baseline, the allocator's reserved bytes); for another process
//! only NVML's total is; for a simulated device every term is the scenario's.
//! Unknown terms stay `None`, never 0.

use serde::Serialize;

use super::nvml::GpuReading;

/// `used` on the card split into what is known: for our own CUDA runs every
/// term is known; for other processes only NVML's total for the process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Reconciliation {
    /// NVML's reading of what the process holds on the device.
    pub nvml_used: Option<u64>,
    /// The CUDA context and libraries loaded before any tensor.
    pub context: Option<u64>,
    /// The caching allocator's reserved bytes (allocated + cached free).
    pub reserved: Option<u64>,
    /// cuBLAS/NCCL workspaces and anything outside the caching allocator.
    pub other: Option<u64>,
}

impl Reconciliation {
    /// Split `nvml_used` given the context baseline and the model's reserved bytes.
    pub fn known(nvml_used: u64, context: u64, reserved: u64) -> Reconciliation {
        Reconciliation {
            nvml_used: Some(nvml_used),
            context: Some(context),
            reserved: Some(reserved),
            other: Some(nvml_used.saturating_sub(context.saturating_add(reserved))),
        }
    }

    /// Another process: only its total is known.
    pub fn foreign(nvml_used: Option<u64>) -> Reconciliation {
        Reconciliation {
            nvml_used,
            context: None,
            reserved: None,
            other: None,
        }
    }

    /// Our own run, where NVML's reading or the baseline may be missing:
    /// every term that can be known is, `other` only when all three are.
    pub fn own(nvml_used: Option<u64>, context: Option<u64>, reserved: u64) -> Reconciliation {
        match (nvml_used, context) {
            (Some(u), Some(c)) => Reconciliation::known(u, c, reserved),
            _ => Reconciliation {
                nvml_used,
                context,
                reserved: Some(reserved),
                other: None,
            },
        }
    }
}

/// One GPU: NVML's `used` against the sum of what its processes hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeviceReconciliation {
    pub total: Option<u64>,
    pub nvml_used: Option<u64>,
    pub free: Option<u64>,
    /// Processes NVML lists on the device.
    pub processes: usize,
    /// Of those, how many have no memory reading (WDDM, permissions).
    pub unknown_processes: usize,
    /// What the listed processes hold together; `None` when any is unknown.
    pub processes_sum: Option<u64>,
    /// `used` that no listed process accounts for (the driver, processes in
    /// other containers); `None` when `used` or the sum is unknown.
    pub unattributed: Option<u64>,
    /// `total - used - free`: memory the driver keeps back and counts as
    /// neither (NVML's v2 memory info; ~480 MiB on an 80 GB H100).
    pub driver_reserved: Option<u64>,
}

impl DeviceReconciliation {
    pub fn of(g: &GpuReading) -> DeviceReconciliation {
        let unknown_processes = g.processes.iter().filter(|p| p.used.is_none()).count();
        let processes_sum = (unknown_processes == 0)
            .then(|| g.processes.iter().filter_map(|p| p.used).sum::<u64>());
        let unattributed = match (g.used, processes_sum) {
            (Some(used), Some(sum)) => Some(used.saturating_sub(sum)),
            _ => None,
        };
        DeviceReconciliation {
            total: g.total,
            nvml_used: g.used,
            free: g.free,
            processes: g.processes.len(),
            unknown_processes,
            processes_sum,
            unattributed,
            driver_reserved: match (g.total, g.used, g.free) {
                (Some(t), Some(u), Some(f)) => Some(t.saturating_sub(u.saturating_add(f))),
                _ => None,
            },
        }
    }
}

/// A simulated device's terms, as the scenario sets them: its capacity, the
/// driver/context overhead no allocator can use, the allocator's reserved
/// bytes, and what is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SimulatedTerms {
    pub capacity: u64,
    /// `None` where the run does not say (an imported snapshot).
    pub overhead: Option<u64>,
    pub reserved: u64,
    /// `capacity - overhead - reserved`, as the simulated `cudaMemGetInfo` reports it.
    pub free: Option<u64>,
}

impl SimulatedTerms {
    pub fn new(capacity: u64, overhead: Option<u64>, reserved: u64) -> SimulatedTerms {
        SimulatedTerms {
            capacity,
            overhead,
            reserved,
            free: overhead.map(|o| {
                capacity
                    .saturating_sub(o.min(capacity))
                    .saturating_sub(reserved)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::nvml::ProcessMemory;

    fn gpu(used: Option<u64>, procs: &[Option<u64>]) -> GpuReading {
        GpuReading {
            used,
            total: Some(100),
            free: used.map(|u| 100 - u),
            processes: procs
                .iter()
                .enumerate()
                .map(|(i, u)| ProcessMemory {
                    pid: 100 + i as u32,
                    name: None,
                    used: *u,
                })
                .collect(),
            ..GpuReading::unknown(0)
        }
    }

    #[test]
    fn own_run_splits_used_into_context_reserved_other() {
        let r = Reconciliation::known(1000, 300, 600);
        assert_eq!(r.other, Some(100));
        assert_eq!(
            r.context
                .zip(r.reserved)
                .zip(r.other)
                .map(|((c, a), o)| c + a + o),
            r.nvml_used
        );
        // A reading taken before the allocator's growth shows up: never negative.
        assert_eq!(Reconciliation::known(500, 300, 600).other, Some(0));
    }

    #[test]
    fn own_run_without_reading_or_baseline_leaves_other_unknown() {
        let r = Reconciliation::own(None, Some(300), 600);
        assert_eq!((r.nvml_used, r.other, r.reserved), (None, None, Some(600)));
        let r = Reconciliation::own(Some(1000), None, 600);
        assert_eq!((r.context, r.other), (None, None));
        assert_eq!(
            Reconciliation::own(Some(1000), Some(300), 600).other,
            Some(100)
        );
    }

    #[test]
    fn foreign_process_knows_only_its_total() {
        let r = Reconciliation::foreign(Some(42));
        assert_eq!(r.nvml_used, Some(42));
        assert_eq!((r.context, r.reserved, r.other), (None, None, None));
    }

    #[test]
    fn device_sum_against_used() {
        let d = DeviceReconciliation::of(&gpu(Some(70), &[Some(30), Some(25)]));
        assert_eq!(d.processes_sum, Some(55));
        assert_eq!(d.unattributed, Some(15));
        assert_eq!(d.unknown_processes, 0);
    }

    #[test]
    fn one_unknown_process_makes_the_sum_unknown_not_smaller() {
        let d = DeviceReconciliation::of(&gpu(Some(70), &[Some(30), None]));
        assert_eq!(d.unknown_processes, 1);
        assert_eq!(d.processes_sum, None);
        assert_eq!(d.unattributed, None);
        let d = DeviceReconciliation::of(&gpu(None, &[Some(30)]));
        assert_eq!((d.processes_sum, d.unattributed), (Some(30), None));
    }

    #[test]
    fn simulated_free_is_capacity_minus_overhead_minus_reserved() {
        let t = SimulatedTerms::new(1000, Some(100), 600);
        assert_eq!(t.free, Some(300));
        assert_eq!(SimulatedTerms::new(1000, None, 600).free, None);
        assert_eq!(SimulatedTerms::new(1000, Some(2000), 0).free, Some(0));
    }
}
