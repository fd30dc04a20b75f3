//! Each part's answer checked against its scenario's run: the part's
//! expectations on the run, and its comparisons against other scenarios'
//! runs. A lesson whose answer its scenario does not show fails here.

use std::collections::{BTreeMap, HashMap};

use super::claims::{audit, audit_framing, check_says, lesson_text, names, Quoted};
use super::facts::RunFacts;
use super::format::{Comparison, Figure, Part};
use super::load::LoadedLesson;
use crate::alloc::{format_size, Action, Family, Level};
use crate::scenario::{check, run, ExpectationResult, LoadError, RunOptions, RunResult, Size};
use crate::trace::event::{Event, Marker, Phase};

/// One part's run and what its checks found.
#[derive(Debug, Clone)]
pub struct PartVerdict {
    pub run: RunResult,
    /// The part's `check`, `figures`, `compare` and `says` entries, each
    /// with whether it held.
    pub checks: Vec<ExpectationResult>,
    /// Every other size the part's text and its scenario's narration
    /// state, against what the run shows at that text's moment.
    pub prose: Vec<ExpectationResult>,
}

impl PartVerdict {
    pub fn holds(&self) -> bool {
        self.checks.iter().chain(&self.prose).all(|c| c.passed)
    }
}

/// A scenario's run with its events, and its `alloc_conf`.
fn run_named(lesson: &LoadedLesson, name: &str) -> Result<(RunResult, String), LoadError> {
    let (scenario, built) = lesson.scenario(name)?;
    let opts = RunOptions {
        iterations: None,
        record_events: true,
    };
    Ok((run(&scenario, &built, &opts), scenario.alloc_conf))
}

/// The phase allocated is in when it first reaches the run's peak, summing
/// the allocator's entries (alloc +, free_completed −) between the markers.
fn peak_phase(r: &RunResult) -> Option<Phase> {
    let (mut allocated, mut peak) = (0u64, 0u64);
    let (mut phase, mut at) = (None, None);
    for e in &r.events {
        match e {
            Event::Marker(Marker::PhaseBegin(p)) => phase = Some(*p),
            Event::Marker(Marker::PhaseEnd(_)) => phase = None,
            Event::Alloc(a) if a.action == Action::Alloc => {
                allocated += a.block_size;
                if allocated > peak {
                    peak = allocated;
                    at = phase;
                }
            }
            Event::Alloc(a) if a.action == Action::FreeCompleted => {
                allocated = allocated.saturating_sub(a.block_size)
            }
            _ => {}
        }
    }
    at
}

/// The free blocks at the run's end that have a live block after them in
/// their segment: how many, and their bytes.
fn holes(r: &RunResult) -> (u32, u64) {
    let (mut count, mut bytes) = (0, 0);
    for s in &r.segments {
        let last_live = s.blocks.iter().rposition(|b| b.state.is_active());
        for (i, b) in s.blocks.iter().enumerate() {
            if !b.state.is_active() && last_live.is_some_and(|l| i < l) {
                count += 1;
                bytes += b.size;
            }
        }
    }
    (count, bytes)
}

/// The run's page maps and unmaps (expandable segments), and the first
/// that was not at a segment's end: a map is at an end when nothing is
/// mapped right after it, an unmap when nothing stays mapped right after
/// what it released.
fn pages_at_ends(r: &RunResult) -> (u32, u32, Option<String>) {
    // Mapped ranges: start → end, merged when they touch.
    let mut mapped: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut maps, mut unmaps) = (0, 0);
    let starts_at = |m: &BTreeMap<u64, u64>, addr: u64| m.contains_key(&addr);
    for e in &r.events {
        let Event::Alloc(a) = e else { continue };
        let (start, end) = (a.addr, a.addr.saturating_add(a.size));
        match a.action {
            Action::SegmentMap => {
                maps += 1;
                if starts_at(&mapped, end) {
                    let what = format!("{} mapped in front of mapped memory", format_size(a.size));
                    return (maps, unmaps, Some(what));
                }
                let joined = mapped
                    .iter()
                    .find(|(_, e)| **e == start)
                    .map(|(s, _)| *s)
                    .unwrap_or(start);
                mapped.insert(joined, end);
            }
            Action::SegmentUnmap => {
                unmaps += 1;
                let holder = mapped
                    .range(..=start)
                    .next_back()
                    .map(|(s, e)| (*s, *e))
                    .filter(|(_, e)| *e >= end);
                match holder {
                    Some((s, e)) if e == end => {
                        mapped.remove(&s);
                        if s < start {
                            mapped.insert(s, start);
                        }
                    }
                    _ => {
                        let what = format!("{} unmapped inside a segment", format_size(a.size));
                        return (maps, unmaps, Some(what));
                    }
                }
            }
            _ => {}
        }
    }
    (maps, unmaps, None)
}

