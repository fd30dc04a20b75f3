//! The answer at an out-of-memory, which is never "none found": what held
//! the memory at that moment, what grew since the first iteration and
//! where, and whether the request would have fitted after `empty_cache()`
//! or with expandable segments — both from the allocator, replaying the
//! run's own requests up to the one that failed.

use serde::Serialize;

use super::holders::Holder;
use super::requests::{RequestLog, RunDevice};
use crate::alloc::{format_size, AllocConfig};
use crate::trace::replay::whatif::RetryOutcome;

/// How many holders the answer names.
pub const LISTED_HOLDERS: usize = 6;

/// What an OOM met, and what would have changed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OomAnswer {
    /// The iteration it happened in (0: setup, or a trace's).
    pub iteration: u32,
    /// Where, in words: `iteration 52`, `trace entry 1,234`.
    pub place: String,
    pub requested: u64,
    /// Just before the request (the allocator's replay of the run): what
    /// was allocated and reserved, the largest free cached block and what
    /// the device had left. None where the replay did not reproduce the OOM.
    pub at_request: Option<RetryOutcome>,
    /// The largest holders (after the failing statement unwound), then the
    /// failing statement's own temporaries when the replay knows them.
    pub holders: Vec<Holder>,
    /// Bytes the failing statement had allocated when it failed, freed as
    /// the error unwound.
    pub temporaries: Option<u64>,
    pub grew: Grew,
    pub what_if: Vec<WhatIf>,
}

/// Growth since the first completed iteration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Grew {
    /// The first iteration the run completed (None: it failed in the first).
    pub since_iteration: Option<u32>,
    pub allocated_then: u64,
    pub allocated_now: u64,
    /// Holders that grew since then: (name, bytes then, bytes now), most first.
    pub by: Vec<(String, u64, u64)>,
    /// Holders whose memory was all made in the failing iteration: the
    /// pile-up within one iteration (name, bytes, items).
    pub within_iteration: Vec<(String, u64, u32)>,
    /// Why there is no first iteration to compare with, where it is not
    /// that the run failed in its first (a trace that marks none).
    pub unknown: Option<String>,
}

/// One setting tried on the failing request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WhatIf {
    /// `empty_cache()`, `expandable_segments:True`.
    pub setting: String,
    /// None: the replay could not tell.
    pub fits: Option<bool>,
    /// Why, in words.
    pub why: String,
}

/// The what-ifs for the failing request `at` of `log`. The run's own
/// config is replayed first: where it does not fail at `at` too, the replay
/// is not the run, and nothing is claimed.
pub(super) fn what_ifs(
    log: &RequestLog,
    at: usize,
    device: &RunDevice,
) -> (Option<RetryOutcome>, Vec<WhatIf>) {
    let retry = |config: AllocConfig, empty: bool| log.retry(at, device, config, empty);
    let when = |i: usize| format!("in iteration {}", log.iteration_of(i));
    what_ifs_with(&retry, &device.config, log.entries[at].size, &when)
}

/// The what-ifs from `retry` (the failing request tried under a config,
/// after `empty_cache()` or not); `when` says where an earlier request is.
pub(super) fn what_ifs_with(
    retry: &dyn Fn(AllocConfig, bool) -> RetryOutcome,
    config: &AllocConfig,
    request: u64,
    when: &dyn Fn(usize) -> String,
) -> (Option<RetryOutcome>, Vec<WhatIf>) {
    let own = retry(config.clone(), false);
    if own.fits || own.earlier_ooms > 0 {
        let why = "the allocator's replay of this run's requests did not fail where the run did, \
                   so it cannot say what another setting would have done"
            .to_string();
        let unknown = |setting: &str| WhatIf {
            setting: setting.into(),
            fits: None,
            why: why.clone(),
        };
        return (
            None,
            vec![
                unknown("empty_cache()"),
                unknown("expandable_segments:True"),
            ],
        );
    }
    let mut out = Vec::new();

    let emptied = retry(config.clone(), true);
    let why = if emptied.fits {
        format!(
            "empty_cache() first returns {} of whole free segments to the device, and then \
             the request fits",
            format_size(own.reserved.saturating_sub(emptied.reserved))
        )
    } else {
        format!(
            "before raising, the allocator already did what empty_cache() does (it returned {} of \
             whole free segments) and retried; {}",
            format_size(own.released_by_failure),
            why_not(&emptied, request),
        )
    };
    out.push(WhatIf {
        setting: "empty_cache()".into(),
        fits: Some(emptied.fits),
        why,
    });

    if !config.expandable_segments {
        let mut config = config.clone();
        config.expandable_segments = true;
        config.raw = match config.raw.as_str() {
            "" => "expandable_segments:True".into(),
            raw => format!("{raw},expandable_segments:True"),
        };
        let e = retry(config, false);
        let why = match (e.fits, e.first_earlier_oom) {
            (_, Some(first)) => format!(
                "the same requests replayed with expandable segments run out earlier, {} ({} \
                 before this one do not fit)",
                when(first),
                crate::units::counted(e.earlier_ooms as u64, "request")
            ),
            (true, _) => format!(
                "the same requests replayed with expandable segments: {} allocated, {} reserved \
                 before it, and the request fits (this request: what the run does after it is \
                 not replayed)",
                format_size(e.allocated),
                format_size(e.reserved),
            ),
            (false, _) => format!(
                "the same requests replayed with expandable segments: {}",
                why_not(&e, request)
            ),
        };
        out.push(WhatIf {
            setting: "expandable_segments:True".into(),
            fits: Some(e.fits && e.earlier_ooms == 0),
            why,
        });
    }
    (Some(own), out)
}

