//! The one check of a model written in the language, run by `vramscope check`
//! (through the scenario's loader) and by the build before it allocates
//! anything: every module's output shape, and every rule the build enforces
//! (heads and key/value heads, rotary positions, checkpoint regions, a tied
//! head, LoRA's rank, pooling padding), symbolically. A `Repeat` is walked
//! once per copy only until its block's output and what the walk has seen
//! stop changing (then every further copy is the same check), so
//! `Repeat(n: 18446744073709551615, …)` is answered at once.
//!
//! Each error names PyTorch's module path, the field at fault, and where
//! the module sits in the description ([`Seg`]s from the model's value), so
//! the loader can point at the file's line and column.

use super::build::display;
use super::shape::{out_shape, ShapeError, Sig};
use super::spec::{join, LangModel, Module};

/// One step into a RON value: a named field, or an item of a list or tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Field(&'static str),
    Index(usize),
}

/// What is wrong with one module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("heads ({heads}) must be a multiple of kv_heads ({kv_heads}): each key/value head serves an equal group of query heads")]
    KvHeadsDivide { heads: u64, kv_heads: u64 },
    #[error("kv_heads ({kv_heads}) is more than heads ({heads}): each key/value head serves a group of query heads")]
    KvHeadsOverHeads { heads: u64, kv_heads: u64 },
    #[error("head_dim ({0}) must be even for rotary embeddings (rotate_half splits it in two)")]
    OddHeadDim(u64),
    #[error("head_dim is 0: hidden ({hidden}) / heads ({heads}) rounds down to nothing; give head_dim or fewer heads")]
    ZeroHeadDim { hidden: u64, heads: u64 },
    #[error("rotary positions need a RotaryEmbedding module in the model")]
    NoRotaryEmbedding,
    #[error("a Checkpoint inside another Checkpoint (regions do not nest here)")]
    NestedCheckpoint,
    #[error("a tied LmHead needs an Embedding before it (its weight is the Embedding's)")]
    TiedWithoutEmbedding,
    #[error("LoRA r must be at least 1 (the adapters' rank)")]
    LoraRank,
    #[error("padding {padding} is more than half the kernel {kernel}: PyTorch refuses it (\"pad should be at most half of effective kernel size\")")]
    PoolPadding { kernel: u64, padding: u64 },
    #[error("Repeat needs n of at least 1")]
    RepeatZero,
    #[error("Repeat's block changes the shape at every copy; past {MAX_CHANGING_COPIES} such copies the model is not modelled")]
    RepeatDrifts,
    /// A shape the module cannot take.
    #[error("{0}")]
    Shape(#[from] super::shape::ShapeError),
}

/// Copies of a `Repeat` whose block still changes the shape it passes on:
/// a block that shrinks or grows its input reaches an error or a fixed
/// point long before this.
pub const MAX_CHANGING_COPIES: u64 = 4096;

/// A problem, the module it is in and where that module is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelError {
    /// PyTorch's module path (`layers.0.self_attn`), `""` for the root.
    pub module: String,
    /// Where in the model's value the module (or `field` of it) is written.
    pub at: Vec<Seg>,
    /// The argument at fault, when one is.
    pub field: Option<&'static str>,
    pub problem: Problem,
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.problem, self.field) {
            (p, Some(field)) => write!(f, "{}: {field}: {p}", display(&self.module)),
            (p, None) => write!(f, "{}: {p}", display(&self.module)),
        }
    }
}

impl std::error::Error for ModelError {}

impl ModelError {
    /// Where the error points: the field's value path when a field is at fault.
    pub fn path(&self) -> Vec<Seg> {
        let mut at = self.at.clone();
        at.extend(self.field.map(Seg::Field));
        at
    }
}

/// The heads rules a grouped-query attention obeys (models.md §4).
pub fn heads_rule(heads: u64, kv_heads: u64) -> Result<(), (&'static str, Problem)> {
    if kv_heads > heads {
        return Err(("kv_heads", Problem::KvHeadsOverHeads { heads, kv_heads }));
    }
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(("kv_heads", Problem::KvHeadsDivide { heads, kv_heads }));
    }
    Ok(())
}

