//! The snapshot commands as a user runs them: open, replay --verify, what-if, export.

mod common;

use common::{json, real, vramscope};

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn replay_verify_json_reports_every_device() {
    let file = real("code-location_expandable_3gpu_oom.pickle");
    let (code, out, err) =
        vramscope(&["replay", file.to_str().expect("utf8"), "--verify", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    assert_eq!(v["ok"], true);
    let devices = v["devices"].as_array().expect("devices");
    assert_eq!(devices.len(), 3);
    for d in devices {
        for key in [
            "device",
            "entries",
            "allocs",
            "alloc_addr_match",
            "segment_events",
            "segment_event_match",
            "final_state_match",
            "replayable_from",
        ] {
            assert!(d.get(key).is_some(), "missing {key}");
        }
        assert_eq!(d["allocs"], d["alloc_addr_match"]);
        assert_eq!(d["segment_events"], d["segment_event_match"]);
    }
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn what_if_puts_the_original_config_first() {
    let file = real("sqattn_segment-churn.pickle");
    let (code, out, err) = vramscope(&[
        "replay",
        file.to_str().expect("utf8"),
        "--conf",
        "expandable_segments:True",
        "--conf",
        "max_split_size_mb:128",
        "--capacity",
        "8GiB",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let d = &v["devices"][0];
    assert_eq!(d["capacity"], 8u64 << 30);
    let configs = d["configs"].as_array().expect("configs");
    let confs: Vec<&str> = configs
        .iter()
        .map(|c| c["conf"].as_str().expect("conf"))
        .collect();
    assert_eq!(
        confs,
        vec!["", "expandable_segments:True", "max_split_size_mb:128"]
    );
    for c in configs {
        for key in [
            "peak_reserved",
            "peak_allocated",
            "reserved_end",
            "largest_free_at_worst",
            "fragmentation_at_worst",
            "num_alloc_retries",
            "ooms",
            "segments",
        ] {
            assert!(c.get(key).is_some(), "missing {key}");
        }
        assert!(
            c["peak_reserved"].as_u64().expect("n") <= 8 << 30,
            "never above the device"
        );
        assert!(
            c["peak_allocated"].as_u64().expect("n") <= c["peak_reserved"].as_u64().expect("n")
        );
    }
    // Expandable segments map pages on demand: reserved never peaks higher than with
    // whole 20 MiB+ segments for the same requests.
    assert!(configs[1]["peak_reserved"].as_u64() <= configs[0]["peak_reserved"].as_u64());
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn a_what_if_config_equal_to_the_files_own_is_listed_once() {
    // sqattn ran with the default config, which "" is.
    let file = real("sqattn_segment-churn.pickle");
    let (code, out, err) = vramscope(&[
        "replay",
        file.to_str().expect("utf8"),
        "--conf",
        "",
        "--conf",
        "expandable_segments:True",
        "--conf",
        "expandable_segments:True",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let confs: Vec<&str> = v["devices"][0]["configs"]
        .as_array()
        .expect("configs")
        .iter()
        .map(|c| c["conf"].as_str().expect("conf"))
        .collect();
    assert_eq!(confs, vec!["", "expandable_segments:True"]);
    assert!(err.contains("is the snapshot's own config"), "{err}");
    assert!(err.contains("repeats an earlier --conf"), "{err}");
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn what_if_reports_ooms_instead_of_crashing() {
    let file = real("adam-step_closed-trace_annotations.pickle");
    let (code, out, err) = vramscope(&[
        "replay",
        file.to_str().expect("utf8"),
        "--conf",
        "expandable_segments:True",
        "--capacity",
        "100MiB",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v = json(&out);
    let configs = v["devices"][0]["configs"].as_array().expect("configs");
    // adam-step peaks at 0.22 GiB reserved (SOURCES.md): 100 MiB cannot hold it.
    assert!(!configs[0]["ooms"].as_array().expect("ooms").is_empty());
}

#[test]
fn not_a_snapshot_is_exit_2_with_the_error() {
    let dir = common::temp_dir("bad-snapshot");
    let bad = dir.join("notes.txt");
    std::fs::write(&bad, "hello, this is not a pickle").expect("write");
    for cmd in ["open", "replay"] {
        let (code, out, err) = vramscope(&[cmd, bad.to_str().expect("utf8")]);
        assert_eq!(code, 2, "{cmd}: {out}");
        assert!(err.contains("notes.txt"), "{err}");
        assert!(err.contains("byte"), "names the byte offset: {err}");
    }
    let truncated = dir.join("cut.pickle");
    let bytes = std::fs::read(common::capture("peak_inside_step")).expect("read");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("write");
    let (code, _, err) = vramscope(&["open", truncated.to_str().expect("utf8")]);
    assert_eq!(code, 2, "{err}");
    let (code, _, _) = vramscope(&["open", dir.join("missing.pickle").to_str().expect("utf8")]);
    assert_eq!(code, 2);
}

#[test]
fn export_round_trip_and_never_overwrites_the_input() {
    let dir = common::temp_dir("export");
    let input = common::capture("peak_inside_step");
    let out = dir.join("whatif.pickle");
    let (code, _, err) = vramscope(&[
        "export",
        input.to_str().expect("utf8"),
        "-o",
        out.to_str().expect("utf8"),
        "--conf",
        "expandable_segments:True",
    ]);
    assert_eq!(code, 0, "{err}");
    // The export replays cleanly and opens as a snapshot of its own.
    let (code, text, err) =
        vramscope(&["replay", out.to_str().expect("utf8"), "--verify", "--json"]);
    assert_eq!(code, 0, "{err}{text}");
    assert_eq!(json(&text)["ok"], true);
    let (code, text, _) = vramscope(&["open", out.to_str().expect("utf8"), "--json"]);
    assert_eq!(code, 0);
    assert!(
        json(&text)["devices"][0]["expandable_segments"]
            .as_u64()
            .expect("n")
            > 0
    );

    let copy = dir.join("copy.pickle");
    std::fs::copy(&input, &copy).expect("copy");
    let before = std::fs::read(&copy).expect("read");
    let (code, _, err) = vramscope(&[
        "export",
        copy.to_str().expect("utf8"),
        "-o",
        copy.to_str().expect("utf8"),
    ]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        std::fs::read(&copy).expect("read"),
        before,
        "the input is untouched"
    );
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn open_report_says_what_the_trace_shows_about_leaks() {
    let file = real("eor-nn_snapshot-actions.pickle");
    let (code, out, err) = vramscope(&["open", file.to_str().expect("utf8"), "--json"]);
    assert_eq!(code, 0, "{err}");
    let leaks = &json(&out)["devices"][0]["leaks"];
    // SOURCES.md: 9 snapshot markers; the same bytes are live at each, so no growth.
    assert_eq!(leaks["boundary_source"], "snapshot_marker");
    assert!(leaks["findings"].as_array().expect("findings").is_empty());
    assert!(leaks["conclusion"]
        .as_str()
        .expect("text")
        .contains("No GPU leak is visible"));

    let file = real("code-location_expandable_3gpu_oom.pickle");
    let (code, out, err) = vramscope(&[
        "open",
        file.to_str().expect("utf8"),
        "--headless",
        "--step-marker",
        "modeling_qwen3.py:267",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("leaks (from the trace alone):"));
    assert!(
        out.contains("may delimit layers of one forward pass"),
        "never claims a training leak without backward: {out}"
    );
}

#[test]
fn replay_takes_the_runs_memory_limit_for_garbage_collection() {
    // An H100 run with garbage_collection_threshold:0.6 under
    // set_per_process_memory_fraction (tests/fixtures/pytorch/captured).
    let pickle = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pytorch/captured/var_batch_gc_threshold.pickle");
    let path = pickle.to_str().expect("utf-8 path");
    let (code, _, err) = vramscope(&["replay", path, "--verify"]);
    assert_eq!(code, 1, "without the limit the GC frees cannot be replayed");
    assert!(err.contains("--allowed-memory"), "{err}");
    let (code, out, _) = vramscope(&["replay", path, "--verify", "--allowed-memory", "5153960755"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("segment events 131/131"), "{out}");
    let (code, _, err) = vramscope(&["replay", path, "--verify", "--allowed-memory", "lots"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--allowed-memory"), "{err}");
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn a_what_if_device_of_zero_bytes_is_refused() {
    let file = real("sqattn_segment-churn.pickle");
    let (code, out, err) = vramscope(&[
        "replay",
        file.to_str().expect("utf8"),
        "--conf",
        "expandable_segments:True",
        "--capacity",
        "0",
    ]);
    assert_eq!(code, 2, "{out}");
    assert!(
        err.contains("--capacity 0: a device needs more than 0 bytes"),
        "{err}"
    );
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn open_device_reports_that_device_alone_or_says_which_there_are() {
    let file = real("code-location_expandable_3gpu_oom.pickle");
    let path = file.to_str().expect("utf-8 path");
    let (code, out, err) = vramscope(&["open", path, "--headless", "--device", "1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("== device 1 =="), "{out}");
    assert!(
        !out.contains("== device 0 ==") && !out.contains("== device 2 =="),
        "{out}"
    );
    let (code, _, err) = vramscope(&["open", path, "--headless", "--device", "5"]);
    assert_eq!(code, 2);
    assert!(
        err.contains(
            "--device 5: the snapshot has no device 5; it holds device 0, device 1, device 2"
        ),
        "{err}"
    );
}

/// `open` on one of vramscope's other inputs says what it is and how to
/// open it, rather than only that it is no pickle.
#[test]
fn open_on_a_recording_or_a_scenario_says_how_to_open_it() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let recording = root.join("tests/fixtures/live/peak-inside-step.vslive");
    let scenario = root.join("scenarios/tour.ron");
    for (file, says) in [
        (&recording, "a vramscope live recording, not a PyTorch snapshot: play it with `vramscope attach --replay "),
        (&scenario, "a RON file, not a PyTorch snapshot: a scenario runs with `vramscope run "),
    ] {
        let (code, _, err) = vramscope(&["open", file.to_str().expect("utf-8"), "--headless"]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(says), "{err}");
    }
}

/// The what-if table's first column replays the file under its own config:
/// it is the recorded run, so its peak reserved is PyTorch's own
/// `max_memory_reserved()` (which the capture wrote beside the snapshot),
/// also where the run freed its cache to retry a failed `cudaMalloc`.
#[test]
fn what_if_s_first_column_is_the_recorded_run() {
    for stem in [
        "peak_inside_step",
        "fragmentation_oom_bug",
        "fragmentation_oom_empty_cache",
        "adam_first_step_oom_bug",
        "grad_accum_big_batch_oom",
    ] {
        let file = common::capture(stem);
        let measured: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(file.with_extension("json")).expect("the capture's figures"),
        )
        .expect("json");
        let (code, out, err) = vramscope(&[
            "replay",
            file.to_str().expect("utf8"),
            "--conf",
            "expandable_segments:True",
            "--json",
        ]);
        assert_eq!(code, 0, "{stem}: {err}");
        let recorded = &json(&out)["devices"][0]["configs"][0];
        assert_eq!(
            recorded["peak_reserved"], measured["max_memory_reserved"],
            "{stem}: {recorded}"
        );
    }
}

/// `replay --verify` on a snapshot without a trace checks nothing, says so,
/// and does not report success.
#[test]
fn verifying_a_snapshot_without_a_trace_says_it_verified_nothing() {
    let dir = common::temp_dir("state-only");
    let mut snap = vramscope::trace::snapshot::import_file(&common::capture("peak_inside_step"))
        .expect("a capture");
    snap.device_traces.clear();
    let file = dir.join("state-only.pickle");
    std::fs::write(&file, vramscope::trace::snapshot::export_bytes(&snap)).expect("write");
    let path = file.to_str().expect("utf8");
    let (code, out, err) = vramscope(&["replay", path, "--verify"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.starts_with("NOT VERIFIED: no device has a trace"),
        "{out}"
    );
    assert!(!out.contains("OK"), "{out}");
    let (code, out, _) = vramscope(&["replay", path, "--verify", "--json"]);
    assert_eq!(code, 1);
    let v = json(&out);
    assert_eq!(v["ok"], false);
    assert_eq!(v["nothing_to_verify"], true);
}
