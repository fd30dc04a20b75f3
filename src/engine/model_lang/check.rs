//! The one analysis of a model written in the language, run by `vramscope
//! check` (through the scenario's loader), by `vramscope model`, and by the
//! build before it allocates anything. One walk of the tree yields the
//! output shape, the parameter and buffer counts and the number of modules,
//! and refuses, at the first module that breaks one, every rule the build
//! obeys: each dimension's bounds and each probability (from the module's
//! arguments), heads and key/value heads, rotary positions, checkpoint
//! regions, a tied head, LoRA's rank, pooling padding, and the shape each
//! module takes. What each module kind says is in `kinds.rs`; this walks
//! the containers. A `Repeat` is walked once per copy only until its
//! block's output and what the walk has seen stop changing (then every
//! further copy is the same check, and its counts are the first copy's
//! times `n`), so `Repeat(n: 18446744073709551615, …)` is answered at once.
//!
//! Each error names PyTorch's module path, the field at fault, and where
//! the module sits in the description ([`Seg`]s from the model's value), so
//! the loader can point at the file's line and column.

use super::build::display;
use super::count::Counts;
use super::kinds::Here;
use super::shape::{ShapeError, Sig};
use super::spec::{join, LangModel, Module};
use crate::engine::config::KvPath;

/// 2^21: three such factors multiply to at most 2^63, so the engine's shape
/// arithmetic (products of up to three dimensions) fits in u64.
pub const MAX_DIM: u64 = 1 << 21;

/// Modules in one model, every `Repeat` unrolled (the build makes each).
pub const MAX_MODULES: u64 = 1 << 16;

/// One step into a RON value: a named field, or an item of a list or tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Field(&'static str),
    Index(usize),
}

/// A probability as written (compared by its bits, so a problem is `Eq`).
#[derive(Debug, Clone, Copy)]
pub struct Probability(pub f64);

impl PartialEq for Probability {
    fn eq(&self, o: &Probability) -> bool {
        self.0.to_bits() == o.0.to_bits()
    }
}

impl Eq for Probability {}

impl std::fmt::Display for Probability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What is wrong with one module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("must be at least {min}")]
    TooSmall { min: u64 },
    #[error("{0} is larger than {MAX_DIM}, the largest dimension modelled")]
    TooLarge(u64),
    #[error("{0} is not a probability between 0 and 1")]
    NotProbability(Probability),
    #[error(
        "{0} modules once every Repeat is unrolled, more than {MAX_MODULES}, the most modelled"
    )]
    TooManyModules(u64),
    #[error("heads ({heads}) must be a multiple of kv_heads ({kv_heads}): each key/value head serves an equal group of query heads")]
    KvHeadsDivide { heads: u64, kv_heads: u64 },
    #[error("kv_heads ({kv_heads}) is more than heads ({heads}): each key/value head serves a group of query heads")]
    KvHeadsOverHeads { heads: u64, kv_heads: u64 },
    #[error("head_dim ({0}) must be even for rotary embeddings (rotate_half splits it in two)")]
    OddHeadDim(u64),
    #[error("head_dim is 0: hidden ({hidden}) / heads ({heads}) rounds down to nothing; give head_dim or fewer heads")]
    ZeroHeadDim { hidden: u64, heads: u64 },
    #[error(
        "the hidden size ({hidden}) is not a multiple of the number of attention heads ({heads})"
    )]
    HiddenNotMultipleOfHeads { hidden: u64, heads: u64 },
    #[error("rotary positions need a RotaryEmbedding module in the model")]
    NoRotaryEmbedding,
    #[error("a MaskedAttention needs a CausalMask before it (the `mask` its masked_fill uses)")]
    NoCausalMask,
    #[error("a MaskedAttention inside a Checkpoint is not modelled (its recomputation would need the forward's mask)")]
    MaskInRegion,
    #[error("a Checkpoint inside another Checkpoint (regions do not nest here)")]
    NestedCheckpoint,
    #[error("a tied LmHead needs an Embedding before it (its weight is the Embedding's)")]
    TiedWithoutEmbedding,
    #[error("LoRA r must be at least 1 (the adapters' rank)")]
    LoraRank,
    #[error("no projection is named {0} (target_modules match the last part of a module path, e.g. q_proj)")]
    LoraNoTarget(String),
    #[error("padding {padding} is more than half the kernel {kernel}: PyTorch refuses it (\"pad should be at most half of effective kernel size\")")]
    PoolPadding { kernel: u64, padding: u64 },
    #[error("Efficient cannot run grouped-query attention (kv_heads {kv_heads} < heads {heads}): PyTorch 2.11's memory-efficient kernel takes no enable_gqa (models.md §4.4), so SDPA raises \"No available kernel. Aborting execution.\"; leave sdpa unset, force Flash, Cudnn or Math, or name the releases that repeat k and v to every head first (transformers before 4.54, or torch before 2.5)")]
    EfficientGqa { heads: u64, kv_heads: u64 },
    #[error("blocksize {0} is not one bitsandbytes quantises with (32, 64, 128, 256, 512, 1024, 2048 or 4096)")]
    Blocksize(u64),
    #[error("Repeat needs n of at least 1")]
    RepeatZero,
    #[error("Repeat's block changes the shape at every copy; past {MAX_CHANGING_COPIES} such copies the model is not modelled")]
    RepeatDrifts,
    /// A shape the module cannot take.
    #[error("{0}")]
    Shape(#[from] ShapeError),
    #[error(
        "top_k ({top_k}) is more than experts ({experts}): each row goes to top_k distinct experts"
    )]
    MoeTopK { top_k: u64, experts: u64 },
    #[error("{0}")]
    MoeRouting(String),
    #[error("dispatch GroupedMm needs a gated expert (Mixtral or Qwen): transformers 5.x keeps a layer's experts as gate_up_proj [E, 2·I, H] and down_proj [E, H, I]")]
    MoeGroupedGelu,
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
    /// The argument at fault, when one is (a tuple variant's one value,
    /// `BatchNorm2d(0)`, is named as PyTorch names it: `features`).
    pub field: Option<&'static str>,
    pub problem: Problem,
}

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.field {
            Some(field) => write!(f, "{}: {field}: {}", display(&self.module), self.problem),
            None => write!(f, "{}: {}", display(&self.module), self.problem),
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

/// What the analysis of a model at one input yields.
#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    /// The model's output.
    pub output: Sig,
    /// Its parameters and buffers (`sum(p.numel() for p in model.parameters())`).
    pub counts: Counts,
    /// Modules once every `Repeat` is unrolled.
    pub modules: u64,
}

