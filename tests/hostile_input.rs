//! Input an adversary writes, through the binary as a user runs it: each
//! gets a clear refusal (exit 2, the file and position or the argument) or
//! a bounded run, never a signal, a hang, a blow-up, a replaced file or a
//! control byte on the terminal.

mod common;

use common::{temp_dir, vramscope, VALID};

/// `VALID` with its loop replaced by `steps`.
fn with_steps(steps: &str) -> String {
    let start = VALID.find("    steps: [").expect("VALID has steps");
    let end = VALID[start..].find("    ],\n").expect("steps end") + start + "    ],\n".len();
    format!(
        "{}    steps: [\n{steps}\n    ],\n{}",
        &VALID[..start],
        &VALID[end..]
    )
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path.to_str().expect("utf-8").to_string()
}

#[test]
fn a_repeat_asking_for_a_billion_steps_is_refused_at_check_where_it_stands() {
    let dir = temp_dir("repeat-bomb");
    let text =
        with_steps("        Repeat(times: 1000000000, steps: [ZeroGrad(set_to_none: true)]),");
    let line = text
        .lines()
        .position(|l| l.contains("Repeat("))
        .expect("the Repeat")
        + 1;
    let file = write(&dir, "bomb.ron", &text);
    for cmd in ["check", "run"] {
        let mut args = vec![cmd, file.as_str()];
        if cmd == "run" {
            args.push("--headless");
        }
        let (code, _, err) = vramscope(&args);
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(err.contains(&format!("bomb.ron:{line}:9:")), "{cmd}: {err}");
        assert!(
            err.contains("at most 1,000,000 steps") && err.contains("1,000,000,000"),
            "{err}"
        );
    }
}

