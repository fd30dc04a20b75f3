//! Positions in the file: a malformed file, an unknown field (in a step, the
//! engine or the optimizer), an unknown preset, a layer list that is no MLP
//! and a negative size each refused where it stands; the format
//! reference's examples load; `check`'s exit status and position.

use super::*;

#[test]
fn valid_file_loads() {
    let (s, built) = load_str(VALID, "ok.ron").expect("valid");
    assert_eq!(s.name, "ok");
    assert_eq!(built.program.iterations, 3);
}
#[test]
fn missing_comma_points_at_the_next_field() {
    let text = VALID.replace(
        "    name: \"ok\",\n",
        "    name: \"ok\"\n", // line 2: no comma
    );
    let (line, column, _) = at(&text);
    assert_eq!((line, column), (3, 5), "at `description` on line 3");
}
#[test]
fn unknown_field_points_at_it() {
    let text = VALID.replace(
        "    iterations: 3,\n",
        "    iterations: 3,\n    colour: \"red\",\n", // line 15
    );
    let (line, column, message) = at(&text);
    assert_eq!(line, 15);
    assert_eq!(column, 11, "just after `colour`");
    assert!(message.contains("colour"), "{message}");
}
#[test]
fn unknown_field_inside_a_step_points_at_it() {
    // `create_graph` is a real PyTorch argument this format does not model:
    // it must be refused, not run as if it were absent.
    let text = VALID.replace(
        "Backward(loss: \"loss\", retain_graph: false)",
        "Backward(loss: \"loss\", retain_graph: false, create_graph: true)", // line 11
    );
    let (line, column, message) = at(&text);
    assert_eq!(line, 11);
    assert_eq!(column, 65, "just after `create_graph`");
    assert!(message.contains("create_graph"), "{message}");
    assert!(
        message.contains("retain_graph"),
        "lists the known fields: {message}"
    );
}
#[test]
fn unknown_engine_and_optimizer_fields_are_refused() {
    for (insert, field) in [
        ("    engine: (bn_backend: \"native\"),\n", "bn_backend"),
        (
            "    optimizer: (kind: AdamW(weight_decay: 0.01, amsgrad: false), \
             implementation: Foreach, capturable: false, cpu_offload: false, maximize: true),\n",
            "maximize",
        ),
    ] {
        let text = VALID.replace(
            "    iterations: 3,\n",
            &format!("{insert}    iterations: 3,\n"),
        );
        let (line, _, message) = at(&text);
        assert_eq!(line, 14, "{message}");
        assert!(message.contains(field), "{message}");
    }
}
#[test]
fn the_spec_name_resnet_basic_is_resnet18() {
    let (_, by_spec) =
        load_str(&VALID.replace("mlp-mnist", "resnet-basic"), "a.ron").expect("§10.4 name");
    let (_, by_torchvision) =
        load_str(&VALID.replace("mlp-mnist", "resnet18"), "b.ron").expect("preset name");
    assert_eq!(by_spec.model, by_torchvision.model);
}
#[test]
fn unknown_preset_points_at_the_name() {
    let text = VALID.replace("Preset(\"mlp-mnist\")", "Preset(\"gpt-5\")"); // line 5
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (5, 20), "at `gpt-5` inside the quotes");
    assert!(message.contains("unknown preset"), "{message}");
}
#[test]
fn a_layer_list_that_is_not_an_mlp_points_at_the_layer() {
    let layers = "Layers([Linear(784, 10), Linear(10, 10)])";
    let text = VALID.replace("Preset(\"mlp-mnist\")", layers); // line 5
    let (line, column, message) = at(&text);
    let written = text.lines().nth(4).expect("line 5");
    let second = written.find("Linear(10, 10)").expect("written") + 1;
    assert_eq!(
        (line, column),
        (5, second),
        "at the second Linear: {message}"
    );
    assert!(
        message.contains("layer 1: put a ReLU between two Linear layers"),
        "{message}"
    );
}
#[test]
fn negative_size_is_rejected_where_it_stands() {
    let text = VALID.replace("capacity: \"1GiB\"", "capacity: -5"); // line 4
    let (line, column, message) = at(&text);
    assert_eq!(line, 4);
    assert_eq!(column, 39, "just after `-5`");
    assert!(message.contains("negative"), "{message}");
}
/// The ```ron blocks of `scenarios/README.md`: complete scenarios must load
/// as they stand; `// fragment` blocks must load as a loop's steps.
#[test]
fn the_format_reference_examples_load() {
    let doc = std::fs::read_to_string(scenarios_dir().join("README.md")).expect("README.md");
    let blocks: Vec<&str> = doc
        .split("```ron\n")
        .skip(1)
        .filter_map(|b| b.split_once("```").map(|(code, _)| code))
        .collect();
    assert!(blocks.len() >= 3, "found {} ron blocks", blocks.len());
    let (mut full, mut fragments) = (0, 0);
    for (i, block) in blocks.iter().enumerate() {
        let text = if block.trim_start().starts_with("// fragment") {
            fragments += 1;
            format!(
                "Scenario(name: \"f\", description: \"d\", \
                 device: (name: \"s\", capacity: \"8GiB\"), model: Preset(\"gpt-tiny\"), \
                 steps: [LoadBatch(x: \"x\", y: \"y\"),\n{block}], iterations: 1)"
            )
        } else {
            full += 1;
            block.to_string()
        };
        if let Err(e) = load_str(&text, &format!("README block {i}")) {
            panic!("README.md ron block {i} does not load: {e}\n{text}");
        }
    }
    assert!(
        full >= 2 && fragments >= 1,
        "{full} complete, {fragments} fragments"
    );
}
#[test]
fn check_exit_status_and_position() {
    let dir = temp_dir("check");
    let good = dir.join("good.ron");
    std::fs::write(&good, VALID).expect("write");
    let (code, out, err) = vramscope(&["check", good.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{out}{err}");

    let bad = dir.join("bad.ron");
    std::fs::write(
        &bad,
        VALID.replace("Preset(\"mlp-mnist\")", "Preset(\"gpt-5\")"),
    )
    .expect("write");
    let bad_s = bad.to_str().expect("utf-8");
    let (code, _, err) = vramscope(&["check", bad_s]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("{bad_s}:5:20:")), "{err}");

    // Every built-in file passes `check` too.
    for b in builtins().iter().take(3) {
        let path = scenarios_dir().join(format!("{}.ron", b.name));
        let (code, _, err) = vramscope(&["check", path.to_str().expect("utf-8")]);
        assert_eq!(code, 0, "{}: {err}", b.name);
    }
    let _ = std::fs::remove_dir_all(dir);
}
