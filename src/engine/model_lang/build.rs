//! A [`Module`] tree built on the engine: parameters and buffers allocated in
//! the order `.to("cuda")`'s `_apply` visits them (children in registration
//! order, each leaf module's parameters then its buffers; the model's own
//! parameters, `Positions`, after every child), each tagged with its module
//! path, in the dtype `LangModel::dtypes` gives its path. The optimizer's
//! list is `parameters()` order: the model's own first.

use super::kinds::Leaf;
use super::spec::{join, Module};
use crate::engine::error::{EngineError, Result};
use crate::engine::modules::resnet::Bufs;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

/// A built module: what its forward needs (tensor ids, module scopes).
#[derive(Debug)]
pub(crate) enum Node {
    /// Children (arena indices) in order.
    Seq(Vec<usize>),
    Residual(usize),
    /// A Python function's frame around `inner` (`Module::Frame`).
    Frame(usize),
    /// `Module::HfModel` around `inner`.
    HfModel(usize),
    /// A checkpoint region around `inner`; `site` numbers the region for
    /// recomputation (`LangNet::sites`).
    Checkpoint {
        site: usize,
        inner: usize,
        reentrant: bool,
    },
    /// Any other module (`kinds.rs`).
    Leaf(Box<Leaf>),
}

/// The built model: an arena of nodes, the root, and every checkpoint
/// region's inner node by site number.
#[derive(Debug)]
pub(crate) struct LangNet {
    pub nodes: Vec<Node>,
    pub root: usize,
    pub sites: Vec<usize>,
    /// The RotaryEmbedding's buffer, when the model has one.
    pub inv_freq: Option<TensorId>,
    /// Its sliding layers' own (Gemma 3).
    pub local_inv_freq: Option<TensorId>,
    /// The window of the sliding-window mask the model's forward builds
    /// and no layer takes (`RotaryEmbedding`'s `unused_sliding_mask`).
    pub unused_sliding_mask: Option<u64>,
    pub run_state: super::xfmr::XRun,
    /// The model's own parameters (`Module::Positions`), by slot.
    pub own_params: Vec<TensorId>,
    pub hand: super::handwritten::HandRun,
    pub moe: super::moe::MoeRun,
    /// The first Embedding's weight (the model's input embeddings).
    pub embedding: Option<TensorId>,
    /// `enable_input_require_grads()`: the output of the embedding with
    /// this weight is made to require grad (`kbit.rs`).
    pub input_grads: Option<TensorId>,
    /// The criterion is transformers' own loss (`criterion: CausalLm`),
    /// which `*ForCausalLM.forward` computes before it returns: the
    /// `LmHead`'s input (`hidden_states`, a local of that forward) lives
    /// until the loss is made (`Engine::hold_to_loss`).
    pub loss_in_forward: bool,
}

pub(crate) struct Builder<'a> {
    pub params: &'a mut Vec<TensorId>,
    pub bufs: &'a mut Bufs,
    nodes: Vec<Node>,
    sites: Vec<usize>,
    /// Inside a checkpoint region (regions do not nest).
    in_region: bool,
    pub(super) x: super::xfmr::XState,
    /// The model's own parameters, built after every submodule's: (module,
    /// dims, dtype).
    pub(super) own: Vec<(u32, Vec<u64>, crate::engine::dtype::DType)>,
    /// `LangModel::dtypes`, and whether each has named a parameter yet.
    dtypes: Vec<(String, crate::engine::dtype::DType, bool)>,
    /// Inside a `Registered`: the leaves met, built when the outermost one
    /// ends, in registration order.
    deferred: Option<Vec<Deferred>>,
}

/// A leaf whose parameters wait for its `Registered` (its node a
/// placeholder until then).
struct Deferred {
    slot: usize,
    path: String,
    module: Module,
}

/// Where `path` falls in a `Registered`'s `order` (relative to `at`): the
/// first entry it is under, or after all of them.
fn rank(order: &[String], at: &str, path: &str) -> usize {
    let rel = if at.is_empty() {
        path
    } else {
        path.strip_prefix(at)
            .and_then(|r| r.strip_prefix('.'))
            .unwrap_or(path)
    };
    order
        .iter()
        .position(|o| crate::engine::modules::under_path(o, rel))
        .unwrap_or(order.len())
}

