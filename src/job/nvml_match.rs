//! A live job's GPUs as NVML sees them from here, beside what the job's
//! caching allocator reserved (issue 29, "NVML reconciliation for that
//! process"). The difference is what the process holds outside the caching
//! allocator: the CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers and
//! other libraries' memory.
//!
//! A job's device is found among NVML's GPUs by UUID, then PCI bus id (both
//! from the job's hello); only when the job gave neither, by CUDA ordinal,
//! which `CUDA_VISIBLE_DEVICES` can renumber, so the match says so. Nothing
//! is guessed: a GPU or a process NVML does not list is said to be missing,
//! and why that can be.

use std::net::IpAddr;

use serde::Serialize;

use super::address::Address;
use super::session::Session;
use crate::alloc::format_size;
use crate::device::nvml::GpuReading;
use crate::device::PciAddress;
use crate::units::format_size_or_unknown as size;

/// The `memory_stats()` key of the bytes the caching allocator reserved.
pub const STATS_RESERVED: &str = "reserved_bytes.all.current";

/// What the difference between NVML and the allocator is made of.
pub const DIFFERENCE_IS: &str =
    "CUDA context, cuBLAS/cuDNN workspaces, memory outside the caching allocator (NCCL, other libraries)";

/// Where the job runs, as seen from this vramscope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobPlace {
    /// On this machine: a unix socket, or TCP to a loopback address.
    Here,
    /// Reached over TCP at `host`, not loopback: NVML here reads this
    /// machine's GPUs, not the job's.
    Remote { host: String },
    /// A recording played back: the job is not running here.
    Recording,
}

impl JobPlace {
    pub fn of(address: &Address) -> JobPlace {
        match address {
            Address::Unix(_) => JobPlace::Here,
            Address::Tcp { host, .. } if is_loopback(host) => JobPlace::Here,
            Address::Tcp { host, .. } => JobPlace::Remote { host: host.clone() },
        }
    }
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// What the job's stream says of one of its devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobDevice {
    /// The job's CUDA ordinal.
    pub device: u8,
    pub name: Option<String>,
    pub pci: Option<PciAddress>,
    pub uuid: Option<String>,
    /// Bytes the caching allocator reserved, as the stream built them
    /// (the job's state and the entries since); `None` before its state.
    pub reserved: Option<u64>,
    /// `memory_stats()`'s reserved bytes, where the job sent them.
    pub stats_reserved: Option<u64>,
}

/// The job as far as NVML matching needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveJob {
    pub pid: Option<u32>,
    pub hostname: Option<String>,
    pub devices: Vec<JobDevice>,
}

impl LiveJob {
    pub fn of_session(s: &Session) -> LiveJob {
        let hello = s.hello();
        let devices = s
            .devices()
            .into_iter()
            .filter_map(|d| u8::try_from(d).ok())
            .map(|d| {
                let said = hello.and_then(|h| h.devices.iter().find(|x| x.device == d));
                JobDevice {
                    device: d,
                    name: said.and_then(|x| x.name.clone()),
                    pci: said.and_then(|x| x.pci_bus_id),
                    uuid: said.and_then(|x| x.uuid.clone()),
                    reserved: s
                        .started()
                        .then(|| s.map(usize::from(d)).map_or(0, |m| m.reserved)),
                    stats_reserved: s
                        .stats()
                        .iter()
                        .find(|x| x.device == d)
                        .and_then(|x| x.get(STATS_RESERVED))
                        .and_then(|v| u64::try_from(v).ok()),
                }
            })
            .collect();
        LiveJob {
            pid: hello.and_then(|h| u32::try_from(h.pid).ok()),
            hostname: hello.and_then(|h| h.hostname.clone()),
            devices,
        }
    }
}

/// How a job's device was found among NVML's GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchedBy {
    Uuid,
    PciBusId,
    /// The job gave no UUID or bus id: NVML's index taken as the CUDA
    /// ordinal, which `CUDA_VISIBLE_DEVICES` can renumber.
    Ordinal,
}

impl MatchedBy {
    pub fn describe(self) -> &'static str {
        match self {
            MatchedBy::Uuid => "matched by UUID",
            MatchedBy::PciBusId => "matched by PCI bus id",
            MatchedBy::Ordinal => {
                "matched by CUDA ordinal only (the job gave no UUID or bus id; CUDA_VISIBLE_DEVICES can renumber)"
            }
        }
    }
}

