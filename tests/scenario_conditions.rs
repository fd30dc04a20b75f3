//! What a scenario says it runs under — `device.gpu`, `torch`, `env`,
//! `capture` — and what that makes of the run: the memory, the workspaces,
//! the reductions' scratch, the report's first lines; and for a condition
//! that cannot hold, the error at its place in the file.

use vramscope::engine::{CublasLtWorkspace, CublasWorkspaceMode, GpuArch};
use vramscope::scenario::{load_str, run, LoadError, RunOptions};

mod common;

use common::{vramscope, VALID};

const DEVICE: &str = r#"device: (name: "sim", capacity: "1GiB", overhead: "100MiB"),"#;

fn with_device(device: &str) -> String {
    assert!(VALID.contains(DEVICE), "the base file changed");
    VALID.replace(DEVICE, device)
}

fn with_extra(extra: &str) -> String {
    VALID.replace(
        "    model: Preset(\"mlp-mnist\"),",
        &format!("    {extra}\n    model: Preset(\"mlp-mnist\"),"),
    )
}

/// The error's line, column and message; panics on a file that loads.
fn refused(text: &str) -> (usize, usize, String) {
    match load_str(text, "c.ron") {
        Err(LoadError::At {
            line,
            column,
            message,
            ..
        }) => (line, column, message),
        Err(other) => panic!("not a positioned error: {other:?}"),
        Ok(_) => panic!("loaded:\n{text}"),
    }
}

fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("{needle} not in the text"))
}

