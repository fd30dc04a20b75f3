//! Model and data dimensions a scenario may ask for: positive, consistent
//! (heads divide the width, as nanoGPT asserts), and small enough that the
//! engine's shape arithmetic (products of up to three dimensions) fits in u64.

use super::format::{DataSpec, LayerSpec, ModelSpec};
use crate::engine::model_lang::ModelInput;

/// The largest dimension modelled: the model's analysis holds the
/// language's modules to it too.
pub use crate::engine::model_lang::MAX_DIM;
/// Layer counts: each layer is engine bookkeeping for every op it runs, and
/// 2^21 layers took minutes and tens of GB of host memory.
pub const MAX_LAYERS: u64 = 1024;
/// An unfused LSTM runs one cell per step: past this, a single iteration
/// takes minutes.
pub const MAX_UNFUSED_BPTT: u64 = 1 << 16;

/// Messages about a scenario's dimensions, in the order they are found.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn push(&mut self, message: impl Into<String>) {
        self.0.push(message.into());
    }

    /// A dimension: at least `min`, at most [`MAX_DIM`].
    fn dim(&mut self, field: &str, v: u64, min: u64) {
        if v < min {
            self.push(format!("{field} must be at least {min}"));
        } else if v > MAX_DIM {
            self.push(format!(
                "{field} of {v} is larger than {MAX_DIM}, the largest dimension modelled"
            ));
        }
    }

    fn layers(&mut self, layers: u64) {
        if layers > MAX_LAYERS {
            self.push(format!(
                "model.layers: {layers} is more than {MAX_LAYERS}, the most modelled"
            ));
        }
    }

    fn dropout(&mut self, p: f64) {
        if !(0.0..=1.0).contains(&p) {
            self.push(format!(
                "model.dropout: {p} is not a probability between 0 and 1"
            ));
        }
    }
}

/// Problems with the model's and the data's dimensions, one message each.
pub(crate) fn problems(model: &ModelSpec, data: &DataSpec) -> Vec<String> {
    let mut out = Problems::default();
    match model {
        ModelSpec::Preset(_) | ModelSpec::HfConfig(_) => {}
        ModelSpec::Mlp { dims, .. } => {
            dims.iter()
                .for_each(|&d| out.dim("model.dims: a width", d, 1));
            if dims.len() < 2 {
                out.push("model.dims needs at least two widths (input and output)");
            }
        }
        ModelSpec::Layers(layers) => {
            for l in layers {
                if let LayerSpec::Linear(a, b) = l {
                    out.dim("model: a Linear in_features", *a, 1);
                    out.dim("model: a Linear out_features", *b, 1);
                }
            }
        }
        ModelSpec::Gpt {
            layers,
            heads,
            width,
            vocab,
            block_size,
            dropout,
            checkpoint,
            checkpoint_segments,
            checkpoint_reentrant,
        } => {
            out.dim("model.layers", *layers, 0);
            out.dim("model.heads", *heads, 1);
            out.dim("model.width", *width, 1);
            out.dim("model.vocab", *vocab, 1);
            out.dim("model.block_size", *block_size, 1);
            out.dropout(*dropout);
            if *heads > 0 && width % heads != 0 {
                out.push(format!(
                    "model: width {width} is not a multiple of heads {heads} (each head gets width / heads)"
                ));
            }
            match checkpoint_segments {
                Some(_) if *checkpoint => out.push(
                    "model: `checkpoint: true` (every block) and `checkpoint_segments` (checkpoint_sequential) checkpoint the same blocks two ways: give one",
                ),
                Some(n) if *n == 0 || n > layers => out.push(format!(
                    "model.checkpoint_segments: checkpoint_sequential splits the {layers} blocks into 1 to {layers} segments, not {n}"
                )),
                None if *checkpoint_reentrant && !*checkpoint => out.push(
                    "model: `checkpoint_reentrant` chooses how blocks are checkpointed; say which with `checkpoint: true` or `checkpoint_segments`",
                ),
                _ => {}
            }
            out.layers(*layers);
        }
        ModelSpec::LstmLm {
            vocab,
            emb,
            hidden,
            layers,
            bptt,
            dropout,
            cudnn,
        } => {
            out.dim("model.vocab", *vocab, 1);
            out.dim("model.emb", *emb, 1);
            out.dim("model.hidden", *hidden, 1);
            out.dim("model.layers", *layers, 1);
            out.dim("model.bptt", *bptt, 1);
            out.dropout(*dropout);
            out.layers(*layers);
            let longest = data
                .seq
                .iter()
                .chain(&data.seq_schedule)
                .chain([bptt])
                .max();
            if let (false, Some(&t)) = (*cudnn, longest.filter(|&&t| t > MAX_UNFUSED_BPTT)) {
                out.push(format!(
                    "model: an unfused LSTM (cudnn: false) steps one cell per token; a sequence of {t} is more than {MAX_UNFUSED_BPTT}, the most modelled"
                ));
            }
        }
        ModelSpec::ResNet18 { classes, image } => {
            out.dim("model.classes", *classes, 1);
            out.dim("model.image", *image, 32);
        }
        ModelSpec::Modules { input, .. } => {
            match input {
                ModelInput::Features(f) => out.dim("model.input: features", *f, 1),
                ModelInput::Images {
                    channels,
                    height,
                    width,
                } => {
                    out.dim("model.input: channels", *channels, 1);
                    out.dim("model.input: height", *height, 1);
                    out.dim("model.input: width", *width, 1);
                }
                ModelInput::Tokens { seq } => out.dim("model.input: seq", *seq, 1),
            }
            // The modules' own arguments (their bounds, Repeat's n, the
            // number of modules) are the model's analysis: the build runs
            // it and says where each problem is written.
        }
    }
    for &b in data.batch.iter().chain(&data.batch_schedule) {
        out.dim("data: a batch size", b, 1);
    }
    for &t in data.seq.iter().chain(&data.seq_schedule) {
        out.dim("data: a sequence length", t, 1);
    }
    out.0
}
