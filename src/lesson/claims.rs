//! The sizes a part's text states, checked like its figures: each `says`
//! entry against the figure of the run it names, and every other size in
//! the part's own text (setup, question, right choice, explanation) and in
//! its scenario's narration against what the run shows at that text's
//! moment: a narration at its own event, the lesson's text anywhere the
//! run narrates or at its end. A wrong choice states what is false on
//! purpose and is not read.

use super::facts::{Fact, Moment, RunFacts};
use super::figure::{figures_in, StatedFigure};
use super::format::{Part, Quantity, Says};
use super::LETTERS;
use crate::alloc::format_size;
use crate::scenario::{ExpectationResult, RunResult};

/// The part's own text a reader sees, each with where it is.
pub fn lesson_text(part: &Part) -> Vec<(&'static str, &str)> {
    let mut out: Vec<(&'static str, &str)> = Vec::new();
    out.extend(part.setup.iter().map(|p| ("setup", p.as_str())));
    out.push(("question", part.question.as_str()));
    if let Some(right) = LETTERS
        .iter()
        .position(|l| *l == part.answer)
        .and_then(|i| part.choices.get(i))
    {
        out.push(("the right choice", right.as_str()));
    }
    out.extend(part.explanation.iter().map(|p| ("explanation", p.as_str())));
    out
}

/// A quantity's value: one figure, or one per iteration (each must hold).
enum Value {
    One(u64),
    Each(Vec<u64>),
}

fn describe(q: &Quantity) -> String {
    match q {
        Quantity::PeakAllocated => "the peak allocated".into(),
        Quantity::PeakReserved => "the peak reserved".into(),
        Quantity::Allocated => "allocated at that moment".into(),
        Quantity::Reserved => "reserved at that moment".into(),
        Quantity::StepEndAllocated => "allocated at every iteration's end".into(),
        Quantity::StepEndLow => "the lowest allocated at an iteration's end".into(),
        Quantity::StepEndHigh => "the highest allocated at an iteration's end".into(),
        Quantity::StepGrowth => "allocated's growth from one iteration's end to the next".into(),
        Quantity::PhasePeak(p) => format!("the highest allocated in {p}"),
        Quantity::InactiveSplit => "inactive split bytes at the end".into(),
        Quantity::Context => "the memory never the allocator's (the context)".into(),
        Quantity::Capacity => "the device's capacity".into(),
        Quantity::Of(name, q) => format!("{} in {name}", describe(q)),
        Quantity::Minus(a, b) => format!("{} less {}", describe(a), describe(b)),
    }
}

/// Runs another scenario a quantity names (the part's `compare` runner).
pub type Other<'a> = dyn FnMut(&str) -> Result<RunResult, String> + 'a;

fn value(q: &Quantity, r: &RunResult, m: &Moment, other: &mut Other) -> Result<Value, String> {
    let ends: Vec<u64> = r.per_iteration.iter().map(|p| p.allocated).collect();
    let one = Value::One;
    Ok(match q {
        Quantity::PeakAllocated => one(m.peak_allocated.max(r.peak_allocated)),
        Quantity::PeakReserved => one(m.peak_reserved.max(r.peak_reserved)),
        Quantity::Allocated => one(m.allocated),
        Quantity::Reserved => one(m.reserved),
        Quantity::StepEndAllocated => Value::Each(ends),
        Quantity::StepEndLow => one(ends.iter().copied().min().ok_or("no iteration ended")?),
        Quantity::StepEndHigh => one(ends.iter().copied().max().ok_or("no iteration ended")?),
        Quantity::StepGrowth => {
            Value::Each(ends.windows(2).map(|w| w[1].saturating_sub(w[0])).collect())
        }
        Quantity::PhasePeak(name) => one(m
            .phase_peaks
            .iter()
            .find(|(p, _)| p.name() == name)
            .map(|(_, v)| *v)
            .ok_or_else(|| format!("no {name} phase ran"))?),
        Quantity::InactiveSplit => one(r
            .stats
            .get(
                crate::alloc::Family::InactiveSplitBytes,
                crate::alloc::Level::All,
            )
            .current as u64),
        Quantity::Context => one(r.conditions.overhead),
        Quantity::Capacity => one(r.conditions.capacity),
        Quantity::Of(name, q) => {
            let run = other(name)?;
            let end = RunFacts::read(&run, "").end();
            value(q, &run, &end, other)?
        }
        Quantity::Minus(a, b) => match (value(a, r, m, other)?, value(b, r, m, other)?) {
            (Value::One(a), Value::One(b)) => one(a.saturating_sub(b)),
            _ => return Err("Minus takes two single figures".into()),
        },
    })
}

/// Where `text` is shown: the part's own text (the run's end), else the
/// first narration that holds it (that narration's moment).
fn moment_of<'m>(part: &Part, facts: &'m RunFacts, text: &str) -> Option<&'m Moment> {
    if lesson_text(part).iter().any(|(_, t)| t.contains(text)) {
        return facts.moments.last();
    }
    facts
        .moments
        .iter()
        .find(|m| m.narration.as_deref().is_some_and(|n| n.contains(text)))
}

