//! The model language's syntax tree: `nn.Module`s as RON values.
//!
//! A model is a tree of [`Module`]s; each child of a [`Module::Sequential`]
//! has a name, which becomes a segment of its parameters' module path
//! (`layers.3.mlp.gate_proj`), and [`Module::Repeat`] names its copies
//! `0`, `1`, …, as `nn.ModuleList` does. Wrappers that are code in a
//! `forward` rather than modules (`Residual`, `Checkpoint`) add no segment.
//!
//! Adding a module kind touches one file besides this one: a variant here
//! (field names as PyTorch's constructor has them), then one arm in each of
//! the matches of `kinds.rs` — its arguments (bounds, probabilities,
//! parameter and buffer counts), its rules and output shape, its build (in
//! `named_parameters()` order, which is `.to("cuda")` order), its forward,
//! the projections LoRA may adapt in it, and PyTorch's words for a tensor
//! it refuses as the first module. `tests/module_kinds.rs` holds
//! every match on a kind to that file. Then a row in scenarios/README.md's
//! module table, and a test of its request sequence derived from PyTorch's
//! rules (`engine/tests/lang.rs`).

use serde::{Deserialize, Serialize};

/// One `nn.Module` (or a structural wrapper around one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Module {
    /// `nn.Sequential(OrderedDict(...))`: named children run in order, each
    /// output replacing the last (`x = child(x)`).
    Sequential(Vec<(String, Module)>),
    /// `n` copies of `block`, named `0` … `n-1` (an `nn.ModuleList` run in a loop).
    Repeat { n: u64, block: Box<Module> },
    /// `nn.Linear(in, out, bias)`.
    Linear {
        #[serde(rename = "in")]
        input: u64,
        out: u64,
        #[serde(default = "yes")]
        bias: bool,
    },
    /// bitsandbytes' `Linear4bit(in, out, bias, compute_dtype,
    /// compress_statistics, quant_type)` (models.md §13): a frozen weight
    /// packed two 4-bit values a byte, one absmax per `blocksize` values
    /// (uint8 plus a nested fp32 one per 256 with `double_quant`); its
    /// forward dequantises the weight to the compute dtype for the matmul.
    /// Defaults as bitsandbytes' constructor: FP4, blocksize 64, double
    /// quantisation on, the compute dtype taken from the first input.
    Linear4bit {
        #[serde(rename = "in")]
        input: u64,
        out: u64,
        #[serde(default = "yes")]
        bias: bool,
        #[serde(default = "fp4")]
        quant_type: crate::engine::bnb::QuantType,
        #[serde(default = "blocksize_4bit")]
        blocksize: u64,
        #[serde(default = "yes")]
        double_quant: bool,
        #[serde(default)]
        compute_dtype: Option<crate::engine::dtype::DType>,
    },
    /// bitsandbytes' `Linear8bitLt(in, out, bias, has_fp16_weights=False)`
    /// (LLM.int8, models.md §13): a frozen int8 weight and one fp32 scale a
    /// row; its forward quantises the input by rows and keeps it for
    /// backward.
    Linear8bitLt {
        #[serde(rename = "in")]
        input: u64,
        out: u64,
        #[serde(default = "yes")]
        bias: bool,
    },
    /// `nn.ReLU()`.
    ReLU,
    /// `nn.ReLU(inplace=True)`.
    InplaceReLU,
    /// `nn.GELU()`.
    GELU,
    /// `nn.GELU(approximate="tanh")`.
    GELUTanh,
    /// `nn.SiLU()`.
    SiLU,
    /// `nn.Dropout(p)`.
    Dropout(f64),
    /// `nn.Embedding(num, dim)`: token ids in, vectors out.
    Embedding { num: u64, dim: u64 },
    /// `nn.LayerNorm(dim, bias)` over the last dimension.
    LayerNorm {
        dim: u64,
        #[serde(default = "yes")]
        bias: bool,
    },
    /// `x + f(x)` (a residual connection written in a `forward`).
    Residual(Box<Module>),
    /// `nn.Conv2d(in, out, kernel, stride, padding, bias)`, square kernels.
    Conv2d {
        #[serde(rename = "in")]
        input: u64,
        out: u64,
        kernel: u64,
        #[serde(default = "one")]
        stride: u64,
        #[serde(default)]
        padding: u64,
        #[serde(default = "yes")]
        bias: bool,
    },
    /// `nn.BatchNorm2d(features)` (affine, tracking running stats).
    BatchNorm2d(u64),
    /// `nn.MaxPool2d(kernel, stride, padding)`.
    MaxPool2d {
        kernel: u64,
        stride: u64,
        #[serde(default)]
        padding: u64,
    },
    /// `nn.AdaptiveAvgPool2d((1, 1))`.
    AdaptiveAvgPool2d,
    /// `torch.flatten(x, 1)` (a view).
    Flatten,
    /// torchvision's `BasicBlock(inplanes, planes, stride)` (ResNet-18/34),
    /// with the 1×1 downsample when the shape changes.
    BasicBlock {
        inplanes: u64,
        planes: u64,
        #[serde(default = "one")]
        stride: u64,
    },
    /// torchvision's `Bottleneck(inplanes, planes, stride)` (ResNet-50 v1.5:
    /// the stride on the 3×3 conv), output `4 × planes` channels.
    Bottleneck {
        inplanes: u64,
        planes: u64,
        #[serde(default = "one")]
        stride: u64,
    },
    /// `torch.utils.checkpoint.checkpoint(module, x, use_reentrant=...)`.
    Checkpoint {
        module: Box<Module>,
        reentrant: bool,
    },
    /// Hugging Face `LlamaRMSNorm(dim)` (models.md §1; the engine switch
    /// `hf_rmsnorm` picks HF's composite, `nn.RMSNorm`'s fused kernel or
    /// ATen's composite).
    RMSNorm { dim: u64 },
    /// Gemma's `(1 + weight)` RMSNorm (`Gemma2RMSNorm`, Gemma 3's the
    /// same; transformers 5.16.1 modeling_gemma2.py:49-63): the norm in
    /// fp32 with its temporaries gone as used, `* (1.0 +
    /// self.weight.float())` in fp32 (the product saves the fp32 normed
    /// input and `1 + weight`), then `type_as(x)`. Weight `[dim]`.
    GemmaRMSNorm { dim: u64 },
    /// `LlamaRotaryEmbedding`: the model's `inv_freq` buffer [head_dim / 2].
    /// Every `Attention` / `DecoderLayer` with rotary positions uses it; its
    /// cos/sin are computed once per forward before the first of them
    /// (`hf_rope_scope: Layer`: by each), where this module stands when it
    /// stands before them (the model's forward runs it before its layers).
    /// Its forward is the identity. `float32`: `inv_freq` and
    /// `original_inv_freq` stay fp32 whatever the model's dtype, as a model
    /// built in its dtype keeps them (`from_config(config, dtype=…)`:
    /// `__init__` makes them with `.float()`, transformers 5.16.1
    /// modeling_qwen3.py:106, and nothing casts them).
    RotaryEmbedding {
        head_dim: u64,
        #[serde(default)]
        float32: bool,
        /// Gemma 3's two tables, one per layer type
        /// (`Gemma3RotaryEmbedding`, transformers 5.16.1
        /// modeling_gemma3.py:156-225): `full_attention_inv_freq` and
        /// `sliding_attention_inv_freq` (the latter from
        /// `rope_local_base_freq`), each with its `original_` copy, and a
        /// cos/sin pair of each per forward (modeling_gemma3.py:559-561);
        /// a `sliding` `HfAttention` takes the second.
        #[serde(default)]
        sliding: bool,
        /// The model's forward also builds a sliding-window causal mask of
        /// this window that no layer takes (transformers 5.x: Qwen2-MoE's
        /// `create_sliding_window_causal_mask` with `sliding_window` 0 when
        /// `use_sliding_window` is false, modeling_qwen2_moe.py:493-496,
        /// configuration_qwen2_moe.py:111): made after the positions and
        /// before the tables when the keys are at least the window
        /// (`_ignore_causal_mask_sdpa`, masking_utils.py:262-263), held
        /// until the forward returns (`model_lang/hf_v5.rs`).
        #[serde(default)]
        unused_sliding_mask: Option<u64>,
    },
    /// `LlamaAttention` with `sdpa_attention_forward` (models.md §4):
    /// `q_proj`, `k_proj`, `v_proj` (`kv_heads` heads: GQA, MQA at 1),
    /// `o_proj`; rotary positions or none; SDPA as PyTorch 2.11 picks it
    /// unless `sdpa` forces a backend.
    Attention {
        hidden: u64,
        heads: u64,
        /// None: `heads` (plain multi-head attention).
        #[serde(default)]
        kv_heads: Option<u64>,
        /// None: hidden / heads.
        #[serde(default)]
        head_dim: Option<u64>,
        #[serde(default = "yes")]
        causal: bool,
        #[serde(default = "yes")]
        rotary: bool,
        /// Biases on q, k, v (Qwen2); o_proj has none.
        #[serde(default)]
        bias: bool,
        #[serde(default)]
        dropout: f64,
        #[serde(default)]
        sdpa: Option<crate::engine::config::SdpaBackend>,
    },
    /// An MLP: gated SwiGLU `down_proj(silu(gate_proj(x)) * up_proj(x))`
    /// (models.md §3) or `c_proj(gelu(c_fc(x)))`.
    Mlp {
        hidden: u64,
        intermediate: u64,
        #[serde(default = "yes")]
        gated: bool,
        #[serde(default)]
        bias: bool,
    },
    /// `LlamaDecoderLayer`: input_layernorm, self_attn, residual,
    /// post_attention_layernorm, mlp (SwiGLU), residual.
    DecoderLayer {
        hidden: u64,
        intermediate: u64,
        heads: u64,
        #[serde(default)]
        kv_heads: Option<u64>,
        #[serde(default)]
        head_dim: Option<u64>,
        #[serde(default)]
        qkv_bias: bool,
    },
    /// `lm_head = Linear(hidden, vocab, bias=False)`; `tied`: its weight is
    /// the model's first `Embedding` (`tie_word_embeddings`); `softcap`:
    /// Gemma's final logit soft-capping in the same frame (transformers
    /// 5.16.1 modeling_gemma2.py:527-530): `logits = logits / cap`,
    /// `logits = torch.tanh(logits)`, `logits = logits * cap`, each
    /// rebinding letting the last go (tanh saves its result).
    LmHead {
        hidden: u64,
        vocab: u64,
        tied: bool,
        #[serde(default)]
        softcap: bool,
    },
    /// `BertEmbeddings` (models.md §8.1): word, position and token-type
    /// tables, LayerNorm, dropout.
    BertEmbeddings {
        vocab: u64,
        hidden: u64,
        max_positions: u64,
        type_vocab: u64,
        dropout: f64,
    },
    /// `BertLayer` (models.md §8.2): self-attention (not causal), output
    /// dense + dropout + post-LN, intermediate GELU, output + post-LN.
    BertLayer {
        hidden: u64,
        intermediate: u64,
        heads: u64,
        dropout: f64,
    },
    /// `BertPooler`: dense + tanh on the first token.
    BertPooler { hidden: u64 },
    /// A softmax over the last dimension: `F.softmax(x, -1)` (`Fused`), or
    /// written by hand (`Manual`): `e = torch.exp(x - x.max(-1,
    /// keepdim=True).values); e / e.sum(-1, keepdim=True)`, each op saving
    /// what PyTorch's autograd saves for it (ops/handwritten.rs).
    Softmax(SoftmaxKind),
    /// `x * torch.sigmoid(x)`: a SiLU written by hand (sigmoid saves its
    /// result, the product both factors: one tensor more than `nn.SiLU`).
    SigmoidMul,
    /// `mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)` made once
    /// per forward where it stands, for the `MaskedAttention`s after it
    /// (each `masked_fill` saves it); its forward is the identity.
    CausalMask,
    /// Causal self-attention written by hand: `qkv = Linear(hidden, 3 *
    /// hidden)`, split, `view(b, t, heads, d).transpose(1, 2)`, `q @
    /// k.transpose(-2, -1) / math.sqrt(d)`, `masked_fill(mask, -inf)` with
    /// the model's `CausalMask`, the softmax, `@ v`, `transpose(1,
    /// 2).reshape(b, t, hidden)`, `proj = Linear(hidden, hidden)`. Its
    /// locals (qkv's output, the masked scores, the attention output) live
    /// until the enclosing `Frame` returns (or until it returns, without one).
    MaskedAttention {
        hidden: u64,
        heads: u64,
        softmax: SoftmaxKind,
    },
    /// `x + self.pos[:t]` with `pos = nn.Parameter(torch.zeros(seq, dim))`
    /// owned by the model itself: first in `parameters()` (the optimizer's
    /// order), moved by `.cuda()` after every submodule's parameters.
    Positions { seq: u64, dim: u64 },
    /// A `forward` written op for op: statements `name = expr` run in order
    /// on the module's input `x` (`X`), as CPython runs them: an operand
    /// that no name holds dies as the op that takes it returns, a name
    /// lives until the module returns (then the names go in the order they
    /// were first bound). Returns the last statement's value. Each op saves
    /// what PyTorch's autograd saves for it (ops/handwritten.rs).
    Ops(Vec<(String, Expr)>),
    /// A Python function's frame around `module` (a block's `forward`): the
    /// locals its hand-written ops keep (`MaskedAttention`'s) die when it
    /// returns, in the order Python clears them. Adds no path segment.
    Frame(Box<Module>),
    /// A module whose `__init__` registers its submodules in another order
    /// than its `forward` calls them (transformers' decoder layers register
    /// `self_attn` and `mlp` before their norms; `LlamaModel` its
    /// `rotary_emb` last, though its forward runs it before the layers):
    /// the parameters and buffers under `module` are allocated, and listed
    /// for the optimizer, in `order` (child paths relative to here; a leaf
    /// under none of them comes last, in forward order), while the forward
    /// runs as `module` says. Adds no path segment.
    Registered {
        order: Vec<String>,
        module: Box<Module>,
    },
    /// transformers' `<Family>Model.forward` around its body, a
    /// `Sequential` whose first child makes the embeddings: `inputs_embeds`
    /// (that child's output) stays bound until it returns, and the
    /// positions and rotary tables it made (`position_ids`,
    /// `position_embeddings`) go as it returns, before the LM head runs
    /// (transformers 5.16.1 modeling_qwen3.py:381-388, locals of the
    /// forward). Adds no path segment.
    HfModel(Box<Module>),
    /// Gemma's scaled word embedding (`Gemma2TextScaledWordEmbedding`,
    /// transformers 5.16.1 modeling_gemma2.py:338-349): `nn.Embedding(num,
    /// dim)` and a 0-dim `embed_scale` buffer (`sqrt(dim)`, made in the
    /// model's dtype); the forward is `embedding(x) * embed_scale`, a new
    /// tensor (the product saves nothing), the embedding's own output gone
    /// as it returns. Takes `Tokens`.
    ScaledEmbedding { num: u64, dim: u64 },
    /// A sparse mixture-of-experts MLP, Mixtral / Qwen-MoE style
    /// (model_lang/moe.rs): `router = Linear(hidden, experts, bias=False)`
    /// (named `router`), softmax, top-`top_k`, the weights renormalised
    /// when `norm_topk_prob`, `experts` copies of `expert` (each
    /// `intermediate` wide) run on the rows routed to them and summed back
    /// with `index_add`; Qwen2-MoE's `shared_expert` (its width) and
    /// `shared_expert_gate` when given. The routing depends on the data:
    /// `routing` says it (`Balanced`, an assumption, or `Counts`).
    /// `dispatch: GroupedMm` (and `Hf` under transformers 5.x) is 5.x's
    /// block: 3-D experts run through `torch._grouped_mm`
    /// (model_lang/moe/grouped.rs).
    SparseMoe {
        hidden: u64,
        intermediate: u64,
        experts: u64,
        top_k: u64,
        expert: super::moe::ExpertKind,
        #[serde(default = "yes")]
        norm_topk_prob: bool,
        #[serde(default)]
        shared_expert: Option<u64>,
        routing: super::moe::Routing,
        #[serde(default)]
        dispatch: super::moe::Dispatch,
        #[serde(default = "gate")]
        router: String,
        /// `GroupedMm` (5.x): the experts registered before the router, as
        /// Qwen3-MoE's block does (modeling_qwen3_moe.py:273-274).
        #[serde(default)]
        experts_first: bool,
    },
    /// Causal self-attention with one fused projection: `qkv =
    /// Linear(hidden, 3 * hidden)`, split, `view(b, t, heads,
    /// d).transpose(1, 2)`, `F.scaled_dot_product_attention(q, k, v,
    /// is_causal=True)` (PyTorch's backend choice),
    /// `proj(att.transpose(1, 2).reshape(b, t, hidden))` (model_lang/moe.rs).
    QkvAttention { hidden: u64, heads: u64 },
    /// Hugging Face's attention as Qwen3, Gemma 3 and Phi-3 write it
    /// (model_lang/hf_layers.rs): `q_proj`, `k_proj`, `v_proj` (biased when
    /// `bias`), `o_proj`, with `qk_norm` an RMSNorm of `head_dim` on each
    /// query and key head before the rotary positions (`q_norm`,
    /// `k_norm`); or `fused_qkv`: one `qkv_proj` sliced three ways
    /// (Phi-3). Rotary positions (the model's `RotaryEmbedding`), causal,
    /// SDPA as PyTorch picks it.
    HfAttention {
        hidden: u64,
        heads: u64,
        kv_heads: u64,
        head_dim: u64,
        #[serde(default)]
        bias: bool,
        #[serde(default)]
        qk_norm: bool,
        #[serde(default)]
        fused_qkv: bool,
        /// A sliding-window layer (`layer_types`): under `hf_use_cache` its
        /// cache is a `DynamicSlidingWindowLayer`, whose first update moves
        /// an 8-byte window tensor to the GPU (transformers 5.16.1
        /// cache_utils.py:215, 227), held until the model's output goes.
        #[serde(default)]
        sliding: bool,
        /// `q_norm` and `k_norm` are Gemma's `(1 + weight)` norms
        /// (`Gemma3RMSNorm`, transformers 5.16.1 modeling_gemma3.py:136-150,
        /// 338-339), not Llama's: as `GemmaRMSNorm`.
        #[serde(default)]
        gemma_qk_norm: bool,
    },
    /// A gated MLP `down_proj(act(gate_proj(x)) * up_proj(x))`, no biases:
    /// `act` SiLU (SwiGLU) or `GeluTanh` (Gemma's GeGLU); `fused`: Phi-3's
    /// one `gate_up_proj` chunked in two (model_lang/hf_layers.rs).
    GatedMlp {
        hidden: u64,
        intermediate: u64,
        #[serde(default)]
        act: super::hf_layers::GateAct,
        #[serde(default)]
        fused: bool,
    },
}

