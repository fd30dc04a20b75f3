//! CUDA starts and `torch.cuda`'s answers: the device the helper is told
//! about (`hello`), the allocator config and rules read from the program's
//! environment (`init`), the stats, the SDPA backend the dispatcher takes,
//! and the program's holder walks passed on to the stream.

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::{json, Value};

use super::super::args::{bad, ok};
use super::super::error::TraceError;
use super::super::plans::{ORDERED_OPS, PLANNED_OPS, STAGED_OPS};
use super::super::rules::{
    after_ops, autocast_table, backend_name, dtype_named, release_of, Rules, HOST_OUTPUTS,
};
use super::{Reply, Simulator};
use crate::alloc::{AllocConfig, CachingAllocator};
use crate::device::{GpuProfile, SimDevice};
use crate::engine::ops::sdpa_select::SdpaCall;
use crate::engine::SdpaBackend;

impl<W: Write> Simulator<W> {
    pub(super) fn hello(&mut self, v: &Value) -> Value {
        let h = v.get(1).cloned().unwrap_or(Value::Null);
        self.pid = h.get("pid").and_then(Value::as_u64).unwrap_or(0);
        self.argv = crate::traced::message::strings(h.get("argv"));
        if let Some(t) = h.get("torch").and_then(Value::as_str) {
            let (version, rules) = release_of(t);
            self.version = version;
            self.outcome.torch = Some(t.to_string());
            self.outcome.rules = Some(rules);
        }
        let g = self.opts.gpu;
        json!({
            "device": {
                "name": g.product,
                "total_memory": g.total_memory,
                "major": g.arch.major(),
                "minor": minor_of(g),
                "sm_count": g.sm_count,
                "max_threads_per_sm": g.max_threads_per_sm,
            },
            "steps": self.opts.steps,
            "after_ops": after_ops(),
            "before_ops": PLANNED_OPS,
            "staged_ops": STAGED_OPS.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            "register_order": STAGED_OPS
                .iter()
                .filter_map(|(n, o)| o.map(|o| (n.to_string(), o.to_vec())))
                .chain(ORDERED_OPS.iter().map(|(n, o)| (n.to_string(), o.to_vec())))
                .collect::<BTreeMap<_, _>>(),
            "host_outputs": HOST_OUTPUTS.iter().map(|(n, i)| (n.to_string(), i.to_vec())).collect::<BTreeMap<_, _>>(),
            "sdpa": true,
            "autocast": autocast_table(),
            "holders_budget_ms": (self.opts.holders_budget_ms > 0.0).then_some(self.opts.holders_budget_ms),
        })
    }

    /// The program's holder walk (`["holders", fields]`: PROTOCOL.md
    /// `holders` but `t`, `seq`, `step` and `allocated`, which are the
    /// stream's and the allocator's, added here).
    pub(super) fn holders(&mut self, index: u64, v: &Value) -> Result<(), TraceError> {
        let Some(fields) = v.get(1).and_then(Value::as_object) else {
            return Err(bad(index, "holders: element 1 is not an object"));
        };
        self.emit()?;
        let allocated = self.alloc.as_ref().map(|a| a.stats().allocated_bytes());
        self.out.holders(fields, allocated)
    }

