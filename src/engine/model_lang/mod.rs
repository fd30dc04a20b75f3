//! The model language (issue 28): any model described as a tree of
//! `nn.Module`s in RON ([`spec`]), built on the engine with its parameters
//! in PyTorch's order and module paths ([`build`]), run by the same ops as
//! the hand-written presets ([`forward`]), counted ([`count`]), and checked
//! ([`check`]: every shape and every rule the build enforces, symbolically)
//! before it is built. [`presets`] holds the models
//! written in it.

pub mod build;
pub mod check;
pub mod count;
pub mod forward;
pub mod presets;
pub mod shape;
pub mod spec;
pub mod xfmr;
pub mod xfmr_check;

pub use check::{ModelError, Problem, Seg};
pub use count::{count, Counts};
pub use shape::{ShapeError, Sig};
pub use spec::{LangModel, ModelInput, Module};

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
