//! The GPU panel (`v`) for an attached job: NVML's reading of the job's pid
//! on its GPU (found by bus id, not by number) beside the reserved bytes of
//! its stream, or why there is none. Readings are built here; the job is a
//! stream written here, through the live producer.

use std::io::Cursor;
use std::sync::Arc;

use serde_json::json;

use super::helpers::{app_finished, keys, opts, screen};
use crate::alloc::format_size;
use crate::device::nvml::{GpuReading, ProcessMemory};
use crate::device::{GpuUnavailable, PciAddress};
use crate::job::nvml_match::JobPlace;
use crate::job::synth::StreamWriter;
use crate::job::{open_recording, read_recording};
use crate::producers::{job_source, Source, SourceMsg};
use crate::tui::app::App;

const MIB: u64 = 1 << 20;
const PID: u64 = 4242;
/// The job's one segment, and what `memory_stats()` says it reserved.
const SEGMENT: u64 = 2048 * MIB;

fn bus(b: u32) -> PciAddress {
    PciAddress {
        domain: 0,
        bus: b,
        device: 0,
    }
}

/// A job on `cuda:0` (`device`: the hello's device entry) with one 2 GiB
/// segment holding a 512 MiB block, its stats, then `bye`.
fn job(device: serde_json::Value, place: JobPlace) -> App {
    let mut w = StreamWriter::recording();
    w.send(
        json!({"t": "hello", "protocol": 1, "pid": PID, "hostname": "node7",
        "mode": "agent", "stacks": false, "devices": [device]}),
    );
    w.send(json!({"t": "state", "seq": 0, "reason": "start", "chunks": 0}));
    let base = 0x7f00_0000_0000u64;
    w.send(json!({"t": "entries", "first": 0, "entries": [
        ["segment_alloc", 0, base, SEGMENT, 0, 1, null],
        ["alloc", 0, base, 512 * MIB, 0, 2, null]]}));
    w.send(json!({"t": "stats", "device": 0, "seq": 2,
        "stats": {"reserved_bytes.all.current": SEGMENT, "allocated_bytes.all.current": 512 * MIB}}));
    w.send(json!({"t": "bye", "reason": "the process is exiting"}));
    let frames =
        read_recording(Box::new(Cursor::new(w.bytes)), "job.vslive".into()).expect("a recording");
    let src = job_source(frames, None, None, Arc::default()).job_at(place);
    app_finished(vec![("pid 4242".into(), src)], &opts())
}

fn h100_device() -> serde_json::Value {
    json!({"device": 0, "name": "NVIDIA H100 80GB HBM3", "total_memory": 80u64 << 30,
           "pci_bus_id": "0000:3b:00.0", "uuid": null})
}

/// NVML here: an A100 at bus 1b (NVML's GPU 0) and the H100 at bus 3b
/// (NVML's GPU 1, the job's cuda:0 under CUDA_VISIBLE_DEVICES=1), where
/// `procs` run.
fn readings(procs: Vec<ProcessMemory>) -> Vec<GpuReading> {
    vec![
        GpuReading {
            pci: Some(bus(0x1b)),
            name: Some("NVIDIA A100".into()),
            processes: vec![ProcessMemory {
                pid: PID as u32,
                name: None,
                used: Some(MIB),
            }],
            ..GpuReading::unknown(0)
        },
        GpuReading {
            pci: Some(bus(0x3b)),
            name: Some("NVIDIA H100 80GB HBM3".into()),
            processes: procs,
            ..GpuReading::unknown(1)
        },
    ]
}

fn the_job(used: Option<u64>) -> Vec<ProcessMemory> {
    vec![
        ProcessMemory {
            pid: 99,
            name: None,
            used: Some(10 * MIB),
        },
        ProcessMemory {
            pid: PID as u32,
            name: Some("python".into()),
            used,
        },
    ]
}

fn show(app: &mut App, nvml: Result<Vec<GpuReading>, GpuUnavailable>) {
    app.gpu
        .attach(Source::from_messages([SourceMsg::Gpus(nvml)]));
    // At the live edge, where the stream's reserved bytes are.
    keys(app, "Gv");
    app.drain_sources();
}

/// The panel's rows and notes as text, one per line.
fn panel(app: &mut App) -> String {
    let _ = screen(app, 140, 44);
    let f = &app.gpu.frame;
    let mut out = vec![f.title.clone()];
    out.extend(f.rows.iter().map(|(k, v)| format!("{k}: {v}")));
    out.extend(f.notes.iter().cloned());
    out.join("\n")
}

