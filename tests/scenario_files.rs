//! Scenario files as a user writes them: what loads, and for what does not,
//! the error with its file, line and column, or the field or step at fault
//! (RON's positions plus our checks), from the library and from `vramscope check`.

use vramscope::scenario::{builtins, load_str, run, LoadError, RunOptions};

mod common;

use common::{scenarios_dir, temp_dir, vramscope, VALID};

// ---------------------------------------------------------------- malformed files

fn at(text: &str) -> (usize, usize, String) {
    match load_str(text, "bad.ron") {
        Err(LoadError::At {
            file,
            line,
            column,
            message,
        }) => {
            assert_eq!(file, "bad.ron");
            (line, column, message)
        }
        Err(other) => panic!("not a positioned error: {other:?}"),
        Ok(_) => panic!("loaded a malformed file:\n{text}"),
    }
}

/// Each of `cases` (steps added after `step` in `VALID`, the line it must be
/// refused at, and what the message must say) refused at its step's line,
/// column 9.
fn refused_after(step: &str, cases: &[(&str, usize, &str)]) {
    for (added, line, said) in cases {
        let text = VALID.replace(step, &format!("{step}{added}"));
        let (l, column, message) = at(&text);
        assert_eq!((l, column), (*line, 9), "{added}: {message}");
        assert!(message.contains(said), "{added}: {message}");
    }
}

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
fn sequence_schedules_are_checked_against_the_model() {
    let gpt = VALID.replace(
        "model: Preset(\"mlp-mnist\"),",
        "model: Gpt(layers: 1, heads: 2, width: 64, vocab: 128, block_size: 64),\n    \
         data: (batch: 2, seq_schedule: [16, 32]),",
    );
    let (s, built) = load_str(&gpt, "gpt.ron").expect("a schedule within the block size");
    assert_eq!(s.data.seq_schedule, vec![16, 32]);
    assert_eq!(built.program.seq_lens, vec![16, 32]);

    let too_long = gpt.replace("[16, 32]", "[16, 128]");
    let err = load_str(&too_long, "gpt.ron").expect_err("longer than block_size");
    assert!(err.to_string().contains("block_size 64"), "{err}");

    let zero = gpt.replace("[16, 32]", "[16, 0]");
    let err = load_str(&zero, "gpt.ron").expect_err("zero length");
    assert!(
        err.to_string()
            .contains("sequence length must be at least 1"),
        "{err}"
    );

    let mlp = VALID.replace(
        "    iterations: 3,\n",
        "    data: (seq_schedule: [8]),\n    iterations: 3,\n",
    );
    let err = load_str(&mlp, "mlp.ron").expect_err("an MLP has no sequence");
    assert!(
        err.to_string().contains("GPT and LSTM models only"),
        "{err}"
    );
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
fn model_and_data_dimensions_are_checked_before_running() {
    // Each of these used to panic (division by zero heads, u64 overflow in
    // shape arithmetic) or run a model PyTorch refuses to build.
    let gpt = |model: &str| {
        VALID.replace(
            "model: Preset(\"mlp-mnist\"),",
            &format!("model: {model},\n    data: (batch: 2, seq: 16),"),
        )
    };
    for (text, expected) in [
        (
            gpt("Gpt(layers: 1, heads: 0, width: 64, vocab: 128, block_size: 64)"),
            "model.heads must be at least 1",
        ),
        (
            gpt("Gpt(layers: 1, heads: 3, width: 64, vocab: 128, block_size: 64)"),
            "not a multiple of heads 3",
        ),
        (
            gpt("Gpt(layers: 1, heads: 1, width: 9223372036854775807, vocab: 128, block_size: 64)"),
            "larger than 2097152",
        ),
        (
            gpt("Gpt(layers: 1, heads: 2, width: 64, vocab: 128, block_size: 64, dropout: 1.5)"),
            "not a probability",
        ),
        // checkpoint_sequential: Python's range() with step 0 past L segments.
        (
            gpt("Gpt(layers: 2, heads: 2, width: 64, vocab: 128, block_size: 64, checkpoint_segments: 3)"),
            "into 1 to 2 segments, not 3",
        ),
        (
            gpt("Gpt(layers: 2, heads: 2, width: 64, vocab: 128, block_size: 64, checkpoint_segments: 0)"),
            "into 1 to 2 segments, not 0",
        ),
        (
            gpt("Gpt(layers: 2, heads: 2, width: 64, vocab: 128, block_size: 64, checkpoint: true, checkpoint_segments: 2)"),
            "give one",
        ),
        (
            gpt("Gpt(layers: 2, heads: 2, width: 64, vocab: 128, block_size: 64),\n    criterion: Bce"),
            "criterion: applies to classifiers",
        ),
        (
            VALID.replace("iterations: 3,", "iterations: 1048576,"),
            "more than 100000, the most a run keeps",
        ),
        (
            VALID.replace("iterations: 3,", "iterations: 50000,\n    epochs: 3,"),
            "150000 in all (iterations × epochs)",
        ),
        (
            VALID.replace(
                "model: Preset(\"mlp-mnist\"),",
                "model: Preset(\"mlp-mnist\"),\n    model_dtype: F8,",
            ),
            "model_dtype: F8 is not a dtype a model trains in",
        ),
        (
            VALID.replace("Preset(\"mlp-mnist\")", "ResNet18(image: 16)"),
            "model.image must be at least 32",
        ),
        (
            VALID.replace("Preset(\"mlp-mnist\")", "Mlp(dims: [784, 0, 10])"),
            "must be at least 1",
        ),
        // Each of these two ran for minutes (tens of GB of host memory).
        (
            gpt("Gpt(layers: 2097152, heads: 1, width: 8, vocab: 8, block_size: 64)"),
            "more than 1024",
        ),
        (
            VALID.replace(
                "Preset(\"mlp-mnist\")",
                "LstmLm(vocab: 8, emb: 8, hidden: 8, layers: 1, bptt: 262144, cudnn: false)",
            ),
            "unfused LSTM",
        ),
        (
            VALID.replace(
                "    iterations: 3,\n",
                "    data: (batch: 4000000000000),\n    iterations: 3,\n",
            ),
            "a batch size of 4000000000000",
        ),
    ] {
        let err = load_str(&text, "dims.ron").expect_err(expected);
        assert!(err.to_string().contains(expected), "{expected}: {err}");
    }
    load_str(
        &gpt("Gpt(layers: 0, heads: 2, width: 64, vocab: 128, block_size: 64)"),
        "ok.ron",
    )
    .expect("a GPT with no blocks is still a model");
}

#[test]
fn feeding_a_model_the_wrong_tensor_stops_with_pytorchs_error() {
    // Any bound tensor may reach `Forward`; a wrong rank or dtype used to
    // index past a shape's end and panic.
    for (model, expected) in [
        (
            "Preset(\"mlp-mnist\")",
            "mat1 and mat2 shapes cannot be multiplied (1x3 and 784x1024)",
        ),
        (
            "Gpt(layers: 1, heads: 1, width: 4, vocab: 4, block_size: 4)",
            "not enough values to unpack (expected 2, got 1)",
        ),
        (
            "LstmLm(vocab: 4, emb: 4, hidden: 4, layers: 1, bptt: 3)",
            "'indices' to have one of the following scalar types: Long, Int",
        ),
        (
            "ResNet18(classes: 4, image: 32)",
            "input to conv2d, but got input of size: [3]",
        ),
    ] {
        let text = format!(
            "Scenario(name: \"t\", description: \"t\", device: (name: \"d\", capacity: \"1GiB\"), \
             model: {model}, steps: [AllocateBuffer(name: \"x\", shape: [3], dtype: F32), \
             Forward(input: \"x\", output: \"o\")], iterations: 1)"
        );
        let (scenario, built) = load_str(&text, "wrong.ron").expect("loads");
        let result = run(&scenario, &built, &RunOptions::default());
        let error = result.error.unwrap_or_default();
        assert!(error.contains(expected), "{model}: {error}");
    }
}

#[test]
fn a_model_in_the_language_refuses_a_fed_tensor_in_pytorchs_words() {
    // The first module has PyTorch's words: a Conv2d's weight and channels,
    // a Linear's dtype, as F.conv2d and F.linear say them.
    for (model, buffer, expected) in [
        (
            "ResNet18(classes: 4, image: 32)",
            "shape: [1, 4, 32, 32], dtype: F32",
            "Given groups=1, weight of size [64, 3, 7, 7], expected input[1, 4, 32, 32] to have 3 channels, but got 4 channels instead",
        ),
        (
            "Mlp(dims: [8, 4])",
            "shape: [2, 8], dtype: I64",
            "expected m1 and m2 to have the same dtype, but got: long int != float",
        ),
    ] {
        let text = format!(
            "Scenario(name: \"t\", description: \"t\", device: (name: \"d\", capacity: \"1GiB\"), \
             model: {model}, steps: [AllocateBuffer(name: \"x\", {buffer}), \
             Forward(input: \"x\", output: \"o\")], iterations: 1)"
        );
        let (scenario, built) = load_str(&text, "fed.ron").expect("loads");
        let error = run(&scenario, &built, &RunOptions::default())
            .error
            .unwrap_or_default();
        assert!(error.contains(expected), "{model}: {error}");
    }
}

#[test]
fn a_loss_target_that_does_not_fit_the_output_stops_with_pytorchs_error() {
    let run_text = |target_step: &str| {
        let text = VALID.replace(
            "Loss(output: \"out\", target: \"y\", into: \"loss\")",
            target_step,
        );
        let (scenario, built) = load_str(&text, "loss.ron").expect("loads");
        run(&scenario, &built, &RunOptions::default())
            .error
            .unwrap_or_default()
    };
    // mlp-mnist: out [256, 10]; x [256, 784] f32 is neither class indices
    // nor probabilities shaped like out.
    let err = run_text("Loss(output: \"out\", target: \"x\", into: \"loss\")");
    assert!(err.contains("not implemented for 'Float'"), "{err}");
    // Class indices must be one per row: `out` rows are 256, a [7] buffer is not.
    let err = run_text(
        "AllocateBuffer(name: \"t\", shape: [7], dtype: I64), \
         Loss(output: \"out\", target: \"t\", into: \"loss\")",
    );
    assert!(
        err.contains("Expected input batch_size (256) to match target batch_size (7)"),
        "{err}"
    );
    // Probabilities shaped like the output are a valid cross-entropy target.
    assert_eq!(
        run_text("Loss(output: \"out\", target: \"out\", into: \"loss\")"),
        ""
    );
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

#[test]
fn unbound_name_points_at_the_step() {
    let text = VALID.replace(
        "Forward(input: \"x\", output: \"out\")",
        "Forward(input: \"xs\", output: \"out\")", // line 9
    );
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (9, 9), "at `Forward`");
    assert!(message.contains("`xs`"), "{message}");
}

#[test]
fn deleting_an_unbound_name_or_reading_a_deleted_one_points_at_the_step() {
    // Python: `del nope` before any `nope = ...` raises NameError.
    let text = VALID.replace(
        "        ZeroGrad(set_to_none: true),\n",
        "        ZeroGrad(set_to_none: true),\n        Delete(name: \"nope\"),\n", // line 8
    );
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (8, 9), "at `Delete`");
    assert!(message.contains("`nope`"), "{message}");

    let text = VALID.replace(
        "        Loss(output: \"out\", target: \"y\", into: \"loss\"),\n",
        "        Delete(name: \"out\"),\n        Loss(output: \"out\", target: \"y\", into: \"loss\"),\n",
    ); // Loss moves to line 11
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (11, 9), "at the `Loss` that reads `out`");
    assert!(message.contains("`out`"), "{message}");
}

