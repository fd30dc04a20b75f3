//! What the helper found holding a job's tensors (PROTOCOL.md `holders`):
//! chains from a Python frame or module down to the container or name that
//! keeps what grew, as the line people read and as leak findings, so the
//! views list them with the rest.

use serde::Serialize;

use crate::alloc::format_size;
use crate::leak::{Finding, FindingKind, Severity};
use crate::units::format_count;

/// Reports a session keeps (the newest).
pub const KEPT_REPORTS: usize = 16;
/// Chains one report may carry, and links one chain may have.
pub const MAX_CHAINS: usize = 64;
pub const MAX_LINKS: usize = 64;

/// One walk's report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HoldersReport {
    pub seq: u64,
    /// The step that had just ended.
    pub step: Option<u64>,
    /// `memory_allocated()` over the job's devices then.
    pub allocated: Option<u64>,
    /// `grew` or `requested`.
    pub reason: String,
    pub budget_ms: Option<f64>,
    pub spent_ms: Option<f64>,
    /// The walk reached everything before its budget ran out.
    pub complete: bool,
    pub chains: Vec<HolderChain>,
}

/// From a root to what holds the tensors.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HolderChain {
    /// The root: `train.py:42 in train`, or `train.py (module __main__)`.
    #[serde(rename = "where")]
    pub at: String,
    /// Links from the root, as Python writes them (`self`, `.history`).
    pub path: Vec<String>,
    /// The container's type (`list`, `dict`, …) or `name`.
    pub holder: String,
    pub items: Option<u64>,
    pub tensors: u64,
    pub bytes: u64,
    pub graph_bytes: u64,
    pub graph_complete: bool,
    pub grew_bytes: Option<i64>,
    pub example: Option<HolderExample>,
    /// A name's tensor, in words (a container has `example` instead).
    pub what: Option<String>,
    pub fix: Option<String>,
}

/// A container's last tensor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HolderExample {
    pub link: String,
    pub what: String,
    pub graph_bytes: u64,
}

impl HolderChain {
    /// The holder as the user wrote it: `self.history`.
    pub fn name(&self) -> String {
        match self.path.is_empty() {
            true => self.at.clone(),
            false => self.path.concat(),
        }
    }

    /// `train.py:42 in train: self.history (list, 1,601 items) → [1600]:
    /// 0-dim tensor float32, grad_fn=AddBackward0, its graph keeps 12.3 MiB
    /// of saved tensors`.
    pub fn text(&self) -> String {
        let mut s = format!("{}: {}", self.at, self.name());
        let keeps = |bytes: u64, complete: bool| match (bytes, complete) {
            (0, _) => String::new(),
            (b, true) => format!(", its graph keeps {} of saved tensors", format_size(b)),
            (b, false) => format!(
                ", its graph keeps at least {} of saved tensors",
                format_size(b)
            ),
        };
        if self.holder == "name" {
            if let Some(w) = &self.what {
                s.push_str(&format!(
                    ": {w}{}",
                    keeps(self.graph_bytes, self.graph_complete)
                ));
            }
            return s;
        }
        match self.items {
            Some(n) => s.push_str(&format!(
                " ({}, {})",
                self.holder,
                crate::units::counted(n, "item")
            )),
            None => s.push_str(&format!(" ({})", self.holder)),
        }
        if let Some(e) = &self.example {
            s.push_str(&format!(
                " → {}: {}{}",
                e.link,
                e.what,
                keeps(e.graph_bytes, true)
            ));
        }
        s
    }

    /// What it holds in all, in words.
    fn holds(&self) -> String {
        let mut s = format!(
            "{} of {}",
            format_size(self.bytes),
            crate::units::counted(self.tensors, "CUDA tensor")
        );
        if self.graph_bytes > 0 {
            s.push_str(&format!(
                " and {}{} of saved tensors their graphs keep",
                if self.graph_complete { "" } else { "at least " },
                format_size(self.graph_bytes)
            ));
        }
        s
    }
}

impl HoldersReport {
    /// The chains as leak findings: a holder that grew is a leak to look
    /// at; one the user asked about is a holder, said plainly.
    pub fn findings(&self) -> Vec<Finding> {
        self.findings_since(None)
    }

    /// [`Self::findings`], their growth per step where the last walk's
    /// step is known (walks come at most once a second, often several
    /// steps apart; else the growth since that walk).
    pub fn findings_since(&self, last_walk_step: Option<u64>) -> Vec<Finding> {
        let steps = match (self.step, last_walk_step) {
            (Some(now), Some(then)) if now > then => now - then,
            _ => 1,
        };
        self.chains
            .iter()
            .map(|c| {
                let grew = c.grew_bytes.filter(|g| *g > 0);
                let kind = match (self.reason.as_str(), grew) {
                    ("grew", _) | (_, Some(_)) => FindingKind::GrowingHolder,
                    _ => FindingKind::PythonHolder,
                };
                let mut f = Finding::new(c.name(), kind);
                f.bytes = c.bytes + c.graph_bytes;
                f.growth_per_iter = grew.map_or(0, |g| g / steps as i64);
                f.path = vec![c.text()];
                f.fix = c.fix.clone().unwrap_or_default();
                let at_oom = self.reason == "oom";
                f.severity = match kind {
                    FindingKind::GrowingHolder => Severity::Critical,
                    _ if at_oom => Severity::Warning,
                    _ => Severity::Info,
                };
                let step = match self.step {
                    _ if at_oom => " when the allocation failed (out of memory)".to_string(),
                    Some(s) => format!(" at step {}", format_count(s)),
                    None => String::new(),
                };
                let budget = match (self.spent_ms, self.budget_ms, self.complete) {
                    (Some(s), Some(b), true) => format!(" ({s:.1} ms of a {b:.0} ms budget)"),
                    (Some(s), Some(b), false) => format!(
                        " (stopped at its {b:.0} ms budget after {s:.1} ms: what it did not reach is not listed)"
                    ),
                    _ => String::new(),
                };
                let growth = match grew {
                    Some(g) => format!(
                        ", {} more than at the helper's last look",
                        format_size(g.unsigned_abs())
                    ),
                    None => String::new(),
                };
                f.evidence = format!(
                    "The job's helper walked from its frames and module globals to its CUDA \
                     tensors{step}{budget}: `{}` holds {}{growth}.",
                    c.name(),
                    c.holds(),
                );
                f
            })
            .collect()
    }
}