#[test]
fn a_live_job_is_reconciled_with_nvml_by_bus_id_at_80x24_and_200x60() {
    let mut app = job(h100_device(), JobPlace::Here);
    show(&mut app, Ok(readings(the_job(Some(SEGMENT + 517 * MIB)))));
    let p = panel(&mut app);
    for want in [
        " GPU memory · live job pid 4242 · NVML vs its allocator ",
        "device: cuda:0 · NVIDIA H100 80GB HBM3 · NVML GPU 1, matched by PCI bus id",
        "NVML used: 2.50 GiB (pid 4242 on this GPU)",
        "job reserved: 2.00 GiB (from its stream; memory_stats() 2.00 GiB)",
        "difference: +517.00 MiB (context, workspaces, outside the caching allocator)",
        "CUDA context, cuBLAS/cuDNN workspaces, memory outside the caching allocator",
    ] {
        assert!(p.contains(want), "missing {want:?} in\n{p}");
    }
    // The A100's 1 MiB of the same pid is another GPU's.
    assert!(!p.contains(&format_size(MIB)), "{p}");
    let small = screen(&mut app, 80, 24);
    assert!(small.contains("NVML vs its allocator"), "{small}");
    assert!(small.contains("517.00 MiB"), "{small}");
    insta::assert_snapshot!("gpu_live_80x24", small);
    let large = screen(&mut app, 200, 60);
    assert!(large.contains("matched by PCI bus id"), "{large}");
    insta::assert_snapshot!("gpu_live_200x60", large);
}

#[test]
fn a_job_that_gave_no_ids_is_matched_by_ordinal_and_says_so() {
    let device = json!({"device": 0, "name": "NVIDIA A100", "total_memory": 40u64 << 30});
    let mut app = job(device, JobPlace::Here);
    show(&mut app, Ok(readings(the_job(Some(SEGMENT)))));
    let p = panel(&mut app);
    // NVML's GPU 0 is taken for cuda:0: its 1 MiB, and the note why.
    assert!(
        p.contains("NVML GPU 0, matched by CUDA ordinal only"),
        "{p}"
    );
    let used = format!("NVML used: {} (pid 4242", format_size(MIB));
    assert!(p.contains(&used), "{p}");
    let difference = format!("difference: -{} (", format_size(SEGMENT - MIB));
    assert!(p.contains(&difference), "{p}");
    assert!(p.contains("CUDA_VISIBLE_DEVICES can renumber"), "{p}");
    assert!(
        p.contains(
            "is older than the stream's reserved bytes, or NVML's GPU 0 is not the job's cuda:0"
        ),
        "{p}"
    );
}

#[test]
fn a_pid_nvml_does_not_see_is_said_not_guessed() {
    let mut app = job(h100_device(), JobPlace::Here);
    show(&mut app, Ok(readings(Vec::new())));
    let p = panel(&mut app);
    assert!(
        p.contains("NVML: no reading: NVML lists no process on GPU 1"),
        "{p}"
    );
    assert!(p.contains("job reserved: 2.00 GiB"), "{p}");
    assert!(!p.contains("difference"), "{p}");

    let mut app = job(h100_device(), JobPlace::Here);
    show(&mut app, Ok(readings(the_job(None)[..1].to_vec())));
    let p = panel(&mut app);
    assert!(
        p.contains("pid 4242 is not among the 1 process NVML lists on GPU 1"),
        "{p}"
    );

    let mut app = job(h100_device(), JobPlace::Here);
    show(&mut app, Ok(readings(the_job(None))));
    assert!(panel(&mut app).contains("does not report its memory"));
}

#[test]
fn a_job_on_another_host_or_a_recording_reads_no_nvml_and_says_why() {
    let remote = JobPlace::Remote {
        host: "10.0.0.7".into(),
    };
    let mut app = job(h100_device(), remote);
    show(&mut app, Ok(readings(the_job(Some(SEGMENT)))));
    let p = panel(&mut app);
    assert!(
        p.contains("another host (node7, reached over TCP at 10.0.0.7, not loopback)"),
        "{p}"
    );
    assert!(!p.contains("NVML used"), "{p}");

    // The shipped recording (its hello has no bus id: old recordings read).
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/live/peak-inside-step.vslive");
    let frames = open_recording(&path).expect("the fixture");
    let src = job_source(frames, None, None, Arc::default()).job_at(JobPlace::Recording);
    let mut app = app_finished(vec![("adam-step".into(), src)], &opts());
    show(&mut app, Ok(readings(the_job(Some(SEGMENT)))));
    let p = panel(&mut app);
    assert!(p.contains(" GPU memory · recorded job pid "), "{p}");
    assert!(
        p.contains("NVML: no reading: a recording: the job is not running here"),
        "{p}"
    );
}

/// With the real NVML: on a machine without a driver, the panel says so.
#[test]
fn without_nvml_here_the_panel_says_so() {
    if crate::device::nvml::available().is_ok() {
        eprintln!("NVML present: the no-NVML path cannot be exercised here");
        return;
    }
    let mut app = job(h100_device(), JobPlace::Here);
    keys(&mut app, "v");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !matches!(
        app.gpu.nvml,
        crate::tui::gpu_panel::NvmlState::Unavailable(_)
    ) {
        assert!(std::time::Instant::now() < deadline, "no answer from NVML");
        app.drain_sources();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let s = screen(&mut app, 120, 30);
    assert!(
        s.contains("NVML  no reading: NVML unavailable here: no NVIDIA driver found"),
        "{s}"
    );
    assert!(s.contains("job reserved  2.00 GiB"), "{s}");
    assert!(!s.contains("panicked"), "{s}");
}
