//! The free set against a sorted list: order, best fit, spilling and the pending block.

use super::size_classes::{class_of, CLASSES};
use super::FreeSet;

#[test]
fn classes_are_monotonic_and_in_range() {
    let mut sizes: Vec<u64> = (0..64u32)
        .flat_map(|shift| {
            (0..64u64).map(move |k| (1u64 << shift).saturating_add(k << shift.saturating_sub(6)))
        })
        .collect();
    sizes.extend((1..5000u64).map(|i| i * 512 * (1 + i % 7)));
    sizes.push(u64::MAX);
    sizes.sort_unstable();
    assert!(sizes.windows(2).all(|w| class_of(w[0]) <= class_of(w[1])));
    assert!(sizes.iter().all(|s| class_of(*s) < CLASSES));
}

#[test]
fn many_blocks_of_one_size_stay_in_address_order() {
    // Whole free segments share one size: one class, many chunks.
    let mut set = FreeSet::default();
    let mut model: Vec<u64> = Vec::new();
    let mut x: u64 = 99;
    for i in 0..5000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let addr = (x % 100_000) << 21;
        if i % 4 == 3 && !model.is_empty() {
            let a = model.swap_remove((x as usize >> 3) % model.len());
            assert_eq!(set.remove(0, 2 << 20, a).map(|_| ()), Some(()));
        } else if !model.contains(&addr) {
            set.insert(0, 2 << 20, addr, i);
            model.push(addr);
        }
        if i % 500 == 0 {
            let mut sorted = model.clone();
            sorted.sort_unstable();
            assert_eq!(
                set.first_from(0, 1 << 20).map(|h| h.entry.addr),
                sorted.first().copied()
            );
        }
    }
    model.sort_unstable();
    let all: Vec<u64> = set.iter().map(|e| e.addr).collect();
    assert_eq!(all, model);
    let below: Vec<u64> = set.below(0, 3 << 20).map(|e| e.addr).collect();
    assert_eq!(below, model.iter().rev().copied().collect::<Vec<_>>());
    assert!(set.from(0, (2 << 20) + 1).next().is_none());
    assert_eq!(set.remove(0, 2 << 20, 1 << 60), None);
    // Shrinking moves the class back to its flat slot, still in order.
    while model.len() > 3 {
        let a = model.remove(model.len() / 2);
        assert!(set.remove(0, 2 << 20, a).is_some());
    }
    let all: Vec<u64> = set.iter().map(|e| e.addr).collect();
    assert_eq!(all, model);
    assert_eq!(set.largest(), 2 << 20);
    set.insert(0, 4 << 20, 0, 1);
    assert_eq!(set.largest(), 4 << 20);
}

#[test]
fn order_matches_a_sorted_list() {
    let mut set = FreeSet::default();
    let mut model: Vec<(u64, u64)> = Vec::new();
    let mut x: u64 = 12345;
    for i in 0..3000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let size = 512 * (1 + x % 40_000);
        let addr = (x >> 20) << 9;
        if i % 3 == 2 && !model.is_empty() {
            let (s, a) = model.swap_remove((x as usize) % model.len());
            assert!(set.remove(0, s, a).is_some());
        } else if !model.contains(&(size, addr)) {
            set.insert(0, size, addr, i);
            model.push((size, addr));
        }
    }
    model.sort_unstable();
    let all: Vec<(u64, u64)> = set.iter().map(|e| (e.size, e.addr)).collect();
    assert_eq!(all, model);
    assert_eq!(set.len(), model.len());
    for probe in [512, 4096, 1 << 20, 5 << 20, 20 << 20, 1 << 40] {
        let want: Vec<_> = model
            .iter()
            .filter(|e| e.0 >= probe)
            .take(5)
            .copied()
            .collect();
        let got: Vec<_> = set
            .from(0, probe)
            .take(5)
            .map(|e| (e.size, e.addr))
            .collect();
        assert_eq!(got, want, "from {probe}");
        let first = set
            .first_from(0, probe)
            .map(|h| (h.entry.size, h.entry.addr));
        assert_eq!(first, want.first().copied(), "first_from {probe}");
        let mut stepped = Vec::new();
        let mut at = set.first_from(0, probe);
        while let Some(h) = at.filter(|_| stepped.len() < 5) {
            stepped.push((h.entry.size, h.entry.addr));
            at = set.next_after(0, h.entry.size, h.entry.addr);
        }
        assert_eq!(stepped, want, "next_after from {probe}");
        let want: Vec<_> = model
            .iter()
            .rev()
            .filter(|e| e.0 < probe)
            .take(5)
            .copied()
            .collect();
        let got: Vec<_> = set
            .below(0, probe)
            .take(5)
            .map(|e| (e.size, e.addr))
            .collect();
        assert_eq!(got, want, "below {probe}");
    }
    assert_eq!(set.largest(), model.last().map_or(0, |e| e.0));
}

