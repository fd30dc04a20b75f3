//! What a run has said: the narration of the moment at the cursor (every
//! narration marker said together, in a row) and the history of all of it up
//! to the cursor, newest last, for the `E` popup. Taken from the `Narration`
//! markers the producer put in the event stream.

use std::sync::Arc;

use super::popup::{LineStyle, Popup, PopupLine};
use super::run_view::RunView;
use crate::trace::event_store::EventStore;
use crate::trace::{Event, Marker};
use crate::units::escape_controls;

fn text_of(e: Option<Event>) -> Option<Arc<str>> {
    match e {
        Some(Event::Marker(Marker::Narration(t))) => Some(t),
        _ => None,
    }
}

/// The narration said together with the one at event `last` (the markers in
/// a row that end there), in the order said.
pub fn moment(events: &EventStore, last: usize) -> Vec<Arc<str>> {
    let mut first = last;
    while first > 0 && text_of(events.get(first - 1)).is_some() {
        first -= 1;
    }
    (first..=last)
        .filter_map(|i| text_of(events.get(i)))
        .collect()
}

/// One narration of the history: where it was said and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Said {
    pub event: usize,
    pub iteration: Option<u32>,
    pub text: Arc<str>,
}

/// Every narration at or before the cursor, oldest first.
pub fn history(r: &RunView) -> Vec<Said> {
    let events = r.timeline.events();
    let said = r.said_upto();
    let upto = r.marks.narration.partition_point(|i| *i < said);
    let it = &r.marks.iteration;
    r.marks.narration[..upto]
        .iter()
        .filter_map(|&i| {
            let text = text_of(events.get(i))?;
            let k = it.partition_point(|x| x.0 < i);
            Some(Said {
                event: i,
                iteration: k.checked_sub(1).map(|k| it[k].1),
                text,
            })
        })
        .collect()
}

/// The `E` popup: the history, scrolled to its newest entry.
pub fn history_popup(r: &RunView) -> Popup {
    let said = history(r);
    let mut head = Vec::new();
    if said.is_empty() {
        head.push(PopupLine::new(
            "nothing has been narrated yet at this point of the run",
            LineStyle::Dim,
        ));
    }
    for (n, s) in said.iter().enumerate() {
        if n > 0 {
            head.push(PopupLine::new("", LineStyle::Dim));
        }
        let when = match s.iteration {
            Some(k) => format!("iteration {k} · event {}", s.event),
            None => format!("before the first iteration · event {}", s.event),
        };
        head.push(PopupLine::new(when, LineStyle::Heading));
        for l in escape_controls(&s.text).split('\n') {
            head.push(PopupLine::new(l.trim().to_string(), LineStyle::Text));
        }
    }
    let title = format!(" Narration so far · {} · {} ", r.title, said.len());
    let mut p = Popup::new(title, head, None);
    p.key(super::input::PopupAction::Bottom);
    p
}
