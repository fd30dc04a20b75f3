//! The NVML poller: every GPU's reading on a thread of its own (memory at
//! ~3 Hz, the process list at most once a second), sent as
//! [`SourceMsg::Gpus`]. The first message says whether NVML works here.

use std::time::{Duration, Instant};

use super::source::{Source, SourceMsg};
use crate::device::nvml::{read_all, ProcessMemory};
use crate::device::GpuUnavailable;

/// How often the poller reads memory and the process list.
pub const MEMORY_PERIOD: Duration = Duration::from_millis(333);
pub const PROCESS_PERIOD: Duration = Duration::from_millis(1000);

/// Poll NVML until the source is dropped.
pub fn nvml_source() -> Source {
    let (tx, rx) = flume::bounded(4);
    let spawned = std::thread::Builder::new()
        .name("nvml-poller".into())
        .spawn(move || {
            let mut last_processes: Option<Instant> = None;
            let mut processes: Vec<Vec<ProcessMemory>> = Vec::new();
            loop {
                let started = Instant::now();
                let due = last_processes.is_none_or(|t| t.elapsed() >= PROCESS_PERIOD);
                let reading = read_all(due).map(|mut gpus| {
                    if due {
                        processes = gpus.iter().map(|g| g.processes.clone()).collect();
                        last_processes = Some(Instant::now());
                    } else {
                        for (g, p) in gpus.iter_mut().zip(&processes) {
                            g.processes = p.clone();
                        }
                    }
                    gpus
                });
                let failed = reading.is_err();
                // Never block on the receiver: a slow UI just misses a reading.
                match tx.try_send(SourceMsg::Gpus(reading)) {
                    Err(flume::TrySendError::Disconnected(_)) => return,
                    _ if failed => return,
                    _ => {}
                }
                // The period includes the reading itself, so memory stays at ~3 Hz.
                std::thread::sleep(MEMORY_PERIOD.saturating_sub(started.elapsed()));
            }
        });
    match spawned {
        Ok(_) => Source::new(rx, None),
        Err(_) => Source::from_messages([SourceMsg::Gpus(Err(GpuUnavailable::Driver(
            "could not start the NVML thread".into(),
        )))]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poller_rates_are_within_the_issue_bounds() {
        // Memory at 2–4 Hz, the process list at most once a second.
        assert!(MEMORY_PERIOD >= Duration::from_millis(250));
        assert!(MEMORY_PERIOD <= Duration::from_millis(500));
        assert!(PROCESS_PERIOD >= Duration::from_secs(1));
    }
}
