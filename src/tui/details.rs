//! What the popups say: the stack of a block's allocation, the details of
//! one event, and the error / OOM message or narration at the cursor in
//! full. Built from what the source recorded; where it recorded nothing,
//! they say so and what is known instead, never a guess.

use crate::alloc::{format_size, Action, AllocEvent, BlockState, Tag};
use crate::producers::{BlockStack, SiteKind, StackOrigin, TagDescription};
use crate::trace::{Event, Marker};
use crate::units::{escape_controls, format_epoch_us};

use super::popup::{LineStyle, Popup, PopupLine};
use super::run_view::RunView;

fn line(text: impl Into<String>) -> PopupLine {
    PopupLine::new(text, LineStyle::Text)
}

fn dim(text: impl Into<String>) -> PopupLine {
    PopupLine::new(text, LineStyle::Dim)
}

fn field(name: &str, value: impl std::fmt::Display) -> PopupLine {
    line(format!("{name:<13}{value}"))
}

/// The stack of block `addr` as the map holds it at the cursor; `None`
/// when there is no such block.
pub fn stack_popup(r: &RunView, addr: u64) -> Option<Popup> {
    let (a, b) = r.map.block_at(addr)?;
    let state = match b.state {
        BlockState::ActiveAllocated => "allocated",
        BlockState::ActivePendingFree => "pending free",
        BlockState::Inactive => "free",
    };
    let title = format!(" Stack · block {a:#x} · {} {state} ", format_size(b.size));
    let mut head = vec![line(format!(
        "block {a:#x}  {}  requested {}  {state}",
        format_size(b.size),
        format_size(b.requested)
    ))];
    if let Some((sa, s)) = r.map.segment_at(a) {
        head.push(dim(format!(
            "in segment {sa:#x}  {}  {} pool  stream {}",
            format_size(s.size),
            s.pool.name(),
            s.stream
        )));
    }
    if b.state == BlockState::Inactive {
        head.push(line(
            "free: cached by the allocator, no allocation holds it, so it has no stack",
        ));
        return Some(Popup::new(title, head, None));
    }
    let tags = r.tags.as_ref();
    match tags.and_then(|t| t.stack(b.tag, a)) {
        Some(bs) => {
            head.extend(origin_lines(r, &bs));
            head.extend(stack_lines(&bs));
            Some(Popup::new(title, head, bs.stack.filter(|s| !s.is_empty())))
        }
        None => {
            let desc = (b.tag != Tag::NONE)
                .then(|| tags.and_then(|t| t.describe(b.tag)))
                .flatten();
            head.extend(attribution_lines(
                desc.as_ref(),
                tags.map(|t| t.site_kind()),
            ));
            Some(Popup::new(title, head, None))
        }
    }
}

/// Where the block's stack comes from, and when that entry happened.
fn origin_lines(r: &RunView, bs: &BlockStack) -> Vec<PopupLine> {
    let recorded = bs.stack.as_ref().is_some_and(|s| !s.is_empty());
    let text = match bs.origin {
        StackOrigin::Entry(e) => {
            let time = r
                .tags
                .as_ref()
                .and_then(|t| t.entry_time(e))
                .map(|t| format!(" at {}", format_epoch_us(t)))
                .unwrap_or_default();
            format!("allocated by trace entry {e}{time}")
        }
        StackOrigin::FinalState if r.is_empty() && recorded => {
            "stack from the file's final state (segments[].blocks[]); the file has no trace".into()
        }
        StackOrigin::FinalState if r.is_empty() => {
            "the file has no trace, and its final state (segments[].blocks[]) \
             records no stack for this block"
                .into()
        }
        StackOrigin::FinalState if recorded => "allocated before the trace began and still \
             live at its end: stack from the file's final state (segments[].blocks[])"
            .into(),
        StackOrigin::FinalState => "allocated before the trace began and still live at its \
             end; the file's final state (segments[].blocks[]) records no stack for it"
            .into(),
        StackOrigin::BeforeTrace => "allocated before the trace began and freed within it: \
             neither the trace nor the file's final state holds its stack"
            .into(),
    };
    vec![line(text)]
}

