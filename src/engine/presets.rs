//! Model presets (engine.md §10) as serialisable configs.

use serde::{Deserialize, Serialize};

use super::config::SdpaBackend;
use super::dtype::DType;
use super::presets_hf::DecoderLm;

/// The training criterion applied by `Step::Loss`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LossKind {
    /// `F.cross_entropy(out.view(-1, C), target.view(-1))`.
    CrossEntropy,
    /// `F.nll_loss(out, target)` (the model already returns log-probs).
    Nll,
    /// `F.mse_loss(out, target)`.
    Mse,
    /// `F.binary_cross_entropy(torch.sigmoid(out), target)` (`nn.BCELoss`
    /// after a sigmoid): multi-label targets shaped like the output.
    Bce,
    /// `F.binary_cross_entropy_with_logits(out, target)` (`nn.BCEWithLogitsLoss`).
    BceWithLogits,
    /// `out.sum()` (engine.md §12).
    Sum,
    /// Hugging Face's `ForCausalLMLoss` on [B, T, V] logits and [B, T]
    /// labels (models.md §5.2).
    HfCausalLm,
}

/// What a model is: written in the language, or one of the two models
/// still written by hand (nanoGPT's fused-QKV blocks with their checkpoint
/// plans, and the recurrent LSTM language model, whose forward takes and
/// returns a hidden state the language has no module for yet).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum ModelKind {
    /// nanoGPT (§10.2). `seq` is the training sequence length T ≤ block_size.
    Gpt2 {
        n_layer: u64,
        n_head: u64,
        n_embd: u64,
        vocab: u64,
        block_size: u64,
        seq: u64,
        bias: bool,
        dropout: f64,
        /// One non-reentrant checkpoint region per block (§7, §10.2).
        checkpoint: bool,
        /// `checkpoint_sequential(blocks, n, x, use_reentrant=False)`: the
        /// blocks in `n` segments of `L // n`, every segment but the last one
        /// a checkpoint region (§7). Exclusive with `checkpoint`.
        #[serde(default)]
        checkpoint_segments: Option<u64>,
        /// `use_reentrant=True` for those regions (§7, §9 pitfall 9).
        #[serde(default)]
        checkpoint_reentrant: bool,
        /// Force an SDPA backend (None: automatic, §1.7).
        sdpa: Option<SdpaBackend>,
    },
    /// pytorch/examples word_language_model (§10.3).
    LstmLm {
        vocab: u64,
        emb: u64,
        hidden: u64,
        layers: u64,
        bptt: u64,
        dropout: f64,
        /// cuDNN `_cudnn_rnn` (true) or the unfused LSTMCell loop (§8.4).
        cudnn: bool,
    },
    /// A model written in the language (`model_lang`): the MLPs, ResNets,
    /// a lone Linear, the Hugging Face shapes, and any a scenario writes.
    Modules(crate::engine::model_lang::LangModel),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub kind: ModelKind,
    /// Default batch size (a program's schedule may override it per iteration).
    pub batch: u64,
    pub loss: LossKind,
    /// Parameters' and floating buffers' dtype: F32, or what `model.half()`,
    /// `model.to(torch.bfloat16)` or `model.double()` made them.
    #[serde(default = "fp32")]
    pub param_dtype: DType,
}

fn fp32() -> DType {
    DType::F32
}

impl ModelConfig {
    /// §10.1 `mlp-mnist`: 784 → 1024 → 1024 → 10, B = 256.
    pub fn mlp_mnist() -> ModelConfig {
        ModelConfig::mlp(&[784, 1024, 1024, 10], false)
    }

    /// An MLP of `dims` (§10.1), trained with cross-entropy at batch 256.
    pub fn mlp(dims: &[u64], inplace_relu: bool) -> ModelConfig {
        ModelConfig::modules(
            crate::engine::model_lang::presets::mlp(dims, inplace_relu),
            256,
        )
    }

    /// §10.2 `gpt2-small` (d = 768, h = 12, L = 12, V = 50,257, tied).
    pub fn gpt2_small(batch: u64, seq: u64) -> ModelConfig {
        ModelConfig::gpt(12, 12, 768, 50_257, 1024, batch, seq)
    }