#[test]
fn optimizer_step_without_backward_points_at_it() {
    let text = VALID.replace(
        "        Backward(loss: \"loss\", retain_graph: false),\n",
        "",
    ); // OptimizerStep moves up to line 11
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (11, 9), "at `OptimizerStep`");
    assert!(message.contains("needs a Backward"), "{message}");
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

// ---------------------------------------------------------------- the CLI

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

/// The GPU profile turns on the reductions' scratch: the bias gradients of
/// adam-first-step-sgd's [1024, 3072] MLP projections take the staging buffer
/// and semaphores ATen takes on the H100's 132 SMs (25,165,824 B and 96 B),
/// which a run on a device with no profile does not allocate.
#[test]
fn a_gpu_profile_gives_the_bias_gradients_their_scratch() {
    use vramscope::alloc::Action;
    use vramscope::trace::Event;
    let path = scenarios_dir().join("adam-first-step-sgd.ron");
    let with = std::fs::read_to_string(&path).expect("the library scenario");
    let text = with.replace("gpu: \"H100-SXM-80GB\", ", "");
    assert_ne!(with, text, "the profile came out");
    let sizes = |text: &str| -> Vec<u64> {
        let (sc, built) = load_str(text, "sgd.ron").expect("loads");
        let r = run(
            &sc,
            &built,
            &RunOptions {
                iterations: Some(1),
                record_events: true,
            },
        );
        assert!(r.error.is_none() && r.oom.is_none(), "{:?}", r.error);
        r.events
            .iter()
            .filter_map(|e| match e {
                Event::Alloc(a) if a.action == Action::Alloc => Some(a.size),
                _ => None,
            })
            .collect()
    };
    let (on, off) = (sizes(&with), sizes(&text));
    let count = |v: &[u64], size: u64| v.iter().filter(|s| **s == size).count();
    // Twelve c_fc bias gradients, each with a 96 B semaphore array.
    assert_eq!(count(&on, 96), 12);
    assert_eq!(count(&off, 96), 0);
    assert!(count(&on, 25_165_824) >= count(&off, 25_165_824) + 12);
}

