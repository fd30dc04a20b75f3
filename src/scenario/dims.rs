//! Model and data dimensions a scenario may ask for: positive, consistent
//! (heads divide the width, as nanoGPT asserts), and small enough that the
//! engine's shape arithmetic (products of up to three dimensions) fits in u64.

use super::format::{DataSpec, LayerSpec, ModelSpec};
use crate::engine::model_lang::{ModelInput, Module};

/// 2^21: three such factors multiply to at most 2^63.
pub const MAX_DIM: u64 = 1 << 21;
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

/// Modules in one model, every `Repeat` unrolled.
pub const MAX_MODULES: u64 = 1 << 16;

/// Problems with a language module's arguments; returns how many modules
/// it unrolls to (saturating).
fn modules(out: &mut Problems, at: &str, m: &Module) -> u64 {
    let field = |f: &str| format!("{at}: {f}");
    match m {
        Module::Sequential(children) => children.iter().fold(1, |n, (name, c)| {
            n.saturating_add(modules(out, &format!("{at}.{name}"), c))
        }),
        Module::Repeat { n, block } => {
            if *n == 0 {
                out.push(format!("{at}: Repeat needs n of at least 1"));
            }
            n.saturating_mul(modules(out, &format!("{at}.0"), block))
                .saturating_add(1)
        }
        Module::Residual(inner) | Module::Checkpoint { module: inner, .. } => {
            modules(out, at, inner).saturating_add(1)
        }
        Module::Linear { input, out: o, .. } => {
            out.dim(&field("Linear in"), *input, 1);
            out.dim(&field("Linear out"), *o, 1);
            1
        }
        Module::Embedding { num, dim } => {
            out.dim(&field("Embedding num"), *num, 1);
            out.dim(&field("Embedding dim"), *dim, 1);
            1
        }
        Module::LayerNorm { dim, .. } => {
            out.dim(&field("LayerNorm dim"), *dim, 1);
            1
        }
        Module::Dropout(p) => {
            if !(0.0..=1.0).contains(p) {
                out.push(format!(
                    "{at}: Dropout({p}) is not a probability between 0 and 1"
                ));
            }
            1
        }
        Module::Conv2d {
            input,
            out: o,
            kernel,
            stride,
            padding,
            ..
        } => {
            out.dim(&field("Conv2d in"), *input, 1);
            out.dim(&field("Conv2d out"), *o, 1);
            out.dim(&field("Conv2d kernel"), *kernel, 1);
            out.dim(&field("Conv2d stride"), *stride, 1);
            out.dim(&field("Conv2d padding"), *padding, 0);
            1
        }
        Module::BatchNorm2d(c) => {
            out.dim(&field("BatchNorm2d features"), *c, 1);
            1
        }
        Module::MaxPool2d {
            kernel,
            stride,
            padding,
        } => {
            out.dim(&field("MaxPool2d kernel"), *kernel, 1);
            out.dim(&field("MaxPool2d stride"), *stride, 1);
            out.dim(&field("MaxPool2d padding"), *padding, 0);
            1
        }
        Module::BasicBlock {
            inplanes,
            planes,
            stride,
        }
        | Module::Bottleneck {
            inplanes,
            planes,
            stride,
        } => {
            out.dim(&field("inplanes"), *inplanes, 1);
            out.dim(&field("planes"), *planes, 1);
            out.dim(&field("stride"), *stride, 1);
            8
        }
        Module::ReLU
        | Module::InplaceReLU
        | Module::GELU
        | Module::GELUTanh
        | Module::SiLU
        | Module::AdaptiveAvgPool2d
        | Module::Flatten => 1,
    }
}

/// Problems with the model's and the data's dimensions, one message each.
pub(crate) fn problems(model: &ModelSpec, data: &DataSpec) -> Vec<String> {
    let mut out = Problems::default();
    match model {
        ModelSpec::Preset(_) => {}
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
        ModelSpec::Modules { input, net, .. } => {
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
            let modules = modules(&mut out, "model.net", net);
            if modules > MAX_MODULES {
                out.push(format!(
                    "model.net: {modules} modules once every Repeat is unrolled, more than {MAX_MODULES}, the most modelled"
                ));
            }
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
