//! The cache's growth explained once the run is over: which iterations
//! made reserved rise and with what shapes (the batch and sequence the
//! program gave them, the largest request they made), and which setting
//! helps — the run's own requests replayed under each, not a rule of thumb.

use super::detector::Detector;
use super::finding::FindingKind;
use crate::alloc::{format_size, Action, AllocConfig};
use crate::device::SimDevice;
use crate::trace::replay::whatif::{what_if_on, Requests, WhatIfResult};

/// Iterations named where reserved rose.
const LISTED_RISES: usize = 6;

/// One setting replayed over the whole run.
struct Tried {
    label: String,
    /// The line to put in the program.
    fix: String,
    result: WhatIfResult,
}

impl Detector {
    /// At the end of the run: the cache-growth finding gets the shapes
    /// that made reserved rise and the settings replayed on the run's
    /// requests, the best of them as its fix.
    pub fn finish(&mut self) {
        let Some(i) = self
            .findings
            .iter()
            .position(|f| f.kind == FindingKind::CacheFragmentation)
        else {
            return;
        };
        if self.requests.is_empty() {
            return;
        }
        let rises = self.reserved_rises();
        let tried = self.settings_tried();
        let f = &mut self.findings[i];
        if !rises.is_empty() {
            f.path
                .push(format!("reserved rose in {}", rises.join(", ")));
        }
        let Some((own, others)) = tried.split_first() else {
            return;
        };
        let base = own.result.peak_reserved;
        let mut said = Vec::new();
        for t in others {
            let r = &t.result;
            let oom = match r.oom_count {
                0 => String::new(),
                n => format!(
                    ", {} not fitting",
                    crate::units::counted(n as u64, "request")
                ),
            };
            said.push(format!(
                "{}: peak reserved {} (this run {}), {} at the end{oom}",
                t.label,
                format_size(r.peak_reserved),
                format_size(base),
                format_size(r.reserved_end),
            ));
        }
        f.path
            .push(format!("the same requests replayed — {}", said.join("; ")));
        // The lowest peak among the settings that lower it by a tenth; the
        // first listed (expandable segments: no sync each iteration) when
        // it is within a tenth of that.
        let helps: Vec<&Tried> = others
            .iter()
            .filter(|t| t.result.oom_count == 0 && t.result.peak_reserved * 10 <= base * 9)
            .collect();
        let lowest = helps.iter().map(|t| t.result.peak_reserved).min();
        let best = helps
            .iter()
            .find(|t| lowest.is_some_and(|l| t.result.peak_reserved * 10 <= l * 11))
            .copied();
        match best {
            Some(t) => {
                f.fix = t.fix.clone();
                f.evidence.push_str(&format!(
                    " Replayed on this run's own requests, {} keeps reserved at {} at its peak \
                     instead of {}.",
                    t.label,
                    format_size(t.result.peak_reserved),
                    format_size(base)
                ));
            }
            None => f.evidence.push_str(
                " Replayed on this run's own requests, no setting tried lowers the peak by a \
                 tenth: make the shapes fewer (pad or bucket them) instead.",
            ),
        }
    }

    /// Iterations where reserved rose over the one before, with the batch
    /// and sequence the program gave them and their largest request.
    fn reserved_rises(&self) -> Vec<String> {
        let v: Vec<_> = self.iterations.iter().collect();
        let mut out = Vec::new();
        let mut count = 0;
        for w in v.windows(2) {
            if w[1].reserved <= w[0].reserved || w[1].iteration < 2 {
                continue;
            }
            count += 1;
            if out.len() == LISTED_RISES {
                continue;
            }
            let it = w[1].iteration;
            let mut shape = Vec::new();
            if let Some(b) = cycled(&self.facts.batch_sizes, it) {
                shape.push(format!("batch {b}"));
            }
            if let Some(t) = cycled(&self.facts.seq_lens, it) {
                shape.push(format!("sequence {t}"));
            }
            if let Some(big) = self.largest_request(it) {
                shape.push(format!("requests up to {}", format_size(big)));
            }
            out.push(format!(
                "iteration {it} (+{}{})",
                format_size(w[1].reserved - w[0].reserved),
                if shape.is_empty() {
                    String::new()
                } else {
                    format!(": {}", shape.join(", "))
                }
            ));
        }
        if count > out.len() {
            out.push(format!("and {} more", count - out.len()));
        }
        out
    }

    fn largest_request(&self, it: u32) -> Option<u64> {
        let starts = &self.requests.iteration_starts;
        let k = starts.iter().position(|(i, _)| *i == it)?;
        let from = starts[k].1;
        let to = starts
            .get(k + 1)
            .map_or(self.requests.entries.len(), |s| s.1);
        self.requests.entries[from..to]
            .iter()
            .filter(|e| e.action == Action::Alloc)
            .map(|e| e.size)
            .max()
    }

    /// The run's own config first (its replay is the baseline), then
    /// expandable segments, then `empty_cache()` after every iteration.
    fn settings_tried(&self) -> Vec<Tried> {
        let d = &self.device;
        let device = || SimDevice::new(d.name.clone(), d.total, d.overhead).placed(d.placement);
        let requests = Requests {
            entries: &self.requests.entries,
            empty_cache_at: &self.requests.empty_cache_at,
            start: None,
        };
        let mut out = vec![Tried {
            label: "this run".into(),
            fix: String::new(),
            result: what_if_on(&requests, d.config.clone(), device()),
        }];
        if !d.config.expandable_segments {
            let mut config: AllocConfig = d.config.clone();
            config.expandable_segments = true;
            config.raw = match config.raw.as_str() {
                "" => "expandable_segments:True".into(),
                raw => format!("{raw},expandable_segments:True"),
            };
            let fix = format!(
                "os.environ[\"PYTORCH_CUDA_ALLOC_CONF\"] = \"{}\"  # before the first CUDA allocation",
                config.raw
            );
            out.push(Tried {
                label: "expandable_segments:True".into(),
                fix,
                result: what_if_on(&requests, config, device()),
            });
        }
        let mut every: Vec<usize> = self
            .requests
            .iteration_starts
            .iter()
            .skip(1)
            .map(|(_, at)| *at)
            .chain(self.requests.empty_cache_at.iter().copied())
            .collect();
        every.sort_unstable();
        let emptied = Requests {
            entries: &self.requests.entries,
            empty_cache_at: &every,
            start: None,
        };
        out.push(Tried {
            label: "empty_cache() after every iteration".into(),
            fix: "torch.cuda.empty_cache()  # at the end of each iteration (a sync: it costs time)"
                .into(),
            result: what_if_on(&emptied, d.config.clone(), device()),
        });
        out
    }
}

/// A per-iteration schedule's entry for iteration `it` (from 1), cycled.
fn cycled(schedule: &[u64], it: u32) -> Option<u64> {
    let i = it.saturating_sub(1) as usize;
    (!schedule.is_empty()).then(|| schedule[i % schedule.len()])
}
