//! The embedded training engine: tensors, autograd, ops, modules, optimizers,
//! AMP, checkpointing and RNNs, modelled for *memory* only (engine.md). No
//! math happens: shapes, dtypes, bytes, lifetimes and graphs do.
//!
//! An [`Engine`] owns a [`crate::alloc::CachingAllocator`] on a simulated
//! device, a model built from a [`ModelConfig`] preset, and runs a [`Program`]
//! (a list of [`Step`]s repeated for N iterations). Everything it does is an
//! [`EngineEvent`]; [`Engine::held_state`] exposes the graph for the leak detector.
//! On a real GPU an engine may own a [`crate::device::KernelLauncher`]: each
//! op then launches `kernels/` on its tensors' device addresses (`launch/`),
//! which changes no allocator decision.
//!
//! By concern: `ops/` (each op's saved tensors, outputs and temporaries),
//! `modules/` (the presets' layers), `autograd/` (the graph, backward,
//! checkpointing), `optim.rs` and `amp.rs`, `scratch/` (what ATen's kernels
//! take for themselves), `launch/` (real kernels); tensors, storages and
//! bindings at the top.

pub mod amp;
pub mod autograd;
pub mod bindings;
pub mod bnb;
pub mod config;
pub mod conv_workspace;
pub mod dtype;
mod ema;
pub mod error;
pub mod estimate;
pub mod events;
pub mod held;
mod held_walk;
pub mod hf_config;
mod hf_load;
mod hf_quant;
pub mod hf_switches;
mod hvp;
mod input_grad;
mod keep;
pub mod launch;
mod loop_steps;
pub mod measured;
pub mod model_lang;
pub mod modules;
mod named_optim;
pub mod ops;
pub mod optim;
pub mod presets;
pub mod presets_hf;
pub mod program;
mod recreate;
pub mod rnn;
pub(crate) mod scratch;
pub mod shape;
mod slab;
pub mod storage;
pub mod summary;
pub mod tag;
pub mod tensor;
pub mod torch_rules;
pub mod transformers_release;
pub mod work;

#[cfg(test)]
pub(crate) mod tests;

use crate::alloc::{AllocConfig, CachingAllocator, Tag, TorchVersion};
use crate::device::{AnyDevice, AnyLauncher, SimDevice};
use crate::trace::Phase;

pub use amp::GradScalerState;
pub use autograd::NodeId;
pub use bindings::Value;
pub use config::{
    CublasLtWorkspace, CublasWorkspaceMode, EngineConfig, GpuArch, OptimImpl, SdpaBackend,
};
pub use dtype::DType;
pub use error::{EngineError, ErrorKind, Result, BACKWARD_TWICE};
pub use events::EngineEvent;
pub use held::{HeldState, NodeInfo, RootInfo, RootKind, SavedInfo, StorageInfo};
pub use launch::LaunchStats;
pub use loop_steps::{DictKey, EveryUnit, HiddenPart};
pub use optim::{OptimizerConfig, OptimizerKind};
pub use presets::{Evidence, LossKind, ModelConfig, ModelKind, PresetInfo, PRESET_CATALOGUE};
pub use program::{
    numbered, preorder_len, BatchAssign, Fill, GradContext, KeepWhat, Program, SecondModel, Step,
    MAX_RUN_EVENTS,
};
pub use scratch::reduce::ReduceDevice;
pub use shape::Shape;
pub use storage::{DeviceKind, StorageId};
pub use tag::{AllocTag, Category, TagTable, NO_STEP};
pub use tensor::TensorId;

use amp::AmpState;
use autograd::checkpoint::CheckpointState;
use bindings::Bindings;
use modules::Model;
use optim::Optimizer;
use slab::Slab;

/// Ambient state PyTorch keeps in thread-locals and module flags.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    pub iteration: u32,
    pub phase: Phase,
    pub module: u32,
    pub step: u32,
    pub op: &'static str,
    /// Grad mode (`no_grad` turns it off, engine.md §4).
    pub grad_enabled: bool,
    pub inference: bool,
    /// `model.train()` / `model.eval()` (engine.md §4: flags only).
    pub training: bool,
}