/// The GPU NVML lists for the job's device, and how it was found; `None`
/// when the job named its device and NVML lists no such GPU.
pub fn find_gpu<'a>(d: &JobDevice, gpus: &'a [GpuReading]) -> Option<(&'a GpuReading, MatchedBy)> {
    if let Some(u) = &d.uuid {
        let want = bare_uuid(u);
        if let Some(g) = gpus.iter().find(|g| {
            g.uuid
                .as_deref()
                .is_some_and(|x| bare_uuid(x).eq_ignore_ascii_case(want))
        }) {
            return Some((g, MatchedBy::Uuid));
        }
    }
    if let Some(p) = d.pci {
        if let Some(g) = gpus.iter().find(|g| g.pci == Some(p)) {
            return Some((g, MatchedBy::PciBusId));
        }
    }
    if d.uuid.is_some() || d.pci.is_some() {
        return None;
    }
    gpus.iter()
        .find(|g| g.index == u32::from(d.device))
        .map(|g| (g, MatchedBy::Ordinal))
}

/// torch writes a UUID bare, NVML with `GPU-`.
fn bare_uuid(u: &str) -> &str {
    u.strip_prefix("GPU-").unwrap_or(u)
}

/// NVML here, as the caller has it.
#[derive(Debug, Clone, Copy)]
pub enum NvmlNow<'a> {
    /// No reading has come yet.
    Waiting,
    /// NVML cannot be used here, and why.
    Unavailable(&'a str),
    Read(&'a [GpuReading]),
}

/// Why there is no NVML reading of the job's process on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    Recording,
    Remote {
        host: String,
        hostname: Option<String>,
    },
    Waiting,
    NoNvml(String),
    NoPid,
    NoSuchGpu {
        device: u8,
        by: String,
        listed: usize,
    },
    NoProcesses {
        gpu: u32,
    },
    PidNotListed {
        pid: u32,
        gpu: u32,
        listed: usize,
    },
    MemoryNotReported {
        pid: u32,
        gpu: u32,
    },
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unavailable::Recording => {
                write!(f, "a recording: the job is not running here, so NVML has nothing to read of it")
            }
            Unavailable::Remote { host, hostname } => write!(
                f,
                "the job runs on another host ({}reached over TCP at {host}, not loopback): NVML here reads this machine's GPUs, not the job's",
                hostname.as_ref().map_or(String::new(), |h| format!("{h}, "))
            ),
            Unavailable::Waiting => write!(f, "waiting for NVML's first reading"),
            Unavailable::NoNvml(why) => write!(f, "NVML unavailable here: {why}"),
            Unavailable::NoPid => write!(f, "the job has not said its pid yet"),
            Unavailable::NoSuchGpu { device, by, listed } => write!(
                f,
                "NVML lists no GPU with the job's {by} for cuda:{device} ({listed} GPU{} listed here)",
                if *listed == 1 { "" } else { "s" }
            ),
            Unavailable::NoProcesses { gpu } => write!(
                f,
                "NVML lists no process on GPU {gpu}: the job's pid is not visible here (in a container NVML may list none)"
            ),
            Unavailable::PidNotListed { pid, gpu, listed } => write!(
                f,
                "pid {pid} is not among the {listed} process{} NVML lists on GPU {gpu} (a job in another PID namespace, such as a container, has another pid here)",
                if *listed == 1 { "" } else { "es" }
            ),
            Unavailable::MemoryNotReported { pid, gpu } => write!(
                f,
                "NVML lists pid {pid} on GPU {gpu} but does not report its memory (WDDM, or no permission)"
            ),
        }
    }
}

/// NVML's reading of the job's process on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmlRead {
    pub matched_by: MatchedBy,
    /// NVML's index of the GPU.
    pub gpu: u32,
    pub used_by_process: u64,
    /// `used_by_process` − the reserved bytes (the stream's, else
    /// `memory_stats()`'s); negative when NVML's reading is older than
    /// the allocator's growth. `None` when neither reserved is known.
    pub difference: Option<i64>,
}

/// One job device against NVML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNvml {
    pub device: u8,
    pub name: Option<String>,
    pub reserved: Option<u64>,
    pub stats_reserved: Option<u64>,
    pub reading: Result<NvmlRead, Unavailable>,
}

/// Each of the job's devices against NVML here.
pub fn reconcile(job: &LiveJob, place: &JobPlace, nvml: NvmlNow<'_>) -> Vec<DeviceNvml> {
    job.devices
        .iter()
        .map(|d| DeviceNvml {
            device: d.device,
            name: d.name.clone(),
            reserved: d.reserved,
            stats_reserved: d.stats_reserved,
            reading: read_device(job, d, place, nvml),
        })
        .collect()
}

