//! The detail lines under the map: the block at the cursor, its request,
//! and the stack that asked for it.

use crate::alloc::{format_size, BlockState, Tag};
use crate::producers::{BlockStack, StackOrigin};
use crate::tui::app::RunView;
use crate::tui::views::fit_site;

pub(super) fn detail_lines(r: &RunView, width: usize) -> Vec<String> {
    let Some(addr) = r.sel_block else {
        return Vec::new();
    };
    let Some((a, b)) = r.map.block_at(addr) else {
        return vec![format!(
            "block {addr:#x}: not in the map at this event (freed and merged, or released)"
        )];
    };
    let state = match b.state {
        BlockState::ActiveAllocated => "allocated",
        BlockState::ActivePendingFree => "pending free",
        BlockState::Inactive => "free",
    };
    let mut lines = vec![format!(
        "block {a:#x}  {}  requested {}  {state}",
        format_size(b.size),
        format_size(b.requested)
    )];
    if let Some((sa, s)) = r.map.segment_at(a) {
        lines.push(format!(
            "segment {sa:#x}  {}  {} pool  stream {}{}",
            format_size(s.size),
            s.pool.name(),
            s.stream,
            if s.expandable { "  expandable" } else { "" }
        ));
    }
    let recorded = b
        .state
        .is_active()
        .then(|| r.tags.as_ref().and_then(|t| t.stack(b.tag, a)))
        .flatten();
    if let Some(bs) = recorded {
        lines.extend(stack_summary(&bs, r.is_empty(), width));
        return lines;
    }
    let desc = (b.tag != Tag::NONE)
        .then(|| r.tags.as_ref().and_then(|t| t.describe(b.tag)))
        .flatten();
    match desc {
        Some(d) => {
            let mut parts = Vec::new();
            if let Some(c) = d.category {
                parts.push(c.name().to_string());
            }
            if let Some(op) = &d.op {
                parts.push(format!("op {op}"));
            }
            if let Some(m) = &d.module {
                parts.push(format!("module {m}"));
            }
            if let Some(i) = d.iteration {
                parts.push(format!("iteration {i}"));
            }
            lines.push(if parts.is_empty() {
                "no attribution".into()
            } else {
                parts.join(" · ")
            });
            if let Some(step) = &d.step {
                lines.push(format!("step {}  {}", step.location, step.statement));
            } else if !d.frames.is_empty() {
                lines.push(format!("frames: {}", d.frames.join(" ← ")));
            }
        }
        None if b.state == BlockState::Inactive => lines.push("free: no owner".into()),
        None => lines.push("no attribution for this block".into()),
    }
    lines
}

/// A block's recorded stack in two lines: the user's line (its end kept
/// where the width cuts it), then where the stack comes from.
fn stack_summary(bs: &BlockStack, no_trace: bool, width: usize) -> Vec<String> {
    let stack = bs.stack.as_deref().filter(|s| !s.is_empty());
    let first = match stack.map(|s| &s.site) {
        Some(Some(site)) => format!("your code: {}", fit_site(site, width.saturating_sub(11))),
        Some(None) => "no frame of your own code in its stack".to_string(),
        None => "no stack recorded".to_string(),
    };
    let origin = match (bs.origin, stack.is_some()) {
        (StackOrigin::Entry(e), _) => format!("allocated by trace entry {e}"),
        (StackOrigin::FinalState, true) if no_trace => "stack from the file's final state".into(),
        (StackOrigin::FinalState, false) if no_trace => {
            "the file's final state records none".into()
        }
        (StackOrigin::FinalState, true) => {
            "allocated before the trace; stack from the file's final state".into()
        }
        (StackOrigin::FinalState, false) => {
            "allocated before the trace; the file's final state records none".into()
        }
        (StackOrigin::BeforeTrace, _) => "allocated before the trace began, freed within it".into(),
    };
    let more = match stack {
        Some(s) => format!("b: all {} frames · ", s.frames.len()),
        None => String::new(),
    };
    vec![first, format!("{more}{origin}")]
}