/// Issue 39's input steps are checked like every other: the gradient a
/// `GradSignStep` takes the sign of, and the name `RequiresGrad` flags,
/// must be bound tensors, else the step's line and column.
#[test]
fn input_gradient_steps_point_at_what_they_read() {
    let text = VALID.replace(
        "        OptimizerStep,\n",
        "        OptimizerStep,\n        GradSignStep(input: \"x\", grad: \"g\", clamp: true, detach: true),\n",
    ); // line 13
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (13, 9), "at `GradSignStep`: {message}");
    assert!(message.contains("`g`"), "{message}");

    let text = VALID.replace(
        "        OptimizerStep,\n",
        "        OptimizerStep,\n        NewList(name: \"xs\"),\n        RequiresGrad(name: \"xs\"),\n",
    ); // line 14
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (14, 9), "at `RequiresGrad`: {message}");
    assert!(message.contains("requires_grad_"), "{message}");

    let text = VALID.replace(
        "        Forward(input: \"x\", output: \"out\"),\n",
        "        RequiresGrad(name: \"x\"),\n        Forward(input: \"x\", output: \"out\"),\n",
    );
    load_str(&text, "ok.ron").expect("a bound tensor is fine");
}

/// Issue 39's re-created model and optimizer are steps without fields,
/// checked like every other: a field is refused at the step with the
/// variant's name, and so is one inside a `with torch.autocast(...)`
/// block, whose cast cache would keep the old weights' casts (not
/// modelled); the plain statements load.
#[test]
fn recreate_steps_are_checked_at_the_step() {
    let text = VALID.replace(
        "        OptimizerStep,\n",
        "        OptimizerStep,\n        RecreateModel(model: \"teacher\"),\n",
    ); // line 13
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (13, 22), "at `RecreateModel(`: {message}");
    assert!(
        message.contains("`RecreateModel` takes no fields"),
        "{message}"
    );

    let text = VALID.replace(
        "        OptimizerStep,\n",
        "        OptimizerStep,\n        AutocastEnter(dtype: F16),\n        RecreateOptimizer,\n        AutocastExit,\n",
    ); // line 14
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (14, 9), "at `RecreateOptimizer`: {message}");
    assert!(message.contains("autocast"), "{message}");

    let text = VALID.replace(
        "        OptimizerStep,\n",
        "        OptimizerStep,\n        RecreateModel,\n        RecreateOptimizer,\n",
    );
    load_str(&text, "ok.ron").expect("re-creating the model and the optimizer is fine");
}