/// One expression of an `Ops` statement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Expr {
    /// The module's input.
    X,
    /// A name an earlier statement bound.
    Var(String),
    /// `torch.exp(a)` (saves its result).
    Exp(Box<Expr>),
    /// `torch.sigmoid(a)` (saves its result).
    Sigmoid(Box<Expr>),
    /// `torch.tanh(a)` (saves its result).
    Tanh(Box<Expr>),
    /// `torch.relu(a)` (saves its result).
    Relu(Box<Expr>),
    /// `a + b` (saves nothing).
    Add(Box<Expr>, Box<Expr>),
    /// `a - b` (saves nothing).
    Sub(Box<Expr>, Box<Expr>),
    /// `a * b` (saves each operand the other's gradient needs).
    Mul(Box<Expr>, Box<Expr>),
    /// `a / b` (saves `b`, and `a` when `b` needs a gradient).
    Div(Box<Expr>, Box<Expr>),
    /// `a * c` or `a / c` for a Python number `c` (saves nothing).
    Scale(Box<Expr>),
    /// `a.max(dim=-1, keepdim=True).values` (saves the int64 indices).
    Max(Box<Expr>),
    /// `a.sum(dim=-1, keepdim=True)` (saves nothing).
    Sum(Box<Expr>),
}

/// How a `Softmax` is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SoftmaxKind {
    /// `F.softmax(x, dim=-1)`: SoftmaxBackward0 saves its result.
    Fused,
    /// `exp(x - max) / sum`: max's indices, exp's result, the sum and (as
    /// div's `self`) exp's result again are saved.
    Manual,
}