pub struct Engine {
    pub(crate) alloc: CachingAllocator<AnyDevice>,
    pub(crate) cfg: EngineConfig,
    pub(crate) storages: Slab<storage::Storage>,
    pub(crate) tensors: Slab<tensor::Tensor>,
    /// Version counters of tensors that share a storage without being views
    /// of one another (`Tensor::version_cell`).
    pub(crate) version_cells: Vec<u32>,
    pub(crate) nodes: Slab<autograd::Node>,
    pub(crate) tags: TagTable,
    pub(crate) ctx: Ctx,
    pub(crate) events: Vec<EngineEvent>,
    pub(crate) next_seq: u64,
    /// Events handed out (or dropped) so far, for [`MAX_RUN_EVENTS`].
    pub(crate) events_out: u64,
    /// cuBLAS workspaces per (handle, stream): [main thread, autograd thread] (§1.6).
    pub(crate) workspaces: [Option<StorageId>; 2],
    /// Cached cuBLASLt workspaces, per thread like `workspaces`.
    pub(crate) lt_workspaces: [Option<StorageId>; 2],
    pub(crate) cudnn_dropout_state: Option<StorageId>,
    pub(crate) locals: Vec<TensorId>,
    pub(crate) amp: AmpState,
    pub(crate) ckpt: CheckpointState,
    pub(crate) model: Option<Box<Model>>,
    /// Second models under their names (`BuildModel`: a teacher).
    pub(crate) named_models: Vec<(String, Box<Model>)>,
    /// The model's parameter dtype (F32 unless `model.half()` and the like).
    pub(crate) param_dtype: DType,
    pub(crate) optimizer: Option<Optimizer>,
    /// Second optimizers under their names (`BuildOptimizer`: a GAN's
    /// `optimizerG`), each over a second model's parameters.
    pub(crate) named_optimizers: Vec<(String, Optimizer)>,
    pub(crate) scaler: Option<GradScalerState>,
    pub(crate) bindings: Bindings,
    /// An error an op's bookkeeping found mid-way (a save that PyTorch
    /// refuses); the op returns it when it ends.
    pub(crate) op_error: Option<EngineError>,
    /// Live non-leaf tensors `retain_grad()` was called on.
    pub(crate) retaining: Vec<TensorId>,
    /// Tensors a Python object holds beside a tensor it returns (a model
    /// output's `DynamicCache`): each list goes when its tensor does.
    pub(crate) held_by: rustc_hash::FxHashMap<TensorId, Vec<TensorId>>,
    /// Of `held_by`, the one a loss made from its tensor lets go
    /// (`Engine::hold_to_loss`).
    pub(crate) held_to_loss: rustc_hash::FxHashMap<TensorId, TensorId>,
    /// The Node a backward reached after an earlier backward had already
    /// run it and freed its saved tensors (the backward-twice error's
    /// cause, which the leak detector traces back to a root).
    pub(crate) spent_reached: Option<autograd::NodeId>,
    /// While `torch.autograd.grad` runs: the nodes it executes and the
    /// input whose gradient it captures.
    pub(crate) grad_only: Option<autograd::GradOnly>,
    /// While a `create_graph=True` backward runs: the gradients it
    /// computes are recorded (`autograd/second_order.rs`).
    pub(crate) create_graph: bool,
    /// Forward hooks registered on Linear modules: (module id, list, what).
    pub(crate) forward_hooks: Vec<(u32, String, KeepWhat)>,
    /// Full backward hooks registered on Linear modules: (module id, list, what).
    pub(crate) backward_hooks: Vec<(u32, String, KeepWhat)>,
    /// The `BackwardHookFunctionBackward` nodes that run backward hooks.
    pub(crate) grad_hooks: Vec<modules::GradHook>,
    /// Warnings already shown this run.
    pub(crate) warned: Vec<&'static str>,
    /// Runs real kernels on the tensors (a CUDA run); None: nothing is launched.
    pub(crate) launcher: Option<AnyLauncher>,
    pub(crate) launch_stats: LaunchStats,
    /// The kernels' arithmetic and traffic so far, for time estimates.
    pub(crate) work: work::WorkTally,
    /// bitsandbytes' quantised weights (`bnb.rs`).
    pub(crate) bnb: bnb::BnbState,
    /// A transformers 5.x `from_pretrained` model built on meta, until its
    /// checkpoint loads (`hf_load.rs`).
    pub(crate) hf_meta: Option<hf_load::MetaModel>,
    /// Tests: every launch checked against the allocator's blocks first.
    #[cfg(test)]
    pub(crate) launch_violations: Option<Vec<String>>,
}

