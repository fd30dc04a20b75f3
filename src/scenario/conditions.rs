//! The conditions a scenario runs under, resolved from its file: the GPU it
//! names (a profile: architecture, SMs, memory), the memory the run may use,
//! the PyTorch release whose rules apply, and the environment variables it
//! was captured under. A run as shipped is a run under these, and the report
//! says which they were.

use std::collections::BTreeMap;

use serde::Serialize;

use super::format::Scenario;
use crate::alloc::TorchVersion;
use crate::device::{profile, GpuProfile};
use crate::engine::config::parse_workspace_config;
use crate::engine::config::HfRmsNorm;
use crate::engine::{
    CublasLtWorkspace, CublasWorkspaceMode, EngineConfig, ReduceDevice, SdpaBackend,
};

/// Environment variables a scenario may set (`env: {…}`): the ones that
/// change what goes through the caching allocator. `PYTORCH_CUDA_ALLOC_CONF`
/// is the scenario's `alloc_conf`.
pub const ENV_KEYS: [&str; 3] = [
    "CUBLAS_WORKSPACE_CONFIG",
    "CUBLASLT_WORKSPACE_SIZE",
    "TORCH_CUBLAS_WORKSPACE_CACHE",
];

/// The resolved conditions of a scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Conditions {
    /// What reports call the device.
    pub device_name: String,
    /// The GPU profile, when the scenario names one.
    pub gpu: Option<GpuProfile>,
    /// Memory the run may use, overhead included (on a larger card, what
    /// `set_per_process_memory_fraction` holds it to).
    pub capacity: u64,
    /// Memory that is never the allocator's (CUDA context, other processes).
    pub overhead: u64,
    pub torch: String,
    /// The transformers release the scenario names (`transformers:`), as
    /// written; None: the newest modelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transformers: Option<String>,
    pub env: BTreeMap<String, String>,
    /// The capture under `tests/fixtures/pytorch/captured/` the test suite
    /// checks this scenario against, as shipped.
    pub capture: Option<String>,
    /// The capture program written for it that awaits a GPU run (no
    /// capture yet: nothing checked).
    pub awaiting_capture: Option<String>,
    /// The file is a built-in scenario, byte for byte: what the test suite
    /// checked is what runs.
    pub as_shipped: bool,
    /// The settings its `engine` block makes (`sdpa_backend Flash`,
    /// `conv_workspaces 23 entries`): conditions a capture ran under (a
    /// forced kernel, cuDNN's measured sizes) that the report names.
    pub stated_engine: Vec<String>,
    /// What the model assumes where the data decide (a mixture of
    /// experts' routing), with the module each is written at: the report
    /// names each as an assumption.
    pub assumptions: Vec<String>,
}

impl Conditions {
    /// Whether these figures are the ones the test suite checked against a
    /// real GPU's, in a sentence.
    pub fn verification(&self) -> String {
        match (&self.capture, self.as_shipped) {
            (Some(stem), true) => format!(
                "checked as shipped against the capture tests/fixtures/pytorch/captured/{stem}.pickle by the test suite"
            ),
            (Some(stem), false) => format!(
                "names the capture {}, but is not a built-in scenario as shipped: this build cannot say these figures were checked",
                crate::units::escape_controls(stem)
            ),
            (None, _) => match &self.awaiting_capture {
                Some(stem) => format!(
                    "not checked against a capture yet: its program tests/fixtures/pytorch/{}.py awaits a GPU run; the figures are the model's",
                    crate::units::escape_controls(stem)
                ),
                None => "not checked against a capture: the figures are the model's".to_string(),
            },
        }
    }
}

/// Why the conditions do not resolve: the field at fault (a word to find in
/// the file) and the message.
pub(crate) type Problem = (String, String);

