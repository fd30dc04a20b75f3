use super::*;
use crate::alloc::{AllocEvent, Pool, Tag};

const MIB: u64 = 1 << 20;

fn entry(action: Action, addr: u64, size: u64) -> Event {
    Event::Alloc(AllocEvent {
        action,
        addr,
        size,
        block_size: size,
        stream: 0,
        pool: Pool::Large,
        device_free: 0,
        tag: Tag::NONE,
    })
}

/// A block of `size` at `addr` (inside a segment) taken and given back:
/// allocated is `size` higher right after the first of the three.
fn spike(addr: u64, size: u64) -> [Event; 3] {
    [
        entry(Action::Alloc, addr, size),
        entry(Action::FreeRequested, addr, size),
        entry(Action::FreeCompleted, addr, size),
    ]
}

fn oom(size: u64) -> Event {
    entry(Action::Oom, 0, size)
}

/// Peaks so far for every `pos` in `0..=len`, by walking the samples.
fn walked(start: Peak, samples: &[Sample]) -> Vec<Peak> {
    let mut run = start;
    let mut out = vec![run];
    for s in samples {
        run = run.merge(Peak {
            allocated: s.allocated,
            reserved: s.reserved,
        });
        out.push(run);
    }
    out
}

#[test]
fn the_curve_is_the_maps_own_after_every_event() {
    // Segments come and go between spikes, so reserved steps up and down.
    let mut events = Vec::new();
    for k in 0..2000u64 {
        let seg = 0x1_0000_0000 + (k % 7) * (64 << 20);
        events.push(entry(Action::SegmentAlloc, seg, 20 << 20));
        events.extend(spike(seg, ((k % 13) + 1) << 20));
        if k % 3 != 0 {
            events.push(entry(Action::SegmentFree, seg, 20 << 20));
        }
    }
    let mut t = Timeline::new();
    let mut map = MemoryMap::default();
    let mut want = Vec::new();
    for e in &events {
        t.push(e.clone());
        if let Event::Alloc(a) = e {
            let _ = map.apply(a);
        }
        want.push(Sample {
            allocated: map.allocated,
            reserved: map.reserved,
        });
    }
    assert!(t.samples().eq(want.iter().copied()));
    assert!(want.windows(2).any(|w| w[0].reserved > w[1].reserved));
    for (i, w) in want.iter().enumerate().step_by(97) {
        assert_eq!(t.sample(i), Some(*w), "event {i}");
        for to in [i + 1, i + 300, i + 1000] {
            let by_hand = want[i..to.min(want.len())]
                .iter()
                .map(|s| Bucket::of(*s))
                .reduce(Bucket::merge);
            assert_eq!(t.range_summary(i, to), by_hand, "[{i}, {to})");
        }
    }
    assert_eq!(t.sample(want.len()), None);
}

#[test]
fn peak_and_ooms_until_follow_the_cursor() {
    let mut t = Timeline::new();
    assert_eq!(t.peak_until(0), Peak::default(), "an empty timeline");
    t.push(entry(Action::SegmentAlloc, 0, 20 * MIB)); // 0: reserved 20
    t.extend(spike(0, 12 * MIB)); // 1..=3: allocated 12 after 1
    t.push(oom(64 * MIB)); // 4
    t.push(entry(Action::SegmentAlloc, 64 * MIB, 2 * MIB)); // 5: reserved 22
    t.push(entry(Action::SegmentFree, 64 * MIB, 2 * MIB)); // 6: reserved 20
    t.extend(spike(0, 16 * MIB)); // 7..=9: allocated 16 after 7
    t.push(oom(64 * MIB)); // 10
    let p = |allocated: u64, reserved: u64| Peak {
        allocated: allocated * MIB,
        reserved: reserved * MIB,
    };
    // pos = events applied: at 0 nothing is, so nothing has peaked yet.
    assert_eq!(t.peak_until(0), p(0, 0));
    assert_eq!(t.peak_until(1), p(0, 20));
    assert_eq!(t.peak_until(2), p(12, 20));
    assert_eq!(t.peak_until(5), p(12, 20));
    assert_eq!(t.peak_until(6), p(12, 22));
    assert_eq!(t.peak_until(7), p(12, 22), "reserved stays at its peak");
    assert_eq!(t.peak_until(8), p(16, 22));
    assert_eq!(t.peak_until(t.len()), t.peak());
    assert_eq!(t.peak_until(usize::MAX), t.peak());
    assert_eq!(t.peak(), p(16, 22));
    let ooms: Vec<usize> = (0..=t.len()).map(|pos| t.ooms_until(pos)).collect();
    assert_eq!(ooms, [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2]);
    assert_eq!(t.ooms_until(usize::MAX), 2);
    assert_eq!(t.gaps_until(t.len()), 0);
    assert_eq!(Timeline::new().ooms_until(5), 0);
}

