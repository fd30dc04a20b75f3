//! `attach --json`/`--headless`: the `live.nvml` entry per device of the
//! job, NVML read once at the end, or why not (a recording; no NVML here).

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;

use serde_json::{json, Value};
use vramscope::device::nvml;
use vramscope::job::frame::FrameReader;
use vramscope::job::synth::StreamWriter;

const FIXTURE: &str = "tests/fixtures/live/peak-inside-step.vslive";
const SEGMENT: u64 = 1 << 30;

#[test]
fn a_recording_reads_no_nvml_and_says_why_in_json_and_text() {
    let (code, out, err) = common::vramscope(&["attach", "--replay", FIXTURE, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    let entries = v["live"]["nvml"].as_array().expect("live.nvml");
    assert_eq!(
        entries.len(),
        v["devices"].as_array().expect("devices").len()
    );
    for e in entries {
        let why = e["unavailable"].as_str().expect("why");
        assert!(
            why.contains("a recording: the job is not running here"),
            "{why}"
        );
        assert!(e.get("used_by_process").is_none() && e.get("difference").is_none());
        // What the stream says stays: the job's reserved bytes at its end.
        assert_eq!(e["reserved"], v["devices"][0]["reserved"], "{e}");
    }
    let (code, out, err) = common::vramscope(&["attach", "--replay", FIXTURE, "--headless"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("nvml cuda:0: reserved ") && out.contains("no NVML reading: a recording"),
        "{out}"
    );
}

/// A job on this machine (a unix socket) whose hello names its GPU's bus id.
fn serve_job(path: &std::path::Path) -> std::thread::JoinHandle<()> {
    let mut w = StreamWriter::stream();
    w.send(
        json!({"t": "hello", "protocol": 1, "pid": 4242, "mode": "agent",
        "devices": [{"device": 0, "name": "NVIDIA H100 80GB HBM3",
                     "pci_bus_id": "0000:3b:00.0", "uuid": "GPU-8e3c"}]}),
    );
    w.send(json!({"t": "state", "seq": 0, "reason": "start", "chunks": 0}));
    w.send(json!({"t": "entries", "first": 0, "entries": [
        ["segment_alloc", 0, 0x7f00_0000_0000u64, SEGMENT, 0, 1, null]]}));
    w.send(json!({"t": "bye", "reason": "done"}));
    let l = UnixListener::bind(path).expect("bind");
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut frames = FrameReader::new(&mut s, "server");
        let _ = frames.next_frame().expect("read").expect("client hello");
        s.write_all(&w.bytes).expect("write");
        let _ = s.read(&mut [0u8; 1]);
    })
}

#[test]
fn a_job_here_is_compared_with_nvml_or_told_why_not() {
    let dir = common::temp_dir("nvml");
    let path = dir.join("job.sock");
    let server = serve_job(&path);
    let (code, out, err) = common::vramscope(&["attach", path.to_str().expect("utf-8"), "--json"]);
    server.join().expect("server");
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    let e = &v["live"]["nvml"][0];
    assert_eq!(e["device"], 0);
    assert_eq!(e["reserved"], SEGMENT);
    let why = e["unavailable"].as_str().expect("no reading of pid 4242");
    if nvml::available().is_err() {
        assert!(
            why.starts_with("NVML unavailable here: no NVIDIA driver found"),
            "{why}"
        );
    } else {
        // A GPU here: no such bus id, or no process 4242 on it.
        assert!(why.contains("0000:3b:00") || why.contains("4242"), "{why}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
