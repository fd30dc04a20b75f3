//! The RON schema of a scenario file. Field names read like the PyTorch they
//! stand for; the loop's steps are the engine's own `Step`s.

use serde::{Deserialize, Serialize};

use super::size::Size;
use crate::engine::model_lang::{ModelInput, Module};
use crate::engine::{DType, EngineConfig, OptimizerConfig, Step};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    /// One line: what the scenario shows.
    pub description: String,
    pub device: DeviceSpec,
    /// `PYTORCH_CUDA_ALLOC_CONF`.
    #[serde(default)]
    pub alloc_conf: String,
    /// PyTorch release whose rules apply (2.0 … 2.15); default 2.11.
    #[serde(default)]
    pub torch: Option<String>,
    /// The transformers release the Hugging Face models follow (`"4.40"`):
    /// how grouped k and v reach SDPA; default the newest, GQA-aware.
    #[serde(default)]
    pub transformers: Option<String>,
    /// Environment variables the run had (`CUBLAS_WORKSPACE_CONFIG`, …).
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// The H100 capture the test suite checks this scenario against, as
    /// shipped (a stem under `tests/fixtures/pytorch/captured/`).
    #[serde(default)]
    pub capture: Option<String>,
    /// The capture program written for this scenario
    /// (`tests/fixtures/pytorch/<stem>.py`) that has not run on a GPU yet:
    /// the report says the figures are the model's, unchecked.
    #[serde(default)]
    pub awaiting_capture: Option<String>,
    /// Engine switches (engine.md §0.4): any subset of the engine's config.
    #[serde(default)]
    pub engine: Option<EngineConfig>,
    pub model: ModelSpec,
    /// The model's parameters and floating inputs in this dtype:
    /// `model.to("cuda", dtype)`, e.g. `model.half()` (F16) or
    /// `model.to(torch.bfloat16)` (BF16); F32 when absent.
    #[serde(default)]
    pub model_dtype: Option<DType>,
    /// The loss a classifier (MLP, ResNet or a `Modules` model) trains
    /// with, instead of its cross-entropy (or a preset's own); targets are
    /// shaped to match, and `Sum` has none.
    #[serde(default)]
    pub criterion: Option<Criterion>,
    #[serde(default)]
    pub optimizer: Option<OptimizerConfig>,
    #[serde(default)]
    pub data: DataSpec,
    /// Steps run once before the loop.
    #[serde(default)]
    pub setup: Vec<Step>,
    /// One iteration of the training loop.
    pub steps: Vec<Step>,
    pub iterations: u32,
    /// The loop runs `iterations` times per epoch.
    #[serde(default)]
    pub epochs: Option<u32>,
    #[serde(default)]
    pub narration: Vec<Narration>,
    #[serde(default)]
    pub expect: Vec<Expectation>,
    /// The points `vramscope sweep` runs when given no `--batch`.
    #[serde(default)]
    pub sweep: Option<SweepSpec>,
}

/// A batch sweep the scenario carries: each point is the whole scenario run
/// with `data.batch` (and `data.seq`) set to the point's values.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    pub batch: Vec<u64>,
    /// Sequence lengths (GPT and LSTM models); every batch runs at each.
    #[serde(default)]
    pub seq: Vec<u64>,
    /// What the sweep shows, said after its fit: a built-in's figures here
    /// are checked against the sweep by the test suite.
    #[serde(default)]
    pub narration: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    /// Shown in reports; default: the GPU's name, or "sim".
    #[serde(default)]
    pub name: Option<String>,
    /// A known GPU (`H100-SXM-80GB`, …): its architecture, SMs and memory.
    #[serde(default)]
    pub gpu: Option<String>,
    /// Memory the run may use, the overhead included: on a larger card, what
    /// `set_per_process_memory_fraction` holds it to. Default: the GPU's memory.
    #[serde(default)]
    pub capacity: Option<Size>,
    /// CUDA context and other processes: never available to the allocator.
    /// Default: the GPU's measured context, else 0.
    #[serde(default)]
    pub overhead: Option<Size>,
}

