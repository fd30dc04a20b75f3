//! The run view's GPU memory panel (`v`): simulated terms labelled as such
//! with NVML's reason for being unavailable, and a CUDA run's reconciliation
//! from a reading built here.

use super::helpers::*;
use crate::alloc::format_size;
use crate::device::nvml::{GpuReading, ProcessMemory};
use crate::device::{GpuUnavailable, PciAddress};
use crate::producers::{RunMsg, ScenarioMsg, Source, SourceMsg};

const MIB: u64 = 1 << 20;

fn no_driver() -> Source {
    Source::from_messages([SourceMsg::Gpus(Err(GpuUnavailable::NoNvml(
        "libnvidia-ml.so.1: cannot open shared object file".into(),
    )))])
}

#[test]
fn simulated_run_shows_simulated_terms_and_why_nvml_is_unavailable() {
    let (_, built) = crate::scenario::resolve(FIXED).expect("built-in");
    let (capacity, overhead) = (built.engine.device_bytes, built.engine.device_overhead);
    assert!(overhead > 0, "{FIXED} sets a context overhead");
    let gpu = built.conditions.gpu.expect("{FIXED} names its GPU");
    let capture = built.conditions.capture.clone().expect("and its capture");
    let mut app = app_finished(vec![(FIXED.into(), scenario(FIXED))], &opts());
    app.gpu.attach(no_driver());
    keys(&mut app, "G");
    let before = screen(&mut app, 140, 44);
    assert!(!before.contains("GPU memory ·"), "hidden until v");
    keys(&mut app, "v");
    app.drain_sources();
    let out = screen(&mut app, 140, 44);
    let reserved = app.runs[0].map.reserved;
    assert!(reserved > 0);
    for want in [
        "GPU memory · simulated device".to_string(),
        format!("simulated capacity  {}", format_size(capacity)),
        format!(
            "simulated context  {} (CUDA context and other memory outside the allocator)",
            format_size(overhead)
        ),
        format!(
            "GPU profile  {} ({}, {} SMs",
            gpu.name,
            gpu.arch.name(),
            gpu.sm_count
        ),
        format!("PyTorch rules  {}", built.conditions.torch),
        "checked as shipped against the capture".to_string(),
        format!("{capture}.pickle"),
        format!("allocator reserved  {}", format_size(reserved)),
        format!(
            "simulated free  {}",
            format_size(capacity - overhead - reserved)
        ),
        "simulated run: no real GPU memory is used".to_string(),
        "no NVIDIA driver found".to_string(),
    ] {
        assert!(out.contains(&want), "missing {want:?} in\n{out}");
    }
    insta::assert_snapshot!("gpu_panel_simulated_140x44", out);
    // Esc closes it.
    app.handle_key(code(crossterm::event::KeyCode::Esc));
    assert!(!app.gpu.shown);
}

#[test]
fn help_lists_the_gpu_panel_key() {
    let mut app = leaky_app();
    keys(&mut app, "?");
    let out = screen(&mut app, 140, 44);
    assert!(
        out.contains("GPU memory: NVML's reading vs the model"),
        "{out}"
    );
}

/// Under `CUDA_VISIBLE_DEVICES=1`, `cuda:0` is NVML's GPU 1: the panel finds
/// the reading by PCI address, not by number.
#[test]
fn cuda_run_reconciles_nvml_with_the_model() {
    let events = recorded_events(FIXED);
    let bus = |bus| PciAddress {
        domain: 0,
        bus,
        device: 0,
    };
    let src = Source::from_messages([
        SourceMsg::Scenario(ScenarioMsg::ContextBaseline(Some(500 * MIB))),
        SourceMsg::Run(RunMsg::Events(events)),
        SourceMsg::Run(RunMsg::Finished),
    ])
    .with_capacity(80 << 30)
    .on_cuda(0, Some(bus(0x3b)));
    let mut app = app_with(vec![("cuda".into(), src)], &opts());
    let (tx, rx) = flume::unbounded();
    app.gpu.attach(Source::new(rx, None));
    let reserved = app.runs[0].timeline.head().reserved;
    let used = 500 * MIB + reserved + 96 * MIB;
    let another = GpuReading {
        pci: Some(bus(0x1b)),
        name: Some("NVIDIA A100".into()),
        total: Some(40 << 30),
        used: Some(3 << 30),
        free: Some(37 << 30),
        ..GpuReading::unknown(0)
    };
    tx.send(SourceMsg::Gpus(Ok(vec![
        another,
        GpuReading {
            pci: Some(bus(0x3b)),
            name: Some("NVIDIA H100".into()),
            total: Some(80 << 30),
            used: Some(used + 1024 * MIB),
            free: Some((80 << 30) - used - 1024 * MIB),
            processes: vec![ProcessMemory {
                pid: std::process::id(),
                name: None,
                used: Some(used),
            }],
            ..GpuReading::unknown(1)
        },
    ])))
    .expect("send");
    keys(&mut app, "v");
    app.drain_sources();
    let out = screen(&mut app, 140, 44);
    for want in [
        "GPU memory · cuda:0 · NVML vs model".to_string(),
        format!("NVML used  {} (this process)", format_size(used)),
        "CUDA context  500.00 MiB (baseline)".to_string(),
        format!("model reserved  {}", format_size(reserved)),
        "other  96.00 MiB (cuBLAS, workspaces, non-PyTorch)".to_string(),
    ] {
        assert!(out.contains(&want), "missing {want:?} in\n{out}");
    }
    assert!(!out.contains("NVML unavailable"), "{out}");
}

#[test]
fn cuda_run_without_a_reading_says_unknown() {
    let src = Source::from_messages([SourceMsg::Run(RunMsg::Finished)]).on_cuda(0, None);
    let mut app = app_with(vec![("cuda".into(), src)], &opts());
    app.gpu.attach(no_driver());
    keys(&mut app, "v");
    app.drain_sources();
    let out = screen(&mut app, 140, 44);
    assert!(out.contains("NVML used  unknown (this process)"), "{out}");
    assert!(out.contains("CUDA context  unknown (baseline)"), "{out}");
    assert!(out.contains("other  unknown"), "{out}");
    assert!(!out.contains("other  0 bytes"), "{out}");
}

#[test]
fn scenario_source_carries_the_simulated_overhead() {
    let (scenario, built) = crate::scenario::resolve("tour").expect("built-in");
    let overhead = built.engine.device_overhead;
    let src = crate::producers::scenario_source(scenario, built, std::time::Duration::ZERO);
    assert_eq!((src.overhead, src.cuda), (Some(overhead), None));
}