/// `hidden / heads` unless given; never 0 (the projections would have no
/// outputs).
fn nonzero_head_dim(
    hidden: u64,
    heads: u64,
    head_dim: Option<u64>,
) -> Result<u64, (Option<&'static str>, Problem)> {
    match head_dim.unwrap_or(hidden / heads.max(1)) {
        0 => Err((Some("heads"), Problem::ZeroHeadDim { hidden, heads })),
        d => Ok(d),
    }
}

impl LangModel {
    /// The model's output for batch `b` (a token input's length `seq` when
    /// given), or the first thing the build would refuse.
    pub fn check(&self, b: u64, seq: Option<u64>) -> Result<Sig, ModelError> {
        if self.lora.as_ref().is_some_and(|l| l.r == 0) {
            return Err(ModelError {
                // Not a module: the model's `lora` option.
                module: "lora".to_string(),
                at: vec![Seg::Field("lora")],
                field: Some("r"),
                problem: Problem::LoraRank,
            });
        }
        let mut walk = Walk::default();
        let mut at = vec![Seg::Field("net")];
        let out = walk.node("", &mut at, &self.net, self.input.sig(b, seq))?;
        if let (Some((module, at)), false) = (walk.rotary_user.take(), walk.rotary_embedding) {
            return Err(ModelError {
                module,
                at,
                field: None,
                problem: Problem::NoRotaryEmbedding,
            });
        }
        Ok(out)
    }

    /// The walk from an input of any shape (what a run feeds the model).
    pub fn check_input(&self, x: Sig) -> Result<Sig, ModelError> {
        let mut walk = Walk::default();
        walk.node("", &mut vec![Seg::Field("net")], &self.net, x)
    }

    /// [`LangModel::check`]'s output shape (what the sweep and the build ask).
    pub fn output(&self, b: u64, seq: Option<u64>) -> Result<Sig, ModelError> {
        self.check(b, seq)
    }
}

/// What the walk has seen so far, in build order.
#[derive(Debug, Default, Clone, PartialEq)]
struct Walk {
    in_region: bool,
    embedding_seen: bool,
    rotary_embedding: bool,
    /// The first module that uses rotary positions, and where it is written.
    rotary_user: Option<(String, Vec<Seg>)>,
}