    /// §10.2 `gpt-tiny`: d = 256, h = 4, L = 4, T = 256, V = 8,192.
    pub fn gpt_tiny() -> ModelConfig {
        ModelConfig::gpt(4, 4, 256, 8192, 256, 8, 256)
    }

    pub fn gpt(
        n_layer: u64,
        n_head: u64,
        n_embd: u64,
        vocab: u64,
        block_size: u64,
        batch: u64,
        seq: u64,
    ) -> ModelConfig {
        ModelConfig {
            kind: ModelKind::Gpt2 {
                n_layer,
                n_head,
                n_embd,
                vocab,
                block_size,
                seq,
                bias: true,
                dropout: 0.0,
                checkpoint: false,
                checkpoint_segments: None,
                checkpoint_reentrant: false,
                sdpa: None,
            },
            batch,
            loss: LossKind::CrossEntropy,
            param_dtype: DType::F32,
        }
    }

    /// §10.3 `lstm-lm-ptb`: V = 10,000, 200/200, 2 layers, T = 35, B = 20, p = 0.2.
    pub fn lstm_lm_ptb() -> ModelConfig {
        ModelConfig {
            kind: ModelKind::LstmLm {
                vocab: 10_000,
                emb: 200,
                hidden: 200,
                layers: 2,
                bptt: 35,
                dropout: 0.2,
                cudnn: true,
            },
            batch: 20,
            loss: LossKind::Nll,
            param_dtype: DType::F32,
        }
    }

    /// §10.3 variant `lstm-lm-medium`: E = H = 650.
    pub fn lstm_lm_medium() -> ModelConfig {
        ModelConfig {
            kind: ModelKind::LstmLm {
                vocab: 10_000,
                emb: 650,
                hidden: 650,
                layers: 2,
                bptt: 35,
                dropout: 0.5,
                cudnn: true,
            },
            batch: 20,
            loss: LossKind::Nll,
            param_dtype: DType::F32,
        }
    }

    /// §10.4 ResNet-18 at 224×224.
    pub fn resnet18(batch: u64) -> ModelConfig {
        ModelConfig::resnet18_for(1000, 224, batch)
    }

    /// torchvision's ResNet-18 (BasicBlocks) for `classes` on `image`² RGB images.
    pub fn resnet18_for(classes: u64, image: u64, batch: u64) -> ModelConfig {
        use crate::engine::model_lang::presets::resnet;
        ModelConfig::modules(resnet([2, 2, 2, 2], false, classes, image), batch)
    }

    /// `nn.Linear(in, out)` with `loss = out.sum()` (§12).
    pub fn linear(in_features: u64, out_features: u64, batch: u64) -> ModelConfig {
        use crate::engine::model_lang::presets::linear;
        ModelConfig {
            loss: LossKind::Sum,
            ..ModelConfig::modules(linear(in_features, out_features, true), batch)
        }
    }

    /// A model written in the language, trained with cross-entropy.
    pub fn modules(model: crate::engine::model_lang::LangModel, batch: u64) -> ModelConfig {
        ModelConfig {
            kind: ModelKind::Modules(model),
            batch,
            loss: LossKind::CrossEntropy,
            param_dtype: DType::F32,
        }
    }

    /// A Hugging Face causal LM in the language, trained with
    /// `ForCausalLMLoss` at batch 1.
    pub fn causal_lm(lm: &DecoderLm) -> ModelConfig {
        ModelConfig {
            loss: LossKind::HfCausalLm,
            ..ModelConfig::modules(lm.to_lang(), 1)
        }
    }

