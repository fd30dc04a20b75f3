//! The transformer modules' parameter counts, output shapes and argument
//! bounds (the language's `count.rs`, `shape.rs` and the scenario's
//! `dims.rs` hand these variants over here).

use super::count::Counts;
use super::shape::{ShapeError, Sig};
use super::spec::Module;

/// Parameters of a transformer module.
pub(crate) fn count(m: &Module) -> Counts {
    let params = |n| Counts {
        parameters: n,
        ..Counts::default()
    };
    let attention = |h: u64, heads: u64, kv: Option<u64>, d: Option<u64>, bias: bool| {
        let d = d.unwrap_or(h / heads.max(1));
        let (q, kv) = (heads * d, kv.unwrap_or(heads) * d);
        2 * h * q + 2 * h * kv + if bias { q + 2 * kv } else { 0 }
    };
    match m {
        Module::RMSNorm { dim } => params(*dim),
        Module::RotaryEmbedding { head_dim } => Counts {
            buffer_elements: head_dim / 2,
            buffers: 1,
            ..Counts::default()
        },
        Module::Attention {
            hidden,
            heads,
            kv_heads,
            head_dim,
            bias,
            ..
        } => params(attention(*hidden, *heads, *kv_heads, *head_dim, *bias)),
        Module::Mlp {
            hidden,
            intermediate,
            gated,
            bias,
        } => {
            let (h, i) = (*hidden, *intermediate);
            let n = if *gated { 3 } else { 2 };
            let b = if *bias {
                if *gated {
                    2 * i + h
                } else {
                    i + h
                }
            } else {
                0
            };
            params(n * h * i + b)
        }
        Module::DecoderLayer {
            hidden,
            intermediate,
            heads,
            kv_heads,
            head_dim,
            qkv_bias,
        } => params(
            attention(*hidden, *heads, *kv_heads, *head_dim, *qkv_bias)
                + 3 * hidden * intermediate
                + 2 * hidden,
        ),
        Module::LmHead {
            hidden,
            vocab,
            tied,
        } => params(if *tied { 0 } else { hidden * vocab }),
        Module::BertEmbeddings {
            vocab,
            hidden,
            max_positions,
            type_vocab,
            ..
        } => Counts {
            parameters: (vocab + max_positions + type_vocab) * hidden + 2 * hidden,
            buffer_elements: 0,
            buffers: 2,
        },
        Module::BertLayer {
            hidden,
            intermediate,
            ..
        } => {
            let (h, i) = (*hidden, *intermediate);
            params(4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h)
        }
        Module::BertPooler { hidden } => params(hidden * hidden + hidden),
        _ => Counts::default(),
    }
}

/// The shape a transformer module returns for `x`.
pub(crate) fn out_shape(m: &Module, x: &Sig) -> Result<Sig, ShapeError> {
    let last = |dim: u64, what: &'static str| -> Result<Sig, ShapeError> {
        if x.ids {
            return Err(ShapeError::TokenIds {
                what,
                got: x.dims.clone(),
            });
        }
        if x.dims.last() != Some(&dim) {
            return Err(ShapeError::LastDim {
                what,
                dim,
                got: x.dims.clone(),
            });
        }
        Ok(x.clone())
    };
    match m {
        Module::RMSNorm { dim } => last(*dim, "RMSNorm"),
        Module::RotaryEmbedding { .. } => Ok(x.clone()),
        Module::Attention { hidden, .. } | Module::DecoderLayer { hidden, .. } => {
            let s = last(*hidden, "attention")?;
            if s.dims.len() != 3 {
                return Err(ShapeError::AttentionInput {
                    hidden: *hidden,
                    got: s.dims,
                });
            }
            Ok(s)
        }
        Module::Mlp { hidden, .. } | Module::BertLayer { hidden, .. } => last(*hidden, "the block"),
        Module::LmHead { hidden, vocab, .. } => {
            let mut s = last(*hidden, "LmHead")?;
            if let Some(l) = s.dims.last_mut() {
                *l = *vocab;
            }
            Ok(s)
        }
        Module::BertEmbeddings {
            hidden,
            max_positions,
            ..
        } => {
            if !x.ids || x.dims.len() != 2 {
                return Err(ShapeError::BertEmbeddingsInput {
                    got: x.dims.clone(),
                });
            }
            if x.dims[1] > *max_positions {
                return Err(ShapeError::TooLong {
                    seq: x.dims[1],
                    max_positions: *max_positions,
                });
            }
            Ok(Sig {
                dims: vec![x.dims[0], x.dims[1], *hidden],
                ids: false,
            })
        }
        Module::BertPooler { hidden } => {
            let s = last(*hidden, "BertPooler")?;
            Ok(Sig {
                dims: vec![s.dims[0], *hidden],
                ids: false,
            })
        }
        _ => Ok(x.clone()),
    }
}

/// A transformer module's dimensions by name (each must be at least 1),
/// and its dropout probability, for the scenario's checks.
pub(crate) fn dims(m: &Module) -> (Vec<(&'static str, u64)>, Option<f64>) {
    match m {
        Module::RMSNorm { dim } => (vec![("RMSNorm dim", *dim)], None),
        Module::RotaryEmbedding { head_dim } => {
            (vec![("RotaryEmbedding head_dim", *head_dim)], None)
        }
        Module::Attention {
            hidden,
            heads,
            kv_heads,
            head_dim,
            dropout,
            ..
        } => {
            let mut d = vec![("Attention hidden", *hidden), ("Attention heads", *heads)];
            d.extend(kv_heads.map(|k| ("Attention kv_heads", k)));
            d.extend(head_dim.map(|k| ("Attention head_dim", k)));
            (d, Some(*dropout))
        }
        Module::Mlp {
            hidden,
            intermediate,
            ..
        } => (
            vec![("Mlp hidden", *hidden), ("Mlp intermediate", *intermediate)],
            None,
        ),
        Module::DecoderLayer {
            hidden,
            intermediate,
            heads,
            kv_heads,
            head_dim,
            ..
        } => {
            let mut d = vec![
                ("DecoderLayer hidden", *hidden),
                ("DecoderLayer intermediate", *intermediate),
                ("DecoderLayer heads", *heads),
            ];
            d.extend(kv_heads.map(|k| ("DecoderLayer kv_heads", k)));
            d.extend(head_dim.map(|k| ("DecoderLayer head_dim", k)));
            (d, None)
        }
        Module::LmHead { hidden, vocab, .. } => (
            vec![("LmHead hidden", *hidden), ("LmHead vocab", *vocab)],
            None,
        ),
        Module::BertEmbeddings {
            vocab,
            hidden,
            max_positions,
            type_vocab,
            dropout,
        } => (
            vec![
                ("BertEmbeddings vocab", *vocab),
                ("BertEmbeddings hidden", *hidden),
                ("BertEmbeddings max_positions", *max_positions),
                ("BertEmbeddings type_vocab", *type_vocab),
            ],
            Some(*dropout),
        ),
        Module::BertLayer {
            hidden,
            intermediate,
            heads,
            dropout,
        } => (
            vec![
                ("BertLayer hidden", *hidden),
                ("BertLayer intermediate", *intermediate),
                ("BertLayer heads", *heads),
            ],
            Some(*dropout),
        ),
        Module::BertPooler { hidden } => (vec![("BertPooler hidden", *hidden)], None),
        _ => (Vec::new(), None),
    }
}
