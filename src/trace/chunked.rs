//! A growable list stored in fixed-size chunks: pushing never copies what is
//! already stored. A timeline that grows while it is drawn (a live job)
//! would otherwise stall a frame each time its `Vec` doubles: at 600,000
//! events, copying the packed events alone takes milliseconds.

/// Elements per chunk (the first chunk grows up to it as a `Vec` does, so a
/// short run holds no more than it needs).
const CHUNK: usize = 1 << 16;

#[derive(Debug, Clone)]
pub struct ChunkedVec<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for ChunkedVec<T> {
    fn default() -> Self {
        ChunkedVec {
            chunks: Vec::new(),
            len: 0,
        }
    }
}

impl<T> ChunkedVec<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn push(&mut self, value: T) {
        match self.chunks.last_mut() {
            Some(last) if last.len() < CHUNK => last.push(value),
            _ => {
                let mut chunk = if self.chunks.is_empty() {
                    Vec::new()
                } else {
                    Vec::with_capacity(CHUNK)
                };
                chunk.push(value);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    /// Keep the first `n` elements.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len {
            return;
        }
        self.chunks.truncate(n.div_ceil(CHUNK));
        if let Some(last) = self.chunks.last_mut() {
            last.truncate(n - (n.div_ceil(CHUNK) - 1) * CHUNK);
        }
        self.len = n;
    }

    pub fn get(&self, i: usize) -> Option<&T> {
        self.chunks.get(i / CHUNK)?.get(i % CHUNK)
    }

    pub fn last(&self) -> Option<&T> {
        self.len.checked_sub(1).and_then(|i| self.get(i))
    }

    /// Elements the chunks have room for.
    pub fn capacity(&self) -> usize {
        self.chunks.iter().map(Vec::capacity).sum()
    }
}

impl<T> std::ops::Index<usize> for ChunkedVec<T> {
    type Output = T;

    fn index(&self, i: usize) -> &T {
        match self.get(i) {
            Some(v) => v,
            None => panic!("index {i} out of a ChunkedVec of {}", self.len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_it_holds_the_first_elements_and_grows_again() {
        for n in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 5] {
            let mut v = ChunkedVec::default();
            (0..3 * CHUNK).for_each(|i| v.push(i));
            v.truncate(n);
            assert_eq!(v.len(), n);
            assert_eq!(v.last().copied(), n.checked_sub(1));
            assert_eq!(v.get(n), None);
            v.push(7);
            assert_eq!((v.len(), v[n]), (n + 1, 7));
            assert!((0..n).all(|i| v[i] == i));
        }
    }

    #[test]
    fn holds_what_a_vec_holds_across_chunk_edges() {
        let mut c = ChunkedVec::default();
        let n = 2 * CHUNK + 3;
        for i in 0..n {
            c.push(i as u64 * 7);
        }
        assert_eq!(c.len(), n);
        for i in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, n - 1] {
            assert_eq!(c.get(i), Some(&(i as u64 * 7)), "{i}");
            assert_eq!(c[i], i as u64 * 7);
        }
        assert_eq!(c.get(n), None);
        assert_eq!(c.last(), Some(&((n - 1) as u64 * 7)));
        assert!(c.capacity() >= n);
    }

    #[test]
    fn a_short_list_holds_about_what_it_needs() {
        let mut c = ChunkedVec::default();
        for i in 0..10u32 {
            c.push(i);
        }
        assert!(c.capacity() < 64, "{}", c.capacity());
        assert!(ChunkedVec::<u8>::default().is_empty());
    }
}
