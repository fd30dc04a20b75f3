//! Hugging Face model shapes (models.md): decoder LMs of the Llama family
//! (Llama, Mistral, Qwen2, SmolLM2) and BERT encoders, with PEFT LoRA.

use serde::{Deserialize, Serialize};

use super::bnb::{QuantType, Quantization};
use super::model_lang::{LangModel, ModelInput, Module};

/// A Llama-family causal LM (`LlamaForCausalLM` and its copies).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecoderLm {
    pub hidden: u64,
    pub intermediate: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    /// None: hidden / heads.
    #[serde(default)]
    pub head_dim: Option<u64>,
    pub vocab: u64,
    /// `tie_word_embeddings`: lm_head.weight is embed_tokens.weight.
    pub tied: bool,
    /// q/k/v projections with biases (Qwen2).
    #[serde(default)]
    pub qkv_bias: bool,
    /// Training sequence length T.
    pub seq: u64,
    /// `get_peft_model(model, LoraConfig(...))`.
    #[serde(default)]
    pub lora: Option<LoraSpec>,
    /// `quantization_config` (bitsandbytes, models.md §13).
    #[serde(default)]
    pub quantization: Option<Quantization>,
    /// `prepare_model_for_kbit_training(model)` before LoRA (§13.4).
    #[serde(default)]
    pub kbit_training: bool,
}

impl DecoderLm {
    pub fn head_dim(&self) -> u64 {
        self.head_dim.unwrap_or(self.hidden / self.heads.max(1))
    }
}

/// PEFT `LoraConfig` (models.md §6.1): rank, alpha, dropout, targets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraSpec {
    pub r: u64,
    pub alpha: f64,
    #[serde(default)]
    pub dropout: f64,
    /// Module names as PEFT matches them: `q_proj`, `k_proj`, `v_proj`,
    /// `o_proj`, `gate_proj`, `up_proj`, `down_proj`.
    pub target_modules: Vec<String>,
}

/// The projections LoRA can target in a decoder layer.
pub const LORA_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

impl LoraSpec {
    pub fn targets(&self, name: &str) -> bool {
        self.target_modules.iter().any(|t| t == name)
    }
}

/// `BertForSequenceClassification` (models.md §8): BertModel with pooler,
/// dropout and a `num_labels` classifier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BertSpec {
    pub hidden: u64,
    pub intermediate: u64,
    pub layers: u64,
    pub heads: u64,
    pub vocab: u64,
    pub max_positions: u64,
    pub type_vocab: u64,
    /// `hidden_dropout_prob` = `attention_probs_dropout_prob`.
    pub dropout: f64,
    pub num_labels: u64,
    pub seq: u64,
}

/// Hugging Face presets (models.md §0.3 shapes, from each model's published
/// `config.json`): batch and sequence are the preset's training defaults.
pub(crate) fn decoder_preset(name: &str) -> Option<DecoderLm> {
    let lm = |hidden, intermediate, layers, heads, kv_heads, vocab, tied| DecoderLm {
        hidden,
        intermediate,
        layers,
        heads,
        kv_heads,
        head_dim: None,
        vocab,
        tied,
        qkv_bias: false,
        seq: 2048,
        lora: None,
        quantization: None,
        kbit_training: false,
    };
    Some(match name {
        "tinyllama-1.1b" => lm(2048, 5632, 22, 32, 4, 32_000, false),
        "llama-3.2-1b" => lm(2048, 8192, 16, 32, 8, 128_256, true),
        "llama-3-8b" => lm(4096, 14_336, 32, 32, 8, 128_256, false),
        "llama-3-8b-qlora" => qlora(lm(4096, 14_336, 32, 32, 8, 128_256, false)),
        "qwen2.5-0.5b-qlora" => {
            let mut m = lm(896, 4864, 24, 14, 2, 151_936, true);
            m.qkv_bias = true;
            m.seq = 1024;
            qlora(m)
        }
        "mistral-7b" => lm(4096, 14_336, 32, 32, 8, 32_000, false),
        "qwen2.5-0.5b" | "qwen2.5-0.5b-lora" => {
            let mut m = lm(896, 4864, 24, 14, 2, 151_936, true);
            m.qkv_bias = true;
            m.seq = 1024;
            if name.ends_with("-lora") {
                // models.md §6.4's example: r = 16 on all seven projections.
                m.lora = Some(LoraSpec {
                    r: 16,
                    alpha: 32.0,
                    dropout: 0.05,
                    target_modules: LORA_TARGETS.iter().map(|t| t.to_string()).collect(),
                });
            }
            m
        }
        _ => return None,
    })
}

