//! Every module kind of the language, one arm per concern, all here:
//!
//! 1. [`Module::args`]: what its arguments alone say (each dimension and
//!    the least it may be, each probability, its parameters and buffers,
//!    how many modules it counts as);
//! 2. [`Module::out_shape`]: the rules the build obeys in context (heads,
//!    rotary positions, a tied head, pooling padding) and the shape it
//!    returns for an input, or the error PyTorch raises for that input;
//! 3. [`Builder::leaf`]: its parameters and buffers allocated in
//!    `named_parameters()` order, as a [`Leaf`];
//! 4. [`LangNet::run_leaf`]: its forward on the engine's ops;
//! 5. [`Leaf::projections`]: the projections LoRA may adapt in it, and
//! 6. [`Module::projection_names`]: their names, for the analysis;
//! 7. [`Module::pytorch_refusal`]: PyTorch's words for a tensor it refuses
//!    when it is the first module to get one;
//! 8. [`Module::assumption`]: what it assumes where the data decide (a
//!    mixture of experts' routing), for views and reports.
//!
//! The containers (`Sequential`, `Repeat`, `Residual`, `Checkpoint`,
//! `Frame`) are walked by `check.rs` (the analysis), `build.rs` and
//! `forward.rs`; every other module reaches this file through one `_` arm
//! in each of them.
//! `tests/layers.rs` counts the matches on `Module` outside this file, so
//! a new kind cannot quietly add a walker of its own.

use super::build::{display, Builder, LangNet};
use super::check::{Problem, Seen};
use super::count::{attention_params, batch_norm, conv, params, Counts};
use super::handwritten::MaskedAttn;
use super::shape::{attention_input, conv_like, floats_in, last_dim, ShapeError, Sig};
use super::spec::{join, Module, SoftmaxKind, BOTTLENECK_EXPANSION};
use super::xfmr::BertEmbeddings;
use crate::engine::config::SdpaBackend;
use crate::engine::dtype::DType;
use crate::engine::error::{EngineError, Result};
use crate::engine::modules::bert::BertLayer;
use crate::engine::modules::bottleneck::Bottleneck;
use crate::engine::modules::decoder::{
    new_rms_norm, Attention, AttentionSpec, DecoderLayer, RmsNorm, SwiGlu,
};
use crate::engine::modules::lora::Proj;
use crate::engine::modules::resnet::{BasicBlock, BatchNorm, Conv};
use crate::engine::modules::{Embedding, LayerNorm, Linear};
use crate::engine::ops::elementwise::Unary;
use crate::engine::shape::Shape;
use crate::engine::tensor::{Layout, TensorId};
use crate::engine::Engine;