/// Each `says` entry: its text is in the part's text or narration, states
/// one size, and that size is the named figure of the run.
pub fn check_says(
    part: &Part,
    r: &RunResult,
    facts: &RunFacts,
    other: &mut Other,
) -> Vec<ExpectationResult> {
    part.says
        .iter()
        .map(|Says(text, q)| {
            let expectation = format!("\"{text}\" is {}", describe(q));
            let failed = |observed: String| ExpectationResult {
                expectation: expectation.clone(),
                passed: false,
                observed,
            };
            let Some(m) = moment_of(part, facts, text) else {
                return failed("not in the part's text or its scenario's narration".into());
            };
            let stated = figures_in(text);
            let [figure] = stated.as_slice() else {
                return failed(format!("states {} sizes, not one", stated.len()));
            };
            match value(q, r, m, other) {
                Err(why) => failed(why),
                Ok(Value::One(v)) => ExpectationResult {
                    expectation,
                    passed: figure.holds_for(v),
                    observed: format_size(v),
                },
                Ok(Value::Each(vs)) => ExpectationResult {
                    expectation,
                    passed: !vs.is_empty() && vs.iter().all(|v| figure.holds_for(*v)),
                    observed: each(&vs),
                },
            }
        })
        .collect()
}

/// Figures, one per iteration, as a line: "2.78 MiB at each of 34".
fn each(vs: &[u64]) -> String {
    let shown: Vec<String> = vs.iter().map(|v| format_size(*v)).collect();
    match shown.as_slice() {
        [] => "none".into(),
        [one] => one.clone(),
        [first, rest @ ..] if rest.iter().all(|s| s == first) => {
            format!("{first} at each of {}", shown.len())
        }
        _ if shown.len() > 6 => format!("{} … ({} figures)", shown[..6].join(", "), shown.len()),
        _ => shown.join(", "),
    }
}

/// A figure in a decimal unit with decimals reads as a measurement in a
/// unit the screen never shows ("2.9 MB" for 2.78 MiB): refused whatever
/// it matches. A whole decimal figure ("a 100 MB tensor") is a size a
/// program asked for and is checked like the others.
fn decimal_measurement(f: &StatedFigure) -> bool {
    f.decimal && f.text.contains('.')
}

/// `text` names the scenario `name`, as a whole word.
pub fn names(text: &str, name: &str) -> bool {
    let boundary = |c: Option<char>| !c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-');
    text.match_indices(name).any(|(i, _)| {
        boundary(text[..i].chars().next_back()) && boundary(text[i + name.len()..].chars().next())
    })
}

/// A scenario a text names, whose figures that text may quote.
pub struct Quoted {
    pub name: &'static str,
    /// Its run's figures at its end, named as its.
    pub facts: Vec<Fact>,
    pub run: RunFacts,
}