#[test]
fn nested_repeats_count_as_their_product() {
    let dir = temp_dir("repeat-nested");
    let text = with_steps(
        "        Repeat(times: 2000, steps: [Repeat(times: 2000, steps: [ZeroGrad(set_to_none: true)])]),",
    );
    let file = write(&dir, "nested.ron", &text);
    let (code, _, err) = vramscope(&["check", &file]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("4,000,000"), "{err}");
    // Within the bound it is a valid file.
    let text = with_steps(
        "        Repeat(times: 20, steps: [Repeat(times: 20, steps: [ZeroGrad(set_to_none: true)])]),",
    );
    let file = write(&dir, "fine.ron", &text);
    let (code, _, err) = vramscope(&["check", &file]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn more_iterations_than_the_step_bound_are_refused_before_running() {
    let (code, out, err) = vramscope(&["run", "tour", "--iterations", "100000", "--headless"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        err.contains("--iterations 100000: the run would execute"),
        "{err}"
    );
}

#[cfg(unix)]
fn mkfifo(path: &std::path::Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(status.success());
}

/// A named pipe given where a file belongs was opened, and waited for a
/// writer forever.
#[cfg(unix)]
#[test]
fn a_named_pipe_is_refused_not_waited_on() {
    let dir = temp_dir("fifo");
    let pipe = dir.join("snapshot.pickle");
    mkfifo(&pipe);
    let pipe = pipe.to_str().expect("utf-8");
    let out = dir.join("out.pickle");
    let out = out.to_str().expect("utf-8");
    for args in [
        vec!["open", pipe, "--headless"],
        vec!["replay", pipe, "--verify"],
        vec!["check", pipe],
        vec!["run", pipe, "--headless"],
        vec!["export", pipe, "-o", out],
        vec!["compare", pipe, "tour", "--headless"],
        vec!["attach", "--replay", pipe, "--json"],
    ] {
        let (code, _, err) = vramscope(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("a named pipe"), "{args:?}: {err}");
    }
}

#[cfg(unix)]
#[test]
fn export_never_replaces_the_input_however_it_is_named() {
    let dir = temp_dir("export-self");
    let input = dir.join("in.pickle");
    let (code, _, err) = vramscope(&["export", "tour", "-o", input.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{err}");
    let before = std::fs::read(&input).expect("written");
    let link = dir.join("link.pickle");
    std::os::unix::fs::symlink(&input, &link).expect("symlink");
    let dotted = dir.join(".").join("in.pickle");
    for (from, to) in [(&input, &dotted), (&dotted, &input), (&input, &link)] {
        let (code, _, err) = vramscope(&[
            "export",
            from.to_str().expect("utf-8"),
            "-o",
            to.to_str().expect("utf-8"),
        ]);
        assert_eq!(code, 2, "{from:?} -> {to:?}: {err}");
        assert!(err.contains("refusing to overwrite the input"), "{err}");
    }
    assert_eq!(std::fs::read(&input).expect("still there"), before);
    assert!(std::fs::symlink_metadata(&link)
        .expect("link kept")
        .file_type()
        .is_symlink());
}

#[cfg(unix)]
#[test]
fn export_writes_only_over_a_plain_file_and_leaves_no_temporary_file() {
    let dir = temp_dir("export-targets");
    let target = dir.join("keep.txt");
    std::fs::write(&target, b"keep").expect("write");
    let link = dir.join("link.pickle");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let pipe = dir.join("pipe.pickle");
    mkfifo(&pipe);
    for (out, why) in [
        (link.as_path(), "symbolic link"),
        (pipe.as_path(), "a named pipe"),
        (&*dir, "a directory"),
    ] {
        let (code, _, err) = vramscope(&["export", "tour", "-o", out.to_str().expect("utf-8")]);
        assert_eq!(code, 2, "{out:?}: {err}");
        assert!(err.contains(why), "{out:?}: {err}");
    }
    assert_eq!(std::fs::read(&target).expect("read"), b"keep");
    assert!(std::fs::symlink_metadata(&link)
        .expect("kept")
        .file_type()
        .is_symlink());
    let (code, _, err) = vramscope(&[
        "export",
        "tour",
        "-o",
        dir.join("no-such-dir")
            .join("x.pickle")
            .to_str()
            .expect("utf-8"),
    ]);
    assert_eq!(code, 2, "{err}");
    let left: Vec<String> = std::fs::read_dir(&dir)
        .expect("read dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("vramscope-tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A snapshot whose trace is one `oom` entry dict, written once and then
/// referred to `n` times (2 bytes each): cheap input that used to make
/// millions of report lines and a file many times its size.
fn shared_entry_bomb(n: usize) -> Vec<u8> {
    use vramscope::trace::pickle::{PickleWriter, BATCH};
    let mut w = PickleWriter::new();
    w.empty_dict();
    w.memoize();
    w.mark();
    w.str("segments");
    w.empty_list();
    w.memoize();
    w.str("device_traces");
    w.empty_list();
    w.memoize();
    w.mark();
    w.empty_list();
    w.memoize();
    let mut entry = None;
    let mut left = n;
    while left > 0 {
        w.mark();
        for _ in 0..left.min(BATCH) {
            match entry {
                Some(memo) => w.get(memo),
                None => {
                    w.empty_dict();
                    entry = Some(w.memoize());
                    w.mark();
                    for (k, v) in [
                        ("action", None),
                        ("size", Some(1 << 20)),
                        ("stream", Some(0)),
                    ] {
                        w.str(k);
                        match v {
                            Some(v) => w.uint(v),
                            None => w.str("oom"),
                        }
                    }
                    w.str("device_free");
                    w.uint(0);
                    w.str("frames");
                    w.empty_list();
                    w.setitems();
                }
            }
        }
        w.appends();
        left -= left.min(BATCH);
    }
    w.appends();
    w.setitems();
    w.finish()
}

#[test]
fn millions_of_references_to_one_record_are_refused() {
    let dir = temp_dir("bomb-refused");
    let file = dir.join("bomb.pickle");
    let bytes = shared_entry_bomb(3_000_000);
    assert!(bytes.len() < 7 << 20, "{} bytes", bytes.len());
    std::fs::write(&file, &bytes).expect("write");
    let file = file.to_str().expect("utf-8");
    let out = dir.join("out.pickle");
    for args in [
        vec!["open", file, "--headless"],
        vec!["export", file, "-o", out.to_str().expect("utf-8")],
    ] {
        let (code, out, err) = vramscope(&args);
        assert_eq!(code, 2, "{args:?}: {out}");
        assert!(err.contains("refers to the same records"), "{err}");
        assert!(out.len() < 1024, "{}", out.len());
    }
}

#[test]
fn a_repeated_record_is_summarised_in_reports_and_shared_in_exports() {
    let dir = temp_dir("bomb-summarised");
    let file = dir.join("bomb.pickle");
    let n = 300_000;
    let bytes = shared_entry_bomb(n);
    std::fs::write(&file, &bytes).expect("write");
    let file = file.to_str().expect("utf-8");
    let (code, out, err) = vramscope(&["open", file, "--headless"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().count() < 60, "{out}");
    assert!(
        out.contains("… and 299,990 more OOM entries (300,000 OOMs in all"),
        "{out}"
    );
    let (code, out, err) = vramscope(&["open", file, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = common::json(&out);
    assert_eq!(v["devices"][0]["oom_count"], n);
    assert_eq!(v["devices"][0]["ooms"].as_array().map(Vec::len), Some(100));
    // The export refers to the one record too: about the input's size.
    let exported = dir.join("out.pickle");
    let (code, _, err) = vramscope(&["export", file, "-o", exported.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{err}");
    let size = std::fs::metadata(&exported).expect("written").len();
    assert!(size < 2 * bytes.len() as u64, "{size} from {}", bytes.len());
    let (code, out, _) = vramscope(&["open", exported.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 0);
    assert_eq!(common::json(&out)["devices"][0]["oom_count"], n);
}

/// `tests/fixtures/hostile/`: inputs that once crashed, hung or spoke to the
/// terminal (`make.py` writes the pickles).
fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hostile")
        .join(name);
    path.to_str().expect("utf-8").to_string()
}

/// No byte that drives a terminal: control characters other than newline
/// and tab (C0, DEL and C1).
fn assert_no_controls(what: &str, text: &str) {
    let bad: Vec<char> = text
        .chars()
        .filter(|c| c.is_control() && *c != '\n' && *c != '\t')
        .collect();
    assert!(bad.is_empty(), "{what}: {bad:?} in\n{text}");
}

#[test]
fn control_sequences_in_a_snapshot_never_reach_the_terminal() {
    let dir = temp_dir("escapes");
    let file = fixture("escapes.pickle");
    let file = file.as_str();
    let (code, out, err) = vramscope(&["open", file, "--headless"]);
    assert_eq!(code, 0, "{err}");
    assert_no_controls("open", &out);
    assert!(out.contains("\\u{1b}]0;pwned\\u{7}evil.py"), "{out}");
    for args in [
        vec!["replay", file, "--verify"],
        vec!["replay", file, "--conf", "expandable_segments:True"],
        vec!["compare", file, "tour", "--headless"],
        vec!["open", file, "--json"],
    ] {
        let (_, out, err) = vramscope(&args);
        assert_no_controls(&format!("{args:?} stdout"), &out);
        assert_no_controls(&format!("{args:?} stderr"), &err);
    }
    // A scenario file's own text, and a file name, likewise.
    let evil_ron = VALID
        .replace("name: \"ok\"", "name: \"ok\\u{1b}[2J\"")
        .replace(
            "    iterations: 3,\n",
            "    iterations: 3,\n    narration: [(at: Start, text: \"\\u{1b}]0;t\\u{7}hello\")],\n",
        );
    let ron = dir.join("evil\x1b[2J.ron");
    std::fs::write(&ron, evil_ron).expect("write");
    let ron = ron.to_str().expect("utf-8");
    for args in [vec!["run", ron, "--headless"], vec!["check", ron]] {
        let (code, out, err) = vramscope(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert_no_controls(&format!("{args:?}"), &out);
        assert_no_controls(&format!("{args:?}"), &err);
    }
    let (code, _, err) = vramscope(&["check", &format!("{ron}.missing")]);
    assert_eq!(code, 2);
    assert_no_controls("a missing file's name", &err);
}

/// Every hostile scenario fixture is refused with its file, line and column.
#[test]
fn hostile_scenarios_are_refused_where_they_go_wrong() {
    for (name, says) in [
        ("repeat-bomb.ron", "at most 1,000,000 steps"),
        ("nested-too-deep.ron", "nested too deeply"),
        ("not-utf8.ron", "is not UTF-8 text"),
        ("keep-hidden.ron", "Keep uses `hidden`"),
        (
            "autocast-exit-alone.ron",
            "AutocastExit closes no AutocastEnter",
        ),
        ("gpt-heads-zero.ron", "model.heads must be at least 1"),
        ("gpt-huge-layers.ron", "model.layers of 4000000000"),
        ("empty-preset.ron", "unknown preset \"\""),
    ] {
        let file = fixture(name);
        let (code, out, err) = vramscope(&["check", &file]);
        assert_eq!(code, 2, "{name}: {out}");
        assert!(err.contains(says), "{name}: {err}");
        assert!(!err.contains("ron::Options"), "{name}: {err}");
        // `FILE:LINE:COLUMN: message`.
        let rest = err
            .split_once(&format!("{file}:"))
            .map(|(_, r)| r)
            .unwrap_or_default();
        let mut parts = rest.splitn(3, ':');
        let line = parts.next().and_then(|l| l.parse::<usize>().ok());
        let column = parts.next().and_then(|c| c.parse::<usize>().ok());
        assert!(
            line.is_some() && column.is_some(),
            "{name}: no line:column in {err}"
        );
    }
}

#[test]
fn a_bad_pickle_is_described_in_a_line_not_echoed() {
    let (code, _, err) = vramscope(&["open", &fixture("bad-text-opcode.pickle"), "--headless"]);
    assert_eq!(code, 2);
    assert!(err.contains("INT: malformed text argument"), "{err}");
    assert!(err.contains("… (5,865 bytes)"), "{err}");
    assert!(err.len() < 400, "{} bytes: {err}", err.len());
    assert_no_controls("bad text", &err);

    let (code, _, err) = vramscope(&["open", &fixture("address-above-2-63.pickle"), "--headless"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("got -4096 (read as an unsigned 64-bit number: 18446744073709547520)"),
        "{err}"
    );

    // A 16 MB string where a segment type belongs is named, not printed.
    use vramscope::trace::pickle::PickleWriter;
    let mut w = PickleWriter::new();
    w.empty_dict();
    w.memoize();
    w.mark();
    w.str("segments");
    w.empty_list();
    w.memoize();
    w.mark();
    w.empty_dict();
    w.memoize();
    w.mark();
    for (k, v) in [("device", 0), ("address", 1 << 40), ("total_size", 2 << 20)] {
        w.str(k);
        w.uint(v);
    }
    w.str("segment_type");
    w.str(&"x".repeat(16 << 20));
    w.str("blocks");
    w.empty_list();
    w.setitems();
    w.appends();
    w.setitems();
    let dir = temp_dir("long-string");
    let file = dir.join("long.pickle");
    std::fs::write(&file, w.finish()).expect("write");
    let (code, _, err) = vramscope(&["open", file.to_str().expect("utf-8"), "--headless"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("… (16,777,216 bytes)"),
        "{}",
        &err[..err.len().min(400)]
    );
    assert!(err.len() < 400, "{} bytes", err.len());
}

/// A decoder layer at batch 1 × sequence 1: `weight [h] * hidden [1, 1, h]`
/// took the weight's shape (the same elements), and attention then read a
/// sequence dim that was not there (a panic in `Shape::dim`).
#[test]
fn a_decoder_at_batch_one_and_sequence_one_runs() {
    let (code, out, err) = vramscope(&[
        "sweep",
        "llama-lora-finetune",
        "--batch",
        "1",
        "--seq",
        "1",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let v = common::json(&out);
    let point = &v["points"][0];
    assert_eq!(point["batch"], 1, "{out}");
    assert_eq!(point["seq"], 1, "{out}");
    assert!(
        point["peak_allocated"].as_u64().is_some_and(|b| b > 0),
        "{out}"
    );

    // `max_position_embeddings: 1` makes the training sequence 1.
    let (code, out, err) = vramscope(&["model", &fixture("positions-1/config.json"), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = common::json(&out);
    let attn = v["modules"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["module"] == "model.layers.0.self_attn"))
        .cloned()
        .unwrap_or_default();
    assert!(
        attn["saved_bytes_per_sample"]
            .as_u64()
            .is_some_and(|b| b > 0),
        "{out}"
    );
}

/// `AllocateBuffers(count: 1000000000)` passed `check`; `run` then reserved
/// room for a billion list items and aborted (40 GB). Now refused at the
/// step, naming `count`, in `check`, `run` and a lesson alike.
#[test]
fn a_billion_buffers_are_refused_at_the_step_that_asks() {
    let dir = common::Scratch::new("buffers");
    let text = with_steps(
        "        AllocateBuffers(list: \"xs\", count: 1000000000, shape: [1], dtype: F32),",
    );
    let line = text
        .lines()
        .position(|l| l.contains("AllocateBuffers("))
        .expect("the step")
        + 1;
    let file = write(&dir, "buffers.ron", &text);
    for args in [
        vec!["check", file.as_str()],
        vec!["run", file.as_str(), "--headless"],
    ] {
        let (code, _, err) = vramscope(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(&format!("buffers.ron:{line}:9:")), "{err}");
        assert!(
            err.contains("AllocateBuffers count: 1,000,000,000")
                && err.contains("more than the 100,000 a run may"),
            "{err}"
        );
    }
    // Within the bound over the whole run: three iterations of 30,000.
    let text =
        with_steps("        AllocateBuffers(list: \"xs\", count: 30000, shape: [1], dtype: F32),");
    let file = write(&dir, "fine.ron", &text);
    let (code, _, err) = vramscope(&["check", &file]);
    assert_eq!(code, 0, "{err}");
    // Four iterations of it are over, and `--iterations` says so.
    let (code, _, err) = vramscope(&["run", &file, "--iterations", "4", "--headless"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("allocate 120,000 buffers"), "{err}");
}

/// "not a config.json file" was the one message for a pipe, a device and a
/// file too large to be one: each now says which (and a pipe is not waited on).
#[cfg(unix)]
#[test]
fn a_config_json_that_is_not_a_file_says_what_it_is() {
    let dir = common::Scratch::new("config-kinds");
    let pipe = dir.join("pipe.json");
    mkfifo(&pipe);
    let device = dir.join("device.json");
    std::os::unix::fs::symlink("/dev/zero", &device).expect("symlink");
    let big = dir.join("big.json");
    std::fs::write(&big, vec![b' '; 5 << 20]).expect("write");
    let folder = dir.join("folder.json");
    std::fs::create_dir(&folder).expect("a directory named .json");
    for (path, says) in [
        (&pipe, "a named pipe, not a config.json file"),
        (&device, "a device, not a config.json file"),
        (
            &big,
            "larger than 4.00 MiB, more than any config.json holds",
        ),
        (&folder, "a directory, not a config.json file"),
    ] {
        let p = path.to_str().expect("utf-8");
        let (code, _, err) = vramscope(&["model", p]);
        assert_eq!(code, 2, "{p}: {err}");
        assert!(err.contains(says), "{p}: {err}");
    }
}

/// A lesson with `parts` as written, one part a line.
fn lesson_with(parts: &[String]) -> String {
    format!(
        "Lesson(name: \"l\", title: \"t\", description: \"d\", intro: [\"i\"], parts: [\n{}\n], summary: [\"s\"])\n",
        parts.join("\n")
    )
}

fn part(scenario: &str) -> String {
    format!(
        "(scenario: \"{scenario}\", question: \"q?\", choices: [\"a\", \"b\"], answer: 'a', explanation: [\"e\"]),"
    )
}

/// A lesson's `scenario:` that names a pipe or a directory said the file
/// did not exist; one that named any file (`/etc/shadow`) printed its first
/// word in the RON error. Now: what it is, and nothing of its content.
#[cfg(unix)]
#[test]
fn a_lesson_names_only_scenario_files_and_never_echoes_another_file() {
    let dir = common::Scratch::new("lesson-targets");
    mkfifo(&dir.join("pipe.ron"));
    std::fs::create_dir(dir.join("folder.ron")).expect("mkdir");
    std::fs::write(dir.join("secret.txt"), "hunter2:$6$salt$hash:19000\n").expect("write");
    std::fs::write(dir.join("secret.ron"), "hunter2:$6$salt$hash:19000\n").expect("write");
    for (name, says) in [
        ("pipe.ron", "a named pipe"),
        ("folder.ron", "a directory"),
        (
            "secret.txt",
            "its name does not end in .ron: not a scenario file",
        ),
        (
            "secret.ron",
            "it does not start with `Scenario(`: not a scenario file",
        ),
    ] {
        let lesson = write(&dir, "lesson.ron", &lesson_with(&[part(name)]));
        let t = std::time::Instant::now();
        let (code, out, err) = vramscope(&["lesson", &lesson, "--headless"]);
        assert_eq!(code, 2, "{name}: {out}{err}");
        assert!(err.contains(says), "{name}: {err}");
        assert!(err.contains("parts[0].scenario"), "{name}: {err}");
        assert!(
            !err.contains("hunter2") && !out.contains("hunter2"),
            "{err}"
        );
        assert!(t.elapsed() < std::time::Duration::from_secs(5), "{name}");
    }
}

/// A 1,200-part lesson took 18 s to check and run; now it is refused at `parts`.
#[test]
fn a_lesson_of_more_parts_than_a_workshop_holds_is_refused() {
    let dir = common::Scratch::new("lesson-parts");
    let parts = vec![part("tour"); 1200];
    let text = lesson_with(&parts);
    let column = text.find("parts:").expect("parts") + 1;
    let lesson = write(&dir, "big.ron", &text);
    let (code, _, err) = vramscope(&["lesson", &lesson, "--headless"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!(
            "big.ron:1:{column}: parts: 1,200 given; a lesson has at most 100"
        )),
        "{err}"
    );
}

/// A 100,000-point sweep ran for 14.5 s and wrote 96 MB of JSON; a bad
/// entry at the end of a long list echoed the whole list.
#[test]
fn a_sweep_of_more_points_than_a_chart_holds_is_refused() {
    let dir = common::Scratch::new("sweep-points");
    let batches: Vec<String> = (1..=100_000).map(|b| b.to_string()).collect();
    let text = VALID.replace(
        "    iterations: 3,\n",
        &format!(
            "    iterations: 3,\n    sweep: (batch: [{}]),\n",
            batches.join(", ")
        ),
    );
    let file = write(&dir, "sweep.ron", &text);
    let (code, out, err) = vramscope(&["sweep", &file, "--json"]);
    assert_eq!(code, 2, "{}", &out[..out.len().min(300)]);
    assert!(
        err.contains("the scenario's sweep.batch and sweep.seq: 100000 batch sizes × 1 sequence lengths make 100,000 points; a sweep runs at most 1,024"),
        "{err}"
    );
    assert!(out.is_empty(), "{} bytes of output", out.len());
    let list = batches[..2000].join(",");
    let (code, _, err) = vramscope(&["sweep", "tour", "--batch", &list]);
    assert_eq!(code, 2);
    assert!(err.contains("--batch: 2000 batch sizes"), "{err}");
    let (code, _, err) = vramscope(&["sweep", "tour", "--batch", &format!("{list},x")]);
    assert_eq!(code, 2);
    assert!(
        err.contains("`x` is not a whole number"),
        "{}",
        &err[..err.len().min(300)]
    );
    assert!(err.len() < 300, "{} bytes", err.len());
}

/// `export -o` over a 0600 file left a 0644 one: the target keeps its mode.
#[cfg(unix)]
#[test]
fn export_over_a_private_file_keeps_it_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = common::Scratch::new("export-mode");
    let out = dir.join("private.pickle");
    std::fs::write(&out, b"old").expect("write");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let (code, _, err) = vramscope(&["export", "tour", "-o", out.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{err}");
    let meta = std::fs::metadata(&out).expect("written");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(meta.len() > 3, "replaced");
}

/// PyTorch's `_dump_snapshot` rewrites its file in place: a snapshot cut
/// short while `open` read it killed the process with SIGBUS (a mapped page
/// past the new end). The import now ends in an error naming the file.
#[cfg(unix)]
#[test]
fn a_snapshot_cut_short_while_it_is_read_is_an_error_not_a_signal() {
    use vramscope::trace::snapshot::{import_file_reporting, synthetic_snapshot};
    let dir = common::Scratch::new("cut-short");
    let path = dir.join("growing.pickle");
    let file = std::fs::File::create(&path).expect("create");
    let stats = synthetic_snapshot(std::io::BufWriter::new(file), 8 << 20, 7).expect("synth");
    assert!(stats.bytes > 4 << 20, "{stats:?}");
    let mut cut = false;
    let result = import_file_reporting(&path, &mut |_| {
        if !cut {
            cut = true;
            // Another process truncates it as it starts writing anew.
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_len(4096))
                .expect("truncate");
        }
    });
    assert!(cut, "the import reported progress");
    let err = result.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("growing.pickle"), "{err}");
    assert!(
        err.contains("the file changed while it was read") && err.contains("it is 4,096 now"),
        "{err}"
    );
}