impl Engine {
    /// An engine with an empty model (ops can be driven directly).
    pub fn bare(cfg: EngineConfig) -> Result<Engine> {
        let dev = Box::new(
            SimDevice::new("sim", cfg.device_bytes, cfg.device_overhead).placed(cfg.placement),
        );
        Engine::bare_on(cfg, dev)
    }

    /// An engine with an empty model whose memory comes from `dev` (a real GPU
    /// through `crate::device::cuda`, or a simulated one): the allocator's
    /// decisions are the same either way.
    pub fn bare_on(cfg: EngineConfig, dev: AnyDevice) -> Result<Engine> {
        let version = cfg.torch_minor.map_or(TorchVersion::DEFAULT, TorchVersion);
        let conf = AllocConfig::parse_for(&cfg.alloc_conf, version)
            .map_err(|e| EngineError::Program(e.to_string()))?;
        Ok(Engine {
            alloc: CachingAllocator::new(dev, conf),
            cfg,
            storages: Slab::default(),
            tensors: Slab::default(),
            version_cells: Vec::new(),
            nodes: Slab::default(),
            tags: TagTable::new(),
            ctx: Ctx {
                iteration: 0,
                phase: Phase::Setup,
                module: 0,
                step: tag::NO_STEP,
                op: "",
                grad_enabled: true,
                inference: false,
                training: true,
            },
            events: Vec::new(),
            next_seq: 0,
            events_out: 0,
            workspaces: [None, None],
            lt_workspaces: [None, None],
            cudnn_dropout_state: None,
            locals: Vec::new(),
            amp: AmpState::default(),
            ckpt: CheckpointState::default(),
            model: None,
            named_models: Vec::new(),
            named_optimizers: Vec::new(),
            param_dtype: DType::F32,
            optimizer: None,
            scaler: None,
            bindings: Bindings::default(),
            op_error: None,
            retaining: Vec::new(),
            held_by: rustc_hash::FxHashMap::default(),
            held_to_loss: rustc_hash::FxHashMap::default(),
            spent_reached: None,
            grad_only: None,
            create_graph: false,
            forward_hooks: Vec::new(),
            backward_hooks: Vec::new(),
            grad_hooks: Vec::new(),
            warned: Vec::new(),
            launcher: None,
            launch_stats: LaunchStats::default(),
            work: work::WorkTally::default(),
            bnb: bnb::BnbState::default(),
            hf_meta: None,
            #[cfg(test)]
            launch_violations: None,
        })
    }

    /// Build the model (parameters are allocated in PyTorch's `.to("cuda")`
    /// order) and the optimizer (its state is lazy, engine.md §5.1).
    pub fn new(cfg: EngineConfig, model: &ModelConfig, optim: &OptimizerConfig) -> Result<Engine> {
        let dev = Box::new(
            SimDevice::new("sim", cfg.device_bytes, cfg.device_overhead).placed(cfg.placement),
        );
        Engine::new_on(cfg, model, optim, dev)
    }

    /// [`Engine::new`] on the given device.
    pub fn new_on(
        cfg: EngineConfig,
        model: &ModelConfig,
        optim: &OptimizerConfig,
        dev: AnyDevice,
    ) -> Result<Engine> {
        Engine::new_launching(cfg, model, optim, dev, None)
    }