    /// CUDA starts: the allocator's config and the engine's rules from the
    /// program's environment (or `--conf`), read as PyTorch reads them then.
    pub(super) fn init(&mut self, v: &Value) -> Result<Reply, TraceError> {
        let env: BTreeMap<String, String> = v
            .get(1)
            .and_then(Value::as_object)
            .map(|o| {
                o.iter()
                    .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let (conf, from) = match (
            &self.opts.conf,
            env.get("PYTORCH_CUDA_ALLOC_CONF"),
            env.get("PYTORCH_ALLOC_CONF"),
        ) {
            (Some(c), _, _) => (c.clone(), "--conf".to_string()),
            (None, Some(c), _) => (
                c.clone(),
                "the program's PYTORCH_CUDA_ALLOC_CONF".to_string(),
            ),
            (None, None, Some(c)) => (c.clone(), "the program's PYTORCH_ALLOC_CONF".to_string()),
            (None, None, None) => (
                String::new(),
                "the default: no PYTORCH_CUDA_ALLOC_CONF".to_string(),
            ),
        };
        let config = match AllocConfig::parse_for(&conf, self.version) {
            Ok(c) => c,
            Err(e) => {
                return Ok(Some(json!([
                    "error",
                    format!("PYTORCH_CUDA_ALLOC_CONF {conf:?}: {e}")
                ])))
            }
        };
        let rules = match Rules::new(self.opts.gpu, self.version, &env, &conf) {
            Ok(r) => r,
            Err(e) => return Ok(Some(json!(["error", e]))),
        };
        self.start_device(config, rules, conf, from)?;
        Ok(ok())
    }

    fn start_device(
        &mut self,
        config: AllocConfig,
        rules: Rules,
        conf: String,
        from: String,
    ) -> Result<(), TraceError> {
        let g = self.opts.gpu;
        let device = SimDevice::new(g.product, g.total_memory, g.context_bytes.unwrap_or(0))
            .placed(g.placement);
        self.alloc = Some(CachingAllocator::new(device, config.clone()));
        self.kernels_started = false;
        self.config = config;
        self.rules = Some(rules);
        self.outcome.alloc_conf = conf.clone();
        self.outcome.alloc_conf_from = from;
        self.outcome.cuda_started = true;
        let hello = json!({
            "t": "hello", "protocol": 1, "pid": self.pid, "rank": 0, "world_size": 1,
            "hostname": Value::Null, "argv": self.argv, "torch": self.outcome.torch,
            "mode": "trace", "stacks": true, "poll_interval_s": Value::Null,
            "devices": [{"device": 0, "name": format!("{} (simulated)", g.product), "total_memory": g.total_memory,
                          "pci_bus_id": Value::Null, "uuid": Value::Null}],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": conf},
            "started_us": self.out.started_us(),
        });
        self.out.open(&hello)
    }

    pub(in crate::traced) fn allocator(
        &mut self,
    ) -> Result<&mut CachingAllocator<SimDevice>, TraceError> {
        if self.alloc.is_none() {
            let rules = Rules::new(self.opts.gpu, self.version, &BTreeMap::new(), "")
                .map_err(TraceError::Channel)?;
            let conf = self.opts.conf.clone().unwrap_or_default();
            let config = AllocConfig::parse_for(&conf, self.version)
                .map_err(|e| TraceError::Channel(format!("--conf {conf:?}: {e}")))?;
            self.start_device(config, rules, conf, "--conf or the default".into())?;
        }
        self.alloc
            .as_mut()
            .ok_or_else(|| TraceError::Channel("no simulated device".into()))
    }

    /// The SDPA backend PyTorch's dispatcher takes on this GPU.
    pub(super) fn sdpa(&mut self, v: &Value) -> Reply {
        let o = v.get(1).cloned().unwrap_or(Value::Null);
        let dtype = o.get("dtype").and_then(Value::as_str).and_then(dtype_named);
        let Some(dtype) = dtype else {
            return Some(json!(["ok", "math"]));
        };
        let call = SdpaCall {
            dtype,
            mask: o.get("mask").and_then(Value::as_bool).unwrap_or(false),
            dropout: o.get("dropout").and_then(Value::as_f64).unwrap_or(0.0),
            head_dim: o.get("head_dim").and_then(Value::as_u64).unwrap_or(0),
            gqa: o.get("gqa").and_then(Value::as_bool).unwrap_or(false),
        };
        let enabled = o.get("enabled").cloned().unwrap_or(Value::Null);
        let on = |b: SdpaBackend| {
            enabled
                .get(backend_name(b))
                .and_then(Value::as_bool)
                .unwrap_or(true)
        };
        let rules = match &self.rules {
            Some(r) => r.clone(),
            None => match Rules::new(self.opts.gpu, self.version, &BTreeMap::new(), "") {
                Ok(r) => r,
                Err(_) => return Some(json!(["ok", "math"])),
            },
        };
        let b = rules.sdpa_backend(&call, on);
        Some(json!(["ok", backend_name(b)]))
    }

    pub(super) fn stats_value(&self) -> Value {
        match &self.alloc {
            Some(a) => json!(a.stats().to_map(self.version.0 >= 12)),
            None => json!({}),
        }
    }
}

/// Compute capability minor of a profile's architecture.
fn minor_of(g: &GpuProfile) -> u32 {
    use crate::device::GpuArch::*;
    match g.arch {
        Sm75 => 5,
        Sm86 => 6,
        Sm89 => 9,
        _ => 0,
    }
}
