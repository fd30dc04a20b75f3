//! Parameter and buffer counts of a [`Module`] tree, from its constructor
//! arguments alone (what `sum(p.numel() for p in model.parameters())` gives).

use super::spec::{Module, BOTTLENECK_EXPANSION};

/// Elements of parameters and of buffers, and the number of buffer tensors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub parameters: u64,
    /// Floating buffer elements (BatchNorm running mean and variance).
    pub buffer_elements: u64,
    /// Buffer tensors, `num_batches_tracked` (int64, 0-dim) included.
    pub buffers: u64,
}

impl std::ops::Add for Counts {
    type Output = Counts;
    fn add(self, o: Counts) -> Counts {
        Counts {
            parameters: self.parameters + o.parameters,
            buffer_elements: self.buffer_elements + o.buffer_elements,
            buffers: self.buffers + o.buffers,
        }
    }
}

fn params(n: u64) -> Counts {
    Counts {
        parameters: n,
        ..Counts::default()
    }
}

/// BatchNorm2d(c): weight and bias; running_mean, running_var, num_batches_tracked.
fn batch_norm(c: u64) -> Counts {
    Counts {
        parameters: 2 * c,
        buffer_elements: 2 * c,
        buffers: 3,
    }
}

fn conv(cin: u64, cout: u64, k: u64, bias: bool) -> Counts {
    params(cout * cin * k * k + if bias { cout } else { 0 })
}

pub fn count(m: &Module) -> Counts {
    match m {
        Module::Sequential(children) => children
            .iter()
            .fold(Counts::default(), |a, (_, c)| a + count(c)),
        Module::Repeat { n, block } => {
            let c = count(block);
            Counts {
                parameters: n * c.parameters,
                buffer_elements: n * c.buffer_elements,
                buffers: n * c.buffers,
            }
        }
        Module::Linear { input, out, bias } => params(input * out + if *bias { *out } else { 0 }),
        Module::ReLU
        | Module::InplaceReLU
        | Module::GELU
        | Module::GELUTanh
        | Module::SiLU
        | Module::Dropout(_)
        | Module::MaxPool2d { .. }
        | Module::AdaptiveAvgPool2d
        | Module::Flatten => Counts::default(),
        Module::Embedding { num, dim } => params(num * dim),
        Module::LayerNorm { dim, bias } => params(if *bias { 2 * dim } else { *dim }),
        Module::Residual(inner) | Module::Checkpoint { module: inner, .. } => count(inner),
        Module::Conv2d {
            input,
            out,
            kernel,
            bias,
            ..
        } => conv(*input, *out, *kernel, *bias),
        Module::BatchNorm2d(c) => batch_norm(*c),
        Module::BasicBlock {
            inplanes,
            planes,
            stride,
        } => {
            let (i, p) = (*inplanes, *planes);
            let body = conv(i, p, 3, false) + batch_norm(p) + conv(p, p, 3, false) + batch_norm(p);
            if *stride != 1 || i != p {
                body + conv(i, p, 1, false) + batch_norm(p)
            } else {
                body
            }
        }
        Module::Bottleneck {
            inplanes,
            planes,
            stride,
        } => {
            let (i, w, o) = (*inplanes, *planes, planes * BOTTLENECK_EXPANSION);
            let body = conv(i, w, 1, false)
                + batch_norm(w)
                + conv(w, w, 3, false)
                + batch_norm(w)
                + conv(w, o, 1, false)
                + batch_norm(o);
            if *stride != 1 || i != o {
                body + conv(i, o, 1, false) + batch_norm(o)
            } else {
                body
            }
        }
    }
}