    /// A preset by its spec name.
    pub fn preset(name: &str) -> Option<ModelConfig> {
        use crate::engine::model_lang::presets;
        Some(match name {
            "resnet50" => ModelConfig::modules(presets::resnet50(), 32),
            "deep-mlp" => ModelConfig {
                loss: LossKind::Sum,
                ..ModelConfig::modules(presets::deep_mlp(false), 64)
            },
            "mlp-mnist" => ModelConfig::mlp_mnist(),
            "gpt2-small" => ModelConfig::gpt2_small(8, 1024),
            "gpt-tiny" => ModelConfig::gpt_tiny(),
            "lstm-lm-ptb" => ModelConfig::lstm_lm_ptb(),
            "lstm-lm-medium" => ModelConfig::lstm_lm_medium(),
            "resnet18" | "resnet-basic" => ModelConfig::resnet18(32),
            "bert-base" => ModelConfig::modules(super::presets_hf::bert_base().to_lang(), 32),
            _ => {
                let lm = super::presets_hf::decoder_preset(name)?;
                let mut m = ModelConfig::causal_lm(&lm);
                if lm.quantization.is_some() {
                    // `from_pretrained(…, torch_dtype=torch.bfloat16)`: what
                    // is not quantised loads in bf16 (then fp32 by
                    // `prepare_model_for_kbit_training`).
                    m.param_dtype = DType::BF16;
                }
                m
            }
        })
    }
}

/// How a preset's figures have been checked. `tests/real_gpu_fixtures/
/// inventory.rs` holds this to the scenarios: every scenario on a preset
/// that names a capture makes the preset verified, and a verified preset
/// names a scenario on it, that scenario's capture and the conditions it
/// states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// `scenario` (a built-in, or a test scenario under
    /// `tests/fixtures/pytorch/`) runs this preset and matches the H100
    /// capture `capture` (its stem under `tests/fixtures/pytorch/captured/`);
    /// `conditions`: what that scenario states beyond the model (measured
    /// cuDNN workspaces, a transformers setting), without which the figures
    /// are the engine's own estimate.
    Hardware {
        capture: &'static str,
        scenario: &'static str,
        conditions: Option<&'static str>,
    },
    /// Written from PyTorch's, torchvision's and the specs' source; no GPU
    /// capture checks it yet.
    SourceOnly,
}

impl Evidence {
    pub fn label(self) -> &'static str {
        match self {
            Evidence::Hardware {
                conditions: None, ..
            } => "verified on hardware",
            Evidence::Hardware {
                conditions: Some(_),
                ..
            } => "verified, with conditions",
            Evidence::SourceOnly => "from source only",
        }
    }

    /// The evidence in a sentence, as `vramscope model NAME` says it.
    pub fn sentence(self) -> String {
        match self {
            Evidence::Hardware {
                capture,
                scenario,
                conditions,
            } => {
                let base = format!(
                    "verified on hardware: the scenario `{scenario}` on it matches the H100 capture `{capture}`"
                );
                match conditions {
                    None => base,
                    Some(c) => format!(
                        "{base} with {c} (stated by that scenario); elsewhere the engine's estimate"
                    ),
                }
            }
            Evidence::SourceOnly => "from source only: no GPU capture checks it yet".to_string(),
        }
    }
}

/// A preset as `vramscope model --list` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PresetInfo {
    pub name: &'static str,
    pub about: &'static str,
    pub evidence: Evidence,
}

