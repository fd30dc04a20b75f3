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