impl LangModel {
    /// The model at batch `b` (a token input's length `seq` when given):
    /// its output, counts and size, or the first thing the build would
    /// refuse.
    pub fn analyse(&self, b: u64, seq: Option<u64>) -> Result<Analysis, ModelError> {
        self.analyse_under(b, seq, KvPath::EnableGqa)
    }

    /// [`LangModel::analyse`] under the releases whose attention hands
    /// grouped k and v to SDPA as `kv` says (what a forced backend accepts
    /// depends on it: models.md §4.1–4.4).
    pub fn analyse_under(
        &self,
        b: u64,
        seq: Option<u64>,
        kv: KvPath,
    ) -> Result<Analysis, ModelError> {
        if self.lora.as_ref().is_some_and(|l| l.r == 0) {
            return Err(ModelError {
                // Not a module: the model's `lora` option.
                module: "lora".to_string(),
                at: vec![Seg::Field("lora")],
                field: Some("r"),
                problem: Problem::LoraRank,
            });
        }
        let mut walk = Walk::checking();
        walk.seen.grouped_kv_repeated = kv != KvPath::EnableGqa;
        let mut at = vec![Seg::Field("net")];
        let (out, tally) = walk.node("", &mut at, &self.net, Some(self.input.sig(b, seq)))?;
        if let (Some((module, at)), false) =
            (walk.seen.rotary_user.take(), walk.seen.rotary_embedding)
        {
            return Err(ModelError {
                module,
                at,
                field: None,
                problem: Problem::NoRotaryEmbedding,
            });
        }
        if let Some(lora) = &self.lora {
            if !lora
                .target_modules
                .iter()
                .any(|t| walk.seen.projections.contains(t))
            {
                return Err(ModelError {
                    module: "lora".to_string(),
                    at: vec![Seg::Field("lora")],
                    field: Some("target_modules"),
                    problem: Problem::LoraNoTarget(lora.target_modules.join(", ")),
                });
            }
        }
        if tally.modules > MAX_MODULES {
            return Err(ModelError {
                module: String::new(),
                at: vec![Seg::Field("net")],
                field: None,
                problem: Problem::TooManyModules(tally.modules),
            });
        }
        Ok(Analysis {
            output: out.unwrap_or_else(|| self.input.sig(b, seq)),
            counts: tally.counts,
            modules: tally.modules,
        })
    }