/// What a module's arguments say before any input reaches it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Args {
    /// Each dimension: its field, its value, and the least it may be.
    pub dims: Vec<(&'static str, u64, u64)>,
    /// Each probability: its field and value.
    pub probabilities: Vec<(&'static str, f64)>,
    pub counts: Counts,
    /// Modules it counts as toward `MAX_MODULES` (torchvision's blocks are 8).
    pub modules: u64,
}

impl Args {
    fn one(dims: Vec<(&'static str, u64, u64)>, counts: Counts) -> Args {
        Args {
            dims,
            probabilities: Vec::new(),
            counts,
            modules: 1,
        }
    }

    fn with_p(mut self, field: &'static str, p: f64) -> Args {
        self.probabilities.push((field, p));
        self
    }
}

/// A rule broken: the argument at fault (when one is) and the problem.
pub(crate) type Fault = (Option<&'static str>, Problem);

/// Where a module is, for the rules that remember the first module of a
/// kind (the first rotary user).
pub(crate) struct Here<'a> {
    pub path: &'a str,
    pub at: &'a [super::check::Seg],
}

/// `hidden / heads` unless given; never 0 (the projections would have no
/// outputs).
fn nonzero_head_dim(
    hidden: u64,
    heads: u64,
    head_dim: Option<u64>,
) -> std::result::Result<u64, Fault> {
    match head_dim.unwrap_or(hidden / heads.max(1)) {
        0 => Err((Some("heads"), Problem::ZeroHeadDim { hidden, heads })),
        d => Ok(d),
    }
}

/// Grouped-query heads (models.md §4), with the key/value heads as given.
fn heads(heads: u64, kv_heads: Option<u64>) -> std::result::Result<(), Fault> {
    super::check::heads_rule(heads, kv_heads.unwrap_or(heads)).map_err(|(f, p)| (Some(f), p))
}

impl Module {
    /// Concern 1: what the arguments alone say (containers: nothing of their own).
    pub(crate) fn args(&self) -> Args {
        let none = || Args::one(Vec::new(), Counts::default());
        match self {
            Module::Sequential(_)
            | Module::Repeat { .. }
            | Module::Residual(_)
            | Module::Frame(_)
            | Module::Registered { .. }
            | Module::HfModel(_)
            | Module::Checkpoint { .. } => Args::default(),
            Module::Linear { input, out, bias }
            | Module::Linear4bit {
                input, out, bias, ..
            }
            | Module::Linear8bitLt { input, out, bias } => Args::one(
                vec![("in", *input, 1), ("out", *out, 1)],
                params(
                    input
                        .saturating_mul(*out)
                        .saturating_add(if *bias { *out } else { 0 }),
                ),
            ),
            Module::ReLU
            | Module::InplaceReLU
            | Module::GELU
            | Module::GELUTanh
            | Module::SiLU
            | Module::AdaptiveAvgPool2d
            | Module::Flatten => none(),
            Module::Dropout(p) => none().with_p("p", *p),
            Module::Embedding { num, dim } => Args::one(
                vec![("num", *num, 1), ("dim", *dim, 1)],
                params(num.saturating_mul(*dim)),
            ),
            Module::ScaledEmbedding { num, dim } => Args::one(
                vec![("num", *num, 1), ("dim", *dim, 1)],
                Counts {
                    buffer_elements: 1,
                    buffers: 1,
                    ..params(num.saturating_mul(*dim))
                },
            ),
            Module::LayerNorm { dim, bias } => Args::one(
                vec![("dim", *dim, 1)],
                params(if *bias { dim.saturating_mul(2) } else { *dim }),
            ),
            Module::Conv2d {
                input,
                out,
                kernel,
                stride,
                padding,
                bias,
            } => Args::one(
                vec![
                    ("in", *input, 1),
                    ("out", *out, 1),
                    ("kernel", *kernel, 1),
                    ("stride", *stride, 1),
                    ("padding", *padding, 0),
                ],
                conv(*input, *out, *kernel, *bias),
            ),
            Module::BatchNorm2d(c) => Args::one(vec![("features", *c, 1)], batch_norm(*c)),
            Module::MaxPool2d {
                kernel,
                stride,
                padding,
            } => Args::one(
                vec![
                    ("kernel", *kernel, 1),
                    ("stride", *stride, 1),
                    ("padding", *padding, 0),
                ],
                Counts::default(),
            ),
            Module::BasicBlock {
                inplanes,
                planes,
                stride,
            } => {
                let (i, p) = (*inplanes, *planes);
                let body =
                    conv(i, p, 3, false) + batch_norm(p) + conv(p, p, 3, false) + batch_norm(p);
                let counts = if *stride != 1 || i != p {
                    body + conv(i, p, 1, false) + batch_norm(p)
                } else {
                    body
                };
                Args {
                    modules: 8,
                    ..Args::one(
                        vec![("inplanes", i, 1), ("planes", p, 1), ("stride", *stride, 1)],
                        counts,
                    )
                }
            }
            Module::Bottleneck {
                inplanes,
                planes,
                stride,
            } => {
                let (i, w) = (*inplanes, *planes);
                let o = w.saturating_mul(BOTTLENECK_EXPANSION);
                let body = conv(i, w, 1, false)
                    + batch_norm(w)
                    + conv(w, w, 3, false)
                    + batch_norm(w)
                    + conv(w, o, 1, false)
                    + batch_norm(o);
                let counts = if *stride != 1 || i != o {
                    body + conv(i, o, 1, false) + batch_norm(o)
                } else {
                    body
                };
                Args {
                    modules: 8,
                    ..Args::one(
                        vec![("inplanes", i, 1), ("planes", w, 1), ("stride", *stride, 1)],
                        counts,
                    )
                }
            }
            Module::RMSNorm { dim } | Module::GemmaRMSNorm { dim } => {
                Args::one(vec![("dim", *dim, 1)], params(*dim))
            }
            Module::RotaryEmbedding { head_dim, .. } => Args::one(
                vec![("head_dim", *head_dim, 1)],
                Counts {
                    buffer_elements: head_dim / 2,
                    buffers: 1,
                    ..Counts::default()
                },
            ),
            Module::Attention {
                hidden,
                heads,
                kv_heads,
                head_dim,
                bias,
                dropout,
                ..
            } => {
                let mut dims = vec![("hidden", *hidden, 1), ("heads", *heads, 1)];
                dims.extend(kv_heads.map(|k| ("kv_heads", k, 1)));
                dims.extend(head_dim.map(|d| ("head_dim", d, 1)));
                let n = attention_params(*hidden, *heads, *kv_heads, *head_dim, *bias);
                Args::one(dims, params(n)).with_p("dropout", *dropout)
            }
            Module::Mlp {
                hidden,
                intermediate,
                gated,
                bias,
            } => {
                let (h, i) = (*hidden, *intermediate);
                let n = if *gated { 3 } else { 2 };
                let b = match (*bias, *gated) {
                    (false, _) => 0,
                    (true, true) => i.saturating_mul(2).saturating_add(h),
                    (true, false) => i.saturating_add(h),
                };
                let w = h.saturating_mul(i).saturating_mul(n);
                Args::one(
                    vec![("hidden", h, 1), ("intermediate", i, 1)],
                    params(w.saturating_add(b)),
                )
            }
            Module::DecoderLayer {
                hidden,
                intermediate,
                heads,
                kv_heads,
                head_dim,
                qkv_bias,
            } => {
                let mut dims = vec![
                    ("hidden", *hidden, 1),
                    ("intermediate", *intermediate, 1),
                    ("heads", *heads, 1),
                ];
                dims.extend(kv_heads.map(|k| ("kv_heads", k, 1)));
                dims.extend(head_dim.map(|d| ("head_dim", d, 1)));
                let n = attention_params(*hidden, *heads, *kv_heads, *head_dim, *qkv_bias)
                    .saturating_add(hidden.saturating_mul(*intermediate).saturating_mul(3))
                    .saturating_add(hidden.saturating_mul(2));
                Args::one(dims, params(n))
            }
            Module::LmHead {
                hidden,
                vocab,
                tied,
                ..
            } => Args::one(
                vec![("hidden", *hidden, 1), ("vocab", *vocab, 1)],
                params(if *tied {
                    0
                } else {
                    hidden.saturating_mul(*vocab)
                }),
            ),
            Module::BertEmbeddings {
                vocab,
                hidden,
                max_positions,
                type_vocab,
                dropout,
            } => {
                let rows = vocab
                    .saturating_add(*max_positions)
                    .saturating_add(*type_vocab);
                let n = rows
                    .saturating_mul(*hidden)
                    .saturating_add(hidden.saturating_mul(2));
                let counts = Counts {
                    parameters: n,
                    buffer_elements: 0,
                    buffers: 2,
                };
                Args::one(
                    vec![
                        ("vocab", *vocab, 1),
                        ("hidden", *hidden, 1),
                        ("max_positions", *max_positions, 1),
                        ("type_vocab", *type_vocab, 1),
                    ],
                    counts,
                )
                .with_p("dropout", *dropout)
            }
            Module::BertLayer {
                hidden,
                intermediate,
                heads,
                dropout,
            } => {
                let (h, i) = (*hidden, *intermediate);
                let linear = |fin: u64, fout: u64| fin.saturating_mul(fout).saturating_add(fout);
                let n = linear(h, h)
                    .saturating_mul(4)
                    .saturating_add(h.saturating_mul(2))
                    .saturating_add(linear(h, i))
                    .saturating_add(linear(i, h))
                    .saturating_add(h.saturating_mul(2));
                Args::one(
                    vec![
                        ("hidden", h, 1),
                        ("intermediate", i, 1),
                        ("heads", *heads, 1),
                    ],
                    params(n),
                )
                .with_p("dropout", *dropout)
            }
            Module::BertPooler { hidden } => Args::one(
                vec![("hidden", *hidden, 1)],
                params(hidden.saturating_mul(*hidden).saturating_add(*hidden)),
            ),
            Module::Softmax(_) | Module::SigmoidMul | Module::CausalMask | Module::Ops(_) => none(),
            Module::MaskedAttention { hidden, heads, .. } => {
                let h = *hidden;
                // qkv: [3h, h] + [3h]; proj: [h, h] + [h].
                let n = h
                    .saturating_mul(h)
                    .saturating_mul(4)
                    .saturating_add(h.saturating_mul(4));
                Args::one(vec![("hidden", h, 1), ("heads", *heads, 1)], params(n))
            }
            Module::Positions { seq, dim } => Args::one(
                vec![("seq", *seq, 1), ("dim", *dim, 1)],
                params(seq.saturating_mul(*dim)),
            ),
            Module::SparseMoe {
                hidden,
                intermediate,
                experts,
                top_k,
                expert,
                shared_expert,
                ..
            } => super::moe::moe_args(
                *hidden,
                *intermediate,
                *experts,
                *top_k,
                *expert,
                *shared_expert,
            ),
            Module::QkvAttention { hidden, heads } => {
                super::qkv_attention::qkv_args(*hidden, *heads)
            }
            Module::HfAttention {
                hidden,
                heads,
                kv_heads,
                head_dim,
                bias,
                qk_norm,
                ..
            } => {
                super::hf_layers::attn_args(*hidden, *heads, *kv_heads, *head_dim, *bias, *qk_norm)
            }
            Module::GatedMlp {
                hidden,
                intermediate,
                ..
            } => super::hf_layers::mlp_args(*hidden, *intermediate),
        }
    }

    /// Concern 2: the build's rules in context, then the shape this module returns
    /// for `x` (containers pass `x` through: `check.rs` walks them).
    pub(crate) fn out_shape(
        &self,
        x: &Sig,
        seen: &mut Seen,
        here: Here<'_>,
    ) -> std::result::Result<Sig, Fault> {
        let shape = |e: ShapeError| (None, Problem::Shape(e));
        let same = |what: &'static str| floats_in(what, x).map(|()| x.clone()).map_err(shape);
        let rotary = |seen: &mut Seen| {
            if seen.rotary_user.is_none() {
                seen.rotary_user = Some((here.path.to_string(), here.at.to_vec()));
            }
        };
        match self {
            Module::Sequential(_)
            | Module::Repeat { .. }
            | Module::Residual(_)
            | Module::Frame(_)
            | Module::Registered { .. }
            | Module::HfModel(_)
            | Module::Checkpoint { .. } => Ok(x.clone()),
            Module::Linear4bit { blocksize, .. }
                if !crate::engine::bnb::BLOCKSIZES.contains(blocksize) =>
            {
                Err((Some("blocksize"), Problem::Blocksize(*blocksize)))
            }
            Module::Linear { input, out, .. }
            | Module::Linear4bit { input, out, .. }
            | Module::Linear8bitLt { input, out, .. } => {
                floats_in("Linear", x).map_err(shape)?;
                match x.dims.split_last() {
                    Some((&k, lead)) if k == *input => {
                        let mut d = lead.to_vec();
                        d.push(*out);
                        Ok(Sig::floats(d))
                    }
                    _ => Err(shape(ShapeError::LinearIn {
                        input: *input,
                        got: x.dims.clone(),
                    })),
                }
            }
            Module::ReLU
            | Module::InplaceReLU
            | Module::GELU
            | Module::GELUTanh
            | Module::SiLU
            | Module::Dropout(_) => same("an activation"),
            Module::Embedding { dim, .. } | Module::ScaledEmbedding { dim, .. } => {
                seen.embedding = true;
                if !x.ids {
                    return Err(shape(ShapeError::EmbeddingFloats {
                        got: x.dims.clone(),
                    }));
                }
                let mut d = x.dims.clone();
                d.push(*dim);
                Ok(Sig::floats(d))
            }
            Module::LayerNorm { dim, .. } => {
                floats_in("LayerNorm", x).map_err(shape)?;
                if x.dims.last() != Some(dim) {
                    return Err(shape(ShapeError::LayerNormDim {
                        dim: *dim,
                        got: x.dims.clone(),
                    }));
                }
                Ok(x.clone())
            }
            Module::Conv2d {
                input,
                out,
                kernel,
                stride,
                padding,
                ..
            } => conv_like(
                "Conv2d",
                x,
                Some(*input),
                [*out, *kernel, *stride, *padding],
            )
            .map_err(shape),
            Module::BatchNorm2d(c) => {
                floats_in("BatchNorm2d", x).map_err(shape)?;
                if x.dims.len() != 4 || x.dims[1] != *c {
                    return Err(shape(ShapeError::BatchNormInput {
                        channels: *c,
                        got: x.dims.clone(),
                    }));
                }
                Ok(x.clone())
            }
            Module::MaxPool2d {
                kernel,
                stride,
                padding,
            } => {
                if padding.saturating_mul(2) > *kernel {
                    return Err((
                        Some("padding"),
                        Problem::PoolPadding {
                            kernel: *kernel,
                            padding: *padding,
                        },
                    ));
                }
                let c = x.dims.get(1).copied().unwrap_or(0);
                conv_like("MaxPool2d", x, None, [c, *kernel, *stride, *padding]).map_err(shape)
            }
            Module::AdaptiveAvgPool2d => {
                let c = x.dims.get(1).copied().unwrap_or(0);
                conv_like("AdaptiveAvgPool2d", x, None, [c, 1, 1, 0])
                    .map(|s| Sig::floats(vec![s.dims[0], s.dims[1], 1, 1]))
                    .map_err(shape)
            }
            Module::Flatten => {
                if x.dims.len() < 2 {
                    return Err(shape(ShapeError::FlattenRank {
                        got: x.dims.clone(),
                    }));
                }
                Ok(Sig {
                    dims: vec![x.dims[0], x.dims[1..].iter().product()],
                    ids: x.ids,
                })
            }
            Module::BasicBlock {
                inplanes,
                planes,
                stride,
            } => {
                conv_like("BasicBlock", x, Some(*inplanes), [*planes, 3, *stride, 1]).map_err(shape)
            }
            Module::Bottleneck {
                inplanes,
                planes,
                stride,
            } => conv_like(
                "Bottleneck",
                x,
                Some(*inplanes),
                [planes.saturating_mul(BOTTLENECK_EXPANSION), 3, *stride, 1],
            )
            .map_err(shape),
            Module::RMSNorm { dim } | Module::GemmaRMSNorm { dim } => {
                last_dim("RMSNorm", *dim, x).map_err(shape)
            }
            Module::RotaryEmbedding { head_dim, .. } => {
                seen.rotary_embedding = true;
                if !head_dim.is_multiple_of(2) {
                    return Err((Some("head_dim"), Problem::OddHeadDim(*head_dim)));
                }
                Ok(x.clone())
            }
            Module::Attention {
                hidden,
                heads: h,
                kv_heads,
                head_dim,
                rotary: uses_rotary,
                sdpa,
                ..
            } => {
                heads(*h, *kv_heads)?;
                let kv = kv_heads.unwrap_or(*h);
                if *sdpa == Some(SdpaBackend::Efficient) && kv < *h && !seen.grouped_kv_repeated {
                    return Err((
                        Some("sdpa"),
                        Problem::EfficientGqa {
                            heads: *h,
                            kv_heads: kv,
                        },
                    ));
                }
                let d = nonzero_head_dim(*hidden, *h, *head_dim)?;
                if *uses_rotary {
                    if !d.is_multiple_of(2) {
                        return Err((Some("head_dim"), Problem::OddHeadDim(d)));
                    }
                    rotary(seen);
                }
                attention_input("attention", *hidden, x).map_err(shape)
            }
            Module::DecoderLayer {
                hidden,
                heads: h,
                kv_heads,
                head_dim,
                ..
            } => {
                heads(*h, *kv_heads)?;
                let d = nonzero_head_dim(*hidden, *h, *head_dim)?;
                if !d.is_multiple_of(2) {
                    return Err((Some("head_dim"), Problem::OddHeadDim(d)));
                }
                rotary(seen);
                attention_input("attention", *hidden, x).map_err(shape)
            }
            Module::Mlp { hidden, .. } => last_dim("the block", *hidden, x).map_err(shape),
            Module::LmHead {
                hidden,
                vocab,
                tied,
                ..
            } => {
                if *tied && !seen.embedding {
                    return Err((Some("tied"), Problem::TiedWithoutEmbedding));
                }
                let mut s = last_dim("LmHead", *hidden, x).map_err(shape)?;
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
                seen.embedding = true;
                if !x.ids || x.dims.len() != 2 {
                    return Err(shape(ShapeError::BertEmbeddingsInput {
                        got: x.dims.clone(),
                    }));
                }
                if x.dims[1] > *max_positions {
                    return Err(shape(ShapeError::TooLong {
                        seq: x.dims[1],
                        max_positions: *max_positions,
                    }));
                }
                Ok(Sig::floats(vec![x.dims[0], x.dims[1], *hidden]))
            }
            Module::BertLayer { hidden, heads, .. } => {
                if !hidden.is_multiple_of(*heads) {
                    return Err((
                        Some("heads"),
                        Problem::HiddenNotMultipleOfHeads {
                            hidden: *hidden,
                            heads: *heads,
                        },
                    ));
                }
                last_dim("the block", *hidden, x).map_err(shape)
            }
            Module::BertPooler { hidden } => {
                let s = last_dim("BertPooler", *hidden, x).map_err(shape)?;
                Ok(Sig::floats(vec![s.dims[0], *hidden]))
            }
            Module::Softmax(_) | Module::SigmoidMul => same("an activation"),
            Module::Ops(statements) => {
                floats_in("Ops", x).map_err(shape)?;
                super::ops_expr::shapes(statements, &x.dims)
                    .map(Sig::floats)
                    .map_err(shape)
            }
            Module::CausalMask => {
                seen.causal_mask = true;
                if x.dims.len() < 2 {
                    return Err(shape(ShapeError::CausalMaskInput {
                        got: x.dims.clone(),
                    }));
                }
                Ok(x.clone())
            }
            Module::MaskedAttention { hidden, heads, .. } => {
                if !seen.causal_mask {
                    return Err((None, Problem::NoCausalMask));
                }
                if seen.in_region {
                    return Err((None, Problem::MaskInRegion));
                }
                if !hidden.is_multiple_of(*heads) {
                    return Err((
                        Some("heads"),
                        Problem::HiddenNotMultipleOfHeads {
                            hidden: *hidden,
                            heads: *heads,
                        },
                    ));
                }
                attention_input("attention", *hidden, x).map_err(shape)
            }
            Module::Positions { seq, dim } => {
                floats_in("Positions", x).map_err(shape)?;
                if x.dims.len() != 3 || x.dims[2] != *dim {
                    return Err(shape(ShapeError::PositionsInput {
                        dim: *dim,
                        got: x.dims.clone(),
                    }));
                }
                let s = x.clone();
                if s.dims[1] > *seq {
                    return Err(shape(ShapeError::TooLong {
                        seq: s.dims[1],
                        max_positions: *seq,
                    }));
                }
                Ok(s)
            }
            Module::SparseMoe {
                hidden,
                experts,
                top_k,
                routing,
                expert,
                dispatch,
                ..
            } => super::moe::moe_out_shape(*hidden, *experts, *top_k, routing, x)
                .and_then(|s| super::moe::grouped_needs_gate(*expert, *dispatch).map(|()| s)),
            Module::QkvAttention { hidden, heads } => {
                super::qkv_attention::qkv_out_shape(*hidden, *heads, x)
            }
            Module::HfAttention {
                hidden,
                heads,
                kv_heads,
                head_dim,
                ..
            } => {
                let s = super::hf_layers::attn_out_shape(*hidden, *heads, *kv_heads, *head_dim, x)?;
                rotary(seen);
                Ok(s)
            }
            Module::GatedMlp { hidden, .. } => last_dim("GatedMlp", *hidden, x).map_err(shape),
        }
    }
}

impl Module {
    /// Concern 6: the names of the projections in it that LoRA's `target_modules`
    /// may name (a plain `Linear` by the last part of its path).
    pub(crate) fn projection_names(&self, path: &str) -> Vec<String> {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect();
        let attention = ["q_proj", "k_proj", "v_proj", "o_proj"];
        let swiglu = ["gate_proj", "up_proj", "down_proj"];
        match self {
            Module::Linear { .. } | Module::Linear4bit { .. } | Module::Linear8bitLt { .. } => {
                vec![path.rsplit('.').next().unwrap_or(path).to_string()]
            }
            Module::Attention { .. } => names(&attention),
            Module::Mlp { gated: true, .. } => names(&swiglu),
            Module::Mlp { gated: false, .. } => names(&["c_fc", "c_proj"]),
            Module::DecoderLayer { .. } => names(&[&attention[..], &swiglu[..]].concat()),
            Module::Sequential(_)
            | Module::Repeat { .. }
            | Module::Residual(_)
            | Module::Frame(_)
            | Module::Registered { .. }
            | Module::HfModel(_)
            | Module::Checkpoint { .. }
            | Module::ReLU
            | Module::InplaceReLU
            | Module::GELU
            | Module::GELUTanh
            | Module::SiLU
            | Module::Dropout(_)
            | Module::Embedding { .. }
            | Module::ScaledEmbedding { .. }
            | Module::LayerNorm { .. }
            | Module::Conv2d { .. }
            | Module::BatchNorm2d(_)
            | Module::MaxPool2d { .. }
            | Module::AdaptiveAvgPool2d
            | Module::Flatten
            | Module::BasicBlock { .. }
            | Module::Bottleneck { .. }
            | Module::RMSNorm { .. }
            | Module::GemmaRMSNorm { .. }
            | Module::RotaryEmbedding { .. }
            | Module::LmHead { .. }
            | Module::BertEmbeddings { .. }
            | Module::BertLayer { .. }
            | Module::BertPooler { .. }
            | Module::Softmax(_)
            | Module::SigmoidMul
            | Module::CausalMask
            | Module::MaskedAttention { .. }
            | Module::Positions { .. }
            | Module::QkvAttention { .. }
            | Module::HfAttention { .. }
            | Module::GatedMlp { .. }
            | Module::Ops(_) => Vec::new(),
            Module::SparseMoe { .. } => super::moe::moe_projection_names(),
        }
    }
}

impl Module {
    /// Concern 8: what the module assumes where the data decide (a
    /// mixture of experts' routing), in words for views and reports.
    pub(crate) fn assumption(&self) -> Option<String> {
        match self {
            Module::SparseMoe { routing, .. } => Some(format!("routing {}", routing.describe())),
            Module::Sequential(_)
            | Module::Repeat { .. }
            | Module::Residual(_)
            | Module::Frame(_)
            | Module::Registered { .. }
            | Module::HfModel(_)
            | Module::Checkpoint { .. }
            | Module::Linear { .. }
            | Module::Linear4bit { .. }
            | Module::Linear8bitLt { .. }
            | Module::ReLU
            | Module::InplaceReLU
            | Module::GELU
            | Module::GELUTanh
            | Module::SiLU
            | Module::Dropout(_)
            | Module::Embedding { .. }
            | Module::ScaledEmbedding { .. }
            | Module::LayerNorm { .. }
            | Module::Conv2d { .. }
            | Module::BatchNorm2d(_)
            | Module::MaxPool2d { .. }
            | Module::AdaptiveAvgPool2d
            | Module::Flatten
            | Module::BasicBlock { .. }
            | Module::Bottleneck { .. }
            | Module::RMSNorm { .. }
            | Module::GemmaRMSNorm { .. }
            | Module::RotaryEmbedding { .. }
            | Module::Attention { .. }
            | Module::Mlp { .. }
            | Module::DecoderLayer { .. }
            | Module::LmHead { .. }
            | Module::BertEmbeddings { .. }
            | Module::BertLayer { .. }
            | Module::BertPooler { .. }
            | Module::Softmax(_)
            | Module::SigmoidMul
            | Module::CausalMask
            | Module::MaskedAttention { .. }
            | Module::Positions { .. }
            | Module::QkvAttention { .. }
            | Module::HfAttention { .. }
            | Module::GatedMlp { .. }
            | Module::Ops(_) => None,
        }
    }
}

/// A tensor a step feeds the model, as the module that gets it first sees it.
pub(crate) struct Fed<'a> {
    pub dims: &'a [u64],
    /// `torch.Size` as PyTorch prints it (`[4, 784]`).
    pub shape: String,
    pub dtype: DType,
    /// The model's parameters' dtype.
    pub weight: DType,
    /// The input's floating dtype is not the weights' (outside autocast).
    pub mismatch: bool,
}

impl Module {
    /// Concern 7: PyTorch's own words for a tensor this module refuses
    /// when it is the first to get it (`Forward` may be fed any bound
    /// tensor); `None`: the analysis's words will do.
    pub(crate) fn pytorch_refusal(&self, x: &Fed<'_>) -> Option<String> {
        match self {
            Module::Linear { input, out, .. } => {
                // `F.linear(x, W)`: x at least 1-D, of W's dtype, last dimension `in`.
                let Some(&k) = x.dims.last() else {
                    return Some(
                        "both arguments to linear need to be at least 1D, but they are 0D and 2D"
                            .into(),
                    );
                };
                if !x.dtype.is_floating() || x.mismatch {
                    return Some(format!(
                        "expected m1 and m2 to have the same dtype, but got: {} != {}",
                        x.dtype.scalar_name(),
                        x.weight.scalar_name()
                    ));
                }
                let rows = x.dims[..x.dims.len() - 1]
                    .iter()
                    .fold(1, |n: u64, &d| n.saturating_mul(d));
                (k != *input).then(|| {
                    format!(
                        "mat1 and mat2 shapes cannot be multiplied ({rows}x{k} and {input}x{out})"
                    )
                })
            }
            Module::Conv2d {
                input, out, kernel, ..
            } => {
                if x.dims.len() != 4 {
                    return Some(format!(
                        "Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: {}",
                        x.shape
                    ));
                }
                if !x.dtype.is_floating() || x.mismatch {
                    return Some(format!(
                        "Input type ({}) and weight type ({}) should be the same",
                        x.dtype.cuda_type_name(),
                        x.weight.cuda_type_name()
                    ));
                }
                (x.dims[1] != *input).then(|| {
                    format!(
                        "Given groups=1, weight of size [{out}, {input}, {kernel}, {kernel}], expected input{} to have {input} channels, but got {} channels instead",
                        x.shape, x.dims[1]
                    )
                })
            }
            Module::Sequential(_)
            | Module::Repeat { .. }
            | Module::Residual(_)
            | Module::Frame(_)
            | Module::Registered { .. }
            | Module::HfModel(_)
            | Module::Checkpoint { .. }
            // bitsandbytes casts the input to its compute dtype itself.
            | Module::Linear4bit { .. }
            | Module::Linear8bitLt { .. }
            | Module::ReLU
            | Module::InplaceReLU
            | Module::GELU
            | Module::GELUTanh
            | Module::SiLU
            | Module::Dropout(_)
            | Module::Embedding { .. }
            | Module::ScaledEmbedding { .. }
            | Module::LayerNorm { .. }
            | Module::BatchNorm2d(_)
            | Module::MaxPool2d { .. }
            | Module::AdaptiveAvgPool2d
            | Module::Flatten
            | Module::BasicBlock { .. }
            | Module::Bottleneck { .. }
            | Module::RMSNorm { .. }
            | Module::GemmaRMSNorm { .. }
            | Module::RotaryEmbedding { .. }
            | Module::Attention { .. }
            | Module::Mlp { .. }
            | Module::DecoderLayer { .. }
            | Module::LmHead { .. }
            | Module::BertEmbeddings { .. }
            | Module::BertLayer { .. }
            | Module::BertPooler { .. }
            | Module::Softmax(_)
            | Module::SigmoidMul
            | Module::CausalMask
            | Module::MaskedAttention { .. }
            | Module::Positions { .. }
            | Module::SparseMoe { .. }
            | Module::QkvAttention { .. }
            | Module::HfAttention { .. }
            | Module::GatedMlp { .. }
            | Module::Ops(_) => None,
        }
    }
}

/// A built module that is not a container: what its forward needs.
#[derive(Debug)]
pub(crate) enum Leaf {
    Linear(Linear),
    Unary {
        op: Unary,
        module: u32,
    },
    InplaceRelu {
        module: u32,
    },
    Dropout {
        p: f64,
        module: u32,
    },
    Embedding(Embedding),
    /// `Module::ScaledEmbedding`: the embedding (its `embed_scale` buffer is
    /// among the model's buffers).
    ScaledEmbedding(Embedding),
    LayerNorm(LayerNorm),
    Conv(Conv),
    BatchNorm(BatchNorm),
    MaxPool {
        k: u64,
        stride: u64,
        pad: u64,
        module: u32,
    },
    AvgPool {
        module: u32,
    },
    Flatten {
        module: u32,
    },
    BasicBlock(BasicBlock),
    Bottleneck(Bottleneck),
    RmsNorm(RmsNorm),
    GemmaRmsNorm(RmsNorm),
    Rotary,
    Attention {
        attn: Attention,
        rotary: bool,
        sdpa: Option<SdpaBackend>,
    },
    SwiGlu(SwiGlu),
    GeluMlp {
        module: u32,
        fc: Proj,
        act: u32,
        proj: Proj,
    },
    Decoder(DecoderLayer),
    LmHead {
        w: TensorId,
        module: u32,
        softcap: bool,
    },
    BertEmbeddings(BertEmbeddings),
    BertLayer(BertLayer),
    BertPooler {
        dense: Linear,
        act: u32,
    },
    /// A plain `Linear` that LoRA adapted.
    Proj(Proj),
    Softmax {
        kind: SoftmaxKind,
        module: u32,
    },
    SigmoidMul {
        module: u32,
    },
    CausalMask {
        module: u32,
    },
    MaskedAttention(MaskedAttn),
    Ops {
        statements: Vec<(String, super::spec::Expr)>,
        module: u32,
    },
    /// `x + pos[:t]`, the model's own parameter at `slot` (built last).
    Positions {
        slot: usize,
        module: u32,
    },
    SparseMoe(Box<super::moe::MoeLeaf>),
    QkvAttention(super::qkv_attention::QkvAttn),
    HfAttention(super::hf_layers::HfAttn),
    GatedMlp(super::hf_layers::GatedMlp),
}

impl Builder<'_> {
    /// Concern 3: build the module `m` at `path` (not a container: `build.rs`
    /// builds those). The analysis has approved `m` where it stands.
    pub(crate) fn leaf(&mut self, e: &mut Engine, path: &str, m: &Module) -> Result<Leaf> {
        let at = |name: &str| join(path, name);
        let module = |e: &mut Engine| e.tags.module(path);
        let params = &mut *self.params;
        Ok(match m {
            Module::Sequential(_)
            | Module::Repeat { .. }
            | Module::Residual(_)
            | Module::Frame(_)
            | Module::Registered { .. }
            | Module::HfModel(_)
            | Module::Checkpoint { .. } => {
                return Err(EngineError::Program(format!(
                    "{}: a container is built by the builder's walk",
                    display(path)
                )))
            }
            Module::Linear { input, out, bias } => {
                Leaf::Linear(e.new_linear(path, *input, *out, *bias, params)?)
            }
            Module::Linear4bit {
                input,
                out,
                bias,
                quant_type,
                blocksize,
                double_quant,
                compute_dtype,
            } => {
                let q = crate::engine::bnb::Quant4 {
                    quant_type: *quant_type,
                    blocksize: *blocksize,
                    double_quant: *double_quant,
                    compute_dtype: *compute_dtype,
                };
                let layer = crate::engine::bnb::QuantLayer::FourBit(q);
                Leaf::Linear(e.new_quant_linear(path, *input, *out, *bias, layer, params)?)
            }
            Module::Linear8bitLt { input, out, bias } => {
                let layer = crate::engine::bnb::QuantLayer::EightBit;
                Leaf::Linear(e.new_quant_linear(path, *input, *out, *bias, layer, params)?)
            }
            Module::ReLU => unary(e, path, Unary::Relu),
            Module::GELU | Module::GELUTanh => unary(e, path, Unary::Gelu),
            Module::SiLU => unary(e, path, Unary::Silu),
            Module::InplaceReLU => Leaf::InplaceRelu { module: module(e) },
            Module::Dropout(p) => Leaf::Dropout {
                p: *p,
                module: module(e),
            },
            Module::Embedding { num, dim } => {
                let emb = e.new_embedding(path, *num, *dim, params)?;
                self.x.tie.get_or_insert(emb.w);
                Leaf::Embedding(emb)
            }
            Module::ScaledEmbedding { num, dim } => {
                let emb = e.new_embedding(path, *num, *dim, params)?;
                self.x.tie.get_or_insert(emb.w);
                // `nn.Buffer(torch.tensor(embed_scale))` under the model's
                // default dtype, registered after the weight.
                e.new_buffer(at("embed_scale"), &[], e.param_dtype, emb.module, self.bufs)?;
                Leaf::ScaledEmbedding(emb)
            }
            Module::LayerNorm { dim, bias } => {
                Leaf::LayerNorm(e.new_layer_norm(path, *dim, *bias, params)?)
            }
            Module::Conv2d {
                input,
                out,
                kernel,
                stride,
                padding,
                bias,
            } => Leaf::Conv(e.new_conv2d(
                path,
                [*input, *out, *kernel, *stride, *padding],
                *bias,
                params,
            )?),
            Module::BatchNorm2d(c) => Leaf::BatchNorm(e.new_bn(path, *c, params, self.bufs)?),
            Module::MaxPool2d {
                kernel,
                stride,
                padding,
            } => Leaf::MaxPool {
                k: *kernel,
                stride: *stride,
                pad: *padding,
                module: module(e),
            },
            Module::AdaptiveAvgPool2d => Leaf::AvgPool { module: module(e) },
            Module::Flatten => Leaf::Flatten { module: module(e) },
            Module::BasicBlock {
                inplanes,
                planes,
                stride,
            } => Leaf::BasicBlock(BasicBlock::build(
                e,
                path,
                [*inplanes, *planes, *stride],
                params,
                self.bufs,
            )?),
            Module::Bottleneck {
                inplanes,
                planes,
                stride,
            } => Leaf::Bottleneck(Bottleneck::build(
                e,
                path,
                [*inplanes, *planes, *stride],
                params,
                self.bufs,
            )?),
            Module::RMSNorm { dim } => Leaf::RmsNorm(new_rms_norm(e, path, *dim, params)?),
            Module::GemmaRMSNorm { dim } => {
                Leaf::GemmaRmsNorm(new_rms_norm(e, path, *dim, params)?)
            }
            Module::RotaryEmbedding {
                head_dim,
                float32,
                sliding,
                unused_sliding_mask,
            } => {
                let module = module(e);
                let model_dtype = e.param_dtype;
                if *float32 {
                    e.param_dtype = DType::F32;
                }
                // transformers registers `original_inv_freq` as a buffer of its
                // own (`inv_freq.clone()`, `LlamaRotaryEmbedding.__init__`), moved
                // and cast with the model: two 64 B blocks in the Qwen2.5 capture.
                // Gemma 3 registers a pair per layer type, in sorted order.
                let prefixes: &[&str] = if *sliding {
                    &["full_attention_", "sliding_attention_"]
                } else {
                    &[""]
                };
                let mut made = Vec::new();
                for p in prefixes {
                    let buf =
                        e.new_inv_freq(module, *head_dim, self.bufs, &at(&format!("{p}inv_freq")));
                    let pair = buf.and_then(|buf| {
                        e.new_inv_freq(
                            module,
                            *head_dim,
                            self.bufs,
                            &at(&format!("{p}original_inv_freq")),
                        )
                        .map(|_| buf)
                    });
                    match pair {
                        Ok(b) => made.push(b),
                        Err(err) => {
                            e.param_dtype = model_dtype;
                            return Err(err);
                        }
                    }
                }
                e.param_dtype = model_dtype;
                self.x.inv_freq = made.first().copied();
                self.x.local_inv_freq = made.get(1).copied();
                self.x.unused_sliding_mask = *unused_sliding_mask;
                Leaf::Rotary
            }
            Module::Attention {
                hidden,
                heads,
                kv_heads,
                head_dim,
                causal,
                rotary,
                bias,
                dropout,
                sdpa,
            } => {
                let spec = AttentionSpec::new(*hidden, *heads, *kv_heads, *head_dim);
                let mut attn = Attention::build(e, path, &spec, *bias, params)?;
                attn.causal = *causal;
                attn.dropout = *dropout;
                Leaf::Attention {
                    attn,
                    rotary: *rotary,
                    sdpa: *sdpa,
                }
            }
            Module::Mlp {
                hidden,
                intermediate,
                gated,
                bias,
            } => {
                let lin = |e: &mut Engine, name: &str, fin, fout, ps: &mut Vec<TensorId>| {
                    e.new_linear(&at(name), fin, fout, *bias, ps)
                        .map(Proj::plain)
                };
                let (h, i) = (*hidden, *intermediate);
                if *gated {
                    Leaf::SwiGlu(SwiGlu {
                        module: module(e),
                        act: e.tags.module(&at("act_fn")),
                        gate: lin(e, "gate_proj", h, i, params)?,
                        up: lin(e, "up_proj", h, i, params)?,
                        down: lin(e, "down_proj", i, h, params)?,
                    })
                } else {
                    Leaf::GeluMlp {
                        module: module(e),
                        fc: lin(e, "c_fc", h, i, params)?,
                        act: e.tags.module(&at("act")),
                        proj: lin(e, "c_proj", i, h, params)?,
                    }
                }
            }
            Module::DecoderLayer {
                hidden,
                intermediate,
                heads,
                kv_heads,
                head_dim,
                qkv_bias,
            } => {
                let spec = AttentionSpec::new(*hidden, *heads, *kv_heads, *head_dim);
                Leaf::Decoder(DecoderLayer::build(
                    e,
                    path,
                    &spec,
                    *intermediate,
                    *qkv_bias,
                    params,
                )?)
            }
            Module::LmHead {
                hidden,
                vocab,
                tied,
                softcap,
            } => {
                let module = module(e);
                let w = match (tied, self.x.tie) {
                    (true, Some(w)) => w,
                    (true, None) => {
                        return Err(EngineError::Program(format!(
                            "{}: a tied LmHead needs an Embedding before it",
                            display(path)
                        )))
                    }
                    (false, _) => e.new_param(&[*vocab, *hidden], module, params)?,
                };
                Leaf::LmHead {
                    w,
                    module,
                    softcap: *softcap,
                }
            }
            Module::BertEmbeddings {
                vocab,
                hidden,
                max_positions,
                type_vocab,
                dropout,
            } => {
                let h = *hidden;
                let word = e.new_embedding(&at("word_embeddings"), *vocab, h, params)?;
                let position =
                    e.new_embedding(&at("position_embeddings"), *max_positions, h, params)?;
                let token_type =
                    e.new_embedding(&at("token_type_embeddings"), *type_vocab, h, params)?;
                let ln = e.new_layer_norm(&at("LayerNorm"), h, true, params)?;
                let module = module(e);
                let shape = [1, *max_positions];
                let position_ids =
                    e.new_buffer(at("position_ids"), &shape, DType::I64, module, self.bufs)?;
                let token_type_ids =
                    e.new_buffer(at("token_type_ids"), &shape, DType::I64, module, self.bufs)?;
                self.x.tie.get_or_insert(word.w);
                Leaf::BertEmbeddings(BertEmbeddings {
                    module,
                    word,
                    position,
                    token_type,
                    ln,
                    position_ids,
                    token_type_ids,
                    dropout: *dropout,
                })
            }
            Module::BertLayer {
                hidden,
                intermediate,
                heads,
                dropout,
            } => Leaf::BertLayer(BertLayer::build(
                e,
                path,
                [*hidden, *intermediate, *heads],
                *dropout,
                params,
            )?),
            Module::BertPooler { hidden } => Leaf::BertPooler {
                dense: e.new_linear(&at("dense"), *hidden, *hidden, true, params)?,
                act: e.tags.module(&at("activation")),
            },
            Module::Softmax(kind) => Leaf::Softmax {
                kind: *kind,
                module: module(e),
            },
            Module::SigmoidMul => Leaf::SigmoidMul { module: module(e) },
            Module::CausalMask => Leaf::CausalMask { module: module(e) },
            Module::Ops(statements) => Leaf::Ops {
                statements: statements.clone(),
                module: module(e),
            },
            Module::MaskedAttention {
                hidden,
                heads,
                softmax,
            } => {
                let h = *hidden;
                Leaf::MaskedAttention(MaskedAttn {
                    module: module(e),
                    qkv: e.new_linear(&at("qkv"), h, h.saturating_mul(3), true, params)?,
                    proj: e.new_linear(&at("proj"), h, h, true, params)?,
                    heads: *heads,
                    softmax: *softmax,
                })
            }
            Module::Positions { seq, dim } => {
                let module = module(e);
                self.own.push((module, vec![*seq, *dim], e.param_dtype));
                Leaf::Positions {
                    slot: self.own.len() - 1,
                    module,
                }
            }
            Module::SparseMoe {
                hidden,
                intermediate,
                experts,
                top_k,
                expert,
                norm_topk_prob,
                shared_expert,
                routing,
                dispatch,
                router,
                experts_first,
            } => {
                let b = super::moe::MoeBuild {
                    hidden: *hidden,
                    intermediate: *intermediate,
                    experts: *experts,
                    top_k: *top_k,
                    expert: *expert,
                    norm_topk_prob: *norm_topk_prob,
                    shared_expert: *shared_expert,
                    routing,
                    dispatch: *dispatch,
                    router,
                    experts_first: *experts_first,
                };
                Leaf::SparseMoe(Box::new(super::moe::build_moe(e, path, &b, params)?))
            }
            Module::QkvAttention { hidden, heads } => Leaf::QkvAttention(
                super::qkv_attention::build_qkv(e, path, *hidden, *heads, params)?,
            ),
            Module::HfAttention {
                hidden,
                heads,
                kv_heads,
                head_dim,
                bias,
                qk_norm,
                fused_qkv,
                sliding,
                gemma_qk_norm,
            } => {
                let b = super::hf_layers::AttnBuild {
                    hidden: *hidden,
                    heads: *heads,
                    kv_heads: *kv_heads,
                    head_dim: *head_dim,
                    bias: *bias,
                    qk_norm: *qk_norm,
                    fused_qkv: *fused_qkv,
                    sliding: *sliding,
                    gemma_qk_norm: *gemma_qk_norm,
                };
                Leaf::HfAttention(super::hf_layers::build_attn(e, path, &b, params)?)
            }
            Module::GatedMlp {
                hidden,
                intermediate,
                act,
                fused,
            } => Leaf::GatedMlp(super::hf_layers::build_mlp(
                e,
                path,
                [*hidden, *intermediate],
                *act,
                *fused,
                params,
            )?),
        })
    }
}