/// Why a request did not fit, from the allocator's state just before it:
/// too little free at all (the memory is held), or free memory in pieces
/// this request cannot use.
fn why_not(o: &RetryOutcome, request: u64) -> String {
    let cached = o.reserved.saturating_sub(o.allocated);
    let free = o.device_free + cached;
    if free < request {
        return format!(
            "{} allocated; {} free in all ({} on the device, {} cached), less than the {} asked: \
             the memory is held, not fragmented",
            format_size(o.allocated),
            format_size(free),
            format_size(o.device_free),
            format_size(cached),
            format_size(request),
        );
    }
    let pool = if o.small_pool {
        "the small pool (requests up to 1 MiB, served from 2 MiB segments of its own)"
    } else {
        "the large pool"
    };
    format!(
        "{} is free in all, but not where this request can use it: the largest free block in {pool} \
         is {} ({} free there in all), the device has {} left for a new segment, and the other free \
         pieces lie in {} that still hold live blocks",
        format_size(free),
        format_size(o.pool_largest_free),
        format_size(o.pool_free),
        format_size(o.device_free),
        crate::units::counted(o.segments_in_use as u64, "segment"),
    )
}

impl OomAnswer {
    /// The answer in lines, for the report and the TUI's message.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut head = format!(
            "at the OOM ({}): a request of {}",
            self.place,
            format_size(self.requested)
        );
        if let Some(a) = &self.at_request {
            head.push_str(&format!(
                "; just before it {} allocated, {} reserved ({} of it free, the largest free \
                 block {}), {} left on the device",
                format_size(a.allocated),
                format_size(a.reserved),
                format_size(a.reserved.saturating_sub(a.allocated)),
                format_size(a.largest_free),
                format_size(a.device_free),
            ));
        }
        out.push(head);
        out.push(format!("largest holders: {}", self.holders_text()));
        out.push(self.grew_text());
        for w in &self.what_if {
            let verdict = match w.fits {
                Some(true) => "would fit",
                Some(false) => "would not fit",
                None => "unknown",
            };
            out.push(format!("{}: {verdict} — {}", w.setting, w.why));
        }
        out
    }

    /// One line: the largest holder and the what-ifs' verdicts (the TUI's
    /// callout row).
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        if let Some(h) = self.holders.first() {
            parts.push(format!("{} holds {}", h.name, format_size(h.bytes)));
        }
        for w in &self.what_if {
            let verdict = match w.fits {
                Some(true) => "fits",
                Some(false) => "no",
                None => "unknown",
            };
            let setting = w.setting.trim_end_matches(":True");
            parts.push(format!("{setting} {verdict}"));
        }
        format!("at the OOM: {}", parts.join(" · "))
    }

    fn holders_text(&self) -> String {
        let mut parts: Vec<String> = self
            .holders
            .iter()
            .map(|h| {
                let mut s = format!("{} {} ({}", h.name, format_size(h.bytes), h.what);
                if h.named && h.items >= 2 && h.this_iteration == h.bytes && self.iteration > 1 {
                    s.push_str(", all made in this iteration");
                }
                s.push(')');
                s
            })
            .collect();
        if let Some(t) = self.temporaries.filter(|t| *t > 0) {
            parts.push(format!(
                "the failing statement's temporaries {} (freed as the error unwound)",
                format_size(t)
            ));
        }
        if parts.is_empty() {
            return "nothing on the GPU".into();
        }
        parts.join(", ")
    }

    fn grew_text(&self) -> String {
        let g = &self.grew;
        let Some(since) = g.since_iteration else {
            if let Some(why) = &g.unknown {
                return format!("grew: {why}");
            }
            let within = if g.within_iteration.is_empty() {
                String::new()
            } else {
                format!(
                    "; within it: {}",
                    g.within_iteration
                        .iter()
                        .map(|(n, b, items)| match items {
                            0 | 1 => format!("{n} {}", format_size(*b)),
                            k => format!(
                                "{n} {} over {}",
                                format_size(*b),
                                crate::units::counted(u64::from(*k), "item")
                            ),
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            return format!(
                "grew: the run ran out in its first iteration, so there is no earlier iteration to \
                 compare with{within}"
            );
        };
        let mut s = format!(
            "grew since iteration {since}: allocated {} → {}",
            format_size(g.allocated_then),
            format_size(g.allocated_now)
        );
        if g.by.is_empty() {
            s.push_str("; no holder grew (the failing iteration's own peak ran out)");
        } else {
            let by: Vec<String> =
                g.by.iter()
                    .map(|(n, a, b)| match a {
                        0 => format!("{n} +{} (from nothing)", format_size(*b)),
                        a => format!(
                            "{n} +{} ({} → {})",
                            format_size(b - a),
                            format_size(*a),
                            format_size(*b)
                        ),
                    })
                    .collect();
            s.push_str(&format!("; {}", by.join(", ")));
        }
        if !g.within_iteration.is_empty() {
            let w: Vec<String> = g
                .within_iteration
                .iter()
                .map(|(n, b, _)| format!("{n} {}", format_size(*b)))
                .collect();
            s.push_str(&format!(
                "; made within the failing iteration: {}",
                w.join(", ")
            ));
        }
        s
    }
}