impl LangNet {
    pub(crate) fn build(
        e: &mut Engine,
        net: &Module,
        dtypes: &[(String, crate::engine::dtype::DType)],
        params: &mut Vec<TensorId>,
        bufs: &mut Bufs,
    ) -> Result<LangNet> {
        let mut b = Builder {
            params,
            bufs,
            nodes: Vec::new(),
            sites: Vec::new(),
            in_region: false,
            x: super::xfmr::XState::default(),
            own: Vec::new(),
            dtypes: dtypes.iter().map(|(p, d)| (p.clone(), *d, false)).collect(),
            deferred: None,
        };
        let root = b.node(e, "", net)?;
        if let Some((path, _, _)) = b.dtypes.iter().find(|(_, _, named)| !named) {
            return Err(EngineError::Program(format!(
                "no parameter under module `{path}`"
            )));
        }
        // `.cuda()`'s `_apply` moves the children first, then the module's
        // own parameters; `parameters()` lists the own ones first.
        let mut own_params = Vec::with_capacity(b.own.len());
        let model_dtype = e.param_dtype;
        for (module, dims, dtype) in &b.own {
            e.param_dtype = *dtype;
            let p = e.new_param(dims, *module, &mut Vec::new());
            e.param_dtype = model_dtype;
            own_params.push(p?);
        }
        b.params.splice(0..0, own_params.iter().copied());
        Ok(LangNet {
            nodes: b.nodes,
            root,
            sites: b.sites,
            inv_freq: b.x.inv_freq,
            local_inv_freq: b.x.local_inv_freq,
            unused_sliding_mask: b.x.unused_sliding_mask,
            run_state: super::xfmr::XRun::default(),
            own_params,
            hand: super::handwritten::HandRun::default(),
            moe: super::moe::MoeRun::default(),
            embedding: b.x.tie,
            input_grads: None,
            loss_in_forward: false,
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
            Module::Residual(inner) => Node::Residual(self.node(e, path, inner)?),
            Module::Frame(inner) => Node::Frame(self.node(e, path, inner)?),
            Module::HfModel(inner) => Node::HfModel(self.node(e, path, inner)?),
            Module::Registered { order, module } => {
                // No node of its own: the forward is `module`'s.
                return self.registered(e, path, order, module);
            }
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
            leaf => {
                if let Some(waiting) = &mut self.deferred {
                    let slot = self.nodes.len();
                    waiting.push(Deferred {
                        slot,
                        path: path.to_string(),
                        module: leaf.clone(),
                    });
                    return Ok(self.push(Node::Seq(Vec::new())));
                }
                self.built_leaf(e, path, leaf)?
            }
        };
        Ok(self.push(n))
    }

    /// A leaf's parameters, in the dtype its path is given.
    fn built_leaf(&mut self, e: &mut Engine, path: &str, leaf: &Module) -> Result<Node> {
        let model_dtype = e.param_dtype;
        e.param_dtype = self.dtype_at(path, leaf).unwrap_or(model_dtype);
        let built = self.leaf(e, path, leaf);
        e.param_dtype = model_dtype;
        Ok(Node::Leaf(Box::new(built?)))
    }

    /// `Module::Registered`: walk `module` (its forward), holding its
    /// leaves back; put them in `order` (a stable sort, so an inner
    /// `Registered`'s order stands within each entry); build them now when
    /// this is the outermost one, else hand them to the enclosing one.
    fn registered(
        &mut self,
        e: &mut Engine,
        path: &str,
        order: &[String],
        module: &Module,
    ) -> Result<usize> {
        let outer = self.deferred.replace(Vec::new());
        let walked = self.node(e, path, module);
        let mut mine = self.deferred.take().unwrap_or_default();
        self.deferred = outer;
        let root = walked?;
        mine.sort_by_key(|d| rank(order, path, &d.path));
        match &mut self.deferred {
            Some(waiting) => waiting.extend(mine),
            None => {
                for d in mine {
                    let node = self.built_leaf(e, &d.path, &d.module)?;
                    self.nodes[d.slot] = node;
                }
            }
        }
        Ok(root)
    }
}

impl Builder<'_> {
    /// The dtype `LangModel::dtypes` gives the parameters at `path` (the
    /// last entry naming it), marking the entries that name a parameter.
    pub(super) fn dtype_at(
        &mut self,
        path: &str,
        m: &Module,
    ) -> Option<crate::engine::dtype::DType> {
        let has_params = m.args().counts.parameters > 0;
        let mut found = None;
        for (p, d, named) in &mut self.dtypes {
            if crate::engine::modules::under_path(p, path) && has_params {
                *named = true;
                found = Some(*d);
            }
        }
        found
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
