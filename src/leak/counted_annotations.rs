//! Iteration markers a user numbers: `record_function(f"iteration {i}")`,
//! `"step 12"`, `"epoch 0 batch 3"`. Each name differs from the others only
//! in its numbers, appears once, and the numbers count up: that is a loop
//! counter, not a region repeated inside each iteration (`"layer 3"` recurs
//! every iteration and is never taken).

use rustc_hash::FxHashMap;

use crate::trace::snapshot::Annotation;

/// The name with every run of digits replaced by `N`, and the numbers.
fn pattern_of(name: &str) -> (String, Vec<u64>) {
    let mut pattern = String::with_capacity(name.len());
    let mut numbers = Vec::new();
    let mut run: Option<u64> = None;
    for c in name.chars() {
        match c.to_digit(10) {
            Some(d) => {
                run = Some(
                    run.unwrap_or(0)
                        .saturating_mul(10)
                        .saturating_add(u64::from(d)),
                );
            }
            None => {
                if let Some(n) = run.take() {
                    pattern.push('N');
                    numbers.push(n);
                }
                pattern.push(c);
            }
        }
    }
    if let Some(n) = run {
        pattern.push('N');
        numbers.push(n);
    }
    (pattern, numbers)
}

/// The counted annotations of `device` that best mark iterations: the
/// pattern (e.g. `iteration N`) and the start times of its annotations in
/// order. None when no pattern counts up through at least two names.
pub(super) fn counted_annotations(
    annotations: &[Annotation],
    device: i64,
) -> Option<(String, Vec<i64>)> {
    let mut groups: FxHashMap<String, Vec<(i64, Vec<u64>)>> = FxHashMap::default();
    for a in annotations
        .iter()
        .filter(|a| a.device == device && &*a.stage == "START")
    {
        let (pattern, numbers) = pattern_of(&a.name);
        if !numbers.is_empty() {
            groups
                .entry(pattern)
                .or_default()
                .push((a.time_us, numbers));
        }
    }
    groups
        .into_iter()
        .filter_map(|(pattern, mut starts)| {
            starts.sort_by_key(|(t, _)| *t);
            // Strictly increasing numbers: each name once, in counting order.
            let counts_up = starts.len() >= 2 && starts.windows(2).all(|w| w[0].1 < w[1].1);
            counts_up.then(|| {
                let first = starts[0].0;
                let times: Vec<i64> = starts.into_iter().map(|(t, _)| t).collect();
                (pattern, times, first)
            })
        })
        // The longest count; between equals, the one that starts first.
        .max_by(|a, b| a.1.len().cmp(&b.1.len()).then(b.2.cmp(&a.2)))
        .map(|(pattern, times, _)| (pattern, times))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(name: &str, t: i64) -> Annotation {
        Annotation {
            stage: "START".into(),
            name: name.into(),
            device: 0,
            time_us: t,
        }
    }

    #[test]
    fn a_numbered_loop_marks_iterations() {
        let anns: Vec<Annotation> = (1..=5)
            .map(|i| start(&format!("iteration {i}"), i * 10))
            .collect();
        let (pattern, times) = counted_annotations(&anns, 0).expect("a counter");
        assert_eq!(pattern, "iteration N");
        assert_eq!(times, vec![10, 20, 30, 40, 50]);
    }

    #[test]
    fn regions_repeated_in_each_iteration_are_not_a_counter() {
        let mut anns = Vec::new();
        for it in 0..3 {
            for layer in 0..4 {
                anns.push(start(&format!("layer {layer}"), it * 100 + layer * 10));
            }
        }
        assert_eq!(counted_annotations(&anns, 0), None);
        // An iteration counter among them is found.
        anns.extend((0..3).map(|it| start(&format!("epoch 0 step {it}"), it * 100 - 1)));
        let (pattern, times) = counted_annotations(&anns, 0).expect("the step counter");
        assert_eq!(pattern, "epoch N step N");
        assert_eq!(times, vec![-1, 99, 199]);
    }

    #[test]
    fn other_devices_and_unnumbered_names_are_ignored() {
        let mut anns = vec![start("forward", 1), start("forward", 2)];
        let mut other = start("step 1", 3);
        other.device = 1;
        anns.push(other);
        anns.push(start("step 2", 4));
        assert_eq!(counted_annotations(&anns, 0), None);
    }
}
