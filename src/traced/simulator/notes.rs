//! What the trace says about itself: OOMs, the sizes taken from estimates,
//! assumptions or the program's own values, the ops it could not trace and
//! the program's exception, each placed at the program's own line.

use std::io::Write;

use serde_json::Value;

use super::super::args::{stack_at, str_at};
use super::super::outcome::{Assumed, Estimate, Exception, Known, Untraced};
use super::Simulator;

impl<W: Write> Simulator<W> {
    /// OOMs so far.
    pub(in crate::traced) fn ooms(&self) -> u64 {
        self.outcome.ooms
    }

    /// The program's own line for a stack it defined.
    pub(in crate::traced) fn user_frame_of(&self, stack: u32) -> Option<String> {
        self.stacks.get(stack as usize).and_then(|f| user_frame(f))
    }

    /// A size taken from an estimate, once per kind of call.
    pub(in crate::traced) fn outcome_estimate(&mut self, what: &str, bytes: u64) {
        match self.outcome.estimates.iter_mut().find(|e| e.what == what) {
            Some(e) => e.calls += 1,
            None => self.outcome.estimates.push(Estimate {
                what: what.to_string(),
                bytes,
                calls: 1,
            }),
        }
    }

    /// A data-dependent shape taken from an assumption, once per op, line
    /// and assumption (the calls counted).
    pub(in crate::traced) fn outcome_assumed(
        &mut self,
        what: &str,
        assumption: &str,
        stack: Option<u32>,
    ) {
        let at = stack.and_then(|s| self.user_frame_of(s));
        let same = |a: &&mut Assumed| a.what == what && a.assumption == assumption && a.at == at;
        match self.outcome.assumed.iter_mut().find(same) {
            Some(a) => a.calls += 1,
            None => self.outcome.assumed.push(Assumed {
                what: what.to_string(),
                assumption: assumption.to_string(),
                at,
                calls: 1,
            }),
        }
    }

    /// A data-dependent shape taken from the program's own values, once
    /// per op and line (the calls counted).
    pub(in crate::traced) fn outcome_known(&mut self, what: &str, stack: Option<u32>) {
        let at = stack.and_then(|s| self.user_frame_of(s));
        match self
            .outcome
            .known
            .iter_mut()
            .find(|k| k.what == what && k.at == at)
        {
            Some(k) => k.calls += 1,
            None => self.outcome.known.push(Known {
                what: what.to_string(),
                at,
                calls: 1,
            }),
        }
    }

    pub(super) fn untraced(&mut self, v: &Value) {
        let at = stack_at(v, 3)
            .and_then(|s| self.stacks.get(s as usize))
            .and_then(|f| user_frame(f));
        self.outcome.untraced.push(Untraced {
            what: str_at(v, 1),
            why: str_at(v, 2),
            at,
            instead: v.get(4).and_then(Value::as_str).map_or_else(
                || "nothing: the op raised NotImplementedError in the program, which decides what follows".into(),
                String::from,
            ),
        });
    }

    pub(super) fn exception(&mut self, v: &Value) {
        let frames: Vec<String> = v
            .get(3)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|f| {
                        format!(
                            "{}:{} in {}",
                            str_at(f, 0),
                            f.get(1).and_then(Value::as_i64).unwrap_or(0),
                            str_at(f, 2)
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.outcome.exception = Some(Exception {
            kind: str_at(v, 1),
            message: str_at(v, 2),
            at: frames,
        });
    }
}

/// The innermost frame of the program's own code (not PyTorch's, not the
/// standard library's): `file:line in name`.
pub fn user_frame(frames: &[(String, i64, String)]) -> Option<String> {
    let is_library = |f: &str| {
        f.starts_with('<')
            || f.contains("/site-packages/")
            || f.contains("/dist-packages/")
            || f.contains("/lib/python3")
    };
    frames
        .iter()
        .find(|(f, _, _)| !is_library(f))
        .or_else(|| frames.first())
        .map(|(f, l, n)| format!("{f}:{l} in {n}"))
}
