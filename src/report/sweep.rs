//! The headless report of a batch sweep: a table of the points, then the
//! fit and the largest batch in words; or all of it as JSON.

use std::fmt::Write;

use serde_json::Value;

use crate::alloc::format_size;
use crate::sweep::Sweep;

pub fn text(s: &Sweep) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "sweep {}: {} points, each a run of its own; the allocator may use {}",
        s.scenario,
        s.points.len(),
        format_size(s.capacity)
    );
    for note in &s.notes {
        let _ = writeln!(out, "note: {note}");
    }
    if !s.points.is_empty() {
        let with_seq = s.points.iter().any(|p| p.seq.is_some());
        let _ = writeln!(
            out,
            "\n{:>7}{}  {:>14}  {:>14}  result",
            "batch",
            if with_seq { "      seq" } else { "" },
            "peak allocated",
            "peak reserved"
        );
        for p in &s.points {
            let seq = match (with_seq, p.seq) {
                (true, Some(t)) => format!("  {t:>7}"),
                (true, None) => format!("  {:>7}", "—"),
                (false, _) => String::new(),
            };
            let result = if p.oom {
                "OOM".to_string()
            } else if let Some(e) = &p.error {
                format!("error: {e}")
            } else {
                "fits".to_string()
            };
            let _ = writeln!(
                out,
                "{:>7}{seq}  {:>14}  {:>14}  {result}",
                p.batch,
                format_size(p.peak_allocated),
                format_size(p.peak_reserved)
            );
        }
    }
    out.push('\n');
    for line in &s.explanation {
        let _ = writeln!(out, "{line}");
    }
    if !s.narration.is_empty() {
        let _ = writeln!(out, "\nthe scenario says:");
        for line in &s.narration {
            let _ = writeln!(out, "  {line}");
        }
    }
    out
}

pub fn json(s: &Sweep) -> Value {
    serde_json::to_value(s).unwrap_or(Value::Null)
}