/// A second model's statements are checked at the step: `Forward` through
/// a model no `BuildModel` made, or through a tensor, and a `BuildModel`
/// that names the scenario's own `model`.
#[test]
fn second_model_steps_are_checked_at_the_step() {
    let forward = "        Forward(input: \"x\", output: \"out\"),\n";
    let text = VALID.replace(
        forward,
        &format!(
            "{forward}        Forward(input: \"x\", output: \"t_out\", model: \"teacher\"),\n"
        ),
    ); // line 10
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (10, 9), "at the second Forward: {message}");
    assert!(message.contains("`teacher`"), "{message}");

    let text = VALID.replace(
        forward,
        &format!("{forward}        Forward(input: \"x\", output: \"t_out\", model: \"out\"),\n"),
    );
    let (line, _, message) = at(&text);
    assert_eq!(line, 10, "{message}");
    assert!(message.contains("only a model"), "{message}");

    let text = VALID.replace(
        "        ZeroGrad(set_to_none: true),\n",
        "        ZeroGrad(set_to_none: true),\n        BuildModel(name: \"model\"),\n",
    ); // line 8
    let (line, column, message) = at(&text);
    assert_eq!((line, column), (8, 9), "at `BuildModel`: {message}");
    assert!(message.contains("RecreateModel"), "{message}");

    let text = VALID
        .replace(
            "        ZeroGrad(set_to_none: true),\n",
            "        ZeroGrad(set_to_none: true),\n        BuildModel(name: \"teacher\"),\n",
        )
        .replace(
            forward,
            &format!(
                "{forward}        Forward(input: \"x\", output: \"t_out\", model: \"teacher\"),\n"
            ),
        );
    load_str(&text, "ok.ron").expect("a teacher built, then run");
}

