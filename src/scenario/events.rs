//! Engine events into the one event model the views and reports read.

use std::sync::Arc;

use crate::engine::EngineEvent;
use crate::trace::{Event, Marker};

/// A warning as Python prints its category before the text.
pub(crate) fn user_warning(text: &str) -> String {
    format!("UserWarning: {text}")
}

/// The trace event for an engine event.
pub fn to_trace(e: &EngineEvent) -> Option<Event> {
    Some(match e {
        EngineEvent::Alloc(a) => Event::Alloc(*a),
        EngineEvent::IterationBegin(i) => Event::Marker(Marker::IterationBegin(*i)),
        EngineEvent::IterationEnd { iter, .. } => Event::Marker(Marker::IterationEnd(*iter)),
        EngineEvent::PhaseBegin(p) => Event::Marker(Marker::PhaseBegin(*p)),
        EngineEvent::PhaseEnd(p) => Event::Marker(Marker::PhaseEnd(*p)),
        EngineEvent::OpBegin { name, module } => Event::Marker(Marker::OpBegin {
            name: Arc::from(*name),
            module: module.clone(),
        }),
        EngineEvent::OpEnd => Event::Marker(Marker::OpEnd),
        EngineEvent::Error { message, .. } => {
            Event::Marker(Marker::Error(Arc::from(message.as_str())))
        }
        // Shown where the program's own text goes: the UI's callouts and the
        // report's narration (and its own list of warnings).
        EngineEvent::Warning(text) => {
            Event::Marker(Marker::Narration(Arc::from(user_warning(text))))
        }
        EngineEvent::StepBegin { index, .. } => Event::Marker(Marker::Step(*index)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_reaches_the_views_as_a_callout() {
        let ev = to_trace(&EngineEvent::Warning("Gradients will be None"));
        assert_eq!(
            ev,
            Some(Event::Marker(Marker::Narration(Arc::from(
                "UserWarning: Gradients will be None"
            ))))
        );
    }
}