fn stack_lines(bs: &BlockStack) -> Vec<PopupLine> {
    let mut out = Vec::new();
    match bs.stack.as_deref().filter(|s| !s.is_empty()) {
        None => out.push(PopupLine::new("no stack recorded", LineStyle::Heading)),
        Some(s) => {
            match &s.site {
                Some(site) => out.push(PopupLine::new(
                    format!("your code: {site}"),
                    LineStyle::Heading,
                )),
                None => out.push(PopupLine::new(
                    "no frame of your own code in this stack (C++, PyTorch and the interpreter only)",
                    LineStyle::Heading,
                )),
            }
            out.push(dim(""));
            out.push(dim(format!(
                "{} frame{}, innermost first:",
                s.frames.len(),
                if s.frames.len() == 1 { "" } else { "s" }
            )));
        }
    }
    out
}

/// What a source without stacks knows of a block (a simulated run: the
/// engine's op, module, category and iteration).
fn attribution_lines(desc: Option<&TagDescription>, kind: Option<SiteKind>) -> Vec<PopupLine> {
    let mut out = Vec::new();
    match kind {
        Some(SiteKind::EngineOp) => out.push(PopupLine::new(
            "no stack recorded: a simulated run has no Python stack; the scenario says",
            LineStyle::Heading,
        )),
        _ => out.push(PopupLine::new("no stack recorded", LineStyle::Heading)),
    }
    let Some(d) = desc else {
        out.push(dim("nothing else is known of this allocation"));
        return out;
    };
    if let Some(step) = &d.step {
        out.push(field("step", &step.location));
        out.push(field("stands for", &step.statement));
    }
    if let Some(op) = &d.op {
        out.push(field("op", op));
    }
    if let Some(m) = &d.module {
        out.push(field("module", m));
    }
    if let Some(c) = d.category {
        out.push(field("holds", c.name()));
    }
    if let Some(i) = d.iteration {
        out.push(field("iteration", i));
    }
    out
}

/// Details of event `index`: its fields, its trace entry and time where the
/// file has them, and the stack.
pub fn event_popup(r: &RunView, index: usize) -> Option<Popup> {
    let e = r.timeline.events().get(index)?;
    let title = format!(" Event {index} of {} · {} ", r.len(), r.title);
    match e {
        Event::Alloc(a) => Some(alloc_event_popup(r, index, &a, title)),
        Event::Marker(m) => Some(Popup::new(title, marker_lines(&m), None)),
    }
}

fn alloc_event_popup(r: &RunView, index: usize, a: &AllocEvent, title: String) -> Popup {
    let mut head = vec![field("action", a.action.name())];
    if a.action != Action::Oom {
        head.push(field("address", format!("{:#x}", a.addr)));
    }
    head.push(field(
        "size",
        format!("{} ({} bytes)", format_size(a.size), a.size),
    ));
    if a.action != Action::Oom {
        head.push(field("block size", format_size(a.block_size)));
    }
    head.push(field("stream", a.stream));
    head.push(field("pool", a.pool.name()));
    if a.action == Action::Oom {
        head.push(field("device free", format_size(a.device_free)));
    }
    let tags = r.tags.as_ref();
    // The check guards the one-for-one mirroring the index relies on.
    let entry = tags
        .and_then(|t| t.event_entry(index))
        .filter(|d| d.action == a.action);
    match &entry {
        Some(d) => {
            head.push(field("trace entry", d.entry));
            head.push(field("time", time_text(d.time_us, d.first_time_us)));
        }
        None => head.push(field(
            "time",
            match tags.map(|t| t.site_kind()) {
                Some(SiteKind::EngineOp) => {
                    "not recorded: a simulated run orders its events, it does not time them"
                }
                Some(SiteKind::PythonLine) => {
                    "none: a replayed event is the what-if allocator's own, not a trace entry"
                }
                None => "not recorded",
            },
        )),
    }
    // A free's tag is its block's: the allocation it ends.
    let freed = matches!(a.action, Action::FreeRequested | Action::FreeCompleted);
    if let Some(bs) = tags.filter(|_| freed).and_then(|t| t.stack(a.tag, a.addr)) {
        head.push(field("allocated at", allocated_at(&bs)));
    }
    head.push(dim(""));
    if let Some(d) = entry {
        let own = d.stack.filter(|s| !s.is_empty());
        match &own {
            Some(s) => {
                head.push(PopupLine::new(
                    match &s.site {
                        Some(site) => format!("your code: {site}"),
                        None => "no frame of your own code in this entry's stack".into(),
                    },
                    LineStyle::Heading,
                ));
                head.push(dim(format!(
                    "the entry's stack, {} frames, innermost first:",
                    s.frames.len()
                )));
            }
            None => head.push(PopupLine::new(
                "the file records no stack for this entry",
                LineStyle::Heading,
            )),
        }
        return Popup::new(title, head, own);
    }
    match tags.and_then(|t| t.stack(a.tag, a.addr)) {
        Some(bs) => {
            if let StackOrigin::Entry(e) = bs.origin {
                head.push(dim(format!("the stack of its request, trace entry {e}:")));
            }
            head.extend(stack_lines(&bs));
            Popup::new(title, head, bs.stack.filter(|s| !s.is_empty()))
        }
        None => {
            let desc = (a.tag != Tag::NONE)
                .then(|| tags.and_then(|t| t.describe(a.tag)))
                .flatten();
            head.extend(attribution_lines(
                desc.as_ref(),
                tags.map(|t| t.site_kind()),
            ));
            Popup::new(title, head, None)
        }
    }
}