/// A Hessian-vector product's statements are checked where they stand: a
/// gradient of an unbound name, a dot product of a tensor (zip() pairs
/// tuples), `.item()` of the tuple `torch.autograd.grad` returns; the
/// statements as PyHessian's loop writes them load.
#[test]
fn hvp_steps_are_checked_at_the_step() {
    let step = "        OptimizerStep,\n";
    let cases: &[(&str, usize, &str)] = &[
        (
            "        AutogradGradParams(output: \"gv\", into: \"hv\", retain_graph: true),\n",
            13,
            "`gv`, which no earlier step binds",
        ),
        (
            "        ProbeVectors(into: \"v\"),\n        GradDot(a: \"loss\", b: \"v\", into: \"gv\"),\n",
            14,
            "zip() pairs a tuple of tensors",
        ),
        (
            "        AutogradGradParams(output: \"loss\", into: \"g\", retain_graph: false, create_graph: true),\n        \
             NewList(name: \"kept\"),\n        Append(from: \"g\", list: \"kept\", what: Item),\n",
            15,
            "only a tensor has .item()",
        ),
    ];
    refused_after(step, cases);
    let text = VALID.replace(
        step,
        &format!(
            "{step}        AutogradGradParams(output: \"loss\", into: \"g\", retain_graph: false, create_graph: true),\n\
             \x20       ProbeVectors(into: \"v\"),\n\
             \x20       GradDot(a: \"g\", b: \"v\", into: \"gv\"),\n\
             \x20       AutogradGradParams(output: \"gv\", into: \"hv\", retain_graph: true, allow_unused: true),\n\
             \x20       NewList(name: \"g_hist\"),\n\
             \x20       Append(from: \"g\", list: \"g_hist\", what: Cpu),\n"
        ),
    );
    load_str(&text, "ok.ron").expect("a Hessian-vector product as PyHessian writes it");
}

