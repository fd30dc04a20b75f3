//! A [`Module`] tree built on the engine: parameters and buffers allocated in
//! `named_parameters()` order (children in registration order, each module's
//! parameters then its buffers, as `.to("cuda")`'s `_apply` visits them),
//! each tagged with its module path.

use super::spec::{join, Module};
use crate::engine::error::{EngineError, Result};
use crate::engine::modules::bottleneck::Bottleneck;
use crate::engine::modules::resnet::{BasicBlock, BatchNorm, Bufs, Conv};
use crate::engine::modules::{Embedding, LayerNorm, Linear};
use crate::engine::ops::elementwise::Unary;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

/// A built module: what its forward needs (tensor ids, module scopes).
#[derive(Debug)]
pub(crate) enum Node {
    /// Children (arena indices) in order.
    Seq(Vec<usize>),
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
    LayerNorm(LayerNorm),
    Residual(usize),
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
    /// A checkpoint region around `inner`; `site` numbers the region for
    /// recomputation (`LangNet::sites`).
    Checkpoint {
        site: usize,
        inner: usize,
        reentrant: bool,
    },
}

/// The built model: an arena of nodes, the root, and every checkpoint
/// region's inner node by site number.
#[derive(Debug)]
pub(crate) struct LangNet {
    pub nodes: Vec<Node>,
    pub root: usize,
    pub sites: Vec<usize>,
}

pub(crate) struct Builder<'a> {
    pub params: &'a mut Vec<TensorId>,
    pub bufs: &'a mut Bufs,
    nodes: Vec<Node>,
    sites: Vec<usize>,
    /// Inside a checkpoint region (regions do not nest).
    in_region: bool,
}

impl LangNet {
    pub(crate) fn build(
        e: &mut Engine,
        net: &Module,
        params: &mut Vec<TensorId>,
        bufs: &mut Bufs,
    ) -> Result<LangNet> {
        let mut b = Builder {
            params,
            bufs,
            nodes: Vec::new(),
            sites: Vec::new(),
            in_region: false,
        };
        let root = b.node(e, "", net)?;
        Ok(LangNet {
            nodes: b.nodes,
            root,
            sites: b.sites,
        })
    }
}

impl Builder<'_> {
    fn push(&mut self, n: Node) -> usize {
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    /// Build `m` at module path `path`; returns its arena index.
    fn node(&mut self, e: &mut Engine, path: &str, m: &Module) -> Result<usize> {
        let n = match m {
            Module::Sequential(children) => {
                let mut ids = Vec::with_capacity(children.len());
                for (name, child) in children {
                    ids.push(self.node(e, &join(path, name), child)?);
                }
                Node::Seq(ids)
            }
            Module::Repeat { n, block } => {
                let mut ids = Vec::new();
                for i in 0..*n {
                    ids.push(self.node(e, &join(path, &i.to_string()), block)?);
                }
                Node::Seq(ids)
            }
            Module::Linear { input, out, bias } => {
                Node::Linear(e.new_linear(path, *input, *out, *bias, self.params)?)
            }
            Module::ReLU => unary(e, path, Unary::Relu),
            Module::GELU | Module::GELUTanh => unary(e, path, Unary::Gelu),
            Module::SiLU => unary(e, path, Unary::Silu),
            Module::InplaceReLU => Node::InplaceRelu {
                module: e.tags.module(path),
            },
            Module::Dropout(p) => Node::Dropout {
                p: *p,
                module: e.tags.module(path),
            },
            Module::Embedding { num, dim } => {
                Node::Embedding(e.new_embedding(path, *num, *dim, self.params)?)
            }
            Module::LayerNorm { dim, bias } => {
                Node::LayerNorm(e.new_layer_norm(path, *dim, *bias, self.params)?)
            }
            Module::Residual(inner) => Node::Residual(self.node(e, path, inner)?),
            Module::Conv2d {
                input,
                out,
                kernel,
                stride,
                padding,
                bias,
            } => Node::Conv(e.new_conv2d(
                path,
                [*input, *out, *kernel, *stride, *padding],
                *bias,
                self.params,
            )?),
            Module::BatchNorm2d(c) => {
                Node::BatchNorm(e.new_bn(path, *c, self.params, self.bufs)?)
            }
            Module::MaxPool2d {
                kernel,
                stride,
                padding,
            } => Node::MaxPool {
                k: *kernel,
                stride: *stride,
                pad: *padding,
                module: e.tags.module(path),
            },
            Module::AdaptiveAvgPool2d => Node::AvgPool {
                module: e.tags.module(path),
            },
            Module::Flatten => Node::Flatten {
                module: e.tags.module(path),
            },
            Module::BasicBlock {
                inplanes,
                planes,
                stride,
            } => Node::BasicBlock(BasicBlock::build(
                e,
                path,
                [*inplanes, *planes, *stride],
                self.params,
                self.bufs,
            )?),
            Module::Bottleneck {
                inplanes,
                planes,
                stride,
            } => Node::Bottleneck(Bottleneck::build(
                e,
                path,
                [*inplanes, *planes, *stride],
                self.params,
                self.bufs,
            )?),
            Module::Checkpoint { module, reentrant } => {
                if self.in_region {
                    return Err(EngineError::Program(format!(
                        "{}: a Checkpoint inside another Checkpoint (regions do not nest here)",
                        display(path)
                    )));
                }
                self.in_region = true;
                let inner = self.node(e, path, module);
                self.in_region = false;
                let inner = inner?;
                let site = self.sites.len();
                self.sites.push(inner);
                Node::Checkpoint {
                    site,
                    inner,
                    reentrant: *reentrant,
                }
            }
        };
        Ok(self.push(n))
    }
}

fn unary(e: &mut Engine, path: &str, op: Unary) -> Node {
    Node::Unary {
        op,
        module: e.tags.module(path),
    }
}

/// A module path for messages (`(model)` for the root).
pub(crate) fn display(path: &str) -> &str {
    if path.is_empty() {
        "(model)"
    } else {
        path
    }
}
