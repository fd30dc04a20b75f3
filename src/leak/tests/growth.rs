//! Growth in steps: what counts as growth that skips iterations, and what
//! is a cache that filled once and stopped.

use super::super::classify::periodic;
use super::super::detector::GroupSample;

fn series(values: &[u64]) -> Vec<GroupSample> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| GroupSample {
            iteration: i as u32 + 1,
            own: v,
            own_old: v,
            ..GroupSample::default()
        })
        .collect()
}

fn steps_every(k: usize, n: usize, step: u64) -> Vec<u64> {
    (0..n).map(|i| (i / k) as u64 * step).collect()
}

#[test]
fn growth_every_fifth_iteration_is_growth() {
    let s = series(&steps_every(5, 21, 8));
    let p = periodic(&s, |x| x.own_old).expect("four rises");
    assert_eq!(p.at, [6, 11, 16, 21]);
    assert_eq!(p.per_rise, 8);
    assert_eq!(p.since, 1);
    assert_eq!(p.per_iter, 32 / 20);
}

#[test]
fn growth_every_iteration_is_not_a_schedule() {
    assert_eq!(
        periodic(&series(&steps_every(1, 6, 8)), |x| x.own_old),
        None
    );
}

#[test]
fn two_rises_are_not_enough_and_a_fall_starts_over() {
    assert_eq!(
        periodic(&series(&steps_every(5, 11, 8)), |x| x.own_old),
        None
    );
    let mut v = steps_every(5, 21, 8);
    v[18] = 0; // emptied at iteration 19: the rises before it do not count
    assert_eq!(periodic(&series(&v), |x| x.own_old), None);
}

#[test]
fn growth_that_stopped_long_ago_is_a_cache_that_filled() {
    let mut v = steps_every(2, 8, 8); // rises at 3, 5, 7
    v.extend(std::iter::repeat_n(v[7], 20));
    assert_eq!(periodic(&series(&v), |x| x.own_old), None);
    // Within twice the largest gap, it still counts.
    assert!(periodic(&series(&v[..10]), |x| x.own_old).is_some());
}
