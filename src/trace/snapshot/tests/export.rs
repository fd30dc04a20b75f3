//! Export: round trips, and Python reading what we write.

use super::*;

/// Segments, traces, annotations and settings with every stack resolved, so
/// two imports compare equal whatever ids their tables assigned.
fn resolved(s: &Snapshot) -> String {
    let stack = |id: FramesId| -> Vec<&Frame> { s.frames.resolve(id).collect() };
    let mut out = String::new();
    for g in &s.segments {
        let blocks: Vec<_> = g
            .blocks
            .iter()
            .map(|b| {
                (
                    b.address,
                    b.size,
                    b.requested_size,
                    b.state,
                    stack(b.frames),
                )
            })
            .collect();
        out += &format!(
            "{:?}\n",
            (
                g.device,
                g.address,
                g.total_size,
                g.allocated_size,
                g.active_size,
                g.requested_size,
                g.stream,
                g.segment_type,
                g.pool_id,
                g.is_expandable,
                stack(g.frames),
                blocks
            )
        );
    }
    for (d, t) in s.device_traces.iter().enumerate() {
        for e in t {
            out += &format!(
                "{d} {:?}\n",
                (
                    s.action_name(e),
                    e.addr,
                    e.size,
                    e.stream,
                    s.extra(e),
                    e.time_us(),
                    stack(e.frames)
                )
            );
        }
    }
    out += &format!("{:?}\n{:?}\n", s.allocator_settings, s.external_annotations);
    out
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn export_round_trips_every_real_file() {
    for (name, bytes) in real_files() {
        let a = import_bytes(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let out = export_bytes(&a);
        let b = import_bytes(&out).unwrap_or_else(|e| panic!("{name} re-import: {e}"));
        assert_eq!(a.segments.len(), b.segments.len(), "{name}");
        assert!(resolved(&a) == resolved(&b), "{name}: round trip differs");
        // Memo sharing keeps the export near the original size.
        assert!(
            out.len() < bytes.len() * 2,
            "{name}: {} vs {}",
            out.len(),
            bytes.len()
        );
        if a.layout != Layout::LegacyList {
            // Same ids too: import order is deterministic.
            assert_eq!(a.segments, b.segments, "{name}");
            assert_eq!(a.device_traces, b.device_traces, "{name}");
        }
    }
}

/// Python's own `pickle` reads an export with the key sets SCHEMA.md lists.
#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn python_reads_exports() {
    let check = r#"
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
assert isinstance(d, dict), type(d)
assert list(d)[:2] == ["segments", "device_traces"], list(d)
assert set(d) <= {"segments", "device_traces", "allocator_settings", "external_annotations"}
seg_keys = ["device", "address", "total_size", "allocated_size", "active_size", "requested_size",
            "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"]
for s in d["segments"]:
    assert list(s) == seg_keys, list(s)
    assert isinstance(s["segment_pool_id"], tuple) and isinstance(s["is_expandable"], bool)
    for b in s["blocks"]:
        assert list(b) == ["address", "size", "requested_size", "state", "frames"], list(b)
        for f in b["frames"]:
            assert set(f) == {"filename", "line", "name"} and isinstance(f["line"], int)
assert isinstance(d["device_traces"], list)
for t in d["device_traces"]:
    for e in t:
        assert isinstance(e["action"], str) and isinstance(e["size"], int)
        assert ("addr" in e) != (e["action"] == "oom"), e
        assert ("device_free" in e) == (e["action"] == "oom"), e
if "allocator_settings" in d:
    a = d["allocator_settings"]
    assert isinstance(a["PYTORCH_CUDA_ALLOC_CONF"], str) and isinstance(a["max_split_size"], int)
    assert isinstance(a["garbage_collection_threshold"], float)
    assert isinstance(a["expandable_segments"], bool)
    r = a["roundup_power2_divisions"]
    assert list(r) == [str(1 << i) for i in range(16)] and all(isinstance(v, int) for v in r.values())
for x in d.get("external_annotations", []):
    assert set(x) == {"stage", "name", "device", "time_us"}
print("ok", len(d["segments"]))
"#;
    assert!(
        std::process::Command::new("python3")
            .arg("--version")
            .output()
            .is_ok(),
        "python3 is needed for this test (Debian/Ubuntu: sudo apt-get install python3)"
    );
    let dir = crate::scratch::temp_dir("export-python");
    for stem in [
        "code-location_expandable_3gpu_oom",
        "flexgen_legacy-history-blocks",
        "layout-editing_legacy-segment-list_device1",
        "cs336-magma_windows_user-metadata",
        "verl_private-pools_pending-free_state-only",
    ] {
        let out = dir.join(format!("{stem}.pickle"));
        std::fs::write(&out, export_bytes(&load(stem))).expect("write export");
        let run = std::process::Command::new("python3")
            .arg("-c")
            .arg(check)
            .arg(&out)
            .output()
            .expect("python3 runs");
        assert!(
            run.status.success(),
            "{stem}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