/// Resolve `s`'s conditions under release `torch`.
pub(crate) fn conditions(s: &Scenario, torch: TorchVersion) -> Result<Conditions, Problem> {
    let gpu = match &s.device.gpu {
        Some(name) => Some(*profile(name).ok_or_else(|| {
            (
                "gpu".to_string(),
                format!(
                    "device.gpu: unknown GPU \"{name}\"; known: {}",
                    crate::device::profiles::profile_names()
                ),
            )
        })?),
        None => None,
    };
    let capacity = match (s.device.capacity, gpu) {
        (Some(c), Some(g)) if c.0 > g.total_memory => {
            return Err(problem(
                "capacity",
                format!(
                    "device.capacity: {} is more than the {}'s {}",
                    crate::alloc::format_size(c.0),
                    g.name,
                    crate::alloc::format_size(g.total_memory)
                ),
            ))
        }
        (Some(c), _) => c.0,
        (None, Some(g)) => g.total_memory,
        (None, None) => {
            return Err(problem(
                "device",
                "device.capacity: required unless device.gpu names a GPU".to_string(),
            ))
        }
    };
    let overhead = match (s.device.overhead, gpu) {
        (Some(o), _) => o.0,
        (None, Some(g)) => g.context_bytes.unwrap_or(0),
        (None, None) => 0,
    };
    if capacity == 0 {
        return Err(problem(
            "capacity",
            "device.capacity: must be more than 0 bytes".to_string(),
        ));
    }
    if overhead >= capacity {
        return Err(problem(
            "overhead",
            "device.overhead: must be less than the capacity".to_string(),
        ));
    }
    if s.capture.is_some() && s.awaiting_capture.is_some() {
        return Err(problem(
            "awaiting_capture",
            "awaiting_capture: the scenario names a capture already; keep one of the two"
                .to_string(),
        ));
    }
    for key in s.env.keys() {
        if !ENV_KEYS.contains(&key.as_str()) {
            return Err(problem(
                key,
                format!(
                    "env: {key} is not a variable that changes what the allocator sees; known: {} (PYTORCH_CUDA_ALLOC_CONF is alloc_conf)",
                    ENV_KEYS.join(", ")
                ),
            ));
        }
    }
    let device_name = s
        .device
        .name
        .clone()
        .or_else(|| gpu.map(|g| g.product.to_string()))
        .unwrap_or_else(|| "sim".to_string());
    Ok(Conditions {
        device_name,
        gpu,
        capacity,
        overhead,
        torch: torch.to_string(),
        transformers: s.transformers.clone(),
        env: s.env.clone(),
        capture: s.capture.clone(),
        awaiting_capture: s.awaiting_capture.clone(),
        as_shipped: false,
        stated_engine: s.engine.as_ref().map(stated_settings).unwrap_or_default(),
        assumptions: match &s.model {
            super::format::ModelSpec::Modules { net, .. } => {
                crate::engine::model_lang::moe::assumptions(net)
            }
            _ => Vec::new(),
        },
    })
}

/// The fields of a scenario's `engine` block that differ from the engine's
/// defaults, as `name value` (a list as its length).
fn stated_settings(e: &EngineConfig) -> Vec<String> {
    let (Ok(serde_json::Value::Object(ours)), Ok(serde_json::Value::Object(default))) = (
        serde_json::to_value(e),
        serde_json::to_value(EngineConfig::default()),
    ) else {
        return Vec::new();
    };
    ours.into_iter()
        .filter(|(k, v)| default.get(k) != Some(v))
        .map(|(k, v)| match v {
            serde_json::Value::Array(a) => format!("{k} {} entries", a.len()),
            serde_json::Value::String(s) => format!("{k} {s}"),
            serde_json::Value::Object(_) => k,
            other => format!("{k} {other}"),
        })
        .collect()
}

fn problem(word: &str, message: String) -> Problem {
    (word.to_string(), message)
}

