//! The model language (issue 28): any model described as a tree of
//! `nn.Module`s in RON ([`spec`]). One analysis ([`check`]) walks the tree
//! once and yields its output shape, its parameter and buffer counts and
//! its size, refusing every argument and shape the build would refuse
//! (symbolically: a `Repeat` is counted, not unrolled); the build
//! ([`build`]) then allocates it with PyTorch's parameter order and module
//! paths, and [`forward`] runs it on the engine's ops. What each module kind
//! says for each of these is in `kinds.rs`, one arm per concern; [`presets`]
//! holds the models written in it.

pub mod build;
pub mod check;
pub mod count;
pub mod forward;
pub(crate) mod handwritten;
pub mod hf_layers;
mod hf_v5;
pub mod kbit;
pub(crate) mod kinds;
pub mod moe;
pub(crate) mod ops_expr;
pub mod presets;
mod qkv_attention;
pub mod shape;
pub mod spec;
pub mod xfmr;

pub use check::{count, Analysis, ModelError, Probability, Problem, Seg, MAX_DIM, MAX_MODULES};
pub use count::Counts;
pub use hf_layers::GateAct;
pub use moe::{counts_for, Dispatch, ExpertKind, Routing};
pub use shape::{ShapeError, Sig};
pub use spec::{Expr, LangModel, ModelInput, Module, SoftmaxKind};

impl ModelInput {
    /// The input `[B, …]` for batch `b` (a token input's length `seq` when given).
    pub fn sig(&self, b: u64, seq: Option<u64>) -> Sig {
        match self {
            ModelInput::Features(f) => Sig {
                dims: vec![b, *f],
                ids: false,
            },
            ModelInput::Images {
                channels,
                height,
                width,
            } => Sig {
                dims: vec![b, *channels, *height, *width],
                ids: false,
            },
            ModelInput::Tokens { seq: t } => Sig {
                dims: vec![b, seq.unwrap_or(*t)],
                ids: true,
            },
        }
    }
}
