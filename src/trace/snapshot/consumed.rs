//! A device trace read once, front to back, whose memory goes back to the
//! system as it is read: a 1 GB snapshot's trace is half a gigabyte, which
//! would otherwise stay whole until its last entry is placed, beside the
//! views' own copy of every event.

use super::TraceEntry;

pub struct ConsumedTrace {
    entries: Vec<TraceEntry>,
    /// Entries handed out so far.
    read: usize,
    /// Bytes from the start of the buffer already given back.
    released: usize,
}

impl ConsumedTrace {
    pub fn new(entries: Vec<TraceEntry>) -> ConsumedTrace {
        ConsumedTrace {
            entries,
            read: 0,
            released: 0,
        }
    }

    /// The index of the first entry the next chunk holds.
    pub fn position(&self) -> usize {
        self.read
    }

    /// The next `n` entries (fewer at the end; `None` once all are read).
    /// The entries of earlier chunks are given back first: they must not
    /// be needed again.
    pub fn next_chunk(&mut self, n: usize) -> Option<&[TraceEntry]> {
        self.release_read();
        if self.read >= self.entries.len() {
            return None;
        }
        let from = self.read;
        self.read = (from + n.max(1)).min(self.entries.len());
        Some(&self.entries[from..self.read])
    }

    /// Give the whole pages of the entries read so far back to the system.
    #[cfg(unix)]
    fn release_read(&mut self) {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(0);
        if page == 0 {
            return;
        }
        let base = self.entries.as_mut_ptr() as usize;
        let from = (base + self.released).next_multiple_of(page);
        let to = (base + self.read * std::mem::size_of::<TraceEntry>()) / page * page;
        if to <= from {
            return;
        }
        // SAFETY: [from, to) is whole pages inside the buffer of `entries`,
        // which this value owns and nothing borrows now (no chunk handed out
        // earlier is still alive: `next_chunk` takes `&mut self`). DONTNEED
        // on private memory makes those pages read as zeros, and an all-zero
        // `TraceEntry` is a valid one (integers and `Action::Alloc`); they are
        // not read again in any case, as every entry before `read` has been
        // handed out.
        let _ = unsafe { libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_DONTNEED) };
        self.released = to - base;
    }

    #[cfg(not(unix))]
    fn release_read(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Action;
    use crate::trace::snapshot::FramesId;

    #[test]
    fn chunks_cover_the_trace_in_order_while_the_read_part_is_given_back() {
        let trace: Vec<TraceEntry> = (0..300_000u64)
            .map(|i| TraceEntry::new(Action::FreeCompleted, 0x1000 + i, i, 7, FramesId(3)))
            .collect();
        let mut consumed = ConsumedTrace::new(trace.clone());
        let mut seen = Vec::new();
        while let Some(chunk) = consumed.next_chunk(65_536) {
            assert_eq!(chunk.first(), trace.get(seen.len()), "chunks in order");
            seen.extend_from_slice(chunk);
        }
        assert!(seen == trace, "every entry once, as it was");
        assert!(consumed.next_chunk(10).is_none());
        #[cfg(unix)]
        assert!(
            consumed.released > (300_000 - 65_536) * std::mem::size_of::<TraceEntry>() - 8192,
            "{} bytes given back",
            consumed.released
        );
    }
}
