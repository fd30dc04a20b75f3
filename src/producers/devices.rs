//! A snapshot's devices: which it holds, which a view shows, where its
//! trace has OOMs, and how to name them — what a view needs to switch.

use std::path::PathBuf;

use crate::alloc::AllocConfig;
use crate::trace::replay::from_snapshot;
use crate::trace::snapshot::Snapshot;

/// The devices a snapshot holds, which one a view shows, and where its
/// trace has OOMs.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotDevices {
    /// The file, to reopen on another device (None: not reopenable).
    pub path: Option<PathBuf>,
    pub devices: Vec<usize>,
    pub current: usize,
    /// Devices whose trace records an OOM.
    pub with_oom: Vec<usize>,
    /// The config a what-if view replays the requests under.
    pub under: Option<AllocConfig>,
}

impl SnapshotDevices {
    /// The device `step` places from the current one, wrapping around.
    pub fn step(&self, step: isize) -> Option<usize> {
        let n = self.devices.len() as isize;
        let at = self.devices.iter().position(|d| *d == self.current)? as isize;
        (n > 1).then(|| self.devices[(at + step).rem_euclid(n) as usize])
    }

    /// The next device after the current one (wrapping) whose trace has an OOM.
    pub fn next_with_oom(&self) -> Option<usize> {
        let after = self
            .with_oom
            .iter()
            .find(|d| **d > self.current)
            .or_else(|| self.with_oom.first())?;
        (*after != self.current).then_some(*after)
    }

    /// `device 1 of 3`.
    pub fn label(&self) -> String {
        let at = self
            .devices
            .iter()
            .position(|d| *d == self.current)
            .map_or(0, |i| i + 1);
        if self.devices.len() > 1 {
            format!("device {} ({at} of {})", self.current, self.devices.len())
        } else {
            format!("device {}", self.current)
        }
    }
}

pub(super) fn devices_with_oom(snap: &Snapshot) -> Vec<usize> {
    (0..snap.device_traces.len())
        .filter(|d| {
            snap.device_traces[*d]
                .iter()
                .any(|e| e.action == crate::alloc::Action::Oom)
        })
        .collect()
}

/// The devices a snapshot holds memory or a trace for, in order.
pub fn snapshot_devices(snap: &Snapshot) -> Vec<usize> {
    let mut devices: Vec<usize> = from_snapshot::traced_devices(snap);
    devices.extend(
        snap.segments
            .iter()
            .filter_map(|s| usize::try_from(s.device).ok()),
    );
    devices.sort_unstable();
    devices.dedup();
    devices
}
