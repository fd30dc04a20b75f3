//! Each call site's surviving bytes at every iteration boundary, kept as the
//! boundaries where they changed.
//!
//! A dense table (boundaries × sites) is what the analysis reads, but a long
//! trace can have 100,000 inferred boundaries and thousands of sites: tens of
//! gigabytes for a table that is almost all repeats. Each site records only
//! the boundaries where its bytes differ from the last one recorded, so memory
//! and time follow the trace's allocations and frees instead.

/// Per site, `(boundary, bytes)` at each boundary where the bytes changed.
#[derive(Debug, Default)]
pub(super) struct SiteSeries {
    changes: Vec<Vec<(u32, u64)>>,
    /// Sites whose live bytes moved since the last boundary.
    dirty: Vec<u32>,
    is_dirty: Vec<bool>,
    boundaries: u32,
}

/// What the leak test needs of one site's series, without building it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SeriesShape {
    pub first: u64,
    pub last: u64,
    pub max: u64,
    /// Boundaries where the bytes rose from the previous one.
    pub ups: usize,
    /// The bytes fell by more than a tenth between two boundaries.
    pub falls_back: bool,
}

impl SiteSeries {
    pub fn add_site(&mut self) {
        self.changes.push(Vec::new());
        self.is_dirty.push(false);
    }

    /// `site`'s live bytes changed (call before its next boundary).
    pub fn touch(&mut self, site: u32) {
        let flag = &mut self.is_dirty[site as usize];
        if !*flag {
            *flag = true;
            self.dirty.push(site);
        }
    }

    /// A boundary: record the bytes of every site that moved since the last.
    pub fn boundary(&mut self, site_live: &[u64]) {
        let b = self.boundaries;
        for site in self.dirty.drain(..) {
            let s = site as usize;
            self.is_dirty[s] = false;
            let now = site_live[s];
            let before = self.changes[s].last().map_or(0, |c| c.1);
            if now != before {
                self.changes[s].push((b, now));
            }
        }
        self.boundaries += 1;
    }

    /// The values' summary; `None` with no boundary at all.
    pub fn shape(&self, site: usize) -> Option<SeriesShape> {
        if self.boundaries == 0 {
            return None;
        }
        let changes = &self.changes[site];
        let first = match changes.first() {
            Some(&(0, v)) => v,
            _ => 0,
        };
        let mut shape = SeriesShape {
            first,
            last: first,
            max: first,
            ups: 0,
            falls_back: false,
        };
        let mut prev = 0;
        for &(b, v) in changes {
            if b > 0 {
                shape.ups += usize::from(v > prev);
                shape.falls_back |= v * 10 < prev * 9;
            }
            shape.max = shape.max.max(v);
            prev = v;
        }
        shape.last = prev;
        Some(shape)
    }

    #[cfg(test)]
    fn stored(&self) -> usize {
        self.changes.iter().map(Vec::len).sum()
    }

    /// The bytes at every boundary, in order.
    pub fn values(&self, site: usize) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.boundaries as usize);
        let mut v = 0;
        let mut next = self.changes[site].iter().peekable();
        for b in 0..self.boundaries {
            if let Some(&(_, value)) = next.next_if(|c| c.0 == b) {
                v = value;
            }
            out.push(v);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::SiteSeries;

    /// The dense table the series stands for, and its summary computed the
    /// obvious way.
    fn dense_shape(v: &[u64]) -> (u64, u64, u64, usize, bool) {
        let ups = v.windows(2).filter(|w| w[1] > w[0]).count();
        let falls = v.windows(2).any(|w| w[1] * 10 < w[0] * 9);
        let max = v.iter().copied().max().unwrap_or(0);
        (v[0], *v.last().unwrap_or(&0), max, ups, falls)
    }

    #[test]
    fn boundaries_cost_only_the_sites_that_moved() {
        let mut series = SiteSeries::default();
        let mut live = vec![0u64; 1_000];
        for _ in 0..1_000 {
            series.add_site();
        }
        for b in 0..10_000u64 {
            live[7] = b % 3;
            series.touch(7);
            series.boundary(&live);
        }
        // Site 7 changes at every boundary but the first (0 → 0); the other
        // 999 never do. A dense table would hold 10,000,000 values.
        assert_eq!(series.stored(), 9_999);
        assert_eq!(series.values(7).len(), 10_000);
        assert_eq!(series.values(3), vec![0; 10_000]);
    }

    proptest::proptest! {
        #[test]
        fn agrees_with_the_dense_table(
            steps in proptest::collection::vec((0u32..4, 0u64..5, proptest::bool::ANY), 1..200)
        ) {
            let mut series = SiteSeries::default();
            let mut live = [0u64; 4];
            let mut dense: Vec<Vec<u64>> = Vec::new();
            let mut sites = 0;
            for (site, bytes, boundary) in steps {
                if boundary {
                    series.boundary(&live[..sites]);
                    dense.push(live[..sites].to_vec());
                    continue;
                }
                while sites <= site as usize {
                    series.add_site();
                    sites += 1;
                }
                live[site as usize] = bytes;
                series.touch(site);
            }
            for s in 0..sites {
                let column: Vec<u64> =
                    dense.iter().map(|row| row.get(s).copied().unwrap_or(0)).collect();
                proptest::prop_assert_eq!(&series.values(s), &column);
                match series.shape(s) {
                    None => proptest::prop_assert!(column.is_empty()),
                    Some(sh) => proptest::prop_assert_eq!(
                        (sh.first, sh.last, sh.max, sh.ups, sh.falls_back),
                        dense_shape(&column)
                    ),
                }
            }
        }
    }
}
