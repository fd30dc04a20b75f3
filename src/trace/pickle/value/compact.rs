//! Streaming support: a batch of decoded values is dropped once the sink has
//! converted it, keeping only what the memo can still reach.

use super::{
    Document, Seq, SeqId, Value, MISC_BITS, M_BYTES, M_FROZENSET, M_SET, T_DICT, T_FLOAT, T_LIST,
    T_MISC, T_TUPLE, T_WIDE,
};

/// Arena sizes at the start of a streamed batch (see [`Document::compact`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checkpoint {
    seqs: u32,
    pool: usize,
    owned: usize,
    wide: usize,
    floats: usize,
    bytes: usize,
}

/// Reused buffers for [`Document::compact`].
#[derive(Default)]
pub(super) struct Scratch {
    state: Vec<u8>,
    map: Vec<u32>,
    todo: Vec<u32>,
    items: Vec<Value>,
    lens: Vec<u32>,
    wide_map: Vec<u32>,
    wide: Vec<i64>,
    float_map: Vec<u32>,
    floats: Vec<f64>,
    bytes_map: Vec<u32>,
    bytes: Vec<Box<[u8]>>,
}

const GONE: u32 = u32::MAX;
const S_NEW: u8 = 0;
const S_CONSUMED: u8 = 1;
const S_KEPT: u8 = 2;

impl Checkpoint {
    /// First container id created after the checkpoint.
    pub(crate) fn first_seq(&self) -> u32 {
        self.seqs
    }
}

impl Document {
    /// Opens a streamed batch: remembers the arena sizes so that
    /// [`Document::compact`] can drop what the batch built.
    pub(crate) fn checkpoint(&mut self) -> Checkpoint {
        self.floor = self.seqs.len() as u32;
        self.dirty = false;
        Checkpoint {
            seqs: self.seqs.len() as u32,
            pool: self.pool.len(),
            owned: self.owned.len(),
            wide: self.wide_ints.len(),
            floats: self.floats.len(),
            bytes: self.bytes.len(),
        }
    }

    /// Closes a streamed batch without dropping anything.
    pub(crate) fn end_batch(&mut self) {
        self.floor = 0;
        self.dirty = false;
    }