/// Issue 39's GAN statements are checked at the step, as Python would
/// refuse them: an optimizer step or zero_grad of a name no
/// `BuildOptimizer` bound (or of a tensor), an optimizer built over a
/// tensor or named as the scenario's own `optimizer`, noise of an integer
/// dtype (torch.randn makes floats only), a second model's `Mlp` with one
/// width, a sum of an unbound name; the statements as DCGAN writes them load.
#[test]
fn gan_steps_are_checked_at_the_step() {
    let step = "        OptimizerStep,\n";
    // Each case adds lines after OptimizerStep (line 12): the last one is
    // the faulty step.
    let cases: &[(&str, usize, &str)] = &[
        (
            "        OptimizerStepOf(optimizer: \"optimizerG\"),\n",
            13,
            "`optimizerG`, which no earlier step binds",
        ),
        (
            "        ZeroGrad(set_to_none: true, optimizer: \"out\"),\n",
            13,
            "only an optimizer has .zero_grad()",
        ),
        (
            "        BuildOptimizer(name: \"optimizerG\", model: \"out\"),\n",
            13,
            "an optimizer is built over a model's .parameters()",
        ),
        (
            "        BuildModel(name: \"netG\"),\n        BuildOptimizer(name: \"optimizer\", model: \"netG\"),\n",
            14,
            "RecreateOptimizer",
        ),
        (
            "        AllocateBuffer(name: \"z\", shape: [256, 64], dtype: I64, fill: Randn),\n",
            13,
            "floating-point tensors only",
        ),
        (
            "        BuildModel(name: \"netG\", model: Mlp(dims: [64])),\n",
            13,
            "at least two widths",
        ),
        (
            "        Add(a: \"loss\", b: \"loss_fake\", into: \"total\"),\n",
            13,
            "`loss_fake`, which no earlier step binds",
        ),
        (
            "        Sub(a: \"loss\", b: \"score\", into: \"wdist\"),\n",
            13,
            "`score`, which no earlier step binds",
        ),
        (
            "        NewList(name: \"gs\"),\n        GradPenalty(grad: \"gs\", into: \"gp\"),\n",
            14,
            "only a tensor has .norm()",
        ),
        (
            "        Interpolate(a: \"x\", b: \"fake\", into: \"x_hat\"),\n",
            13,
            "`fake`, which no earlier step binds",
        ),
    ];
    refused_after(step, cases);

    let text = VALID.replace(
        step,
        &format!(
            "{step}        BuildModel(name: \"netG\", model: Mlp(dims: [64, 128, 784])),\n\
             \x20       BuildOptimizer(name: \"optimizerG\", model: \"netG\"),\n\
             \x20       AllocateBuffer(name: \"z\", shape: [256, 64], dtype: F32, fill: Randn),\n\
             \x20       Forward(input: \"z\", output: \"fake\", model: \"netG\"),\n\
             \x20       Forward(input: \"fake\", output: \"out_g\"),\n\
             \x20       Loss(output: \"out_g\", target: \"y\", into: \"errG\"),\n\
             \x20       Add(a: \"loss\", b: \"errG\", into: \"total\"),\n\
             \x20       ZeroGrad(set_to_none: true, optimizer: \"optimizerG\"),\n\
             \x20       Backward(loss: \"errG\", retain_graph: false),\n\
             \x20       OptimizerStepOf(optimizer: \"optimizerG\"),\n\
             \x20       AllocateBuffer(name: \"x2\", shape: [256, 784], dtype: F32, fill: Randn),\n\
             \x20       Interpolate(a: \"x\", b: \"x2\", into: \"x_hat\"),\n\
             \x20       Keep(from: \"eps\", into: \"e\", what: Detach),\n"
        ),
    );
    load_str(&text, "ok.ron").expect("a generator with its own optimizer, eps bound");
}