fn read_device(
    job: &LiveJob,
    d: &JobDevice,
    place: &JobPlace,
    nvml: NvmlNow<'_>,
) -> Result<NvmlRead, Unavailable> {
    match place {
        JobPlace::Recording => return Err(Unavailable::Recording),
        JobPlace::Remote { host } => {
            return Err(Unavailable::Remote {
                host: host.clone(),
                hostname: job.hostname.clone(),
            })
        }
        JobPlace::Here => {}
    }
    let gpus = match nvml {
        NvmlNow::Waiting => return Err(Unavailable::Waiting),
        NvmlNow::Unavailable(why) => return Err(Unavailable::NoNvml(why.to_string())),
        NvmlNow::Read(g) => g,
    };
    let pid = job.pid.ok_or(Unavailable::NoPid)?;
    let (gpu, matched_by) = find_gpu(d, gpus).ok_or_else(|| Unavailable::NoSuchGpu {
        device: d.device,
        by: match (&d.uuid, d.pci) {
            (Some(u), Some(p)) => format!("UUID {u} or PCI bus id {p}"),
            (Some(u), None) => format!("UUID {u}"),
            (None, Some(p)) => format!("PCI bus id {p}"),
            (None, None) => format!("ordinal {}", d.device),
        },
        listed: gpus.len(),
    })?;
    let at = gpu.index;
    if gpu.processes.is_empty() {
        return Err(Unavailable::NoProcesses { gpu: at });
    }
    let Some(p) = gpu.processes.iter().find(|p| p.pid == pid) else {
        return Err(Unavailable::PidNotListed {
            pid,
            gpu: at,
            listed: gpu.processes.len(),
        });
    };
    let used = p
        .used
        .ok_or(Unavailable::MemoryNotReported { pid, gpu: at })?;
    let difference = d
        .reserved
        .or(d.stats_reserved)
        .map(|r| i128::from(used) - i128::from(r))
        .map(|x| i64::try_from(x).unwrap_or(if x < 0 { i64::MIN } else { i64::MAX }));
    Ok(NvmlRead {
        matched_by,
        gpu: at,
        used_by_process: used,
        difference,
    })
}

pub use crate::units::signed_size;

/// `attach --json`'s `live.nvml` entry for one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvmlEntry {
    pub device: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_by_process: Option<u64>,
    /// The stream's reserved bytes (the `difference` is against these).
    pub reserved: Option<u64>,
    /// `memory_stats()`'s, where the job sent them.
    pub stats_reserved: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub difference: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matched_by: Option<MatchedBy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvml_gpu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

impl From<&DeviceNvml> for NvmlEntry {
    fn from(d: &DeviceNvml) -> NvmlEntry {
        let read = d.reading.as_ref().ok();
        NvmlEntry {
            device: d.device,
            used_by_process: read.map(|r| r.used_by_process),
            reserved: d.reserved,
            stats_reserved: d.stats_reserved,
            difference: read.and_then(|r| r.difference),
            matched_by: read.map(|r| r.matched_by),
            nvml_gpu: read.map(|r| r.gpu),
            unavailable: d.reading.as_ref().err().map(ToString::to_string),
        }
    }
}

impl NvmlEntry {
    /// `attach`'s text line for the device of job `pid`.
    pub fn text_line(&self, pid: Option<u64>) -> String {
        let head = format!("nvml cuda:{}", self.device);
        let reserved = format!(
            "reserved {} (memory_stats() {})",
            size(self.reserved),
            size(self.stats_reserved)
        );
        match (&self.unavailable, self.used_by_process) {
            (None, Some(used)) => format!(
                "{head}: pid {} uses {} on NVML GPU {} ({}); {reserved}; difference {} ({DIFFERENCE_IS})",
                pid.map_or("?".into(), |p| p.to_string()),
                format_size(used),
                self.nvml_gpu.map_or("?".into(), |g| g.to_string()),
                self.matched_by.map_or("match unknown", MatchedBy::describe),
                self.difference.map_or("unknown".into(), signed_size),
            ),
            (why, _) => format!(
                "{head}: {reserved}; no NVML reading: {}",
                why.as_deref().unwrap_or("unknown")
            ),
        }
    }
}

/// Read NVML once (a job on this machine only) and match the job's devices:
/// what `attach --headless`/`--json` report at the end.
pub fn read_once(job: &LiveJob, place: &JobPlace) -> Vec<NvmlEntry> {
    let gpus = (*place == JobPlace::Here).then(|| crate::device::nvml::read_all(true));
    let why = match &gpus {
        Some(Err(e)) => e.to_string(),
        _ => String::new(),
    };
    let now = match &gpus {
        Some(Ok(g)) => NvmlNow::Read(g),
        // Not read: `reconcile` says why from `place` before looking.
        None | Some(Err(_)) => NvmlNow::Unavailable(&why),
    };
    reconcile(job, place, now)
        .iter()
        .map(NvmlEntry::from)
        .collect()
}

#[cfg(test)]
mod tests;