/// A model preset, a preset with its parameters, or a list of layers.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub enum ModelSpec {
    /// `"mlp-mnist"`, `"gpt2-small"`, `"gpt-tiny"`, `"lstm-lm-ptb"`,
    /// `"lstm-lm-medium"`, `"resnet18"`, `"resnet50"`, `"deep-mlp"`.
    Preset(String),
    Mlp {
        dims: Vec<u64>,
        #[serde(default)]
        inplace_relu: bool,
    },
    Gpt {
        layers: u64,
        heads: u64,
        width: u64,
        #[serde(default = "gpt2_vocab")]
        vocab: u64,
        #[serde(default = "gpt2_block")]
        block_size: u64,
        #[serde(default)]
        dropout: f64,
        /// Activation checkpointing of every block.
        #[serde(default)]
        checkpoint: bool,
        /// `checkpoint_sequential(model.transformer.h, n, x)`: n segments,
        /// all but the last checkpointed (n ≈ √layers is the classic choice).
        #[serde(default)]
        checkpoint_segments: Option<u64>,
        /// `use_reentrant=True` for the checkpoint regions above.
        #[serde(default)]
        checkpoint_reentrant: bool,
    },
    LstmLm {
        vocab: u64,
        emb: u64,
        hidden: u64,
        layers: u64,
        bptt: u64,
        #[serde(default)]
        dropout: f64,
        /// cuDNN's fused kernel (true) or the unfused LSTMCell loop.
        #[serde(default = "yes")]
        cudnn: bool,
    },
    ResNet18 {
        #[serde(default = "imagenet_classes")]
        classes: u64,
        #[serde(default = "imagenet_size")]
        image: u64,
    },
    /// `nn.Sequential(...)`: Linear and ReLU layers.
    Layers(Vec<LayerSpec>),
    /// A model written in the module language (scenarios/README.md):
    /// its input, its module tree, and module paths to freeze.
    Modules {
        input: ModelInput,
        net: Module,
        #[serde(default)]
        freeze: Vec<String>,
        /// Module paths whose parameters take their own dtype.
        #[serde(default)]
        dtypes: Vec<(String, crate::engine::dtype::DType)>,
        /// PEFT LoRA on the projections named in `target_modules`.
        #[serde(default)]
        lora: Option<crate::engine::presets_hf::LoraSpec>,
        /// `from_pretrained(…, quantization_config=BitsAndBytesConfig(…))`:
        /// every Linear but the head becomes a bitsandbytes layer.
        #[serde(default)]
        quantization: Option<crate::engine::bnb::Quantization>,
        /// PEFT's `prepare_model_for_kbit_training(model)` before LoRA.
        #[serde(default)]
        kbit_training: bool,
    },
    /// A Hugging Face `config.json` (model_type llama, mistral, qwen2,
    /// gpt2), relative to the scenario's folder or the working directory.
    HfConfig(String),
}

fn gpt2_vocab() -> u64 {
    50_257
}
fn gpt2_block() -> u64 {
    1024
}
fn yes() -> bool {
    true
}
fn imagenet_classes() -> u64 {
    1000
}
fn imagenet_size() -> u64 {
    224
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub enum LayerSpec {
    Linear(u64, u64),
    ReLU,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DataSpec {
    pub batch: Option<u64>,
    /// Sequence length for GPT models.
    pub seq: Option<u64>,
    /// Batch size per iteration, cycled (variable batch sizes).
    #[serde(default)]
    pub batch_schedule: Vec<u64>,
    /// Sequence length per iteration, cycled (variable-length batches): a
    /// GPT's T (at most its block size) or an LSTM's BPTT length.
    #[serde(default)]
    pub seq_schedule: Vec<u64>,
}

/// A moment narration is attached to.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub enum At {
    Start,
    /// The start of iteration N (1-based).
    Iteration(u32),
    /// The first time a phase begins in iteration N: `Phase(2, "backward")`.
    Phase(u32, String),
    /// The first op with this name, e.g. `"linear"` or `"optimizer.step"`.
    Op(String),
    /// When reserved memory first exceeds this.
    ReservedExceeds(super::size::Size),
    /// When allocated memory first exceeds this.
    AllocatedExceeds(super::size::Size),
    /// Right after the first segment (or an expandable segment's pages)
    /// goes back to the driver: `empty_cache()`, or the allocator's own
    /// release before it gives up with an OOM. What a narration about the
    /// lower reserved figure waits for.
    SegmentReleased,
    Oom,
    End,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Narration {
    pub at: At,
    pub text: String,
}

/// What a run must show for the scenario to pass.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub enum Expectation {
    /// A leak finding rooted at this variable (optionally of this kind).
    Leak {
        root: String,
        kind: Option<String>,
    },
    /// No finding that is a memory leak.
    NoLeak,
    /// Some finding of this kind (leak or not), e.g. "cache_fragmentation".
    Finding(String),
    /// An OOM, optionally in this iteration.
    Oom(Option<u32>),
    NoOom,
    /// The run stops with an error whose message contains this text.
    Error(String),
    /// The program prints a warning (`warnings.warn`) containing this text.
    Warning(String),
    PeakReservedUnder(super::size::Size),
    PeakReservedOver(super::size::Size),
    PeakAllocatedUnder(super::size::Size),
    PeakAllocatedOver(super::size::Size),
    /// Allocated bytes at iteration end grow by at least this per iteration.
    AllocatedGrowsAtLeast(super::size::Size),
    /// Allocated bytes at iteration end stay the same from the second iteration on.
    AllocatedFlat,
    /// Requested bytes at iteration end stay the same from the second
    /// iteration on: the same tensors are live, though allocated bytes may
    /// move with the unsplit tails of whichever cached blocks served them.
    RequestedFlat,
    /// Reserved bytes grow while allocated stays flat.
    ReservedGrowsAllocatedFlat,
}

/// `criterion = nn.…()` for a classifier's `[batch, classes]` output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum Criterion {
    /// `nn.CrossEntropyLoss()` on class indices (the default).
    CrossEntropy,
    /// `nn.MSELoss()` against float targets shaped like the output.
    Mse,
    /// `nn.BCELoss()` after `torch.sigmoid(out)`: multi-label float targets.
    Bce,
    /// `nn.BCEWithLogitsLoss()` on the raw output: multi-label float targets.
    BceWithLogits,
    /// `model(x).sum()`: no target (the course's `.sum().backward()`).
    Sum,
    /// Hugging Face's `ForCausalLMLoss` on [B, T, V] logits and [B, T]
    /// labels (models.md §5.2).
    CausalLm,
}
