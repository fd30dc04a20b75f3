//! What shape each module returns for a given input, or the error PyTorch
//! raises for it, checked before anything runs (naming the module path).

use super::build::display;
use super::spec::{Module, BOTTLENECK_EXPANSION};

/// A tensor's shape and whether it holds token ids (integers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sig {
    pub dims: Vec<u64>,
    pub ids: bool,
}

impl Sig {
    fn floats(dims: Vec<u64>) -> Sig {
        Sig { dims, ids: false }
    }
}

type R = std::result::Result<Sig, String>;

fn fmt(dims: &[u64]) -> String {
    let d: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("[{}]", d.join(", "))
}

fn floats_in(path: &str, what: &str, x: &Sig) -> std::result::Result<(), String> {
    if x.ids {
        return Err(format!(
            "{}: {what} takes floats, but gets token ids {} (an Embedding first?)",
            display(path),
            fmt(&x.dims)
        ));
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
fn conv_like(path: &str, what: &str, x: &Sig, cin: Option<u64>, geo: [u64; 4]) -> R {
    let [cout, k, stride, pad] = geo;
    floats_in(path, what, x)?;
    let d = &x.dims;
    if d.len() != 4 {
        return Err(format!(
            "{}: {what} takes [N, C, H, W], got {}",
            display(path),
            fmt(d)
        ));
    }
    if let Some(c) = cin {
        if d[1] != c {
            return Err(format!(
                "{}: {what} expects {c} input channels, got {} (input {})",
                display(path),
                d[1],
                fmt(d)
            ));
        }
    }
    match (pooled(d[2], k, stride, pad), pooled(d[3], k, stride, pad)) {
        (Some(h), Some(w)) => Ok(Sig::floats(vec![d[0], cout, h, w])),
        _ => Err(format!(
            "{}: {what} kernel {k} does not fit input {}",
            display(path),
            fmt(d)
        )),
    }
}

/// The shape one module returns for `x`. Containers (`Sequential`,
/// `Repeat`, `Residual`, `Checkpoint`) are walked by `check.rs`, which
/// calls this for every other module; here they pass `x` through.
pub(super) fn out_shape(path: &str, m: &Module, x: &Sig) -> R {
    match m {
        Module::Sequential(_)
        | Module::Repeat { .. }
        | Module::Residual(_)
        | Module::Checkpoint { .. } => Ok(x.clone()),
        Module::Linear { input, out, .. } => {
            floats_in(path, "Linear", x)?;
            match x.dims.split_last() {
                Some((&k, lead)) if k == *input => {
                    let mut d = lead.to_vec();
                    d.push(*out);
                    Ok(Sig::floats(d))
                }
                _ => Err(format!(
                    "{}: Linear(in: {input}) gets input {} (last dimension must be {input})",
                    display(path),
                    fmt(&x.dims)
                )),
            }
        }
        Module::ReLU
        | Module::InplaceReLU
        | Module::GELU
        | Module::GELUTanh
        | Module::SiLU
        | Module::Dropout(_) => {
            floats_in(path, "an activation", x)?;
            Ok(x.clone())
        }
        Module::Embedding { dim, .. } => {
            if !x.ids {
                return Err(format!(
                    "{}: Embedding takes token ids (Long or Int), got floats {}",
                    display(path),
                    fmt(&x.dims)
                ));
            }
            let mut d = x.dims.clone();
            d.push(*dim);
            Ok(Sig::floats(d))
        }
        Module::LayerNorm { dim, .. } => {
            floats_in(path, "LayerNorm", x)?;
            if x.dims.last() != Some(dim) {
                return Err(format!(
                    "{}: LayerNorm({dim}) gets input {} (last dimension must be {dim})",
                    display(path),
                    fmt(&x.dims)
                ));
            }
            Ok(x.clone())
        }
        Module::RMSNorm { .. }
        | Module::RotaryEmbedding { .. }
        | Module::Attention { .. }
        | Module::Mlp { .. }
        | Module::DecoderLayer { .. }
        | Module::LmHead { .. }
        | Module::BertEmbeddings { .. }
        | Module::BertLayer { .. }
        | Module::BertPooler { .. } => super::xfmr_check::out_shape(path, m, x),
        Module::Conv2d {
            input,
            out,
            kernel,
            stride,
            padding,
            ..
        } => conv_like(
            path,
            "Conv2d",
            x,
            Some(*input),
            [*out, *kernel, *stride, *padding],
        ),
        Module::BatchNorm2d(c) => {
            floats_in(path, "BatchNorm2d", x)?;
            if x.dims.len() != 4 || x.dims[1] != *c {
                return Err(format!(
                    "{}: BatchNorm2d({c}) takes [N, {c}, H, W], got {}",
                    display(path),
                    fmt(&x.dims)
                ));
            }
            Ok(x.clone())
        }
        Module::MaxPool2d {
            kernel,
            stride,
            padding,
        } => {
            let c = x.dims.get(1).copied().unwrap_or(0);
            conv_like(path, "MaxPool2d", x, None, [c, *kernel, *stride, *padding])
        }
        Module::AdaptiveAvgPool2d => {
            let c = x.dims.get(1).copied().unwrap_or(0);
            conv_like(path, "AdaptiveAvgPool2d", x, None, [c, 1, 1, 0])
                .map(|s| Sig::floats(vec![s.dims[0], s.dims[1], 1, 1]))
        }
        Module::Flatten => {
            if x.dims.len() < 2 {
                return Err(format!(
                    "{}: flatten(x, 1) needs at least 2 dimensions, got {}",
                    display(path),
                    fmt(&x.dims)
                ));
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
        } => conv_like(
            path,
            "BasicBlock",
            x,
            Some(*inplanes),
            [*planes, 3, *stride, 1],
        ),
        Module::Bottleneck {
            inplanes,
            planes,
            stride,
        } => conv_like(
            path,
            "Bottleneck",
            x,
            Some(*inplanes),
            [planes * BOTTLENECK_EXPANSION, 3, *stride, 1],
        ),
    }
}