/// Every size the part's text and its scenario's narration state that no
/// `says` entry names, against what the run shows at that text's moment;
/// `known` are the figures of the runs the part compares with (any of its
/// text may state them), `others` those runs (their sizes), `quoted` the
/// scenarios a text names (only that text may state their figures).
pub fn audit(
    part: &Part,
    r: &RunResult,
    facts: &RunFacts,
    known: &[Fact],
    others: &[RunFacts],
    quoted: &[Quoted],
) -> Vec<ExpectationResult> {
    let claimed = |where_: &str, f: &StatedFigure| {
        part.says
            .iter()
            .any(|Says(text, _)| text.contains(&f.text) && where_.contains(text.as_str()))
    };
    let elsewhere = |text: &str, f: &StatedFigure| {
        let named = quoted.iter().filter(|q| names(text, q.name));
        known
            .iter()
            .chain(named.clone().flat_map(|q| &q.facts))
            .find(|k| f.holds_for(k.bytes))
            .map(|k| format!("{}, {}", k.what, format_size(k.bytes)))
            .or_else(|| {
                others
                    .iter()
                    .chain(named.map(|q| &q.run))
                    .find_map(|o| o.has_size(f))
                    .map(|s| format!("a block or segment of a compared run, {}", format_size(s)))
            })
    };
    let mut out = Vec::new();
    let mut judge = |place: String,
                     text: &str,
                     shown: &dyn Fn(&StatedFigure) -> Option<String>,
                     near: &dyn Fn(&StatedFigure) -> Option<Fact>| {
        for f in figures_in(text) {
            if claimed(text, &f) {
                continue;
            }
            let expectation = format!("\"{}\" ({place}) is a figure of the run", f.text);
            let (passed, observed) = if decimal_measurement(&f) {
                (
                    false,
                    "a measured figure in a decimal unit: the screen shows KiB, MiB, GiB"
                        .to_string(),
                )
            } else {
                match shown(&f).or_else(|| elsewhere(text, &f)) {
                    Some(what) => (true, what),
                    None => (
                        false,
                        match near(&f) {
                            Some(n) => format!(
                                "nothing the run shows there rounds to it (nearest: {}, {})",
                                n.what,
                                format_size(n.bytes)
                            ),
                            None => "nothing the run shows there rounds to it".to_string(),
                        },
                    ),
                }
            };
            out.push(ExpectationResult {
                expectation,
                passed,
                observed,
            });
        }
    };
    for (place, text) in lesson_text(part) {
        let anywhere =
            |f: &StatedFigure| (0..facts.moments.len()).find_map(|i| facts.shows(r, i, f));
        let near = |f: &StatedFigure| {
            (0..facts.moments.len())
                .filter_map(|i| facts.nearest(r, i, f))
                .min_by(|a, b| {
                    let d = |k: &Fact| (k.bytes as f64 - f.bytes).abs();
                    d(a).total_cmp(&d(b))
                })
        };
        judge(place.to_string(), text, &anywhere, &near);
    }
    for (i, m) in facts.moments.iter().enumerate() {
        let Some(text) = m.narration.as_deref() else {
            continue;
        };
        let at_moment = |f: &StatedFigure| facts.shows(r, i, f);
        let near = |f: &StatedFigure| facts.nearest(r, i, f);
        let opening: String = text.chars().take(32).collect();
        judge(
            format!("the narration \"{opening}…\""),
            text,
            &at_moment,
            &near,
        );
    }
    out
}

/// Every size a lesson's introduction and summary state, against what any
/// of its parts' runs shows at any moment: the framing text belongs to no
/// one run, but states nothing none of them shows.
pub fn audit_framing(
    intro: &[String],
    summary: &[String],
    runs: &[(&RunResult, &RunFacts)],
) -> Vec<ExpectationResult> {
    let texts = intro
        .iter()
        .map(|t| ("introduction", t))
        .chain(summary.iter().map(|t| ("summary", t)));
    let mut out = Vec::new();
    for (place, text) in texts {
        for f in figures_in(text) {
            let expectation = format!("\"{}\" ({place}) is a figure of the lesson's runs", f.text);
            let shown = runs.iter().find_map(|(r, facts)| {
                (0..facts.moments.len()).find_map(|i| facts.shows(r, i, &f))
            });
            let (passed, observed) = if decimal_measurement(&f) {
                (
                    false,
                    "a measured figure in a decimal unit: the screen shows KiB, MiB, GiB"
                        .to_string(),
                )
            } else {
                match shown {
                    Some(what) => (true, what),
                    None => (false, "no part's run shows it".to_string()),
                }
            };
            out.push(ExpectationResult {
                expectation,
                passed,
                observed,
            });
        }
    }
    out
}