#[test]
fn an_open_traces_start_state_is_the_first_peak() {
    // The state a snapshot's first entry found: 20 MiB reserved, 12 held.
    let mut start = MemoryMap::default();
    for e in [
        entry(Action::SegmentAlloc, 0, 20 * MIB),
        entry(Action::Alloc, 0, 12 * MIB),
    ] {
        let Event::Alloc(a) = e else { unreachable!() };
        start.apply(&a).expect("placeable");
    }
    let mut t = Timeline::starting_from(start);
    let at_start = Peak {
        allocated: 12 * MIB,
        reserved: 20 * MIB,
    };
    assert_eq!(t.peak_until(0), at_start, "no events yet");
    t.push(entry(Action::FreeRequested, 0, 12 * MIB));
    t.push(entry(Action::FreeCompleted, 0, 12 * MIB));
    t.push(entry(Action::SegmentFree, 0, 20 * MIB));
    // A free of a block the map never saw: a gap of an open trace.
    t.push(entry(Action::FreeRequested, 1 << 40, MIB));
    for pos in 0..=t.len() {
        assert_eq!(t.peak_until(pos), at_start, "pos {pos}: memory only fell");
    }
    t.push(entry(Action::SegmentAlloc, 0, 40 * MIB));
    t.extend(spike(0, 30 * MIB));
    assert_eq!(t.peak_until(4), at_start);
    assert_eq!(t.peak_until(5).reserved, 40 * MIB);
    assert_eq!(t.peak_until(5).allocated, 12 * MIB);
    assert_eq!(t.peak_until(6).allocated, 30 * MIB);
    assert_eq!((t.gaps_until(3), t.gaps_until(4)), (0, 1));
    assert_eq!(t.gaps_until(t.len()), t.gaps().len());
}