/// Where the block a free ends was allocated, as far as the file says.
fn allocated_at(bs: &BlockStack) -> String {
    let site = bs.stack.as_ref().and_then(|s| s.site.clone());
    match (site, bs.origin) {
        (Some(site), StackOrigin::Entry(e)) => format!("{site}  (trace entry {e})"),
        (Some(site), _) => format!("{site}  (before the trace began)"),
        (None, StackOrigin::Entry(e)) => {
            format!("trace entry {e}, whose stack has no frame of your own code")
        }
        (None, _) => "before the trace began; no frame of your own code recorded".into(),
    }
}

fn time_text(t: Option<i64>, first: Option<i64>) -> String {
    match t {
        None => "not recorded for this entry (the file has no time_us here)".into(),
        Some(t) => {
            let since = first
                .map(|f| format!("  (+{:.6} s into the trace)", (t - f) as f64 / 1e6))
                .unwrap_or_default();
            format!("{}{since}", format_epoch_us(t))
        }
    }
}

fn marker_lines(m: &Marker) -> Vec<PopupLine> {
    let text = |t: &str| -> Vec<PopupLine> {
        escape_controls(t)
            .split('\n')
            .map(|l| line(l.to_string()))
            .collect()
    };
    let mut out = Vec::new();
    match m {
        Marker::Narration(t) => {
            out.push(PopupLine::new("narration", LineStyle::Heading));
            out.extend(text(t));
        }
        Marker::Error(t) => {
            out.push(PopupLine::new("error", LineStyle::Error));
            out.extend(text(t));
        }
        Marker::Annotation { name, start } => {
            out.push(field(
                "annotation",
                if *start {
                    "region starts"
                } else {
                    "region ends"
                },
            ));
            out.extend(text(name));
        }
        Marker::OpBegin { name, module } => {
            out.push(field("op begins", escape_controls(name)));
            out.push(field("module", escape_controls(module)));
        }
        other => out.push(line(
            super::views::event_log::describe(&Event::Marker(other.clone())).0,
        )),
    }
    out
}

/// The run's failure, the error marker and the narration at the cursor,
/// each in full; `None` when there is none of them.
pub fn message_popup(r: &RunView) -> Option<Popup> {
    let mut head = Vec::new();
    let mut section = |label: &str, style: LineStyle, t: &str| {
        if !head.is_empty() {
            head.push(dim(""));
        }
        head.push(PopupLine::new(label, style));
        head.extend(
            escape_controls(t)
                .split('\n')
                .map(|l| PopupLine::new(l.to_string(), LineStyle::Text)),
        );
    };
    if let Some(f) = &r.failure {
        section("the run failed", LineStyle::Error, f);
    }
    if let Some(e) = &r.frame.error_marker {
        section("error at the cursor", LineStyle::Error, e);
    }
    for n in &r.frame.narration {
        section("narration at the cursor", LineStyle::Heading, n);
    }
    (!head.is_empty()).then(|| Popup::new(format!(" Message · {} ", r.title), head, None))
}
