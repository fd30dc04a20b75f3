//! The run view's GPU memory panel (`v`): for a run on a real GPU, NVML's
//! reading of this process next to the model's reserved bytes, split into
//! context / reserved / other; for a simulated run, the simulated device's
//! terms, labelled as such, and why NVML is not read (or what it reads);
//! for a live job, its process on its GPUs (`gpu_panel_job`).
//!
//! NVML is read only by the poller thread (`producers::nvml_source`);
//! this state drains its channel without blocking. The numbers come from
//! `device::reconcile`; `prepare` only picks and formats them.

use crate::alloc::format_size;
use crate::device::nvml::{reading_at, GpuReading};
use crate::device::reconcile::{Reconciliation, SimulatedTerms};
use crate::device::PciAddress;
use crate::producers::{nvml_source, Polled, Source, SourceMsg};
use crate::scenario::Conditions;
use crate::units::format_size_or_unknown as size;

use super::run_view::RunView;

/// What is known about NVML in this process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NvmlState {
    /// Nobody asked yet: no poller runs.
    #[default]
    NotStarted,
    /// The poller runs; no reading has arrived.
    Waiting,
    /// NVML cannot be used here, and why (e.g. no NVIDIA driver).
    Unavailable(String),
    Read(Vec<GpuReading>),
}

/// What the panel draws, built by [`GpuPanel::prepare`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuPanelFrame {
    pub title: String,
    pub rows: Vec<(&'static str, String)>,
    pub notes: Vec<String>,
}

#[derive(Debug, Default)]
pub struct GpuPanel {
    pub shown: bool,
    rx: Option<Source>,
    pub nvml: NvmlState,
    pub frame: GpuPanelFrame,
}

impl GpuPanel {
    /// Read NVML through `rx` (the poller, or a test's source).
    pub fn attach(&mut self, rx: Source) {
        self.rx = Some(rx);
        self.nvml = NvmlState::Waiting;
    }

    /// Start the poller thread unless one already feeds this panel.
    pub fn start(&mut self) {
        if self.nvml == NvmlState::NotStarted {
            self.attach(nvml_source());
        }
    }

    pub fn toggle(&mut self) {
        self.shown = !self.shown;
        if self.shown {
            self.start();
        }
    }

    /// Take every pending reading (the latest wins); true when the shown
    /// panel must be redrawn.
    pub fn drain(&mut self) -> bool {
        let Some(rx) = &self.rx else { return false };
        let mut changed = false;
        loop {
            match rx.poll() {
                Polled::Msg(SourceMsg::Gpus(Ok(gpus))) => self.nvml = NvmlState::Read(gpus),
                Polled::Msg(SourceMsg::Gpus(Err(e))) => {
                    self.nvml = NvmlState::Unavailable(e.to_string())
                }
                Polled::Msg(_) => continue,
                Polled::Empty => break,
                Polled::Closed => {
                    self.rx = None;
                    if self.nvml == NvmlState::Waiting {
                        self.nvml = NvmlState::Unavailable(
                            "NVML: its reading thread stopped unexpectedly".into(),
                        );
                    }
                    changed = true;
                    break;
                }
            }
            changed = true;
        }
        changed && self.shown
    }

    /// Build the frame for `run` (the active one).
    pub fn prepare(&mut self, run: Option<&RunView>) {
        self.frame = match run {
            None => GpuPanelFrame::default(),
            Some(r) if r.job_place.is_some() || r.job.is_some() => {
                super::gpu_panel_job::job_frame(&self.nvml, r)
            }
            Some(r) => match r.cuda {
                Some(ordinal) => self.cuda_frame(r, ordinal),
                None => self.simulated_frame(r),
            },
        };
    }

    fn reading(&self, pci: Option<PciAddress>) -> Option<&GpuReading> {
        match &self.nvml {
            NvmlState::Read(gpus) => reading_at(gpus, pci),
            _ => None,
        }
    }

    fn nvml_note(&self) -> Option<String> {
        match &self.nvml {
            NvmlState::NotStarted | NvmlState::Waiting => {
                Some("NVML: waiting for the first reading…".into())
            }
            NvmlState::Unavailable(why) => Some(why.clone()),
            NvmlState::Read(_) => None,
        }
    }