/// The engine's settings under `c`: the device, the GPU's architecture and
/// SMs, the environment, and the release's cuBLASLt rule. A setting the
/// scenario's `engine` block makes too is a conflict, not an override.
pub(crate) fn apply(
    c: &Conditions,
    torch: TorchVersion,
    engine: &mut EngineConfig,
) -> Result<(), Problem> {
    engine.device_bytes = c.capacity;
    engine.device_overhead = c.overhead;
    if let Some(g) = &c.gpu {
        if engine.gpu_arch.is_some() || engine.reduce_device.is_some() {
            return Err(problem(
                "engine",
                format!(
                    "engine: gpu_arch and reduce_device come from device.gpu ({}); leave them out",
                    g.name
                ),
            ));
        }
        engine.gpu_arch = Some(g.arch);
        engine.placement = g.placement;
        engine.reduce_device = Some(ReduceDevice {
            sm_count: g.sm_count,
            max_threads_per_sm: g.max_threads_per_sm,
        });
    }
    for (key, value) in &c.env {
        let clash = |field: &str| {
            problem(
                key,
                format!("env: {key} and engine.{field} say the same thing; keep one"),
            )
        };
        match key.as_str() {
            "CUBLAS_WORKSPACE_CONFIG" => {
                if engine.cublas_workspace_config.is_some() {
                    return Err(clash("cublas_workspace_config"));
                }
                if parse_workspace_config(value).is_none() {
                    return Err(problem(
                        key,
                        format!("env: CUBLAS_WORKSPACE_CONFIG is :SIZE_KiB:COUNT pairs such as \":4096:8\", not \"{value}\""),
                    ));
                }
                engine.cublas_workspace_config = Some(value.clone());
            }
            "CUBLASLT_WORKSPACE_SIZE" => {
                if engine.cublaslt_workspace_size.is_some() {
                    return Err(clash("cublaslt_workspace_size"));
                }
                let bytes = value
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .and_then(|kib| kib.checked_mul(1024))
                    .ok_or_else(|| {
                        problem(
                            key,
                            format!("env: CUBLASLT_WORKSPACE_SIZE is in KiB, a whole number below 2^54, not \"{value}\""),
                        )
                    })?;
                engine.cublaslt_workspace_size = Some(bytes);
            }
            "TORCH_CUBLAS_WORKSPACE_CACHE" => {
                if engine.cublas_workspace_mode.is_some() {
                    return Err(clash("cublas_workspace_mode"));
                }
                engine.cublas_workspace_mode = match value.trim() {
                    "1" => Some(CublasWorkspaceMode::Cached),
                    "0" => Some(CublasWorkspaceMode::Eager),
                    _ => {
                        return Err(problem(
                            key,
                            format!("env: TORCH_CUBLAS_WORKSPACE_CACHE is 0 or 1, not \"{value}\""),
                        ))
                    }
                }
            }
            _ => {}
        }
    }
    if let Some(conf) = &engine.cublas_workspace_config {
        if parse_workspace_config(conf).is_none() {
            return Err(problem(
                "cublas_workspace_config",
                format!("engine.cublas_workspace_config is :SIZE_KiB:COUNT pairs such as \":4096:8\", not \"{conf}\""),
            ));
        }
    }
    if engine.cublaslt_workspace.is_none() {
        engine.cublaslt_workspace = Some(lt_rule(torch));
    }
    absent_in_release(torch, engine)
}

/// Engine settings that name what `torch` does not have: a program that
/// cannot have run on it.
fn absent_in_release(torch: TorchVersion, engine: &EngineConfig) -> Result<(), Problem> {
    // `torch.nn.RMSNorm` came in 2.4 (PR #121364, models.md §1.2).
    if torch.0 < 4 && engine.hf_rmsnorm != HfRmsNorm::HfComposite {
        return Err(problem(
            "hf_rmsnorm",
            format!("engine.hf_rmsnorm: torch.nn.RMSNorm came in PyTorch 2.4; {torch} has only transformers' LlamaRMSNorm (HfComposite)"),
        ));
    }
    // cuDNN attention came in 2.3, for inference (PR #115663, merged in
    // early 2024) [inf: release placed by the merge date].
    if torch.0 < 3 && engine.sdpa_backend == Some(SdpaBackend::Cudnn) {
        return Err(problem(
            "sdpa_backend",
            format!("engine.sdpa_backend: cuDNN attention came in PyTorch 2.3; {torch} has flash, memory-efficient and math"),
        ));
    }
    Ok(())
}

/// How a release gives addmm-with-bias its cuBLASLt workspace: one per
/// handle, kept, in 2.11 (the H100 captures: exactly one, under the first
/// Linear); one per call in the 2.6–2.7 adam-step trace. Releases between
/// are not observed and follow the older rule.
pub fn lt_rule(torch: TorchVersion) -> CublasLtWorkspace {
    if torch.0 >= 11 {
        CublasLtWorkspace::Cached
    } else {
        CublasLtWorkspace::Transient
    }
}
