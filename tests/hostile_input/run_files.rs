//! What a run reads, written by an adversary: repeats and iterations past
//! the step bound, hostile scenarios, a decoder at batch and sequence one,
//! a billion buffers, a config.json that is not a file, lessons that name
//! other files or too many parts, and sweeps of too many points.

use super::*;

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