fn unary(e: &mut Engine, path: &str, op: Unary) -> Leaf {
    Leaf::Unary {
        op,
        module: e.tags.module(path),
    }
}

impl LangNet {
    /// Concern 4: a leaf's forward: a new handle; `x` stays the caller's.
    pub(crate) fn run_leaf(&self, e: &mut Engine, leaf: &Leaf, x: TensorId) -> Result<TensorId> {
        match leaf {
            Leaf::Linear(l) => e.apply_linear(l, x),
            Leaf::Unary { op, module } => e.in_module(*module, |e| e.unary(*op, x)),
            Leaf::InplaceRelu { module } => {
                e.in_module(*module, |e| e.relu_(x))?;
                Ok(e.local_ref(x))
            }
            Leaf::Dropout { p, module } => e.in_module(*module, |e| e.dropout(x, *p)),
            Leaf::Embedding(m) => {
                let y = e.in_module(m.module, |e| e.embedding(m.w, x))?;
                // `enable_input_require_grads`' hook: `output.requires_grad_(True)`.
                if self.input_grads == Some(m.w) && e.ctx.grad_enabled {
                    e.t_mut(y).requires_grad = true;
                }
                Ok(y)
            }
            Leaf::ScaledEmbedding(m) => e.in_module(m.module, |e| {
                let y = e.embedding(m.w, x)?;
                if self.input_grads == Some(m.w) && e.ctx.grad_enabled {
                    e.t_mut(y).requires_grad = true;
                }
                // `* self.embed_scale.to(self.weight.dtype)`: the same dtype,
                // no copy; a 0-dim operand that needs no gradient.
                let out = e.mul_scalar(y);
                e.release(y);
                out
            }),
            Leaf::LayerNorm(l) => e.apply_layer_norm(l, x),
            Leaf::Conv(c) => e.apply_conv(c, x),
            Leaf::BatchNorm(n) => e.apply_bn(n, x),
            Leaf::MaxPool {
                k,
                stride,
                pad,
                module,
            } => e.in_module(*module, |e| e.max_pool2d(x, *k, *stride, *pad)),
            Leaf::AvgPool { module } => e.in_module(*module, |e| e.adaptive_avg_pool2d(x)),
            Leaf::Flatten { module } => {
                let s = e.shape(x);
                let rest = s.dims().iter().skip(1).product::<u64>();
                e.in_module(*module, |e| e.reshape(x, Shape::new(&[s.dim(0), rest])))
            }
            Leaf::BasicBlock(b) => e.in_module(b.module, |e| b.forward(e, x)),
            Leaf::Bottleneck(b) => b.forward(e, x),
            Leaf::RmsNorm(r) => e.apply_rms_norm(r, x),
            Leaf::GemmaRmsNorm(r) => e.in_module(r.module, |e| e.rms_norm_gemma(x, r.w)),
            Leaf::Rotary => {
                // `position_embeddings = self.rotary_emb(hidden_states,
                // position_ids)` in the model's forward: the rotary context
                // (positions, tables) is made here when it stands before the
                // layers, and reused when they have made it already.
                self.rope(e, x)?;
                Ok(e.local_ref(x))
            }
            Leaf::Attention { attn, rotary, sdpa } => {
                let rope = if *rotary {
                    Some(self.rope(e, x)?)
                } else {
                    None
                };
                let saved = e.cfg.sdpa_backend;
                if sdpa.is_some() {
                    e.cfg.sdpa_backend = *sdpa;
                }
                let r = e.in_module(attn.module, |e| e.hf_attention(attn, x, rope));
                e.cfg.sdpa_backend = saved;
                r
            }
            Leaf::SwiGlu(m) => e.in_module(m.module, |e| e.swiglu(m, x)),
            Leaf::GeluMlp {
                module,
                fc,
                act,
                proj,
            } => e.in_module(*module, |e| {
                let f = e.apply_proj(fc, x)?;
                let g = e.in_module(*act, |e| e.unary(Unary::Gelu, f));
                let g = e.rebind(f, g)?;
                let o = e.apply_proj(proj, g);
                e.rebind(g, o)
            }),
            Leaf::Decoder(l) => {
                let rope = self.rope(e, x)?;
                e.decoder_layer(l, x, rope)
            }
            Leaf::LmHead { w, module, softcap } => {
                let logits = e.in_module(*module, |e| e.linear(x, *w, None))?;
                let logits = if *softcap {
                    let scaled = e.mul_scalar(logits);
                    let logits = e.rebind(logits, scaled)?;
                    let capped = e.unary(Unary::Tanh, logits);
                    let logits = e.rebind(logits, capped)?;
                    let scaled = e.mul_scalar(logits);
                    e.rebind(logits, scaled)?
                } else {
                    logits
                };
                if self.loss_in_forward {
                    e.hold_to_loss(logits, x);
                }
                Ok(logits)
            }
            Leaf::BertEmbeddings(b) => e.in_module(b.module, |e| e.bert_embeddings(b, x)),
            Leaf::BertLayer(l) => e.in_module(l.module, |e| e.bert_layer(l, x)),
            Leaf::BertPooler { dense, act } => {
                // `hidden_states[:, 0]`: a 2-D view addmm takes as it is.
                let s = e.shape(x);
                let first = e.view_as(x, Shape::new(&[s.dim(0), s.last()]), Layout::Contiguous);
                let p = e.apply_linear(dense, first);
                e.release(first);
                let p = p?;
                let t = e.in_module(*act, |e| e.unary(Unary::Tanh, p));
                e.rebind(p, t)
            }
            Leaf::Proj(p) => e.apply_proj(p, x),
            Leaf::Softmax { kind, module } => {
                e.in_module(*module, |e| super::handwritten::softmax(e, *kind, x))
            }
            Leaf::SigmoidMul { module } => {
                e.in_module(*module, |e| super::handwritten::sigmoid_mul(e, x))
            }
            Leaf::CausalMask { module } => self.causal_mask(e, *module, x),
            Leaf::Ops { statements, module } => {
                e.in_module(*module, |e| super::ops_expr::run(e, statements, x))
            }
            Leaf::MaskedAttention(a) => self.masked_attention(e, a, x),
            Leaf::Positions { slot, module } => self.positions(e, *slot, *module, x),
            Leaf::SparseMoe(m) => self.sparse_moe(e, m, x),
            Leaf::QkvAttention(a) => super::qkv_attention::qkv_attention(e, a, x),
            Leaf::HfAttention(a) => self.hf_attn(e, a, x),
            Leaf::GatedMlp(m) => super::hf_layers::gated_mlp(e, m, x),
        }
    }
}