/// Every preset, in the order they are listed.
pub const PRESET_CATALOGUE: [PresetInfo; 17] = [
    PresetInfo {
        name: "mlp-mnist",
        about: "784 → 1024 → 1024 → 10 MLP, ReLU, cross-entropy, batch 256",
        evidence: Evidence::Hardware {
            capture: "accumulate_loss_train_fixed",
            scenario: "accumulate-loss-train-fixed",
            conditions: None,
        },
    },
    PresetInfo {
        name: "gpt2-small",
        about: "nanoGPT GPT-2 small (12 × 768, 12 heads, V = 50,257, tied), batch 8 × 1,024",
        evidence: Evidence::Hardware {
            capture: "gpt2_small_fits",
            scenario: "gpt2-small-fits",
            conditions: Some("SDPA's memory-efficient kernel forced, as its capture program forced it"),
        },
    },
    PresetInfo {
        name: "gpt-tiny",
        about: "nanoGPT 4 × 256, 4 heads, V = 8,192, batch 8 × 256",
        evidence: Evidence::Hardware {
            capture: "tour",
            scenario: "tour",
            conditions: Some("SDPA's memory-efficient kernel forced, as its capture program forced it"),
        },
    },
    PresetInfo {
        name: "lstm-lm-ptb",
        about: "word_language_model LSTM 200/200, 2 layers, BPTT 35, batch 20",
        evidence: Evidence::Hardware {
            capture: "rnn_hidden_fixed",
            scenario: "rnn-hidden-fixed",
            conditions: Some("cuDNN's RNN workspace, reserve and dropout state measured on the H100"),
        },
    },
    PresetInfo {
        name: "lstm-lm-medium",
        about: "word_language_model LSTM 650/650, 2 layers, dropout 0.5",
        evidence: Evidence::Hardware {
            capture: "lstm_medium",
            scenario: "lstm-medium",
            conditions: Some("cuDNN's RNN workspace, reserve and dropout state measured on the H100"),
        },
    },
    PresetInfo {
        name: "resnet18",
        about: "torchvision ResNet-18 (BasicBlocks), 224², batch 32",
        evidence: Evidence::Hardware {
            capture: "resnet18_train",
            scenario: "resnet18-train",
            conditions: Some("cuDNN's convolution workspaces measured on the H100 at batch 32"),
        },
    },
    PresetInfo {
        name: "resnet50",
        about: "torchvision ResNet-50 v1.5 (Bottlenecks), 224², batch 32, in the model language",
        evidence: Evidence::Hardware {
            capture: "resnet50_batch_sweep",
            scenario: "resnet50-batch-sweep",
            conditions: Some("cuDNN's convolution workspaces measured on the H100 at batch 64"),
        },
    },
    PresetInfo {
        name: "deep-mlp",
        about: "the course's 20 × Linear(4096, 4096) + ReLU, no head, model(x).sum(), batch 64",
        evidence: Evidence::Hardware {
            capture: "deep_mlp_no_checkpoint",
            scenario: "deep-mlp-no-checkpoint",
            conditions: None,
        },
    },
    PresetInfo {
        name: "tinyllama-1.1b",
        about: "TinyLlama 1.1B (22 × 2048, 32/4 heads, I 5632, V 32,000, untied), batch 1 × 2,048",
        evidence: Evidence::SourceOnly,
    },
    PresetInfo {
        name: "llama-3.2-1b",
        about: "Llama 3.2 1B (16 × 2048, 32/8 heads, I 8192, V 128,256, tied), batch 1 × 2,048",
        evidence: Evidence::SourceOnly,
    },
    PresetInfo {
        name: "llama-3-8b",
        about: "Llama 3 8B (32 × 4096, 32/8 heads, I 14,336, V 128,256, untied), batch 1 × 2,048",
        evidence: Evidence::SourceOnly,
    },
    PresetInfo {
        name: "mistral-7b",
        about: "Mistral 7B v0.1 (32 × 4096, 32/8 heads, I 14,336, V 32,000), batch 1 × 2,048",
        evidence: Evidence::SourceOnly,
    },
    PresetInfo {
        name: "qwen2.5-0.5b",
        about: "Qwen2.5 0.5B (24 × 896, 14/2 heads, q/k/v bias, V 151,936, tied), batch 1 × 1,024",
        evidence: Evidence::SourceOnly,
    },
    PresetInfo {
        name: "qwen2.5-0.5b-lora",
        about: "qwen2.5-0.5b with PEFT LoRA r 16, alpha 32, dropout 0.05 on all seven projections",
        evidence: Evidence::Hardware {
            capture: "llama_lora_finetune",
            scenario: "llama-lora-finetune",
            conditions: Some("transformers' use_cache k/v copies in training (hf_use_cache)"),
        },
    },
    PresetInfo {
        name: "qwen2.5-0.5b-qlora",
        about: "qwen2.5-0.5b loaded in 4-bit NF4 (double quant, bf16 compute), prepare_model_for_kbit_training, LoRA r 16 on all seven projections",
        evidence: Evidence::SourceOnly,
    },
    PresetInfo {
        name: "llama-3-8b-qlora",
        about: "llama-3-8b loaded in 4-bit NF4 (double quant, bf16 compute), prepare_model_for_kbit_training, LoRA r 16 on all seven projections",
        evidence: Evidence::SourceOnly,
    },
    PresetInfo {
        name: "bert-base",
        about: "bert-base-uncased + 2-label classifier (12 × 768, 12 heads, dropout 0.1), batch 32 × 128",
        evidence: Evidence::SourceOnly,
    },
];
