//! Live readings from NVML (`nvml-wrapper`): each GPU's memory, utilisation and
//! processes, read on a thread of its own (`producers::nvml`'s poller), never
//! from the render thread. Values NVML cannot give
//! (WDDM, unsupported queries) are `None`, shown as unknown, never as zero.

use std::sync::OnceLock;

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;
use serde::Serialize;

use super::gpu::GpuUnavailable;
use super::pci::PciAddress;
pub use super::reconcile::{DeviceReconciliation, Reconciliation};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessMemory {
    pub pid: u32,
    /// The process's name as NVML reports it, where it can.
    pub name: Option<String>,
    /// `None` where NVML reports the value as unavailable (WDDM).
    pub used: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuReading {
    pub index: u32,
    /// How a CUDA device is matched to this reading.
    pub pci: Option<PciAddress>,
    /// `GPU-…`: the other name CUDA and NVML share.
    pub uuid: Option<String>,
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
    NVML.get_or_init(|| Nvml::init().map_err(init_error))
        .as_ref()
        .map_err(|e| GpuUnavailable::NoNvml(e.clone()))
}

/// Why NVML did not start, in words a user acts on (the library's own text
/// names its loader: "a libloading error occurred: …").
fn init_error(e: nvml_wrapper::error::NvmlError) -> String {
    use nvml_wrapper::error::NvmlError;
    match e {
        NvmlError::LibloadingError(_) => {
            "NVML's library (libnvidia-ml.so.1, part of the NVIDIA driver) is not installed on \
             this machine"
                .to_string()
        }
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".to_string(),
        NvmlError::NoPermission => "no permission to use the NVIDIA driver".to_string(),
        other => other.to_string(),
    }
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
                pci: d.pci_info().ok().map(|p| PciAddress {
                    domain: p.domain,
                    bus: p.bus,
                    device: p.device,
                }),
                uuid: d.uuid().ok(),
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
                                    name: nvml.sys_process_name(p.pid, 64).ok(),
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
    /// What NVML says process `pid` holds on this GPU: `None` when the
    /// process is not listed or its memory is unavailable.
    pub fn process_used(&self, pid: u32) -> Option<u64> {
        self.processes
            .iter()
            .find(|p| p.pid == pid)
            .and_then(|p| p.used)
    }

    pub fn unknown(index: u32) -> GpuReading {
        GpuReading {
            index,
            pci: None,
            uuid: None,
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

/// The reading of the GPU at `pci`: `None` when the address is unknown or
/// NVML does not list it (never a guess by index: see [`PciAddress`]).
pub fn reading_at(gpus: &[GpuReading], pci: Option<PciAddress>) -> Option<&GpuReading> {
    let pci = pci?;
    gpus.iter().find(|g| g.pci == Some(pci))
}

/// What NVML says this very process holds on the GPU at `pci` (its CUDA
/// context right after the device was opened). Reads NVML: never call it
/// from the render thread.
pub fn own_process_used(pci: Option<PciAddress>) -> Result<Option<u64>, GpuUnavailable> {
    let gpus = read_all(true)?;
    Ok(reading_at(&gpus, pci).and_then(|g| g.process_used(std::process::id())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_used_is_unknown_for_an_unlisted_or_unreported_process() {
        let g = GpuReading {
            processes: vec![
                ProcessMemory {
                    pid: 1,
                    name: None,
                    used: Some(7),
                },
                ProcessMemory {
                    pid: 2,
                    name: None,
                    used: None,
                },
            ],
            ..GpuReading::unknown(0)
        };
        assert_eq!(g.process_used(1), Some(7));
        assert_eq!(g.process_used(2), None);
        assert_eq!(g.process_used(3), None);
    }

    #[test]
    fn a_cuda_device_finds_its_reading_by_pci_address_not_by_number() {
        let at = |bus| PciAddress {
            domain: 0,
            bus,
            device: 0,
        };
        // CUDA_VISIBLE_DEVICES=1: cuda:0 is NVML's GPU 1.
        let gpus = [
            GpuReading {
                pci: Some(at(0x1b)),
                ..GpuReading::unknown(0)
            },
            GpuReading {
                pci: Some(at(0x3b)),
                ..GpuReading::unknown(1)
            },
        ];
        assert_eq!(reading_at(&gpus, Some(at(0x3b))).map(|g| g.index), Some(1));
        assert_eq!(reading_at(&gpus, Some(at(0x5e))), None, "not listed");
        assert_eq!(reading_at(&gpus, None), None, "unknown address: no guess");
    }
}