    /// [`Engine::new_on`] that runs kernels on its tensors through `launcher`
    /// from the first parameter on (`launch.rs`).
    pub fn new_launching(
        cfg: EngineConfig,
        model: &ModelConfig,
        optim: &OptimizerConfig,
        dev: AnyDevice,
        launcher: Option<AnyLauncher>,
    ) -> Result<Engine> {
        let mut e = Engine::bare_on(cfg, dev)?;
        e.launcher = launcher;
        e.ctx.phase = Phase::Setup;
        let m = Model::build(&mut e, model)?;
        e.model = Some(Box::new(m));
        e.optimizer = Some(Optimizer::new(optim.clone()));
        Ok(e)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn allocator(&self) -> &CachingAllocator<AnyDevice> {
        &self.alloc
    }

    pub fn allocator_mut(&mut self) -> &mut CachingAllocator<AnyDevice> {
        &mut self.alloc
    }

    /// Events produced since the last call.
    pub fn take_events(&mut self) -> Vec<EngineEvent> {
        self.events_out += self.events.len() as u64;
        std::mem::take(&mut self.events)
    }

    /// Events this engine has made so far.
    pub fn events_made(&self) -> u64 {
        self.events_out + self.events.len() as u64
    }

    /// Drop buffered events without handing them out, or counting them
    /// against [`MAX_RUN_EVENTS`] (benchmarks: nothing keeps them).
    pub fn clear_events(&mut self) {
        self.events.clear();
    }

    pub fn iteration(&self) -> u32 {
        self.ctx.iteration
    }

    pub fn allocated_bytes(&self) -> u64 {
        self.alloc.stats().allocated_bytes()
    }

    pub fn reserved_bytes(&self) -> u64 {
        self.alloc.stats().reserved_bytes()
    }

    pub fn peak_allocated_bytes(&self) -> u64 {
        self.alloc.stats().peak_allocated_bytes()
    }

    /// What a tag means (the engine's `TagId -> AllocTag` table).
    /// Every site tagged so far: decodes any tag this engine has produced.
    pub fn tag_table(&self) -> &TagTable {
        &self.tags
    }

    pub fn tag_info(&self, tag: Tag) -> Option<AllocTag> {
        self.tags.info(tag)
    }

    pub(crate) fn current_tag(&mut self, category: Category) -> Tag {
        let c = &self.ctx;
        let (op, module, step, phase, it) = (c.op, c.module, c.step, c.phase, c.iteration);
        self.tags.tag(op, module, step, category, phase, it)
    }

    /// Enter an op: set the tag's op name and emit a marker. Returns the outer op.
    pub(crate) fn op_begin(&mut self, name: &'static str) -> &'static str {
        let prev = std::mem::replace(&mut self.ctx.op, name);
        let module = self.tags.module_path(self.ctx.module);
        self.events.push(EngineEvent::OpBegin { name, module });
        prev
    }

    pub(crate) fn op_end(&mut self, prev: &'static str) -> Result<()> {
        self.ctx.op = prev;
        self.events.push(EngineEvent::OpEnd);
        match self.op_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Enter a module scope; returns the outer module id.
    pub(crate) fn enter_module(&mut self, id: u32) -> u32 {
        std::mem::replace(&mut self.ctx.module, id)
    }

    pub(crate) fn exit_module(&mut self, prev: u32) {
        self.ctx.module = prev;
    }

    pub(crate) fn phase_begin(&mut self, p: Phase) -> Phase {
        if p != Phase::Setup {
            // Past the model's `.to()`: the program's kernels run from here.
            self.alloc.device_mut().kernels_started();
        }
        let prev = std::mem::replace(&mut self.ctx.phase, p);
        self.events.push(EngineEvent::PhaseBegin(p));
        prev
    }

    pub(crate) fn phase_end(&mut self, p: Phase, prev: Phase) {
        self.events.push(EngineEvent::PhaseEnd(p));
        self.ctx.phase = prev;
    }

    /// The cuBLAS workspace rule at a GEMM (engine.md §1.6): in cached mode the
    /// first GEMM of each (handle, stream) allocates one that is never freed —
    /// the autograd thread has its own handle; in eager mode a transient one.
    /// Returns a storage to free after the GEMM (eager mode).
    pub(crate) fn cublas_workspace(&mut self) -> Result<Option<StorageId>> {
        let bytes = self.cfg.cublas_workspace_bytes();
        if bytes == 0 {
            return Ok(None);
        }
        match self.cfg.workspace_mode() {
            CublasWorkspaceMode::Cached => {
                let thread = usize::from(self.ctx.phase == Phase::Backward);
                if self.workspaces[thread].is_none() {
                    let s = self.new_storage(bytes, Category::Workspace)?;
                    self.storages[s.0].engine_refs += 1;
                    self.workspaces[thread] = Some(s);
                }
                Ok(None)
            }
            CublasWorkspaceMode::Eager => {
                let s = self.new_storage(bytes, Category::Workspace)?;
                self.storages[s.0].engine_refs += 1;
                Ok(Some(s))
            }
        }
    }

    /// The cached cuBLASLt workspace of this thread's handle: taken at its
    /// first Lt call, after the cuBLAS one (the handle is fetched first).
    pub(crate) fn cublaslt_workspace(&mut self) -> Result<()> {
        let thread = usize::from(self.ctx.phase == Phase::Backward);
        if self.lt_workspaces[thread].is_none() {
            let bytes = self.cfg.cublaslt_workspace_bytes();
            let s = self.new_storage(bytes, Category::Workspace)?;
            self.storages[s.0].engine_refs += 1;
            self.lt_workspaces[thread] = Some(s);
        }
        Ok(())
    }

    /// `torch._C._cuda_clearCublasWorkspaces()`: the cuBLAS and the cuBLASLt maps.
    pub fn clear_cublas_workspaces(&mut self) {
        for i in 0..2 {
            for s in [self.workspaces[i].take(), self.lt_workspaces[i].take()]
                .into_iter()
                .flatten()
            {
                self.release_storage_engine(s);
            }
        }
    }

    /// A transient engine-held storage (workspace, scratch): allocate now, free
    /// with [`Engine::free_transient`].
    pub(crate) fn transient(
        &mut self,
        bytes: u64,
        category: Category,
    ) -> Result<Option<StorageId>> {
        if bytes == 0 {
            return Ok(None);
        }
        let s = self.new_storage(bytes, category)?;
        self.storages[s.0].engine_refs += 1;
        Ok(Some(s))
    }

    pub(crate) fn free_transient(&mut self, s: Option<StorageId>) {
        if let Some(s) = s {
            self.release_storage_engine(s);
        }
    }

    /// A reduction's global-memory scratch (`reduce_plan`), when the engine
    /// knows the GPU's SMs: per launch, the staging buffer, then the
    /// semaphores, both freed as the launch returns (semaphores first); for
    /// a reduction split into 32-bit pieces with a half-precision output,
    /// the fp32 accumulation buffer around all of them.
    pub(crate) fn reduction_scratch(
        &mut self,
        shape: Option<scratch::reduce::ReduceShape>,
    ) -> Result<()> {
        let Some(device) = self.cfg.reduce_device else {
            return Ok(());
        };
        let Some(plan) = shape.map(|s| scratch::reduce_split::reduce_plan(s, device)) else {
            return Ok(());
        };
        let mut taken: Vec<Option<Option<StorageId>>> = Vec::new();
        for step in plan.steps() {
            match step {
                autograd::ScratchStep::Take(bytes) => {
                    match self.transient(bytes, Category::Workspace) {
                        Ok(s) => taken.push(Some(s)),
                        Err(e) => {
                            for s in taken.into_iter().rev().flatten() {
                                self.free_transient(s);
                            }
                            return Err(e);
                        }
                    }
                }
                autograd::ScratchStep::Free(i) => {
                    if let Some(s) = taken.get_mut(i).and_then(Option::take) {
                        self.free_transient(s);
                    }
                }
            }
        }
        Ok(())
    }

    /// [`Self::reduction_scratch`] once the reduction's output `out` exists;
    /// if the scratch does not fit, `out` goes too.
    pub(crate) fn scratch_after(
        &mut self,
        out: TensorId,
        shape: Option<scratch::reduce::ReduceShape>,
    ) -> Result<TensorId> {
        match self.reduction_scratch(shape) {
            Ok(()) => Ok(out),
            Err(e) => {
                self.release(out);
                Err(e)
            }
        }
    }

    /// `t` summed whole: a full reduction over its elements, unless it is a
    /// broadcast view (stride 0), whose reduction is not modelled.
    pub(crate) fn full_reduction(&self, t: TensorId) -> Option<scratch::reduce::ReduceShape> {
        (self.layout(t) != tensor::Layout::Expanded).then(|| scratch::reduce::ReduceShape {
            outputs: 1,
            inputs_per_output: self.shape(t).numel(),
            contiguous_inputs: true,
            element_bytes: self.dtype(t).size(),
        })
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache(&mut self) {
        self.alloc.empty_cache();
        self.pull_alloc_events();
    }
}