#[test]
fn peaks_and_ooms_across_keyframes() {
    const K: usize = KEYFRAME_EVERY;
    // Small blocks come and go in one segment; spikes land on each side
    // of keyframe boundaries, and OOMs either side of one.
    let big = 1 << 40;
    let mut events = vec![
        entry(Action::SegmentAlloc, 0, 64 * MIB),
        entry(Action::SegmentAlloc, big, 1 << 30),
    ];
    let specials: Vec<(usize, Vec<Event>)> = vec![
        // Allocated peaks on the last event before keyframe 1 ...
        (K - 1, spike(big, 100 * MIB).to_vec()),
        // ... and on the first event of keyframe 2.
        (2 * K, spike(big, 200 * MIB).to_vec()),
        // Reserved peaks on the last event before keyframe 3.
        (
            3 * K - 1,
            vec![
                entry(Action::SegmentAlloc, 8 << 40, 512 * MIB),
                entry(Action::SegmentFree, 8 << 40, 512 * MIB),
            ],
        ),
        // A smaller spike: no new peak.
        (3 * K + 1, spike(big, 150 * MIB).to_vec()),
        (4 * K - 1, vec![oom(2 << 30), oom(2 << 30)]),
    ];
    let mut i = 0u64;
    while events.len() < 4 * K + 700 {
        let at = events.len();
        if let Some((_, evs)) = specials.iter().find(|(s, _)| *s == at) {
            events.extend(evs.iter().cloned());
        } else if specials.iter().any(|(s, _)| *s > at && *s < at + 3) {
            events.push(Event::Marker(Marker::OpEnd));
        } else {
            events.extend(spike(0, (i % 97 + 1) * 64 * 1024));
            i += 1;
        }
    }
    // Lengths on, just past and just before keyframe boundaries.
    for len in [3 * K, 3 * K + 1, 3 * K - 1, 4 * K, events.len()] {
        let mut t = Timeline::new();
        t.extend(events[..len].iter().cloned());
        let want = walked(Peak::default(), &t.samples().collect::<Vec<_>>());
        for (pos, w) in want.iter().enumerate() {
            assert_eq!(t.peak_until(pos), *w, "len {len} pos {pos}");
        }
        assert_eq!(t.peak_until(len), t.peak());
    }
    let mut t = Timeline::new();
    t.extend(events.iter().cloned());
    let alloc = |pos| t.peak_until(pos).allocated;
    assert!(alloc(K - 1) < 7 * MIB, "only small blocks before the spike");
    assert_eq!(
        alloc(K),
        100 * MIB,
        "the spike at K - 1 is applied at pos K"
    );
    assert_eq!(alloc(K + 1), 100 * MIB);
    assert_eq!(alloc(2 * K), 100 * MIB, "event 2K is not applied at pos 2K");
    assert_eq!(alloc(2 * K + 1), 200 * MIB);
    assert_eq!(alloc(3 * K + 2), 200 * MIB, "the smaller spike is no peak");
    let base = (1 << 30) + 64 * MIB;
    let res = |pos| t.peak_until(pos).reserved;
    assert_eq!((res(3 * K - 1), res(3 * K)), (base, base + 512 * MIB));
    assert_eq!(res(3 * K + 1), base + 512 * MIB);
    let ooms = |pos| t.ooms_until(pos);
    assert_eq!((ooms(4 * K - 1), ooms(4 * K), ooms(4 * K + 1)), (0, 1, 2));
    assert_eq!(ooms(t.len()), 2);
}

/// The cost of the at-cursor queries at the end of a 10-million-event
/// timeline (the worst case: a whole keyframe of samples to merge), and
/// of the seek beside them. `cargo test --release --lib peak_until_cost
/// -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement: builds a 10M-event timeline"]
fn peak_until_cost_on_ten_million_events() {
    use std::time::Instant;
    const N: usize = 10_000_000;
    let mut t = Timeline::new();
    t.push(entry(Action::SegmentAlloc, 0, 1 << 30));
    let mut i = 0u64;
    while t.len() < N {
        if t.len().is_multiple_of(1_000_003) {
            t.push(oom(2 << 30));
        }
        for e in spike(0, (i % 1009 + 1) * 4096) {
            t.push(e);
        }
        i += 1;
    }
    let len = t.len();
    let reps = 1000u32;
    let time = |f: &dyn Fn(usize) -> u64, pos: usize| {
        let t0 = Instant::now();
        let mut acc = 0u64;
        for r in 0..reps as usize {
            acc = acc.wrapping_add(f(std::hint::black_box(pos - r % 2)));
        }
        std::hint::black_box(acc);
        t0.elapsed() / reps
    };
    // The last event but one, and the worst place: a keyframe's last
    // sample, `KEYFRAME_EVERY - 1` samples past its running peak.
    let worst = len / KEYFRAME_EVERY * KEYFRAME_EVERY - 1;
    let mut peak = std::time::Duration::ZERO;
    for pos in [len - 1, worst] {
        let p = time(&|pos| t.peak_until(pos).allocated, pos);
        let o = time(&|pos| t.ooms_until(pos) as u64, pos);
        let t0 = Instant::now();
        for r in 0..20 {
            std::hint::black_box(t.state_at(Some(pos - 1 - r)).allocated);
        }
        let seek = t0.elapsed() / 20;
        eprintln!(
            "{len} events, pos {pos} ({} past a keyframe): peak_until {p:.2?}, ooms_until {o:.2?}, seek (state_at) {seek:.2?}",
            pos % KEYFRAME_EVERY
        );
        peak = peak.max(p);
    }
    eprintln!(
        "heap {:.2} B/event, of which running peaks {:.4} B/event",
        t.heap_bytes() as f64 / len as f64,
        (t.keyframe_peaks.capacity() * std::mem::size_of::<Peak>()) as f64 / len as f64
    );
    assert_eq!(t.peak_until(len), t.peak());
    assert!(peak.as_millis() < 5, "{peak:?}");
}

