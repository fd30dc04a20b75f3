//! Live readings from NVML (`nvml-wrapper`): each GPU's memory, utilisation and
//! processes, polled on a thread of its own (memory at 2–4 Hz, processes at
//! most once a second), never from the render thread. Values NVML cannot give
//! (WDDM, unsupported queries) are `None`, shown as unknown, never as zero.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use serde::Serialize;

use super::gpu::GpuUnavailable;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessMemory {
    pub pid: u32,
    /// `None` where NVML reports the value as unavailable (WDDM).
    pub used: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuReading {
    pub index: u32,
    pub name: Option<String>,
    pub total: Option<u64>,
    pub used: Option<u64>,
    pub free: Option<u64>,
    pub utilization_gpu: Option<u32>,
    pub utilization_memory: Option<u32>,
    pub temperature_c: Option<u32>,
    /// Empty until the first process poll.
    pub processes: Vec<ProcessMemory>,
}

/// NVML, initialised once per process (bottom's approach): the error is kept too.
fn nvml() -> Result<&'static Nvml, GpuUnavailable> {
    static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();
    NVML.get_or_init(|| Nvml::init().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| GpuUnavailable::NoNvml(e.clone()))
}

/// Whether NVML can be used on this machine.
pub fn available() -> Result<(), GpuUnavailable> {
    nvml().map(|_| ())
}

/// Read every GPU's memory and utilisation; with `processes`, their processes too.
pub fn read_all(processes: bool) -> Result<Vec<GpuReading>, GpuUnavailable> {
    let nvml = nvml()?;
    let count = nvml
        .device_count()
        .map_err(|e| GpuUnavailable::NoNvml(e.to_string()))?;
    Ok((0..count)
        .map(|index| {
            let Ok(d) = nvml.device_by_index(index) else {
                return GpuReading::unknown(index);
            };
            let mem = d.memory_info().ok();
            let util = d.utilization_rates().ok();
            GpuReading {
                index,
                name: d.name().ok(),
                total: mem.as_ref().map(|m| m.total),
                used: mem.as_ref().map(|m| m.used),
                free: mem.as_ref().map(|m| m.free),
                utilization_gpu: util.as_ref().map(|u| u.gpu),
                utilization_memory: util.as_ref().map(|u| u.memory),
                temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
                processes: if processes {
                    d.running_compute_processes()
                        .map(|ps| {
                            ps.into_iter()
                                .map(|p| ProcessMemory {
                                    pid: p.pid,
                                    used: match p.used_gpu_memory {
                                        UsedGpuMemory::Used(b) => Some(b),
                                        UsedGpuMemory::Unavailable => None,
                                    },
                                })
                                .collect()
                        })
                        .unwrap_or_default()
                } else {
                    Vec::new()
                },
            }
        })
        .collect())
}

impl GpuReading {
    fn unknown(index: u32) -> GpuReading {
        GpuReading {
            index,
            name: None,
            total: None,
            used: None,
            free: None,
            utilization_gpu: None,
            utilization_memory: None,
            temperature_c: None,
            processes: Vec::new(),
        }
    }
}

/// How often the poller reads memory and the process list.
pub const MEMORY_PERIOD: Duration = Duration::from_millis(333);
pub const PROCESS_PERIOD: Duration = Duration::from_millis(1000);

/// Poll NVML on a thread of its own until the receiver is dropped. The first
/// message says whether NVML works here.
pub fn spawn_poller() -> flume::Receiver<Result<Vec<GpuReading>, GpuUnavailable>> {
    let (tx, rx) = flume::bounded(4);
    let spawned = std::thread::Builder::new()
        .name("nvml-poller".into())
        .spawn(move || {
            let mut last_processes: Option<Instant> = None;
            let mut processes: Vec<Vec<ProcessMemory>> = Vec::new();
            loop {
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
                match tx.try_send(reading) {
                    Err(flume::TrySendError::Disconnected(_)) => return,
                    _ if failed => return,
                    _ => {}
                }
                std::thread::sleep(MEMORY_PERIOD);
            }
        });
    if spawned.is_err() {
        let (tx2, rx2) = flume::bounded(1);
        let _ = tx2.send(Err(GpuUnavailable::Driver(
            "could not start the NVML thread".into(),
        )));
        return rx2;
    }
    rx
}

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
            other: Some(nvml_used.saturating_sub(context + reserved)),
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
}
