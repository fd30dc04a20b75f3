//! A snapshot view's devices: `d` / `D` show the file's next / previous
//! device, `x` goes on to the next device whose trace has an OOM, and every
//! other view of the same file (compare) follows.

use super::{App, RunView};
use crate::producers::{reopen_on, SnapshotDevices};

impl App {
    pub(super) fn step_device(&mut self, step: isize) -> bool {
        let target = self
            .active_run()
            .and_then(|r| r.devices.as_ref())
            .map(|d| d.step(step));
        match target {
            Some(Some(device)) => self.switch_device(device, false),
            Some(None) => {
                self.notice = Some("this snapshot holds one device".into());
                true
            }
            None => {
                self.notice = Some("devices: only a snapshot has several".into());
                true
            }
        }
    }

    /// Show `device` of the active snapshot in place of the current one, and
    /// in every other view of the same file (compare: as recorded against a
    /// what-if); with `then_oom`, at its first OOM once the events hold it.
    pub(super) fn switch_device(&mut self, device: usize, then_oom: bool) -> bool {
        let Some(path) = self
            .active_run()
            .and_then(|r| r.devices.as_ref())
            .map(|d| d.path.clone())
        else {
            return false;
        };
        let same_file = |r: &RunView| {
            r.devices
                .as_ref()
                .is_some_and(|d| d.path.is_some() && d.path == path && d.devices.contains(&device))
        };
        let targets: Vec<usize> = (0..self.runs.len())
            .filter(|i| *i == self.active || same_file(&self.runs[*i]))
            .collect();
        for i in targets {
            let Some(devices) = self.runs[i].devices.clone() else {
                continue;
            };
            match reopen_on(&devices, device) {
                Ok(source) => {
                    let mut run = RunView::new(self.runs[i].title.clone(), source);
                    run.pending_oom = then_oom;
                    // The file's figures cover all its devices.
                    run.summary = self.runs[i].summary.clone();
                    // What the file holds is known already: a second d
                    // before the file is read again goes on from here.
                    run.devices = Some(SnapshotDevices {
                        current: device,
                        ..devices
                    });
                    self.runs[i] = run;
                    self.notice = then_oom.then(|| format!("the next OOM is on device {device}"));
                }
                Err(e) => {
                    self.notice = Some(e);
                    return true;
                }
            }
        }
        self.playing = false;
        self.drain_sources();
        true
    }
}