    /// Closes a streamed batch. Everything created since `cp` is dropped
    /// except what the memo slots `memo` (those written since `cp`) reach,
    /// and `consumed` containers are dropped even when memoised (their memo
    /// slot becomes [`Value::CONSUMED`]) unless a kept container holds them.
    /// Kept containers are renumbered from `cp` on, in creation order, and
    /// `memo` is rewritten to match. Returns the renumbering of the ids from
    /// `cp.first_seq()` (`u32::MAX`: dropped), or `None` when the batch also
    /// changed older containers (then nothing is dropped).
    pub(crate) fn compact(
        &mut self,
        cp: &Checkpoint,
        memo: &mut [Value],
        consumed: &[SeqId],
    ) -> Option<&[u32]> {
        self.floor = 0;
        if std::mem::take(&mut self.dirty) {
            return None;
        }
        let mut sc = std::mem::take(&mut self.scratch);
        let first = cp.seqs;
        let n = self.seqs.len().saturating_sub(first as usize);
        sc.state.clear();
        sc.state.resize(n, S_NEW);
        let local = |v: Value| -> Option<usize> {
            let id = Document::container_id(v)?;
            id.0.checked_sub(first).map(|i| i as usize)
        };
        for id in consumed {
            if let Some(slot) =
                id.0.checked_sub(first)
                    .and_then(|i| sc.state.get_mut(i as usize))
            {
                *slot = S_CONSUMED;
            }
        }
        // Keep what the memo reaches, except consumed roots.
        sc.todo.clear();
        for &v in memo.iter() {
            if let Some(i) = local(v) {
                if sc.state.get(i) == Some(&S_NEW) {
                    sc.state[i] = S_KEPT;
                    sc.todo.push(i as u32);
                }
            }
        }
        while let Some(i) = sc.todo.pop() {
            for &c in self.items(SeqId(first + i)) {
                if let Some(j) = local(c) {
                    if let Some(st) = sc.state.get_mut(j) {
                        if *st != S_KEPT {
                            *st = S_KEPT;
                            sc.todo.push(j as u32);
                        }
                    }
                }
            }
        }
        // New ids, in creation order.
        sc.map.clear();
        let mut next = first;
        for &st in &sc.state {
            if st == S_KEPT {
                sc.map.push(next);
                next += 1;
            } else {
                sc.map.push(GONE);
            }
        }
        let fresh = |len: usize, from: usize, map: &mut Vec<u32>| {
            map.clear();
            map.resize(len.saturating_sub(from), GONE);
        };
        fresh(self.wide_ints.len(), cp.wide, &mut sc.wide_map);
        fresh(self.floats.len(), cp.floats, &mut sc.float_map);
        fresh(self.bytes.len(), cp.bytes, &mut sc.bytes_map);
        sc.wide.clear();
        sc.floats.clear();
        sc.bytes.clear();
        // Copy the kept items out, relocated.
        sc.items.clear();
        sc.lens.clear();
        for i in 0..n {
            if sc.state[i] != S_KEPT {
                continue;
            }
            let items = self.items(SeqId(first + i as u32));
            sc.lens.push(items.len() as u32);
            for &v in items {
                let r = self.relocate(v, cp, &mut sc);
                sc.items.push(r);
            }
        }
        for slot in memo.iter_mut() {
            *slot = match local(*slot) {
                Some(i) if sc.state.get(i) != Some(&S_KEPT) => Value::CONSUMED,
                _ => self.relocate(*slot, cp, &mut sc),
            };
        }
        // Drop the batch and put the kept part back.
        self.pool.truncate(cp.pool);
        self.owned.truncate(cp.owned);
        self.seqs.truncate(first as usize);
        self.wide_ints.truncate(cp.wide);
        self.wide_ints.append(&mut sc.wide);
        self.floats.truncate(cp.floats);
        self.floats.append(&mut sc.floats);
        self.bytes.truncate(cp.bytes);
        self.bytes.append(&mut sc.bytes);
        let mut at = 0usize;
        for &len in &sc.lens {
            let start = self.pool.len() as u32;
            self.pool
                .extend_from_slice(sc.items.get(at..at + len as usize).unwrap_or(&[]));
            at += len as usize;
            self.seqs.push(Seq { start, len });
        }
        self.scratch = sc;
        Some(&self.scratch.map)
    }

    /// `v` with its arena index moved to where [`Document::compact`] puts
    /// it; scalars created in the batch are queued for re-insertion.
    fn relocate(&self, v: Value, cp: &Checkpoint, sc: &mut Scratch) -> Value {
        fn moved<T: Clone>(
            idx: u32,
            from: usize,
            src: &[T],
            map: &mut [u32],
            out: &mut Vec<T>,
        ) -> u32 {
            let Some(local) = (idx as usize).checked_sub(from) else {
                return idx;
            };
            match map.get(local) {
                Some(&m) if m != GONE => m,
                Some(_) => {
                    let new = (from + out.len()) as u32;
                    if let Some(x) = src.get(idx as usize) {
                        out.push(x.clone());
                    }
                    map[local] = new;
                    new
                }
                None => idx,
            }
        }
        let p = v.payload();
        let seq = |id: u32| match id.checked_sub(cp.seqs) {
            Some(i) => sc.map.get(i as usize).copied().unwrap_or(id),
            None => id,
        };
        match v.tag() {
            T_LIST | T_DICT | T_TUPLE => Value::tagged(v.tag(), seq(p)),
            T_WIDE => Value::tagged(
                T_WIDE,
                moved(p, cp.wide, &self.wide_ints, &mut sc.wide_map, &mut sc.wide),
            ),
            T_FLOAT => Value::tagged(
                T_FLOAT,
                moved(
                    p,
                    cp.floats,
                    &self.floats,
                    &mut sc.float_map,
                    &mut sc.floats,
                ),
            ),
            T_MISC => {
                let kind = p & ((1 << MISC_BITS) - 1);
                let i = p >> MISC_BITS;
                match kind {
                    M_SET | M_FROZENSET => Value::misc(kind, seq(i)),
                    M_BYTES => Value::misc(
                        kind,
                        moved(i, cp.bytes, &self.bytes, &mut sc.bytes_map, &mut sc.bytes),
                    ),
                    _ => v,
                }
            }
            _ => v,
        }
    }
}
