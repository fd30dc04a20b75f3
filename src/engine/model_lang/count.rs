//! Parameter and buffer counts, from constructor arguments alone (what
//! `sum(p.numel() for p in model.parameters())` gives): the sums each
//! module kind's arm in `kinds.rs` makes.

/// Elements of parameters and of buffers, and the number of buffer tensors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub parameters: u64,
    /// Floating buffer elements (BatchNorm running mean and variance).
    pub buffer_elements: u64,
    /// Buffer tensors, `num_batches_tracked` (int64, 0-dim) included.
    pub buffers: u64,
}

impl std::ops::Add for Counts {
    type Output = Counts;
    fn add(self, o: Counts) -> Counts {
        Counts {
            parameters: self.parameters.saturating_add(o.parameters),
            buffer_elements: self.buffer_elements.saturating_add(o.buffer_elements),
            buffers: self.buffers.saturating_add(o.buffers),
        }
    }
}

pub(super) fn params(n: u64) -> Counts {
    Counts {
        parameters: n,
        ..Counts::default()
    }
}

/// BatchNorm2d(c): weight and bias; running_mean, running_var, num_batches_tracked.
pub(super) fn batch_norm(c: u64) -> Counts {
    Counts {
        parameters: c.saturating_mul(2),
        buffer_elements: c.saturating_mul(2),
        buffers: 3,
    }
}

/// Saturating: a file may ask for dimensions whose product overflows u64.
pub(super) fn conv(cin: u64, cout: u64, k: u64, bias: bool) -> Counts {
    let w = [cin, k, k].iter().fold(cout, |n, d| n.saturating_mul(*d));
    params(w.saturating_add(if bias { cout } else { 0 }))
}

/// An attention's q, k, v, o weights (and q, k, v biases with `bias`).
pub(super) fn attention_params(
    hidden: u64,
    heads: u64,
    kv_heads: Option<u64>,
    head_dim: Option<u64>,
    bias: bool,
) -> u64 {
    let d = head_dim.unwrap_or(hidden / heads.max(1));
    let q = heads.saturating_mul(d);
    let kv = kv_heads.unwrap_or(heads).saturating_mul(d);
    let weights = hidden
        .saturating_mul(q.saturating_add(kv))
        .saturating_mul(2);
    let biases = if bias {
        q.saturating_add(kv.saturating_mul(2))
    } else {
        0
    };
    weights.saturating_add(biases)
}