/// A run of `n` events from `seed`: segments made and freed, spikes,
/// markers and OOMs, so truncation crosses keyframes, buckets, marks and
/// reserved steps.
fn mixed_events(n: usize, seed: u64) -> Vec<Event> {
    let mut events = vec![entry(Action::SegmentAlloc, 0, 64 * MIB)];
    let mut k = seed;
    while events.len() < n {
        k += 1;
        match k % 11 {
            0 => events.push(Event::Marker(Marker::IterationBegin(k as u32))),
            1 => events.push(oom((k % 5 + 1) << 30)),
            2 => {
                let seg = (1 << 40) + (k % 3) * (1 << 32);
                events.push(entry(Action::SegmentAlloc, seg, (k % 9 + 1) * 2 * MIB));
                events.push(entry(Action::SegmentFree, seg, (k % 9 + 1) * 2 * MIB));
            }
            3 => events.push(Event::Marker(Marker::Narration(format!("n{k}").into()))),
            _ => events.extend(spike(0, (k % 61 + 1) * 512 * 1024)),
        }
    }
    events.truncate(n);
    events
}

#[test]
fn a_truncated_timeline_is_the_one_that_only_ever_had_those_events() {
    const K: usize = KEYFRAME_EVERY;
    let all = mixed_events(3 * K + 900, 1);
    let more = mixed_events(2 * K + 77, 5);
    for n in [
        0,
        1,
        BUCKET - 1,
        BUCKET,
        K - 1,
        K,
        K + 1,
        2 * K + 333,
        all.len() - 1,
    ] {
        let mut cut = Timeline::new();
        cut.extend(all.iter().cloned());
        cut.truncate(n);
        let mut fresh = Timeline::new();
        fresh.extend(all[..n].iter().cloned());
        // Both go on with other events after the cut.
        for t in [&mut cut, &mut fresh] {
            t.extend(more[1..].iter().cloned());
        }
        assert_eq!(cut.len(), fresh.len(), "n {n}");
        assert_eq!(cut.peak(), fresh.peak(), "n {n}");
        assert_eq!(cut.marks(), fresh.marks(), "n {n}");
        assert_eq!(cut.head(), fresh.head(), "n {n}");
        assert!(cut.samples().eq(fresh.samples()), "n {n}: the curve");
        assert!(
            cut.events().iter().eq(fresh.events().iter()),
            "n {n}: the events"
        );
        for pos in (0..=cut.len()).step_by(97).chain([n, n + 1, cut.len()]) {
            assert_eq!(
                cut.peak_until(pos),
                fresh.peak_until(pos),
                "n {n} pos {pos}"
            );
            assert_eq!(
                cut.ooms_until(pos),
                fresh.ooms_until(pos),
                "n {n} pos {pos}"
            );
            assert_eq!(
                cut.range_summary(pos / 2, pos),
                fresh.range_summary(pos / 2, pos),
                "n {n} pos {pos}"
            );
        }
        for at in [
            None,
            Some(n.saturating_sub(1)),
            Some(n),
            Some(cut.len() - 1),
        ] {
            assert_eq!(cut.state_at(at), fresh.state_at(at), "n {n} at {at:?}");
        }
        assert_eq!(
            cut.next_mark(n.saturating_sub(1), MarkKind::Oom),
            fresh.next_mark(n.saturating_sub(1), MarkKind::Oom),
            "n {n}"
        );
    }
}

#[test]
fn truncating_past_the_end_changes_nothing() {
    let all = mixed_events(1000, 3);
    let mut t = Timeline::new();
    t.extend(all.iter().cloned());
    let (peak, len) = (t.peak(), t.len());
    t.truncate(len);
    t.truncate(usize::MAX);
    assert_eq!((t.peak(), t.len()), (peak, len));
}