    /// [`LangModel::analyse`]'s output: the model's output for batch `b`,
    /// or the first thing the build would refuse.
    pub fn check(&self, b: u64, seq: Option<u64>) -> Result<Sig, ModelError> {
        self.analyse(b, seq).map(|a| a.output)
    }

    /// [`LangModel::check`] under the releases [`LangModel::analyse_under`] names.
    pub fn check_under(&self, b: u64, seq: Option<u64>, kv: KvPath) -> Result<Sig, ModelError> {
        self.analyse_under(b, seq, kv).map(|a| a.output)
    }

    /// The walk from an input of any shape (what a run feeds the model),
    /// under the releases [`LangModel::analyse_under`] names.
    pub fn check_input(&self, x: Sig, kv: KvPath) -> Result<Sig, ModelError> {
        let mut walk = Walk::checking();
        walk.seen.grouped_kv_repeated = kv != KvPath::EnableGqa;
        let (out, _) = walk.node("", &mut vec![Seg::Field("net")], &self.net, Some(x.clone()))?;
        Ok(out.unwrap_or(x))
    }

    /// The module that gets the model's input first (through containers).
    pub(crate) fn first_module(&self) -> &Module {
        let mut m = &self.net;
        loop {
            m = match m {
                Module::Sequential(children) => match children.first() {
                    Some((_, c)) => c,
                    None => return m,
                },
                Module::Repeat { block, .. } => block,
                Module::Residual(inner)
                | Module::Frame(inner)
                | Module::Registered { module: inner, .. }
                | Module::HfModel(inner)
                | Module::Checkpoint { module: inner, .. } => inner,
                leaf => return leaf,
            };
        }
    }

    /// [`LangModel::check_under`]'s output shape (what the sweep and the build ask).
    pub fn output(&self, b: u64, seq: Option<u64>, kv: KvPath) -> Result<Sig, ModelError> {
        self.check_under(b, seq, kv)
    }
}

/// The parameters and buffers of a module tree from its arguments alone
/// (the same walk, with no input and nothing refused).
pub fn count(m: &Module) -> Counts {
    let mut walk = Walk {
        seen: Seen::default(),
        checking: false,
    };
    walk.node("", &mut Vec::new(), m, None)
        .map(|(_, t)| t.counts)
        .unwrap_or_default()
}

/// What the walk has seen so far, in build order (the rules that depend on
/// what came before: `kinds.rs` reads and sets it).
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Seen {
    pub in_region: bool,
    pub embedding: bool,
    pub rotary_embedding: bool,
    /// A `CausalMask` came before (what a `MaskedAttention` needs).
    pub causal_mask: bool,
    /// The first module that uses rotary positions, and where it is written.
    pub rotary_user: Option<(String, Vec<Seg>)>,
    /// The names LoRA's `target_modules` may match.
    pub projections: std::collections::BTreeSet<String>,
    /// The releases' attention repeats grouped k and v to every head before
    /// SDPA (`repeat_kv`), so a forced backend sees no grouped heads.
    pub grouped_kv_repeated: bool,
}

/// A subtree's counts and size.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    counts: Counts,
    modules: u64,
}

impl std::ops::Add for Tally {
    type Output = Tally;
    fn add(self, o: Tally) -> Tally {
        Tally {
            counts: self.counts + o.counts,
            modules: self.modules.saturating_add(o.modules),
        }
    }
}

struct Walk {
    seen: Seen,
    /// Refuse what the build refuses (off: counting only).
    checking: bool,
}

type Out = Result<(Option<Sig>, Tally), ModelError>;

impl Walk {
    fn checking() -> Walk {
        Walk {
            seen: Seen::default(),
            checking: true,
        }
    }