fn compare_one(c: &Comparison, mine: &RunResult, other: &RunResult) -> ExpectationResult {
    use std::cmp::Ordering::{Equal, Greater, Less};
    let (what, a, b, want) = match c {
        Comparison::PeakAllocatedAbove(_) => (
            "peak allocated",
            mine.peak_allocated,
            other.peak_allocated,
            Greater,
        ),
        Comparison::PeakAllocatedBelow(_) => (
            "peak allocated",
            mine.peak_allocated,
            other.peak_allocated,
            Less,
        ),
        Comparison::PeakAllocatedSame(_) => (
            "peak allocated",
            mine.peak_allocated,
            other.peak_allocated,
            Equal,
        ),
        Comparison::PeakReservedAbove(_) => (
            "peak reserved",
            mine.peak_reserved,
            other.peak_reserved,
            Greater,
        ),
        Comparison::PeakReservedBelow(_) => (
            "peak reserved",
            mine.peak_reserved,
            other.peak_reserved,
            Less,
        ),
    };
    let relation = match want {
        Greater => "above",
        Less => "below",
        Equal => "the same as",
    };
    ExpectationResult {
        expectation: format!("{what} {relation} {}'s", c.other()),
        passed: a.cmp(&b) == want,
        observed: format!(
            "{what} {} here, {} in {}",
            format_size(a),
            format_size(b),
            c.other()
        ),
    }
}

fn figure_one(f: &Figure, r: &RunResult) -> ExpectationResult {
    let ends: Vec<u64> = r.per_iteration.iter().map(|p| p.allocated).collect();
    let (low, high) = (
        ends.iter().copied().min().unwrap_or(0),
        ends.iter().copied().max().unwrap_or(0),
    );
    let between = format!(
        "allocated at iteration ends {}..{}",
        format_size(low),
        format_size(high)
    );
    let context = format!("{} not the allocator's", format_size(r.conditions.overhead));
    let sized = |what: &str, s: &Size| format!("{what} {}", format_size(s.0));
    let (expectation, passed, observed) = match f {
        Figure::BetweenStepsAllocatedUnder(s) => (
            sized("allocated at every iteration end under", s),
            !ends.is_empty() && high < s.0,
            between,
        ),
        Figure::BetweenStepsAllocatedOver(s) => (
            sized("allocated at every iteration end over", s),
            !ends.is_empty() && low > s.0,
            between,
        ),
        Figure::ContextOver(s) => (
            sized("the context over", s),
            r.conditions.overhead > s.0,
            context,
        ),
        Figure::ContextUnder(s) => (
            sized("the context under", s),
            r.conditions.overhead < s.0,
            context,
        ),
        Figure::ActiveEqualsAllocated => {
            let active = r.stats.get(Family::ActiveBytes, Level::All).current as u64;
            let allocated = r.stats.allocated_bytes();
            (
                "active bytes equal to allocated bytes at the end".to_string(),
                active == allocated,
                format!(
                    "active {}, allocated {}",
                    format_size(active),
                    format_size(allocated)
                ),
            )
        }
        Figure::InactiveSplitOver(s) => {
            let split = r.stats.get(Family::InactiveSplitBytes, Level::All).current as u64;
            (
                sized("inactive split bytes at the end over", s),
                split > s.0,
                format!("inactive split {}", format_size(split)),
            )
        }
        Figure::PagesOnlyAtSegmentEnds => {
            let (maps, unmaps, inside) = pages_at_ends(r);
            let passed = maps > 0 && inside.is_none();
            let observed = match inside {
                Some(what) => what,
                None => format!(
                    "{} and {}, each at a segment's end",
                    crate::units::counted(maps, "map"),
                    crate::units::counted(unmaps, "unmap")
                ),
            };
            (
                "pages mapped and unmapped only at a segment's end".to_string(),
                passed,
                observed,
            )
        }
        Figure::HolesOver(s) => {
            let (count, bytes) = holes(r);
            (
                sized("holes between live blocks at the end over", s),
                bytes > s.0,
                format!(
                    "{} of {}",
                    crate::units::counted(count, "hole"),
                    format_size(bytes)
                ),
            )
        }
        Figure::PeakIn(want) => {
            let name = peak_phase(r).map_or("no phase", |p| p.name());
            (
                format!("the peak in the {want} phase"),
                name == want,
                format!(
                    "peak allocated {} reached in {name}",
                    format_size(r.peak_allocated)
                ),
            )
        }
    };
    ExpectationResult {
        expectation,
        passed,
        observed,
    }
}

