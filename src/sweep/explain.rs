//! The sweep in words: the line, what its intercept and slope are made of,
//! whether the points lie on it and, where they do not, which part of the
//! peak moved off it. Every figure comes from the sweep's own runs.

use std::collections::BTreeMap;

use super::fit::{CategoryLine, Fit, LINEAR_WITHIN};
use super::runner::{MaxBatch, MAX_SEARCH_BATCH};
use super::Sweep;
use crate::alloc::format_size;

/// A category's share is named when it is at least this fraction of the whole.
const NAMED_SHARE: f64 = 0.01;

/// Bytes that may be negative (a fitted intercept, a residual).
pub fn signed_size(v: f64) -> String {
    let magnitude = format_size(v.abs().round() as u64);
    if v < 0.0 {
        format!("-{magnitude}")
    } else {
        magnitude
    }
}

fn category_label(name: &str) -> String {
    name.replace('_', " ")
}

/// `name value` for the lines whose `part` is a named share of `whole`,
/// largest first.
fn shares(lines: &[CategoryLine], whole: f64, part: impl Fn(&CategoryLine) -> f64) -> String {
    let mut named: Vec<(&str, f64)> = lines
        .iter()
        .map(|l| (l.category.as_str(), part(l)))
        .filter(|(_, v)| v.abs() >= NAMED_SHARE * whole.abs() && v.abs() >= 0.5)
        .collect();
    named.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));
    let text: Vec<String> = named
        .iter()
        .map(|(n, v)| format!("{} {}", category_label(n), signed_size(*v)))
        .collect();
    if text.is_empty() {
        "no category more than 1 % of it".to_string()
    } else {
        text.join(", ")
    }
}

pub fn explain(sweep: &Sweep) -> Vec<String> {
    let mut out = Vec::new();
    for fit in &sweep.fits {
        fit_words(sweep, fit, &mut out);
    }
    if sweep.fits.is_empty() && !sweep.points.is_empty() {
        out.push(
            "No line: fewer than two different batches ran to the end, so there is nothing to fit."
                .to_string(),
        );
    }
    left_out_words(sweep, &mut out);
    if sweep.max_batch_by_seq.is_empty() {
        out.extend(largest_point_words(sweep));
    } else {
        out.extend(sweep.max_batch_by_seq.iter().map(max_batch_words));
        out.extend(max_batch_table_words(&sweep.max_batch_by_seq));
    }
    out
}

/// With several sequence lengths searched, their largest batches side by
/// side: how the batch that fits shrinks as the sequence grows.
fn max_batch_table_words(found: &[MaxBatch]) -> Option<String> {
    if found.len() < 2 {
        return None;
    }
    let each: Vec<String> = found
        .iter()
        .map(|m| {
            let seq = m.seq.map_or("—".to_string(), |t| t.to_string());
            let batch = match (&m.error, m.batch) {
                (Some(_), _) => "search stopped".to_string(),
                (None, Some(b)) => b.to_string(),
                (None, None) => "none".to_string(),
            };
            format!("seq {seq} → {batch}")
        })
        .collect();
    let runs: u32 = found.iter().map(|m| m.runs).sum();
    Some(format!(
        "Largest batch that fits by sequence length: {} ({runs} runs in all).",
        each.join(", ")
    ))
}

fn seq_words(seq: Option<u64>) -> String {
    seq.map_or(String::new(), |t| format!(" at sequence length {t}"))
}

