//! `vramscope model SPEC`: a model's parameters, buffers and the activation
//! bytes autograd saves per sample, per module; `--list`: the presets.

use std::process::ExitCode;

use serde_json::json;
use vramscope::alloc::format_size;
use vramscope::engine::summary::ModelSummary;
use vramscope::engine::{EngineConfig, Evidence, ModelConfig, PRESET_CATALOGUE};
use vramscope::scenario::{builtin, resolve, ModelSpec};
use vramscope::units::format_count;

use super::BadInput;

/// How the per-sample column is obtained, said wherever it is shown.
const SAVED_HOW: &str = "saved/sample: bytes of the storages autograd saves for backward after one forward pass at batch 1 through the engine (`out = model(x)`, no loss), each under the module whose op allocated it";

pub fn list(json_out: bool) -> anyhow::Result<ExitCode> {
    if json_out {
        let presets: Vec<_> = PRESET_CATALOGUE
            .iter()
            .map(|p| {
                json!({"name": p.name, "about": p.about, "evidence": p.evidence.label(),
                       "evidence_in_words": p.evidence.sentence()})
            })
            .collect();
        sayjson!(&json!({ "presets": presets }));
        return Ok(ExitCode::SUCCESS);
    }
    let width = PRESET_CATALOGUE
        .iter()
        .map(|p| p.name.len())
        .max()
        .unwrap_or(0);
    for p in PRESET_CATALOGUE {
        sayln!("{:<width$} {:<26} {}", p.name, p.evidence.label(), p.about);
    }
    sayln!(
        "\nverified: a scenario on the preset matches an H100 capture (PyTorch 2.11); with \
         conditions: only with settings that scenario states (measured cuDNN workspaces, a forced \
         SDPA kernel), which `vramscope model NAME` names"
    );
    Ok(ExitCode::SUCCESS)
}

/// The model SPEC names, what checks its figures, what it assumes or leaves
/// out (a config.json family's notes, a mixture of experts' routing), and
/// (for a scenario) its engine switches.
fn model_of(spec: &str) -> Result<Model, BadInput> {
    let evidence_of = |name: &str| {
        PRESET_CATALOGUE
            .iter()
            .find(|p| p.name == name)
            .map_or(Evidence::SourceOnly, |p| p.evidence)
    };
    let said = |e: Evidence| e.sentence();
    if let Some(cfg) = ModelConfig::preset(spec) {
        return Ok((cfg, said(evidence_of(spec)), Vec::new(), None));
    }
    if spec.ends_with(".json") {
        let (cfg, notes) =
            vramscope::engine::hf_config::read_with_notes(std::path::Path::new(spec))
                .map_err(|e| BadInput(e.to_string()))?;
        return Ok((cfg, said(Evidence::SourceOnly), notes, None));
    }
    let (scenario, built) = resolve(spec).map_err(|e| {
        BadInput(format!(
            "{e}\n(SPEC is a preset — `vramscope model --list` — or a scenario)"
        ))
    })?;
    let evidence = match (&scenario.model, builtin(spec), &built.conditions.capture) {
        (ModelSpec::Preset(name), _, _) => said(evidence_of(name)),
        (_, Some(_), Some(capture)) => {
            let stated = &built.conditions.stated_engine;
            let base =
                format!("verified on hardware: this scenario matches the H100 capture `{capture}`");
            if stated.is_empty() {
                base
            } else {
                format!("{base} with the settings it states ({})", stated.join(", "))
            }
        }
        _ => said(Evidence::SourceOnly),
    };
    let notes = built
        .conditions
        .assumptions
        .iter()
        .map(|a| format!("data-dependent, as the scenario states it: {a}"))
        .collect();
    Ok((built.model, evidence, notes, Some(built.engine)))
}

/// A model, what checks its figures, its notes and its engine switches.
type Model = (ModelConfig, String, Vec<String>, Option<EngineConfig>);

pub fn show(spec: &str, json_out: bool) -> anyhow::Result<ExitCode> {
    let (cfg, evidence, notes, engine) = model_of(spec)?;
    let s = ModelSummary::measure_with(&cfg, engine.unwrap_or_default())
        .map_err(|e| BadInput(format!("{spec}: {e}")))?;
    if json_out {
        let mut v = serde_json::to_value(&s)?;
        v["model"] = json!(spec);
        v["evidence"] = json!(evidence);
        v["saved_bytes_how"] = json!(SAVED_HOW);
        v["notes"] = json!(notes);
        sayjson!(&v);
        return Ok(ExitCode::SUCCESS);
    }
    sayln!("{spec}: {evidence}");
    for n in &notes {
        sayln!("note: {n}");
    }
    sayln!(
        "parameters            {} ({} trainable) in {} tensors",
        format_count(s.parameters),
        format_count(s.trainable_parameters),
        s.parameter_tensors
    );
    sayln!(
        "buffers               {} tensors, {}",
        s.buffers,
        format_size(s.buffer_bytes)
    );
    let dtypes: Vec<String> = s
        .bytes_by_dtype
        .iter()
        .map(|(d, b)| format!("{d} {}", format_size(*b)))
        .collect();
    sayln!("parameters + buffers  {}", dtypes.join(", "));
    if s.trainable_parameters > 0 && s.trainable_parameters < s.parameters {
        let trainable: Vec<String> = s
            .trainable_bytes_by_dtype
            .iter()
            .map(|(d, b)| format!("{d} {}", format_size(*b)))
            .collect();
        sayln!("trainable             {}", trainable.join(", "));
    }
    sayln!(
        "saved activations     {} per sample (input {:?})",
        format_size(s.saved_bytes_per_sample),
        s.sample_input
    );
    if s.checkpoint_input_bytes > 0 {
        sayln!(
            "checkpoint inputs     {} per sample kept by checkpoint regions to recompute from",
            format_size(s.checkpoint_input_bytes)
        );
    }
    println!();
    // As wide as the longest path, so the figures stay in their columns.
    let w = s
        .modules
        .iter()
        .map(|r| r.module.chars().count())
        .max()
        .unwrap_or(0)
        .max(36);
    sayln!(
        "{:<w$} {:>14} {:>14} {:>14}",
        "module",
        "parameters",
        "trainable",
        "saved/sample"
    );
    for r in &s.modules {
        let saved = if r.saved_bytes_per_sample == 0 {
            "-".to_string()
        } else {
            format_size(r.saved_bytes_per_sample)
        };
        sayln!(
            "{:<w$} {:>14} {:>14} {:>14}",
            r.module,
            format_count(r.parameters),
            format_count(r.trainable_parameters),
            saved
        );
    }
    println!();
    sayln!("{SAVED_HOW}.");
    Ok(ExitCode::SUCCESS)
}
