//! The model against its data: sequence schedules and dimensions checked
//! before running, a fed tensor or a loss target that does not fit stopped
//! with PyTorch's error, and a GPU profile's scratch on the bias gradients.

use super::*;

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