fn fit_words(sweep: &Sweep, fit: &Fit, out: &mut Vec<String>) {
    let a = fit.allocated;
    out.push(format!(
        "Peak allocated ≈ {} + {} × batch{}: the least-squares line through the {} points that ran to the end (R² = {:.5}).",
        signed_size(a.intercept),
        signed_size(a.slope),
        seq_words(fit.seq),
        fit.batches.len(),
        a.r_squared
    ));
    if !fit.by_category.is_empty() {
        out.push(format!(
            "The intercept, {}, is what the peak holds whatever the batch; by tensor category at the peak: {}.",
            signed_size(a.intercept),
            shares(&fit.by_category, a.intercept, |l| l.line.intercept)
        ));
        if fit.by_category.iter().any(|l| l.line.intercept < 0.0) {
            out.push(
                "A negative share is the straight line's, not memory: that category's own line through the points would reach zero at a batch above 0."
                    .to_string(),
            );
        }
        let constant: Vec<String> = fit
            .by_category
            .iter()
            .filter(|l| l.values.windows(2).all(|w| w[0] == w[1]) && l.values[0] > 0)
            .map(|l| {
                format!(
                    "{} {}",
                    category_label(&l.category),
                    format_size(l.values[0])
                )
            })
            .collect();
        if !constant.is_empty() {
            out.push(format!("The same at every point: {}.", constant.join(", ")));
        }
        out.push(format!(
            "The slope, {} per sample, is what one more sample adds at the peak: {}.",
            signed_size(a.slope),
            shares(&fit.by_category, a.slope, |l| l.line.slope)
        ));
    }
    out.push(linearity_words(fit));
    out.extend(moment_words(sweep, fit));
    if let Some(r) = &fit.rounding {
        out.push(rounding_words(sweep, fit, r));
    }
    out.push(reserved_words(sweep, fit));
    if a.slope > 0.0 {
        let reach = (sweep.capacity as f64 - a.intercept) / a.slope;
        if reach >= 1.0 {
            // Far past the points the peak can move to another moment
            // (activations outgrow the optimizer's state), where other
            // tensors are alive: the line says nothing there.
            let largest = fit.batches.iter().copied().max().unwrap_or(0);
            let beyond = if reach > 2.0 * largest as f64 {
                format!(
                    ", far past the largest batch measured ({largest}), where the peak may fall at another moment with other tensors alive"
                )
            } else {
                String::new()
            };
            out.push(format!(
                "The line reaches the allocator's {} at batch ≈ {:.0}{beyond}; the allocator's rounding and the reserved cache decide where a run really stops (--find-max-batch searches it).",
                format_size(sweep.capacity),
                reach.floor()
            ));
        }
    }
}

fn linearity_words(fit: &Fit) -> String {
    let Some(worst) = fit.worst() else {
        return String::new();
    };
    let side = if worst.bytes >= 0.0 { "above" } else { "below" };
    if fit.linear {
        return format!(
            "Linear: every point lies within {:.0} % of the line; the furthest, batch {}, is {} {side} it ({:.2} % of its peak).",
            LINEAR_WITHIN * 100.0,
            worst.batch,
            format_size(worst.bytes.abs().round() as u64),
            worst.relative.abs() * 100.0
        );
    }
    let i = fit
        .batches
        .iter()
        .position(|b| *b == worst.batch)
        .unwrap_or(0);
    let mut text = format!(
        "Not linear: batch {} lies {} {side} the line ({:.1} % of its peak).",
        worst.batch,
        format_size(worst.bytes.abs().round() as u64),
        worst.relative.abs() * 100.0
    );
    let mut causes: Vec<(&str, f64)> = fit
        .by_category
        .iter()
        .map(|l| {
            let off = l.values[i] as f64 - l.line.at(worst.batch as f64);
            (l.category.as_str(), off)
        })
        .filter(|(_, off)| off.abs() >= 0.1 * worst.bytes.abs())
        .collect();
    causes.sort_by(|a, b| b.1.abs().total_cmp(&a.1.abs()));
    if !causes.is_empty() {
        let list: Vec<String> = causes
            .iter()
            .map(|(n, off)| format!("{} {}", category_label(n), signed_size(*off)))
            .collect();
        text.push_str(&format!(
            " Off their own lines there, by category: {}.",
            list.join(", ")
        ));
    }
    text
}

fn rounding_words(sweep: &Sweep, fit: &Fit, r: &CategoryLine) -> String {
    let first = fit.batches.first().copied().unwrap_or(0);
    let last = fit.batches.last().copied().unwrap_or(0);
    let first_peak = sweep
        .points
        .iter()
        .find(|p| p.seq == fit.seq && p.batch == first)
        .map_or(0, |p| p.peak_allocated);
    let at_first = r.values.first().copied().unwrap_or(0);
    format!(
        "Allocator rounding (every block a multiple of 512 B; a cached block whose remainder is too small to split is handed out whole) is {} of the peak at batch {first} ({}) and {} at batch {last}.",
        format_size(at_first),
        percent_of(at_first, first_peak),
        format_size(r.values.last().copied().unwrap_or(0)),
    )
}