impl Walk {
    fn node(
        &mut self,
        path: &str,
        at: &mut Vec<Seg>,
        m: &Module,
        x: Sig,
    ) -> Result<Sig, ModelError> {
        let fail = |field: Option<&'static str>, problem: Problem, at: &[Seg]| ModelError {
            module: path.to_string(),
            at: at.to_vec(),
            field,
            problem,
        };
        match m {
            Module::Sequential(children) => {
                let mut h = x;
                for (i, (name, child)) in children.iter().enumerate() {
                    // `Sequential([("name", Module), …])`: the list, the pair, its module.
                    at.extend([Seg::Index(0), Seg::Index(i), Seg::Index(1)]);
                    let r = self.node(&join(path, name), at, child, h);
                    at.truncate(at.len() - 3);
                    h = r?;
                }
                return Ok(h);
            }
            Module::Repeat { n, block } => {
                if *n == 0 {
                    return Err(fail(Some("n"), Problem::RepeatZero, at));
                }
                at.push(Seg::Field("block"));
                let r = self.repeat(path, at, *n, block, x);
                at.pop();
                return r;
            }
            Module::Residual(inner) => {
                at.push(Seg::Index(0));
                let r = self.node(path, at, inner, x.clone());
                at.pop();
                let y = r?;
                if y.dims != x.dims {
                    let shapes = ShapeError::ResidualShapes {
                        inner: y.dims,
                        input: x.dims,
                    };
                    return Err(fail(None, Problem::Shape(shapes), at));
                }
                return Ok(y);
            }
            Module::Checkpoint { module, .. } => {
                if self.in_region {
                    return Err(fail(None, Problem::NestedCheckpoint, at));
                }
                self.in_region = true;
                at.push(Seg::Field("module"));
                let r = self.node(path, at, module, x);
                at.pop();
                self.in_region = false;
                return r;
            }
            _ => {}
        }
        if let Err((field, problem)) = self.rules(path, at, m) {
            return Err(fail(field, problem, at));
        }
        out_shape(m, &x).map_err(|e| fail(None, Problem::Shape(e), at))
    }

    /// `n` copies of `block`, walked until a copy changes nothing.
    fn repeat(
        &mut self,
        path: &str,
        at: &mut Vec<Seg>,
        n: u64,
        block: &Module,
        x: Sig,
    ) -> Result<Sig, ModelError> {
        let mut h = x;
        let mut copy = 0u64;
        while copy < n {
            let before = (self.clone(), h.clone());
            h = self.node(&join(path, &copy.to_string()), at, block, h)?;
            copy += 1;
            if (self.clone(), h.clone()) == before {
                // Every later copy gets what this one got: the same check.
                break;
            }
            if copy >= MAX_CHANGING_COPIES && copy < n {
                return Err(ModelError {
                    module: path.to_string(),
                    at: at[..at.len() - 1].to_vec(),
                    field: Some("n"),
                    problem: Problem::RepeatDrifts,
                });
            }
        }
        Ok(h)
    }

    /// The build's rules for one module's arguments and context.
    fn rules(
        &mut self,
        path: &str,
        at: &[Seg],
        m: &Module,
    ) -> Result<(), (Option<&'static str>, Problem)> {
        let rotary = |walk: &mut Walk| {
            if walk.rotary_user.is_none() {
                walk.rotary_user = Some((path.to_string(), at.to_vec()));
            }
        };
        match m {
            Module::Embedding { .. } => self.embedding_seen = true,
            Module::RotaryEmbedding { head_dim } => {
                self.rotary_embedding = true;
                if !head_dim.is_multiple_of(2) {
                    return Err((Some("head_dim"), Problem::OddHeadDim(*head_dim)));
                }
            }
            Module::Attention {
                hidden,
                heads,
                kv_heads,
                head_dim: d,
                rotary: uses_rotary,
                ..
            } => {
                heads_rule(*heads, kv_heads.unwrap_or(*heads)).map_err(|(f, p)| (Some(f), p))?;
                let d = nonzero_head_dim(*hidden, *heads, *d)?;
                if *uses_rotary {
                    if !d.is_multiple_of(2) {
                        return Err((Some("head_dim"), Problem::OddHeadDim(d)));
                    }
                    rotary(self);
                }
            }
            Module::DecoderLayer {
                hidden,
                heads,
                kv_heads,
                head_dim: d,
                ..
            } => {
                heads_rule(*heads, kv_heads.unwrap_or(*heads)).map_err(|(f, p)| (Some(f), p))?;
                let d = nonzero_head_dim(*hidden, *heads, *d)?;
                if !d.is_multiple_of(2) {
                    return Err((Some("head_dim"), Problem::OddHeadDim(d)));
                }
                rotary(self);
            }
            Module::LmHead { tied: true, .. } if !self.embedding_seen => {
                return Err((Some("tied"), Problem::TiedWithoutEmbedding));
            }
            Module::MaxPool2d {
                kernel, padding, ..
            } if padding.saturating_mul(2) > *kernel => {
                return Err((
                    Some("padding"),
                    Problem::PoolPadding {
                        kernel: *kernel,
                        padding: *padding,
                    },
                ));
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model_lang::ModelInput;

    fn model(input: ModelInput, net: Module) -> LangModel {
        LangModel {
            input,
            net,
            freeze: Vec::new(),
            lora: None,
        }
    }

    fn repeat(n: u64, block: Module) -> Module {
        Module::Repeat {
            n,
            block: Box::new(block),
        }
    }

    #[test]
    fn a_repeat_of_u64_max_shape_preserving_copies_is_one_walk() {
        let m = model(
            ModelInput::Features(64),
            repeat(
                u64::MAX,
                repeat(
                    u64::MAX,
                    Module::LayerNorm {
                        dim: 64,
                        bias: true,
                    },
                ),
            ),
        );
        assert_eq!(m.check(8, None).expect("checks").dims, [8, 64]);
    }

    #[test]
    fn a_repeat_that_shrinks_its_input_fails_where_pytorch_would() {
        // 32 → 16 → 8 → 4 → 2 → 1, then a 2×2 window no longer fits.
        let pool = Module::MaxPool2d {
            kernel: 2,
            stride: 2,
            padding: 0,
        };
        let m = model(
            ModelInput::Images {
                channels: 3,
                height: 32,
                width: 32,
            },
            repeat(u64::MAX, pool),
        );
        let e = m.check(1, None).expect_err("the window stops fitting");
        assert_eq!(e.module, "5", "{e}");
        assert!(matches!(e.problem, Problem::Shape(_)), "{e}");
    }

    #[test]
    fn a_repeat_that_grows_its_input_for_ever_is_refused_at_n() {
        let grow = Module::Conv2d {
            input: 3,
            out: 3,
            kernel: 1,
            stride: 1,
            padding: 1,
            bias: false,
        };
        let m = model(
            ModelInput::Images {
                channels: 3,
                height: 8,
                width: 8,
            },
            Module::Sequential(vec![("body".into(), repeat(u64::MAX, grow))]),
        );
        let e = m.check(1, None).expect_err("grows at every copy");
        assert_eq!(e.problem, Problem::RepeatDrifts);
        assert_eq!(e.field, Some("n"));
        assert_eq!(
            e.path(),
            [
                Seg::Field("net"),
                Seg::Index(0),
                Seg::Index(0),
                Seg::Index(1),
                Seg::Field("n")
            ]
        );
    }

    fn attention(hidden: u64, heads: u64) -> Module {
        Module::Sequential(vec![
            (
                "emb".into(),
                Module::Embedding {
                    num: 10,
                    dim: hidden,
                },
            ),
            (
                "attn".into(),
                Module::Attention {
                    hidden,
                    heads,
                    kv_heads: None,
                    head_dim: None,
                    causal: true,
                    rotary: false,
                    bias: false,
                    dropout: 0.0,
                    sdpa: None,
                },
            ),
        ])
    }

    #[test]
    fn attention_without_rotary_positions_takes_an_odd_head_dim_in_check_and_build() {
        use crate::engine::{Engine, EngineConfig, ModelConfig, OptimizerConfig};
        // hidden 6 over 2 heads: head_dim 3, which only rotate_half minds.
        let m = model(ModelInput::Tokens { seq: 4 }, attention(6, 2));
        assert_eq!(m.check(2, None).expect("checks").dims, [2, 4, 6]);
        let cfg = ModelConfig::modules(m, 2);
        let built = Engine::new(EngineConfig::default(), &cfg, &OptimizerConfig::default());
        assert!(built.is_ok(), "{:?}", built.err());
    }

    #[test]
    fn a_head_dim_that_rounds_to_zero_is_refused_at_heads() {
        let m = model(ModelInput::Tokens { seq: 4 }, attention(2, 4));
        let e = m.check(2, None).expect_err("2 / 4 heads");
        assert_eq!(
            e.problem,
            Problem::ZeroHeadDim {
                hidden: 2,
                heads: 4
            }
        );
        assert_eq!(e.field, Some("heads"));
    }

    #[test]
    fn heads_rules() {
        assert!(heads_rule(4, 2).is_ok());
        assert!(heads_rule(4, 4).is_ok());
        assert_eq!(
            heads_rule(3, 2).map_err(|e| e.1),
            Err(Problem::KvHeadsDivide {
                heads: 3,
                kv_heads: 2
            })
        );
        assert_eq!(
            heads_rule(4, 8).map_err(|e| e.1),
            Err(Problem::KvHeadsOverHeads {
                heads: 4,
                kv_heads: 8
            })
        );
    }

    #[test]
    fn the_build_refuses_what_the_check_refuses_with_the_same_error() {
        use crate::engine::{Engine, EngineConfig, EngineError, ModelConfig, OptimizerConfig};
        let m = model(
            ModelInput::Features(64),
            Module::Checkpoint {
                module: Box::new(Module::Checkpoint {
                    module: Box::new(Module::ReLU),
                    reentrant: false,
                }),
                reentrant: false,
            },
        );
        let checked = m.check(2, None).expect_err("nested");
        assert_eq!(checked.problem, Problem::NestedCheckpoint);
        assert_eq!(checked.path(), [Seg::Field("net"), Seg::Field("module")]);
        let mut cfg = ModelConfig::modules(m, 2);
        cfg.batch = 2;
        let built = Engine::new(EngineConfig::default(), &cfg, &OptimizerConfig::default());
        assert_eq!(built.err(), Some(EngineError::Model(checked)));
    }
}
