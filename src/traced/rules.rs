//! The CUDA rules a traced program's ops follow, taken from the engine's
//! settings for the simulated GPU, the PyTorch release and the program's
//! environment, exactly as a scenario on that GPU gets them
//! (`scenario::apply_conditions`): the cuBLAS and cuBLASLt workspaces
//! (engine.md §1.6) and the SDPA backend (models.md §4.4).

use std::collections::BTreeMap;

use crate::alloc::TorchVersion;
use crate::device::GpuProfile;
use crate::engine::ops::sdpa_select::SdpaCall;
use crate::engine::{CublasLtWorkspace, CublasWorkspaceMode, DType, EngineConfig, SdpaBackend};
use crate::scenario::{apply_conditions, Conditions};

/// The aten ops (overload packets) that run a cuBLAS GEMM on the GPU and so
/// take the handle's workspace at their first call on a thread.
pub const GEMM_OPS: [&str; 8] = [
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot",
];

/// The release whose rules a traced PyTorch follows: its own minor version
/// when modelled (2.4 to 2.15), else the nearest, and a sentence saying so.
pub fn release_of(torch: &str) -> (TorchVersion, String) {
    match torch.parse::<TorchVersion>() {
        Ok(v) => (v, format!("PyTorch {v}'s rules (the traced program runs PyTorch {torch})")),
        Err(_) => {
            let minor = torch
                .strip_prefix("2.")
                .and_then(|r| r.split(['.', '+']).next())
                .and_then(|m| m.parse::<u32>().ok());
            let v = match minor {
                Some(m) if m > TorchVersion::NEWEST.0 => TorchVersion::NEWEST,
                Some(_) => TorchVersion::OLDEST,
                None => TorchVersion::DEFAULT,
            };
            (
                v,
                format!("PyTorch {v}'s rules, the nearest modelled release (the traced program runs PyTorch {torch})"),
            )
        }
    }
}

/// The engine's settings for one traced run.
#[derive(Debug, Clone)]
pub struct Rules {
    pub engine: EngineConfig,
}

impl Rules {
    /// The rules on `gpu` under `version` with the program's environment
    /// (`CUBLAS_WORKSPACE_CONFIG`, `CUBLASLT_WORKSPACE_SIZE`,
    /// `TORCH_CUBLAS_WORKSPACE_CACHE`); an unreadable variable is an error
    /// naming it.
    pub fn new(
        gpu: &GpuProfile,
        version: TorchVersion,
        env: &BTreeMap<String, String>,
        alloc_conf: &str,
    ) -> Result<Rules, String> {
        let conditions = Conditions {
            device_name: gpu.name.to_string(),
            gpu: Some(*gpu),
            capacity: gpu.total_memory,
            overhead: gpu.context_bytes.unwrap_or(0),
            torch: version.to_string(),
            env: env
                .iter()
                .filter(|(k, _)| crate::scenario::ENV_KEYS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            capture: None,
            as_shipped: false,
            stated_engine: Vec::new(),
        };
        let mut engine = EngineConfig {
            alloc_conf: alloc_conf.to_string(),
            torch_minor: Some(version.0),
            ..EngineConfig::default()
        };
        apply_conditions(&conditions, version, &mut engine).map_err(|(_, why)| why)?;
        Ok(Rules { engine })
    }

    pub fn cublas_bytes(&self) -> u64 {
        self.engine.cublas_workspace_bytes()
    }

    pub fn cublas_cached(&self) -> bool {
        self.engine.workspace_mode() == CublasWorkspaceMode::Cached
    }

    pub fn lt_bytes(&self) -> u64 {
        self.engine.cublaslt_workspace_bytes()
    }

    pub fn lt_rule(&self) -> CublasLtWorkspace {
        self.engine.lt_workspace()
    }

    /// The backend PyTorch's dispatcher takes for `call` on this GPU, among
    /// the ones the program left enabled; an explicit `engine.sdpa_backend`
    /// would force one, a traced program forces through `sdpa_kernel`.
    pub fn sdpa_backend(&self, call: &SdpaCall, enabled: impl Fn(SdpaBackend) -> bool) -> SdpaBackend {
        call.backend_among(self.engine.sdpa_priority(), enabled)
    }
}

/// A dtype as the helper writes it (`float32`); None for one the engine
/// does not model.
pub fn dtype_named(name: &str) -> Option<DType> {
    [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F8,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::U8,
        DType::Bool,
    ]
    .into_iter()
    .find(|d| d.torch_name() == name)
}

/// `flash`, `efficient`, `math`, `cudnn`: the helper's names.
pub fn backend_name(b: SdpaBackend) -> &'static str {
    match b {
        SdpaBackend::Flash => "flash",
        SdpaBackend::Efficient => "efficient",
        SdpaBackend::Math => "math",
        SdpaBackend::Cudnn => "cudnn",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::profile;

    fn h100() -> &'static GpuProfile {
        profile("H100-SXM-80GB").expect("the H100 profile")
    }

    #[test]
    fn the_environment_sets_the_workspaces_as_a_scenario_env_does() {
        let env: BTreeMap<String, String> = [
            ("CUBLAS_WORKSPACE_CONFIG", ":4096:2:16:8"),
            ("CUBLASLT_WORKSPACE_SIZE", "1024"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let r = Rules::new(h100(), TorchVersion(11), &env, "").expect("valid env");
        assert_eq!(r.cublas_bytes(), 2 * 4096 * 1024 + 8 * 16 * 1024);
        assert_eq!(r.lt_bytes(), 1 << 20);
        assert_eq!(r.lt_rule(), CublasLtWorkspace::Cached);
        let bare = Rules::new(h100(), TorchVersion(11), &BTreeMap::new(), "").expect("no env");
        assert_eq!(bare.cublas_bytes(), 32 << 20, "Hopper's own default");
        let old = Rules::new(h100(), TorchVersion(8), &BTreeMap::new(), "").expect("2.8");
        assert_eq!(old.lt_rule(), CublasLtWorkspace::Transient);
    }

    #[test]
    fn a_bad_variable_is_named() {
        let env: BTreeMap<String, String> =
            [("TORCH_CUBLAS_WORKSPACE_CACHE".to_string(), "yes".to_string())].into();
        let e = Rules::new(h100(), TorchVersion(11), &env, "").expect_err("not 0 or 1");
        assert!(e.contains("TORCH_CUBLAS_WORKSPACE_CACHE"), "{e}");
    }

    #[test]
    fn releases_map_to_the_modelled_ones() {
        assert_eq!(release_of("2.11.0+cu130").0, TorchVersion(11));
        assert_eq!(release_of("2.17.0").0, TorchVersion::NEWEST);
        assert!(release_of("2.17.0").1.contains("nearest"));
        assert_eq!(release_of("2.1.0").0, TorchVersion::OLDEST);
    }
}
