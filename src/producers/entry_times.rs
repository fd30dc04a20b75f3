//! A trace's entry times (µs since the epoch), 4 bytes an entry instead of
//! 8: each run of entries keeps one base time and every entry its offset
//! from it. An offset that does not fit (a run spanning over an hour, a
//! clock stepping back) is kept aside, by entry.

use rustc_hash::FxHashMap;

/// Entries sharing one base time.
const RUN: usize = 4096;
/// An offset meaning "no time recorded".
const ABSENT: u32 = u32::MAX;
/// An offset meaning "see `far`".
const FAR: u32 = u32::MAX - 1;

#[derive(Debug, Default)]
pub(super) struct EntryTimes {
    bases: Vec<i64>,
    offsets: Vec<u32>,
    far: FxHashMap<usize, i64>,
    /// The current run's base, once one of its entries had a time.
    base: Option<i64>,
}

impl EntryTimes {
    #[cfg(test)]
    pub(super) fn new(times: impl ExactSizeIterator<Item = Option<i64>>) -> EntryTimes {
        let mut t = EntryTimes {
            bases: Vec::with_capacity(times.len().div_ceil(RUN)),
            offsets: Vec::with_capacity(times.len()),
            ..EntryTimes::default()
        };
        times.for_each(|time| t.push(time));
        t
    }

    /// The time of the next entry.
    pub(super) fn push(&mut self, time: Option<i64>) {
        let i = self.offsets.len();
        if i.is_multiple_of(RUN) {
            self.bases.push(time.unwrap_or(0));
            self.base = time;
        }
        let offset = match time {
            None => ABSENT,
            Some(time) => {
                let bases = &mut self.bases;
                let b = *self.base.get_or_insert_with(|| {
                    // The run's first time becomes its base.
                    if let Some(last) = bases.last_mut() {
                        *last = time;
                    }
                    time
                });
                match time.checked_sub(b).and_then(|d| u32::try_from(d).ok()) {
                    Some(d) if d < FAR => d,
                    _ => {
                        self.far.insert(i, time);
                        FAR
                    }
                }
            }
        };
        self.offsets.push(offset);
    }

    pub(super) fn get(&self, entry: usize) -> Option<i64> {
        match *self.offsets.get(entry)? {
            ABSENT => None,
            FAR => self.far.get(&entry).copied(),
            d => Some(self.bases.get(entry / RUN)? + i64::from(d)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_time_comes_back_including_gaps_jumps_and_steps_back() {
        let mut times: Vec<Option<i64>> = Vec::new();
        let mut now = 1_764_000_000_000_000i64;
        for i in 0..20_000usize {
            now += (i % 7) as i64 * 13;
            times.push(match i {
                _ if i % 101 == 0 => None,
                // Two hours later, then back again: beyond an offset.
                9000 => Some(now + 7_200_000_000),
                9001 => Some(now - 5),
                _ => Some(now),
            });
        }
        // A run whose first entries have no time.
        for t in &mut times[4096..4100] {
            *t = None;
        }
        let stored = EntryTimes::new(times.iter().copied());
        for (i, want) in times.iter().enumerate() {
            assert_eq!(stored.get(i), *want, "entry {i}");
        }
        // Pushed one at a time while read, the same.
        let mut pushed = EntryTimes::default();
        for (i, t) in times.iter().enumerate() {
            pushed.push(*t);
            assert_eq!(pushed.get(i), *t, "entry {i} as it arrives");
        }
        assert!((0..times.len()).all(|i| pushed.get(i) == stored.get(i)));
        assert_eq!(stored.get(times.len()), None);
        // Four bytes an entry; only the jump is kept aside.
        assert_eq!(stored.offsets.len(), times.len());
        assert_eq!(stored.far.len(), 1);
    }
}
