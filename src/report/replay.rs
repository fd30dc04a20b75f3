//! `vramscope replay`: the verify report and the what-if table.

use std::fmt::Write;

use serde::Serialize;

use crate::alloc::format_size;
use crate::trace::replay::from_snapshot::DeviceReplay;
use crate::trace::replay::whatif::WhatIfResult;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyDevice {
    pub device: usize,
    pub entries: usize,
    pub allocs: usize,
    pub alloc_addr_match: usize,
    pub segment_events: usize,
    pub segment_event_match: usize,
    pub final_state_match: bool,
    pub replayable_from: usize,
    /// Open trace: the state at the first entry was rebuilt from the end state.
    pub rebuilt_start: bool,
    pub estimated_blocks: usize,
    pub differences: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Every replayed decision matched, and there was at least one to check.
    pub ok: bool,
    /// No device has a trace (a state-only snapshot): nothing was checked.
    pub nothing_to_verify: bool,
    pub devices: Vec<VerifyDevice>,
}

impl VerifyReport {
    pub fn new(replays: &[DeviceReplay]) -> VerifyReport {
        let devices: Vec<VerifyDevice> = replays
            .iter()
            .map(|r| {
                let o = &r.outcome;
                VerifyDevice {
                    device: r.device,
                    entries: o.entries,
                    allocs: o.allocs,
                    alloc_addr_match: o.alloc_addr_match,
                    segment_events: o.segment_events,
                    segment_event_match: o.segment_event_match,
                    final_state_match: o.final_state_match == Some(true),
                    replayable_from: o.replayable_from,
                    rebuilt_start: !r.start.is_empty(),
                    estimated_blocks: r.start.estimated_blocks,
                    differences: o.differences.clone(),
                }
            })
            .collect();
        let nothing_to_verify = devices.is_empty();
        let ok = !nothing_to_verify && replays.iter().all(|r| r.outcome.all_matched());
        VerifyReport {
            ok,
            nothing_to_verify,
            devices,
        }
    }

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        if self.nothing_to_verify {
            out.push_str(
                "NOT VERIFIED: no device has a trace, so there is no decision to check (a \
                 state-only snapshot; record one with \
                 torch.cuda.memory._record_memory_history() before the allocations)\n",
            );
            return out;
        }
        for d in &self.devices {
            let pct = |a: usize, b: usize| {
                if b == 0 {
                    100.0
                } else {
                    100.0 * a as f64 / b as f64
                }
            };
            let _ = writeln!(
                out,
                "device {}: {} entries from entry {}{}; alloc addresses {}/{} ({:.2}%), segment events {}/{} ({:.2}%), final state {}",
                d.device,
                d.entries,
                d.replayable_from,
                if d.rebuilt_start {
                    format!(" (open trace: start state rebuilt backwards from the end, {} block sizes estimated)", d.estimated_blocks)
                } else {
                    String::new()
                },
                d.alloc_addr_match,
                d.allocs,
                pct(d.alloc_addr_match, d.allocs),
                d.segment_event_match,
                d.segment_events,
                pct(d.segment_event_match, d.segment_events),
                if d.final_state_match { "matches" } else { "differs" },
            );
            for diff in &d.differences {
                let _ = writeln!(out, "  {diff}");
            }
        }
        let _ = writeln!(
            out,
            "{}",
            if self.ok {
                "OK: every replayed decision matched"
            } else {
                "MISMATCH"
            }
        );
        out
    }
}

/// How one row of the what-if table shows a config's result.
type Cell = fn(&WhatIfResult) -> String;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WhatIfDevice {
    pub device: usize,
    pub capacity: u64,
    /// What the capacity is: the trace's own figure, the most the recorded
    /// run reserved, or the one given.
    pub capacity_from: &'static str,
    /// The first config is the recorded run's; its column is the verify
    /// replay's figures, which follow the trace decision for decision.
    pub configs: Vec<WhatIfResult>,
    /// The first column is the recorded run (on its own device); else (a
    /// `--capacity` given) its config replayed on that capacity.
    pub first_is_recorded: bool,
    /// Whether the verify replay matched every recorded decision.
    pub recorded_matched: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WhatIfReport {
    pub devices: Vec<WhatIfDevice>,
}

impl WhatIfReport {
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for d in &self.devices {
            let _ = writeln!(
                out,
                "device {} on a {} device ({})",
                d.device,
                format_size(d.capacity),
                d.capacity_from
            );
            let width = d
                .configs
                .iter()
                .map(|c| c.conf.len().max(10))
                .max()
                .unwrap_or(10)
                + 2;
            let _ = write!(out, "{:<26}", "");
            for c in &d.configs {
                let name = if c.conf.is_empty() {
                    "(default)"
                } else {
                    c.conf.as_str()
                };
                let _ = write!(out, "{name:>width$}");
            }
            out.push('\n');
            let rows: [(&str, Cell); 8] = [
                ("peak reserved", |c| format_size(c.peak_reserved)),
                ("peak allocated", |c| format_size(c.peak_allocated)),
                ("reserved at end", |c| format_size(c.reserved_end)),
                ("largest free at worst", |c| {
                    format_size(c.largest_free_at_worst)
                }),
                ("fragmentation at worst", |c| {
                    format!("{:.1}%", c.fragmentation_at_worst * 100.0)
                }),
                ("cudaMalloc retries", |c| c.num_alloc_retries.to_string()),
                ("OOMs", |c| c.oom_count.to_string()),
                ("segments at end", |c| c.segments.to_string()),
            ];
            for (name, cell) in rows {
                let _ = write!(out, "{name:<26}");
                for c in &d.configs {
                    let _ = write!(out, "{:>width$}", cell(c));
                }
                out.push('\n');
            }
            if d.first_is_recorded {
                let _ = writeln!(
                    out,
                    "  first column: the recorded run ({}); the others: its requests replayed under each config",
                    if d.recorded_matched {
                        "its replay matched every recorded decision"
                    } else {
                        "its replay differs from the trace in places: see replay --verify"
                    }
                );
            } else {
                let _ = writeln!(
                    out,
                    "  every column: the run's requests replayed on this device, the first under its own config"
                );
            }
            let _ = writeln!(
                out,
                "  fragmentation: {}",
                crate::alloc::FRAGMENTATION_DEFINITION
            );
            for c in &d.configs {
                if let Some(first) = c.ooms.first() {
                    let _ = writeln!(
                        out,
                        "  \"{}\": first OOM at entry {} ({} requested)",
                        c.conf,
                        first.entry,
                        format_size(first.size)
                    );
                }
            }
        }
        out
    }
}