/// `take` removes exactly the entry a lookup returned, wherever it sits:
/// the pending block, a flat slot, or a chunk of a spilled class.
#[test]
fn taking_a_lookups_answer_removes_that_entry() {
    let mut set = FreeSet::default();
    let mut model: Vec<(u64, u64)> = Vec::new();
    let mut x: u64 = 777;
    for i in 0..4000u32 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Few sizes, so some classes spill into chunks.
        let size = 512 * (1 + x % 6) * if x.is_multiple_of(5) { 4096 } else { 1 };
        let addr = (x >> 24) << 9;
        if i % 3 == 0 && !model.is_empty() {
            let probe = model[(x as usize >> 5) % model.len()].0;
            let hit = set.first_from(0, probe).expect("a block fits");
            let want = *model
                .iter()
                .filter(|e| e.0 >= probe)
                .min()
                .expect("model agrees");
            assert_eq!((hit.entry.size, hit.entry.addr), want);
            set.take(hit);
            model.retain(|e| *e != want);
        } else if i % 7 == 1 && !model.is_empty() {
            let (s, a) = model.swap_remove((x as usize >> 9) % model.len());
            let hit = set.find(0, s, a).expect("present");
            assert_eq!((hit.entry.size, hit.entry.addr), (s, a));
            set.take(hit);
            assert!(set.find(0, s, a).is_none());
        } else if !model.contains(&(size, addr)) {
            set.insert(0, size, addr, i);
            model.push((size, addr));
        }
        assert_eq!(set.len(), model.len());
    }
    model.sort_unstable();
    let all: Vec<(u64, u64)> = set.iter().map(|e| (e.size, e.addr)).collect();
    assert_eq!(all, model);
}

/// Classes spill into lists, go back to their flat slots, and spill again
/// into lists another class left: each keeps only its own blocks, in order.
#[test]
fn spilled_lists_are_reused_across_classes() {
    let mut set = FreeSet::default();
    let mut model: Vec<(u64, u64)> = Vec::new();
    let mut next_addr = 0u64;
    let mut fill = |set: &mut FreeSet, model: &mut Vec<(u64, u64)>, size: u64, n: usize| {
        for _ in 0..n {
            // Addresses interleave across sizes, as fragments of one segment do.
            next_addr += 7 << 9;
            set.insert(0, size, next_addr, model.len() as u32);
            model.push((size, next_addr));
        }
    };
    let drain = |set: &mut FreeSet, model: &mut Vec<(u64, u64)>, size: u64, keep: usize| {
        while model.iter().filter(|e| e.0 == size).count() > keep {
            let i = model.iter().position(|e| e.0 == size).expect("one left");
            let (s, a) = model.remove(i);
            assert!(set.remove(0, s, a).is_some());
        }
    };
    let check = |set: &FreeSet, model: &[(u64, u64)], phase: &str| {
        let mut want = model.to_vec();
        want.sort_unstable();
        let got: Vec<(u64, u64)> = set.iter().map(|e| (e.size, e.addr)).collect();
        assert_eq!(got, want, "{phase}");
    };
    let (a, b, c) = (512, 1024, 1536);
    fill(&mut set, &mut model, a, 40);
    fill(&mut set, &mut model, b, 40);
    check(&set, &model, "a and b spilled");
    drain(&mut set, &mut model, a, 5);
    check(&set, &model, "a back in its slot");
    fill(&mut set, &mut model, c, 40);
    check(&set, &model, "c spilled into a's old list");
    fill(&mut set, &mut model, a, 40);
    drain(&mut set, &mut model, b, 0);
    check(&set, &model, "a spilled again, b emptied");
    for size in [a, c] {
        let first = model.iter().filter(|e| e.0 == size).min().copied();
        assert_eq!(
            set.first_from(0, size)
                .map(|h| (h.entry.size, h.entry.addr)),
            first
        );
    }
}