    fn cuda_frame(&self, r: &RunView, ordinal: u32) -> GpuPanelFrame {
        // NVML reads the device now: compare with the model at the live edge.
        let head = r.timeline.head();
        let gpu = self.reading(r.cuda_pci);
        let used = gpu.and_then(|g| g.process_used(std::process::id()));
        let rec = Reconciliation::own(used, r.context_baseline, head.reserved);
        let mut notes: Vec<String> = self.nvml_note().into_iter().collect();
        if let Some(g) = gpu {
            notes.push(format!(
                "device: NVML used {} of {} (free {}), all processes",
                size(g.used),
                size(g.total),
                size(g.free)
            ));
        }
        if r.context_baseline.is_none() {
            notes.push("context unknown: NVML gave no reading before the first allocation".into());
        }
        GpuPanelFrame {
            title: format!(" GPU memory · cuda:{ordinal} · NVML vs model "),
            rows: vec![
                (
                    "NVML used",
                    format!("{} (this process)", size(rec.nvml_used)),
                ),
                ("CUDA context", format!("{} (baseline)", size(rec.context))),
                (
                    "model reserved",
                    format!(
                        "{} (allocated {} + cached free {}, latest)",
                        size(rec.reserved),
                        format_size(head.allocated),
                        format_size(head.cached_free())
                    ),
                ),
                (
                    "other",
                    format!("{} (cuBLAS, workspaces, non-PyTorch)", size(rec.other)),
                ),
            ],
            notes,
        }
    }

    fn simulated_frame(&self, r: &RunView) -> GpuPanelFrame {
        let m = &r.map;
        let mut rows = Vec::new();
        match r.capacity {
            Some(cap) => {
                let t = SimulatedTerms::new(cap, r.overhead, m.reserved);
                rows.push(("simulated capacity", format_size(t.capacity)));
                rows.push((
                    "simulated context",
                    format!(
                        "{} (CUDA context and other memory outside the allocator)",
                        size(t.overhead)
                    ),
                ));
                rows.push((
                    "allocator reserved",
                    format!(
                        "{} (allocated {} + cached free {})",
                        format_size(t.reserved),
                        format_size(m.allocated),
                        format_size(m.cached_free())
                    ),
                ));
                rows.push(("simulated free", size(t.free)));
            }
            None => {
                rows.push(("simulated capacity", "unknown".into()));
                rows.push(("allocator reserved", format_size(m.reserved)));
            }
        }
        if let Some(c) = &r.conditions {
            rows.push(("GPU profile", gpu_profile_text(c)));
            rows.push(("PyTorch rules", c.torch.clone()));
            if let Some(t) = &c.transformers {
                rows.push(("transformers", t.clone()));
            }
        }
        let mut notes = vec!["simulated run: no real GPU memory is used".to_string()];
        if let Some(c) = &r.conditions {
            notes.push(c.verification());
            notes.extend(
                c.assumptions
                    .iter()
                    .map(|a| format!("data-dependent, as the scenario states it: {a}")),
            );
        }
        match &self.nvml {
            NvmlState::Read(gpus) => notes.extend(gpus.iter().map(|g| {
                format!(
                    "NVML GPU {} ({}): used {} of {} — another device, not this run",
                    g.index,
                    g.name.as_deref().unwrap_or("name unknown"),
                    size(g.used),
                    size(g.total)
                )
            })),
            _ => notes.extend(self.nvml_note()),
        }
        GpuPanelFrame {
            title: " GPU memory · simulated device ".into(),
            rows,
            notes,
        }
    }
}

fn gpu_profile_text(c: &Conditions) -> String {
    match &c.gpu {
        Some(g) => format!(
            "{} ({}, {} SMs; {} memory)",
            g.name,
            g.arch.name(),
            g.sm_count,
            if g.memory_measured {
                "measured"
            } else {
                "nominal"
            }
        ),
        None => "none (sm_80 workspace rules, no reduction scratch)".to_string(),
    }
}