/// What `next(batches)` yields as the model's input `x`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum ModelInput {
    /// Floats `[B, features]` in the model's dtype.
    Features(u64),
    /// Images `[B, channels, height, width]` in the model's dtype.
    Images {
        channels: u64,
        height: u64,
        width: u64,
    },
    /// Token ids `[B, seq]`, int64 (the data's `seq` overrides `seq`).
    Tokens { seq: u64 },
}

/// A model written in the language: its input and its module tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LangModel {
    pub input: ModelInput,
    pub net: Module,
    /// `requires_grad_(False)` on every parameter under these module paths
    /// (a path, or a prefix of one at a `.`), right after the model is built.
    #[serde(default)]
    pub freeze: Vec<String>,
    /// Parameters under these module paths (a path, or a prefix of one at a
    /// `.`) in their own dtype, the rest in the model's: `model.to(bf16)`
    /// then `model.ln.float()` (fp32 norms in a bf16 model), done before
    /// `.cuda()`, so each is allocated once, in its dtype. The last path
    /// that names a parameter decides.
    #[serde(default)]
    pub dtypes: Vec<(String, crate::engine::dtype::DType)>,
    /// PEFT `get_peft_model(model, LoraConfig(...))` (models.md §6): every
    /// parameter frozen, adapters on the projections whose name is a target.
    #[serde(default)]
    pub lora: Option<crate::engine::presets_hf::LoraSpec>,
    /// `from_pretrained(…, quantization_config=BitsAndBytesConfig(…))`
    /// (models.md §13): every `nn.Linear` but the head (`LmHead`) is
    /// built as a bitsandbytes layer.
    #[serde(default)]
    pub quantization: Option<crate::engine::bnb::Quantization>,
    /// PEFT's `prepare_model_for_kbit_training(model)` (models.md §13.4),
    /// before LoRA: every parameter frozen, fp16/bf16 parameters but the
    /// 4-bit ones cast to fp32, `empty_cache()`, the input embeddings'
    /// output made to require grad, gradient checkpointing on every
    /// decoder layer.
    #[serde(default)]
    pub kbit_training: bool,
}

impl LangModel {
    /// `net` on `input`, as built: nothing frozen, one dtype, no LoRA, no
    /// quantization (what a file leaves out of the other fields).
    pub fn new(input: ModelInput, net: Module) -> LangModel {
        LangModel {
            input,
            net,
            freeze: Vec::new(),
            dtypes: Vec::new(),
            lora: None,
            quantization: None,
            kbit_training: false,
        }
    }
}

/// The bottleneck's channel expansion (torchvision `Bottleneck.expansion`).
pub const BOTTLENECK_EXPANSION: u64 = 4;

fn yes() -> bool {
    true
}

fn one() -> u64 {
    1
}

fn gate() -> String {
    "gate".into()
}

fn fp4() -> crate::engine::bnb::QuantType {
    crate::engine::bnb::QuantType::FP4
}

fn blocksize_4bit() -> u64 {
    crate::engine::bnb::BLOCKSIZE_4BIT
}

/// `parent.child`, or `child` at the root; a child named `""` adds no
/// segment (a step of a block's `forward` that is not a module of its own,
/// e.g. each residual half of a Hugging Face decoder layer).
pub(crate) fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_string()
    } else if child.is_empty() {
        parent.to_string()
    } else {
        format!("{parent}.{child}")
    }
}
