//! The allocated bytes after each event: 4 bytes a value while every value
//! is a whole number of 512-byte units below 2 TiB (the caching allocator
//! hands out blocks in such units, so its allocated bytes always are), 8
//! from the first value that is not (a hand-made or foreign trace).

use super::chunked::ChunkedVec;

/// The unit values are kept in while they fit.
const UNIT: u64 = 512;

#[derive(Debug, Clone, Default)]
pub struct AllocatedCurve {
    units: ChunkedVec<u32>,
    /// Every value in bytes, once one did not fit `units` (which is then
    /// empty).
    bytes: Option<ChunkedVec<u64>>,
}

impl AllocatedCurve {
    pub fn len(&self) -> usize {
        match &self.bytes {
            Some(b) => b.len(),
            None => self.units.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn push(&mut self, allocated: u64) {
        if let Some(b) = &mut self.bytes {
            b.push(allocated);
            return;
        }
        match u32::try_from(allocated / UNIT) {
            Ok(units) if allocated.is_multiple_of(UNIT) => self.units.push(units),
            _ => {
                let mut b = ChunkedVec::default();
                (0..self.units.len()).for_each(|i| b.push(u64::from(self.units[i]) * UNIT));
                b.push(allocated);
                self.units = ChunkedVec::default();
                self.bytes = Some(b);
            }
        }
    }

    pub fn get(&self, i: usize) -> Option<u64> {
        match &self.bytes {
            Some(b) => b.get(i).copied(),
            None => self.units.get(i).map(|&u| u64::from(u) * UNIT),
        }
    }

    /// Keep the first `n` values.
    pub fn truncate(&mut self, n: usize) {
        match &mut self.bytes {
            Some(b) => b.truncate(n),
            None => self.units.truncate(n),
        }
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        match &self.bytes {
            Some(b) => b.capacity() * 8,
            None => self.units.capacity() * 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_comes_back_narrow_or_wide() {
        let narrow = [0, 512, 20 << 20, (u64::from(u32::MAX)) * UNIT];
        let mut c = AllocatedCurve::default();
        narrow.iter().for_each(|&v| c.push(v));
        assert_eq!(
            c.heap_bytes() / c.len().max(1),
            4,
            "4 bytes a value while they fit"
        );
        assert!(narrow.iter().enumerate().all(|(i, &v)| c.get(i) == Some(v)));
        // Not a multiple of 512, then past 2 TiB: every earlier value kept.
        let wide = [1000, (u64::from(u32::MAX) + 1) * UNIT, 3 << 20];
        wide.iter().for_each(|&v| c.push(v));
        let all: Vec<u64> = narrow.iter().chain(&wide).copied().collect();
        assert_eq!(c.len(), all.len());
        assert!(all.iter().enumerate().all(|(i, &v)| c.get(i) == Some(v)));
        assert_eq!(c.get(all.len()), None);
        c.truncate(2);
        assert_eq!((c.len(), c.get(1), c.get(2)), (2, Some(512), None));
    }

    #[test]
    fn a_value_past_2_tib_alone_widens_it() {
        let mut c = AllocatedCurve::default();
        c.push(1 << 41);
        c.push(512);
        assert_eq!((c.get(0), c.get(1)), (Some(1 << 41), Some(512)));
    }
}
