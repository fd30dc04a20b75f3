//! What shape each module returns for a given input, or the error PyTorch
//! raises for it, checked before anything runs (naming the module path).

/// A tensor's shape and whether it holds token ids (integers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sig {
    pub dims: Vec<u64>,
    pub ids: bool,
}

impl Sig {
    pub(crate) fn floats(dims: Vec<u64>) -> Sig {
        Sig { dims, ids: false }
    }
}

/// The shape a module cannot take, as PyTorch would refuse it (the
/// module's path is [`super::ModelError`]'s).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("{what} takes floats, but gets token ids {got:?} (an Embedding first?)")]
    TokenIds { what: &'static str, got: Vec<u64> },
    #[error("{what} takes [N, C, H, W], got {got:?}")]
    NotImages { what: &'static str, got: Vec<u64> },
    #[error("{what} expects {expected} input channels, got {} (input {got:?})", got[1])]
    Channels {
        what: &'static str,
        expected: u64,
        got: Vec<u64>,
    },
    #[error("{what} kernel {kernel} does not fit input {got:?}")]
    KernelTooLarge {
        what: &'static str,
        kernel: u64,
        got: Vec<u64>,
    },
    #[error("Linear(in: {input}) gets input {got:?} (last dimension must be {input})")]
    LinearIn { input: u64, got: Vec<u64> },
    #[error("Embedding takes token ids (Long or Int), got floats {got:?}")]
    EmbeddingFloats { got: Vec<u64> },
    #[error("LayerNorm({dim}) gets input {got:?} (last dimension must be {dim})")]
    LayerNormDim { dim: u64, got: Vec<u64> },
    #[error("BatchNorm2d({channels}) takes [N, {channels}, H, W], got {got:?}")]
    BatchNormInput { channels: u64, got: Vec<u64> },
    #[error("flatten(x, 1) needs at least 2 dimensions, got {got:?}")]
    FlattenRank { got: Vec<u64> },
    /// A transformer module's last dimension (`what`: RMSNorm, attention, …).
    #[error("{what} gets input {got:?} (last dimension must be {dim})")]
    LastDim {
        what: &'static str,
        dim: u64,
        got: Vec<u64>,
    },
    #[error("attention takes [B, T, {hidden}], got {got:?}")]
    AttentionInput { hidden: u64, got: Vec<u64> },
    #[error("BertEmbeddings takes token ids [B, T], got {got:?}")]
    BertEmbeddingsInput { got: Vec<u64> },
    #[error("sequence length {seq} is longer than max_positions {max_positions}")]
    TooLong { seq: u64, max_positions: u64 },
    #[error("Ops has no statement")]
    OpsEmpty,
    #[error("Ops: `{0}` is not bound by an earlier statement")]
    OpsUnbound(String),
    #[error("Ops: max/sum over the last dimension of a tensor with none")]
    OpsReduceScalar,
    #[error("Ops: shapes {left:?} and {right:?} do not broadcast")]
    OpsBroadcast { left: Vec<u64>, right: Vec<u64> },
    #[error("Ops: {left:?} and {right:?} broadcast to a shape neither has, which is not modelled")]
    OpsBothBroadcast { left: Vec<u64>, right: Vec<u64> },
    #[error("Positions adds pos[:T] to [B, T, {dim}], got {got:?}")]
    PositionsInput { dim: u64, got: Vec<u64> },
    #[error("CausalMask takes [B, T, …] (T from the second dimension), got {got:?}")]
    CausalMaskInput { got: Vec<u64> },
    #[error("Residual adds {inner:?} to its input {input:?}: shapes differ")]
    ResidualShapes { inner: Vec<u64>, input: Vec<u64> },
}

type R = std::result::Result<Sig, ShapeError>;

pub(super) fn floats_in(what: &'static str, x: &Sig) -> std::result::Result<(), ShapeError> {
    if x.ids {
        return Err(ShapeError::TokenIds {
            what,
            got: x.dims.clone(),
        });
    }
    Ok(())
}

/// `(h + 2·pad − k) / stride + 1`, or None when the kernel does not fit.
fn pooled(h: u64, k: u64, stride: u64, pad: u64) -> Option<u64> {
    (h + 2 * pad)
        .checked_sub(k)
        .filter(|_| stride > 0)
        .map(|r| r / stride + 1)
}

/// [N, C, H, W] with C = `cin`, through a k×k window: [N, cout, H', W'].
pub(super) fn conv_like(what: &'static str, x: &Sig, cin: Option<u64>, geo: [u64; 4]) -> R {
    let [cout, k, stride, pad] = geo;
    floats_in(what, x)?;
    let d = &x.dims;
    if d.len() != 4 {
        return Err(ShapeError::NotImages {
            what,
            got: d.clone(),
        });
    }
    if let Some(c) = cin {
        if d[1] != c {
            return Err(ShapeError::Channels {
                what,
                expected: c,
                got: d.clone(),
            });
        }
    }
    match (pooled(d[2], k, stride, pad), pooled(d[3], k, stride, pad)) {
        (Some(h), Some(w)) => Ok(Sig::floats(vec![d[0], cout, h, w])),
        _ => Err(ShapeError::KernelTooLarge {
            what,
            kernel: k,
            got: d.clone(),
        }),
    }
}

/// `x` unchanged, if it is [B, T, hidden]: an attention's or a decoder
/// layer's input.
pub(super) fn attention_input(what: &'static str, hidden: u64, x: &Sig) -> R {
    let s = last_dim(what, hidden, x)?;
    if s.dims.len() != 3 {
        return Err(ShapeError::AttentionInput {
            hidden,
            got: s.dims,
        });
    }
    Ok(s)
}

/// `x` unchanged, if it holds floats whose last dimension is `dim` (the
/// norms and blocks that keep their input's shape).
pub(super) fn last_dim(what: &'static str, dim: u64, x: &Sig) -> R {
    floats_in(what, x)?;
    if x.dims.last() != Some(&dim) {
        return Err(ShapeError::LastDim {
            what,
            dim,
            got: x.dims.clone(),
        });
    }
    Ok(x.clone())
}
