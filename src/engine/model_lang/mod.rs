//! The model language (issue 28): any model described as a tree of
//! `nn.Module`s in RON ([`spec`]), built on the engine with its parameters
//! in PyTorch's order and module paths ([`build`]), run by the same ops as
//! the hand-written presets ([`forward`]), counted ([`count`]) and
//! shape-checked ([`shape`]) before it runs. [`presets`] holds the models
//! written in it.

pub mod build;
pub mod count;
pub mod forward;
pub mod presets;
pub mod shape;
pub mod spec;

pub use count::{count, Counts};
pub use shape::{out_shape, Sig};
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

impl LangModel {
    /// The model's output for batch `b`, or the first module that cannot
    /// take what it is given.
    pub fn output(&self, b: u64, seq: Option<u64>) -> Result<Sig, String> {
        out_shape("", &self.net, &self.input.sig(b, seq))
    }
}