/// The built-in scenarios `texts` name (hyphenated names, as whole words).
fn named_scenarios(texts: &[&str]) -> Vec<&'static str> {
    crate::scenario::builtins()
        .iter()
        .map(|b| b.name)
        .filter(|name| name.contains('-'))
        .filter(|name| texts.iter().any(|t| names(t, name)))
        .collect()
}

/// Run one part's scenario (and any it compares with or quotes) and check
/// its answer and the sizes its text states.
pub fn verify_part(lesson: &LoadedLesson, part: &Part) -> Result<PartVerdict, LoadError> {
    let (mine, conf) = run_named(lesson, &part.scenario)?;
    let mut checks = check(&part.check, &mine);
    checks.extend(part.figures.iter().map(|f| figure_one(f, &mine)));
    let mut others: HashMap<String, RunResult> = HashMap::new();
    let mut known = Vec::new();
    let mut compared = Vec::new();
    for c in &part.compare {
        let (other, other_conf) = run_named(lesson, c.other())?;
        checks.push(compare_one(c, &mine, &other));
        let facts = RunFacts::read(&other, &other_conf);
        known.extend(facts.end_facts(&other, c.other()));
        compared.push(facts);
        others.insert(c.other().to_string(), other);
    }
    // A scenario the part's text or its narration names may be quoted: its
    // figures count as known too.
    let facts = RunFacts::read(&mine, &conf);
    let narrated = facts.moments.iter().filter_map(|m| m.narration.as_deref());
    let texts: Vec<&str> = lesson_text(part)
        .into_iter()
        .map(|(_, t)| t)
        .chain(narrated)
        .collect();
    let mut quoted = Vec::new();
    for name in named_scenarios(&texts) {
        if name == part.scenario {
            continue;
        }
        let (other, other_conf) = run_named(lesson, name)?;
        let f = RunFacts::read(&other, &other_conf);
        quoted.push(Quoted {
            name,
            facts: f.end_facts(&other, name),
            run: f,
        });
        others.entry(name.to_string()).or_insert(other);
    }
    let mut run_other = |name: &str| -> Result<RunResult, String> {
        if let Some(r) = others.get(name) {
            return Ok(r.clone());
        }
        let (r, _) = run_named(lesson, name).map_err(|e| e.to_string())?;
        others.insert(name.to_string(), r.clone());
        Ok(r)
    };
    checks.extend(check_says(part, &mine, &facts, &mut run_other));
    let prose = audit(part, &mine, &facts, &known, &compared, &quoted);
    Ok(PartVerdict {
        run: mine,
        checks,
        prose,
    })
}

/// The sizes the lesson's introduction and summary state, against its
/// parts' runs (`verdicts`, in order) and the runs they compare with.
pub fn verify_framing(lesson: &LoadedLesson, verdicts: &[PartVerdict]) -> Vec<ExpectationResult> {
    let mut runs: Vec<RunResult> = verdicts.iter().map(|v| v.run.clone()).collect();
    let mut compared: Vec<&str> = lesson
        .lesson
        .parts
        .iter()
        .flat_map(|p| p.compare.iter().map(Comparison::other))
        .collect();
    compared.sort_unstable();
    compared.dedup();
    runs.extend(
        compared
            .into_iter()
            .filter_map(|name| run_named(lesson, name).ok().map(|(r, _)| r)),
    );
    let facts: Vec<RunFacts> = runs.iter().map(|r| RunFacts::read(r, "")).collect();
    let pairs: Vec<(&RunResult, &RunFacts)> = runs.iter().zip(&facts).collect();
    audit_framing(&lesson.lesson.intro, &lesson.lesson.summary, &pairs)
}

/// Every part, in order.
pub fn verify(lesson: &LoadedLesson) -> Result<Vec<PartVerdict>, LoadError> {
    lesson
        .lesson
        .parts
        .iter()
        .map(|p| verify_part(lesson, p))
        .collect()
}