#[test]
fn a_gpu_profile_alone_gives_the_cards_memory_context_and_architecture() {
    let text = with_device(r#"device: (gpu: "H100-SXM-80GB"),"#);
    let (_, built) = load_str(&text, "c.ron").expect("loads");
    let c = &built.conditions;
    // Measured on the capture machine: totalGlobalMem and the context.
    assert_eq!(c.capacity, 85_017_493_504);
    assert_eq!(c.overhead, 552_402_944);
    assert_eq!(c.device_name, "NVIDIA H100 80GB HBM3");
    assert_eq!(built.engine.arch(), GpuArch::Sm90);
    assert_eq!(built.engine.cublas_workspace_bytes(), 32 << 20);
    assert_eq!(built.engine.cublaslt_workspace_bytes(), 1 << 20);
    let reduce = built.engine.reduce_device.expect("132 SMs for reductions");
    assert_eq!((reduce.sm_count, reduce.max_threads_per_sm), (132, 2048));
}

#[test]
fn a_profile_name_is_matched_without_case_and_a_capacity_holds_the_card_to_less() {
    let text = with_device(r#"device: (gpu: "a100-sxm-40gb", capacity: "2GiB"),"#);
    let (_, built) = load_str(&text, "c.ron").expect("loads");
    assert_eq!(built.conditions.capacity, 2 << 30);
    assert_eq!(
        built.conditions.overhead, 0,
        "the A100's context was never measured, so none is assumed"
    );
    assert_eq!(built.engine.arch(), GpuArch::Sm80);
    assert_eq!(built.engine.cublas_workspace_bytes(), 8_519_680);
}

#[test]
fn without_a_profile_the_run_keeps_engine_defaults_and_takes_no_reduction_scratch() {
    let (_, built) = load_str(VALID, "c.ron").expect("loads");
    assert!(built.conditions.gpu.is_none());
    assert!(built.engine.reduce_device.is_none());
    assert_eq!(built.engine.arch(), GpuArch::Sm80);
}

#[test]
fn an_unknown_gpu_is_refused_at_its_name_with_the_known_ones() {
    let text = with_device(r#"device: (gpu: "H200", capacity: "1GiB"),"#);
    let (line, _, message) = refused(&text);
    assert_eq!(line, line_of(&text, "H200"));
    assert!(message.contains("unknown GPU \"H200\""), "{message}");
    assert!(
        message.contains("H100-SXM-80GB") && message.contains("T4"),
        "{message}"
    );
}

#[test]
fn a_capacity_beyond_the_card_and_a_device_with_neither_are_refused() {
    let text = with_device(r#"device: (gpu: "T4", capacity: "40GiB"),"#);
    let (_, _, message) = refused(&text);
    assert!(message.contains("more than the T4's"), "{message}");

    let text = with_device(r#"device: (name: "sim"),"#);
    let (_, _, message) = refused(&text);
    assert!(
        message.contains("required unless device.gpu names a GPU"),
        "{message}"
    );
}

#[test]
fn env_sets_the_workspaces_and_their_caching() {
    let text = with_extra(
        r#"env: {"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8", "CUBLASLT_WORKSPACE_SIZE": "2048", "TORCH_CUBLAS_WORKSPACE_CACHE": "0"},"#,
    );
    let (_, built) = load_str(&text, "c.ron").expect("loads");
    assert_eq!(built.engine.cublas_workspace_bytes(), 8_519_680);
    assert_eq!(built.engine.cublaslt_workspace_bytes(), 2 << 20);
    assert_eq!(built.engine.workspace_mode(), CublasWorkspaceMode::Eager);
    assert_eq!(
        built
            .conditions
            .env
            .get("CUBLASLT_WORKSPACE_SIZE")
            .map(String::as_str),
        Some("2048")
    );
}

#[test]
fn env_values_pytorch_could_not_use_are_refused_at_the_variable() {
    for (env, says) in [
        (
            r#"env: {"CUBLAS_WORKSPACE_CONFIG": "4096x8"},"#,
            ":SIZE_KiB:COUNT pairs",
        ),
        (
            r#"env: {"CUBLAS_WORKSPACE_CONFIG": ":18446744073709551615:2"},"#,
            ":SIZE_KiB:COUNT pairs",
        ),
        (
            r#"env: {"CUBLASLT_WORKSPACE_SIZE": "1MiB"},"#,
            "in KiB, a whole number",
        ),
        (
            r#"env: {"CUBLASLT_WORKSPACE_SIZE": "18446744073709551615"},"#,
            "in KiB, a whole number",
        ),
        (
            r#"env: {"TORCH_CUBLAS_WORKSPACE_CACHE": "yes"},"#,
            "is 0 or 1",
        ),
        (
            r#"env: {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},"#,
            "not a variable that changes what the allocator sees",
        ),
    ] {
        let text = with_extra(env);
        let (line, _, message) = refused(&text);
        assert_eq!(line, line_of(&text, "env: {"), "{env}");
        assert!(message.contains(says), "{env}: {message}");
    }
}

#[test]
fn a_setting_made_twice_is_a_conflict_not_an_override() {
    let text = with_extra(
        r#"env: {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
    engine: (cublas_workspace_config: Some(":4096:2")),"#,
    );
    let (_, _, message) = refused(&text);
    assert!(
        message.contains("say the same thing; keep one"),
        "{message}"
    );

    let text = with_device(r#"device: (gpu: "L4"),"#).replace(
        "    model:",
        "    engine: (gpu_arch: Some(Sm90)),\n    model:",
    );
    let (_, _, message) = refused(&text);
    assert!(message.contains("gpu"), "{message}");
}

#[test]
fn the_release_decides_how_addmm_keeps_its_cublaslt_workspace() {
    let (_, built) = load_str(&with_extra(r#"torch: "2.11","#), "c.ron").expect("loads");
    assert_eq!(built.engine.lt_workspace(), CublasLtWorkspace::Cached);
    let (_, built) = load_str(&with_extra(r#"torch: "2.7","#), "c.ron").expect("loads");
    assert_eq!(built.engine.lt_workspace(), CublasLtWorkspace::Transient);
    let (_, built) = load_str(VALID, "c.ron").expect("loads");
    assert_eq!(
        built.engine.lt_workspace(),
        CublasLtWorkspace::Cached,
        "the default release is 2.11"
    );
}

#[test]
fn the_report_says_what_the_run_was_under() {
    let text = with_device(r#"device: (gpu: "H100-SXM-80GB", capacity: "1GiB"),"#);
    let text = text.replace(
        "    model:",
        "    env: {\"CUBLASLT_WORKSPACE_SIZE\": \"1024\"},\n    model:",
    );
    let (sc, built) = load_str(&text, "c.ron").expect("loads");
    let r = run(
        &sc,
        &built,
        &RunOptions {
            iterations: Some(1),
            record_events: false,
        },
    );
    let checks = vramscope::scenario::check(&sc.expect, &r);
    let report = vramscope::report::run::text(&sc, &r, &checks);
    assert!(
        report
            .contains("GPU profile H100-SXM-80GB: sm_90, 132 SMs × 2048 threads; measured memory"),
        "{report}"
    );
    assert!(
        report.contains(
            "PyTorch 2.11 rules; PYTORCH_CUDA_ALLOC_CONF=\"\"; CUBLASLT_WORKSPACE_SIZE=1024"
        ),
        "{report}"
    );
    assert!(report.contains("not checked against a capture"), "{report}");
    let json = vramscope::report::run::json(&r, &checks);
    assert_eq!(json["conditions"]["gpu"]["name"], "H100-SXM-80GB");
    assert_eq!(json["conditions"]["torch"], "2.11");
    assert_eq!(json["conditions"]["capacity"], 1u64 << 30);
}

#[test]
fn help_states_the_default_release() {
    let (code, out, _) = vramscope(&["run", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("default 2.11"), "{out}");
}

#[test]
fn only_the_shipped_text_is_reported_as_checked_against_its_capture() {
    let shipped = vramscope::scenario::builtin("zero-grad-fixed").expect("built-in");
    let (_, built) = load_str(shipped.source, "zero-grad-fixed.ron").expect("loads");
    assert!(built.conditions.as_shipped);
    assert!(
        built
            .conditions
            .verification()
            .starts_with("checked as shipped against the capture"),
        "{}",
        built.conditions.verification()
    );
    let edited = shipped.source.replace("iterations: 10", "iterations: 11");
    assert_ne!(edited, shipped.source);
    let (_, built) = load_str(&edited, "mine.ron").expect("loads");
    assert!(!built.conditions.as_shipped);
    assert!(
        built
            .conditions
            .verification()
            .contains("is not a built-in scenario as shipped"),
        "{}",
        built.conditions.verification()
    );
}