/// The QLoRA recipe (models.md §13.6): `BitsAndBytesConfig(load_in_4bit=True,
/// bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
/// bnb_4bit_compute_dtype=torch.bfloat16)`, `prepare_model_for_kbit_training`,
/// then LoRA r 16, alpha 32, dropout 0.05 on every Linear but the head
/// (PEFT's `target_modules="all-linear"`, which its `tuners_utils.py:2430-2433`
/// says it took from the QLoRA repository; PEFT's per-model default would
/// be q_proj and v_proj only, `utils/constants.py:85`).
fn qlora(mut m: DecoderLm) -> DecoderLm {
    m.quantization = Some(Quantization::FourBit {
        quant_type: QuantType::NF4,
        double_quant: true,
        compute_dtype: crate::engine::dtype::DType::BF16,
    });
    m.kbit_training = true;
    m.lora = Some(LoraSpec {
        r: 16,
        alpha: 32.0,
        dropout: 0.05,
        target_modules: LORA_TARGETS.iter().map(|t| t.to_string()).collect(),
    });
    m
}

/// `bert-base-uncased` with a 2-label classification head, T = 128.
pub(crate) fn bert_base() -> BertSpec {
    BertSpec {
        hidden: 768,
        intermediate: 3072,
        layers: 12,
        heads: 12,
        vocab: 30_522,
        max_positions: 512,
        type_vocab: 2,
        dropout: 0.1,
        num_labels: 2,
        seq: 128,
    }
}

fn named(name: &str, m: Module) -> (String, Module) {
    (name.to_string(), m)
}

impl DecoderLm {
    /// The model in the language, with `LlamaForCausalLM`'s module names:
    /// `model.embed_tokens`, `model.layers.N`, `model.norm`,
    /// `model.rotary_emb`, `lm_head`.
    pub fn to_lang(&self) -> LangModel {
        let layer = Module::DecoderLayer {
            hidden: self.hidden,
            intermediate: self.intermediate,
            heads: self.heads,
            kv_heads: Some(self.kv_heads),
            head_dim: self.head_dim,
            qkv_bias: self.qkv_bias,
        };
        let model = Module::Sequential(vec![
            named(
                "embed_tokens",
                Module::Embedding {
                    num: self.vocab,
                    dim: self.hidden,
                },
            ),
            named(
                "layers",
                Module::Repeat {
                    n: self.layers,
                    block: Box::new(layer),
                },
            ),
            named("norm", Module::RMSNorm { dim: self.hidden }),
            named(
                "rotary_emb",
                Module::RotaryEmbedding {
                    head_dim: self.head_dim(),
                    float32: false,
                    sliding: false,
                    unused_sliding_mask: None,
                },
            ),
        ]);
        LangModel {
            input: ModelInput::Tokens { seq: self.seq },
            net: Module::Sequential(vec![
                named("model", model),
                named(
                    "lm_head",
                    Module::LmHead {
                        hidden: self.hidden,
                        vocab: self.vocab,
                        tied: self.tied,
                        softcap: false,
                    },
                ),
            ]),
            freeze: Vec::new(),
            dtypes: Vec::new(),
            lora: self.lora.clone(),
            quantization: self.quantization.clone(),
            kbit_training: self.kbit_training,
        }
    }
}

impl BertSpec {
    /// `BertForSequenceClassification` in the language: `bert.embeddings`,
    /// `bert.encoder.layer.N`, `bert.pooler`, `dropout`, `classifier`.
    pub fn to_lang(&self) -> LangModel {
        let layer = Module::BertLayer {
            hidden: self.hidden,
            intermediate: self.intermediate,
            heads: self.heads,
            dropout: self.dropout,
        };
        let bert = Module::Sequential(vec![
            named(
                "embeddings",
                Module::BertEmbeddings {
                    vocab: self.vocab,
                    hidden: self.hidden,
                    max_positions: self.max_positions,
                    type_vocab: self.type_vocab,
                    dropout: self.dropout,
                },
            ),
            named(
                "encoder",
                Module::Sequential(vec![named(
                    "layer",
                    Module::Repeat {
                        n: self.layers,
                        block: Box::new(layer),
                    },
                )]),
            ),
            named(
                "pooler",
                Module::BertPooler {
                    hidden: self.hidden,
                },
            ),
        ]);
        LangModel::new(
            ModelInput::Tokens { seq: self.seq },
            Module::Sequential(vec![
                named("bert", bert),
                named("dropout", Module::Dropout(self.dropout)),
                named(
                    "classifier",
                    Module::Linear {
                        input: self.hidden,
                        out: self.num_labels,
                        bias: true,
                    },
                ),
            ]),
        )
    }
}