impl Leaf {
    /// Concern 5: the projections in this leaf LoRA may adapt, in module order; a
    /// plain `Linear` that `targeted` picks becomes a [`Leaf::Proj`] first
    /// (`xfmr::add_lora`).
    pub(crate) fn projections(&mut self, targeted: impl Fn(&Linear) -> bool) -> Vec<&mut Proj> {
        if let Leaf::Linear(l) = self {
            if targeted(l) {
                *self = Leaf::Proj(Proj::plain(l.clone()));
            }
        }
        match self {
            Leaf::Attention { attn, .. } => {
                vec![&mut attn.q, &mut attn.k, &mut attn.v, &mut attn.o]
            }
            Leaf::SwiGlu(m) => vec![&mut m.gate, &mut m.up, &mut m.down],
            Leaf::GeluMlp { fc, proj, .. } => vec![fc, proj],
            Leaf::Decoder(l) => vec![
                &mut l.attn.q,
                &mut l.attn.k,
                &mut l.attn.v,
                &mut l.attn.o,
                &mut l.mlp.gate,
                &mut l.mlp.up,
                &mut l.mlp.down,
            ],
            Leaf::Proj(p) => vec![p],
            Leaf::Linear(_)
            | Leaf::Unary { .. }
            | Leaf::InplaceRelu { .. }
            | Leaf::Dropout { .. }
            | Leaf::Embedding(_)
            | Leaf::ScaledEmbedding(_)
            | Leaf::LayerNorm(_)
            | Leaf::Conv(_)
            | Leaf::BatchNorm(_)
            | Leaf::MaxPool { .. }
            | Leaf::AvgPool { .. }
            | Leaf::Flatten { .. }
            | Leaf::BasicBlock(_)
            | Leaf::Bottleneck(_)
            | Leaf::RmsNorm(_)
            | Leaf::GemmaRmsNorm(_)
            | Leaf::Rotary
            | Leaf::LmHead { .. }
            | Leaf::BertEmbeddings(_)
            | Leaf::BertLayer(_)
            | Leaf::BertPooler { .. }
            | Leaf::Softmax { .. }
            | Leaf::SigmoidMul { .. }
            | Leaf::CausalMask { .. }
            | Leaf::MaskedAttention(_)
            | Leaf::Positions { .. }
            | Leaf::SparseMoe(_)
            | Leaf::QkvAttention(_)
            | Leaf::HfAttention(_)
            | Leaf::GatedMlp(_)
            | Leaf::Ops { .. } => Vec::new(),
        }
    }
}