    /// `m` at module path `path`, written at `at`, on input `x` (`None`:
    /// counting only).
    fn node(&mut self, path: &str, at: &mut Vec<Seg>, m: &Module, x: Option<Sig>) -> Out {
        let fail = |field: Option<&'static str>, problem: Problem, at: &[Seg]| ModelError {
            module: path.to_string(),
            at: at.to_vec(),
            field,
            problem,
        };
        match m {
            Module::Sequential(children) => {
                let (mut h, mut tally) = (x, Tally::default());
                for (i, (name, child)) in children.iter().enumerate() {
                    // `Sequential([("name", Module), …])`: the list, the pair, its module.
                    at.extend([Seg::Index(0), Seg::Index(i), Seg::Index(1)]);
                    let r = self.node(&join(path, name), at, child, h);
                    at.truncate(at.len() - 3);
                    let (y, t) = r?;
                    h = y;
                    tally = tally + t;
                }
                Ok((h, tally + one_module()))
            }
            Module::Repeat { n, block } => {
                if *n == 0 && self.checking {
                    return Err(fail(Some("n"), Problem::RepeatZero, at));
                }
                at.push(Seg::Field("block"));
                let r = self.repeat(path, at, *n, block, x);
                at.pop();
                let (y, one) = r?;
                let tally = Tally {
                    counts: Counts {
                        parameters: n.saturating_mul(one.counts.parameters),
                        buffer_elements: n.saturating_mul(one.counts.buffer_elements),
                        buffers: n.saturating_mul(one.counts.buffers),
                    },
                    modules: n.saturating_mul(one.modules).saturating_add(1),
                };
                Ok((y, tally))
            }
            Module::Residual(inner) => {
                at.push(Seg::Index(0));
                let r = self.node(path, at, inner, x.clone());
                at.pop();
                let (y, t) = r?;
                if let (Some(y), Some(x)) = (&y, &x) {
                    if y.dims != x.dims && self.checking {
                        let shapes = ShapeError::ResidualShapes {
                            inner: y.dims.clone(),
                            input: x.dims.clone(),
                        };
                        return Err(fail(None, Problem::Shape(shapes), at));
                    }
                }
                Ok((y, t + one_module()))
            }
            Module::Frame(inner) => {
                at.push(Seg::Index(0));
                let r = self.node(path, at, inner, x);
                at.pop();
                r
            }
            Module::HfModel(module) => {
                at.push(Seg::Index(0));
                let r = self.node(path, at, module, x);
                at.pop();
                r
            }
            Module::Registered { module, .. } => {
                at.push(Seg::Field("module"));
                let r = self.node(path, at, module, x);
                at.pop();
                r
            }
            Module::Checkpoint { module, .. } => {
                if self.seen.in_region && self.checking {
                    return Err(fail(None, Problem::NestedCheckpoint, at));
                }
                self.seen.in_region = true;
                at.push(Seg::Field("module"));
                let r = self.node(path, at, module, x);
                at.pop();
                self.seen.in_region = false;
                let (y, t) = r?;
                Ok((y, t + one_module()))
            }
            leaf => {
                let args = leaf.args();
                let tally = Tally {
                    counts: args.counts,
                    modules: args.modules,
                };
                let Some(x) = x.filter(|_| self.checking) else {
                    return Ok((None, tally));
                };
                for &(field, value, min) in &args.dims {
                    let problem = if value < min {
                        Problem::TooSmall { min }
                    } else if value > MAX_DIM {
                        Problem::TooLarge(value)
                    } else {
                        continue;
                    };
                    return Err(fail(Some(field), problem, at));
                }
                for &(field, p) in &args.probabilities {
                    if !(0.0..=1.0).contains(&p) {
                        let problem = Problem::NotProbability(Probability(p));
                        return Err(fail(Some(field), problem, at));
                    }
                }
                self.seen.projections.extend(leaf.projection_names(path));
                let here = Here { path, at };
                let y = leaf
                    .out_shape(&x, &mut self.seen, here)
                    .map_err(|(field, problem)| fail(field, problem, at))?;
                Ok((Some(y), tally))
            }
        }
    }

    /// `n` copies of `block`, walked until a copy changes nothing; the
    /// counts are one copy's.
    fn repeat(
        &mut self,
        path: &str,
        at: &mut Vec<Seg>,
        n: u64,
        block: &Module,
        x: Option<Sig>,
    ) -> Out {
        let mut h = x;
        let mut first: Option<Tally> = None;
        let mut copy = 0u64;
        while copy < n {
            let before = (self.seen.clone(), h.clone());
            let (y, t) = self.node(&join(path, &copy.to_string()), at, block, h)?;
            h = y;
            first.get_or_insert(t);
            copy += 1;
            if (self.seen.clone(), h.clone()) == before {
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
        Ok((h, first.unwrap_or_default()))
    }
}

/// A wrapper's own weight toward `MAX_MODULES`.
fn one_module() -> Tally {
    Tally {
        counts: Counts::default(),
        modules: 1,
    }
}

#[cfg(test)]
mod tests;
