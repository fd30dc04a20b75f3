//! The GPU panel (`v`) for a live job: per device of the job, NVML's reading
//! of the job's process beside the reserved bytes from its stream, or why
//! there is none. The match and the difference come from
//! `job::nvml_match`; this only formats them.

use crate::job::nvml_match::{
    reconcile, signed_size, DeviceNvml, JobPlace, MatchedBy, NvmlNow, DIFFERENCE_IS,
};
use crate::units::format_size_or_unknown as size;

use super::gpu_panel::{GpuPanelFrame, NvmlState};
use super::run_view::RunView;

/// The frame for a live job's run.
pub fn job_frame(nvml: &NvmlState, r: &RunView) -> GpuPanelFrame {
    let place = r.job_place.clone().unwrap_or(JobPlace::Here);
    let what = if place == JobPlace::Recording {
        "recorded job"
    } else {
        "live job"
    };
    let Some(job) = &r.job else {
        return GpuPanelFrame {
            title: format!(" GPU memory · {what} · NVML vs its allocator "),
            rows: Vec::new(),
            notes: vec!["waiting for the job's hello (its pid and devices)".into()],
        };
    };
    let now = match nvml {
        NvmlState::NotStarted | NvmlState::Waiting => NvmlNow::Waiting,
        NvmlState::Unavailable(why) => NvmlNow::Unavailable(why),
        NvmlState::Read(gpus) => NvmlNow::Read(gpus),
    };
    let devices = reconcile(job, &place, now);
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for d in &devices {
        device_rows(d, job.pid, &mut rows, &mut notes);
    }
    if devices.is_empty() {
        notes.push("the job has named no CUDA device yet".into());
    }
    if devices.iter().any(|d| d.reading.is_ok()) {
        notes.push(format!(
            "difference = NVML used − reserved: {DIFFERENCE_IS}; NVML lists processes once a second"
        ));
    }
    GpuPanelFrame {
        title: format!(
            " GPU memory · {what} pid {} · NVML vs its allocator ",
            job.pid.map_or("?".into(), |p| p.to_string())
        ),
        rows,
        notes,
    }
}

fn device_rows(
    d: &DeviceNvml,
    pid: Option<u32>,
    rows: &mut Vec<(&'static str, String)>,
    notes: &mut Vec<String>,
) {
    let name = d.name.as_deref().unwrap_or("name unknown");
    let reserved = (
        "job reserved",
        format!(
            "{} (from its stream; memory_stats() {})",
            size(d.reserved),
            size(d.stats_reserved)
        ),
    );
    let r = match &d.reading {
        Ok(r) => r,
        Err(why) => {
            rows.push(("device", format!("cuda:{} · {name}", d.device)));
            rows.push(reserved);
            rows.push(("NVML", format!("no reading: {why}")));
            return;
        }
    };
    let by = match r.matched_by {
        MatchedBy::Uuid => "by UUID",
        MatchedBy::PciBusId => "by PCI bus id",
        MatchedBy::Ordinal => "by CUDA ordinal only",
    };
    rows.push((
        "device",
        format!(
            "cuda:{} · {name} · NVML GPU {}, matched {by}",
            d.device, r.gpu
        ),
    ));
    rows.push((
        "NVML used",
        format!(
            "{} (pid {} on this GPU)",
            crate::alloc::format_size(r.used_by_process),
            pid.map_or("?".into(), |p| p.to_string())
        ),
    ));
    rows.push(reserved);
    rows.push((
        "difference",
        match r.difference {
            Some(x) => format!(
                "{} (context, workspaces, outside the caching allocator)",
                signed_size(x)
            ),
            None => "unknown (no reserved bytes yet)".into(),
        },
    ));
    if r.matched_by == MatchedBy::Ordinal {
        notes.push(format!(
            "cuda:{}: {}",
            d.device,
            MatchedBy::Ordinal.describe()
        ));
    }
    if r.difference.is_some_and(|x| x < 0) {
        notes.push(format!(
            "cuda:{}: negative: NVML's process reading (once a second) is older than the stream's reserved bytes{}",
            d.device,
            if r.matched_by == MatchedBy::Ordinal {
                format!(", or NVML's GPU {} is not the job's cuda:{}", r.gpu, d.device)
            } else {
                String::new()
            }
        ));
    }
}