impl Module {
    /// Concern 8: whether transformers' `gradient_checkpointing_enable()`
    /// checkpoints it (a `GradientCheckpointingLayer`: the decoder and BERT
    /// layers), for `prepare_model_for_kbit_training` (`kbit.rs`).
    pub(crate) fn hf_checkpoint_layer(&self) -> bool {
        match self {
            Module::DecoderLayer { .. } | Module::BertLayer { .. } => true,
            Module::Sequential(_)
            | Module::Repeat { .. }
            | Module::Residual(_)
            | Module::Frame(_)
            | Module::Registered { .. }
            | Module::HfModel(_)
            | Module::Checkpoint { .. }
            | Module::Linear { .. }
            | Module::Linear4bit { .. }
            | Module::Linear8bitLt { .. }
            | Module::ReLU
            | Module::InplaceReLU
            | Module::GELU
            | Module::GELUTanh
            | Module::SiLU
            | Module::Dropout(_)
            | Module::Embedding { .. }
            | Module::ScaledEmbedding { .. }
            | Module::LayerNorm { .. }
            | Module::Conv2d { .. }
            | Module::BatchNorm2d(_)
            | Module::MaxPool2d { .. }
            | Module::AdaptiveAvgPool2d
            | Module::Flatten
            | Module::BasicBlock { .. }
            | Module::Bottleneck { .. }
            | Module::RMSNorm { .. }
            | Module::GemmaRMSNorm { .. }
            | Module::RotaryEmbedding { .. }
            | Module::Attention { .. }
            | Module::Mlp { .. }
            | Module::LmHead { .. }
            | Module::BertEmbeddings { .. }
            | Module::BertPooler { .. }
            | Module::Softmax(_)
            | Module::SigmoidMul
            | Module::CausalMask
            | Module::MaskedAttention { .. }
            | Module::Positions { .. }
            | Module::SparseMoe { .. }
            | Module::QkvAttention { .. }
            | Module::HfAttention { .. }
            | Module::GatedMlp { .. }
            | Module::Ops(_) => false,
        }
    }
}