/// Where each point's peak falls: the phase, op and module of the request
/// that reached it.
fn moment_words(sweep: &Sweep, fit: &Fit) -> Option<String> {
    let mut groups: Vec<(String, Vec<u64>)> = Vec::new();
    for p in sweep
        .points
        .iter()
        .filter(|p| p.seq == fit.seq && fit.batches.contains(&p.batch))
    {
        let m = p.at_peak.as_ref()?;
        let place = format!(
            "in {} at {}{}",
            m.phase.unwrap_or("setup"),
            m.op.as_deref().unwrap_or("an untagged request"),
            m.module
                .as_deref()
                .filter(|m| !m.is_empty())
                .map_or(String::new(), |m| format!(" ({m})"))
        );
        match groups.iter_mut().find(|g| g.0 == place) {
            Some(g) => g.1.push(p.batch),
            None => groups.push((place, vec![p.batch])),
        }
    }
    Some(match groups.as_slice() {
        [] => return None,
        [(place, _)] => format!("Every point peaks at the same moment: {place}."),
        many => format!(
            "The peak falls at different moments, so different tensors are alive at it: {}.",
            many.iter()
                .map(|(place, batches)| format!(
                    "batch {} {place}",
                    batches
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    })
}

fn percent_of(part: u64, whole: u64) -> String {
    if whole == 0 {
        "none".to_string()
    } else {
        format!("{:.2} %", part as f64 * 100.0 / whole as f64)
    }
}

fn reserved_words(sweep: &Sweep, fit: &Fit) -> String {
    let slack: Vec<(u64, u64)> = sweep
        .points
        .iter()
        .filter(|p| p.seq == fit.seq && fit.batches.contains(&p.batch))
        .map(|p| (p.batch, p.peak_reserved.saturating_sub(p.peak_allocated)))
        .collect();
    let lo = slack.iter().min_by_key(|s| s.1).copied().unwrap_or((0, 0));
    let hi = slack.iter().max_by_key(|s| s.1).copied().unwrap_or((0, 0));
    format!(
        "Peak reserved ≈ {} + {} × batch (R² = {:.5}; furthest point {:.1} % off). Reserved grows by whole segments (2 MiB for requests up to 1 MiB, 20 MiB for those up to 10 MiB, larger ones rounded up to 2 MiB), so it moves in steps: reserved exceeds the allocated peak by {} at batch {} to {} at batch {}.",
        signed_size(fit.reserved.intercept),
        signed_size(fit.reserved.slope),
        fit.reserved.r_squared,
        fit.reserved_worst_relative.abs() * 100.0,
        format_size(lo.1),
        lo.0,
        format_size(hi.1),
        hi.0
    )
}

fn left_out_words(sweep: &Sweep, out: &mut Vec<String>) {
    let mut by_reason: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for p in sweep.points.iter().filter(|p| !p.fits()) {
        let label = match p.seq {
            Some(t) => format!("{} (seq {t})", p.batch),
            None => p.batch.to_string(),
        };
        let reason = if p.oom {
            "ran out of memory"
        } else {
            "stopped with an error"
        };
        by_reason.entry(reason).or_default().push(label);
    }
    for (reason, batches) in by_reason {
        out.push(format!(
            "Batch {} {reason} on the {} the allocator may use: left out of the line.",
            batches.join(", "),
            format_size(sweep.capacity)
        ));
    }
}

fn max_batch_words(m: &MaxBatch) -> String {
    let runs = match m.reused {
        0 => format!("{} runs", m.runs),
        r => format!("{} runs (and {r} points the sweep had run)", m.runs),
    };
    let path = m
        .tried
        .iter()
        .map(|(b, fits)| format!("{b}{}", if *fits { "✓" } else { "✗" }))
        .collect::<Vec<_>>()
        .join(" ");
    if let Some(e) = &m.error {
        return format!("The search for the largest batch stopped: {e} (after {runs}: {path}).");
    }
    match (m.batch, m.first_oom) {
        (Some(b), Some(f)) => format!(
            "Largest batch that fits{}: {b} (batch {f} runs out of memory), found in {runs} by doubling then bisection: {path}.",
            seq_words(m.seq)
        ),
        (None, _) => format!(
            "Not even batch 1 fits{}: it runs out of memory.",
            seq_words(m.seq)
        ),
        (Some(b), None) => format!(
            "Every batch up to {b} fits{} (the search stops at {MAX_SEARCH_BATCH}, the largest batch modelled), in {runs}.",
            seq_words(m.seq)
        ),
    }
}

fn largest_point_words(sweep: &Sweep) -> Option<String> {
    let seqs: std::collections::BTreeSet<Option<u64>> =
        sweep.points.iter().map(|p| p.seq).collect();
    let lines: Vec<String> = seqs
        .into_iter()
        .filter_map(|seq| {
            let best = sweep.largest_fitting_point(seq)?;
            let first_fail = sweep
                .points
                .iter()
                .filter(|p| p.seq == seq && p.oom && p.batch > best)
                .map(|p| p.batch)
                .min();
            Some(match first_fail {
                Some(f) => format!(
                    "Of the points{}, the largest that fits is batch {best}; batch {f} runs out of memory (--find-max-batch searches between them).",
                    seq_words(seq)
                ),
                None => format!(
                    "Of the points{}, the largest that fits is batch {best}, and none ran out of memory (--find-max-batch searches for the limit).",
                    seq_words(seq)
                ),
            })
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join(" "))
}
