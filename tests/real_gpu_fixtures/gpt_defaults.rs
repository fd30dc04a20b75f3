//! The GPT captures of issue 24 against their test scenarios: PyTorch's
//! default workspaces, SDPA left to PyTorch, AdamW's for-loop and fused
//! implementations, `clip_grad_norm_`, dropout. Every request is the
//! H100's, in order (`captured_requests_are_the_h100_s_in_order`'s check);
//! where the blocks serving them differ, the difference is the driver's:
//! [`the_rest_is_the_drivers_addresses`] replays the H100's own requests
//! on the simulated device and gets the simulation's figures exactly.

use vramscope::scenario::RunResult;

use crate::addresses::figures_are_the_simulations;
use crate::harness::*;

/// Every request is the H100's in order, and the H100's requests on the
/// simulated device's addresses make the simulation's figures exactly: what
/// `check`'s layout allowance lets through is which cached block the
/// driver's addresses made the best fit, nothing the engine asks for.
fn the_rest_is_the_drivers_addresses(scenario: &str, stem: &str, sim: &RunResult) {
    requests_in_place(scenario, stem);
    figures_are_the_simulations(scenario, stem, sim);
}

/// The fp32 GPT's iteration ends: 2 MiB (iteration 1) and 3 MiB (2, 3)
/// more allocated in the simulation, as amp-fp32's (`FP32_GPT_ENDS`).
const FP32_GPT_ENDS: Layout = Layout {
    ends: 3 << 20,
    ..EXACT
};

fn fixture(name: &str) -> String {
    format!("tests/fixtures/pytorch/{name}.ron")
}

#[test]
fn sdpa_default_fp32_matches_the_h100() {
    // PyTorch 2.11 picks memory-efficient attention for fp32 on the H100,
    // as the engine does.
    let sc = fixture("sdpa-default-fp32");
    let (sim, _) = check(&sc, "sdpa_default_fp32", FP32_GPT_ENDS);
    the_rest_is_the_drivers_addresses(&sc, "sdpa_default_fp32", &sim);
}

#[test]
fn adamw_forloop_matches_the_h100() {
    let sc = fixture("adamw-forloop");
    let (sim, _) = check(&sc, "adamw_forloop", FP32_GPT_ENDS);
    the_rest_is_the_drivers_addresses(&sc, "adamw_forloop", &sim);
}

#[test]
fn adamw_fused_matches_the_h100() {
    let sc = fixture("adamw-fused");
    let (sim, _) = check(&sc, "adamw_fused", FP32_GPT_ENDS);
    the_rest_is_the_drivers_addresses(&sc, "adamw_fused", &sim);
}

#[test]
fn clip_grad_norm_matches_the_h100() {
    let sc = fixture("clip-grad-norm");
    let (sim, _) = check(&sc, "clip_grad_norm", FP32_GPT_ENDS);
    the_rest_is_the_drivers_addresses(&sc, "clip_grad_norm", &sim);
}

#[test]
fn default_workspaces_matches_the_h100() {
    let sc = fixture("default-workspaces");
    let (sim, _) = check(
        &sc,
        "default_workspaces",
        Layout {
            allocated: 1 << 20,
            ends: 2 << 20,
            ..EXACT
        },
    );
    the_rest_is_the_drivers_addresses(&sc, "default_workspaces", &sim);
}

#[test]
fn gpt_dropout_matches_the_h100() {
    let sc = fixture("gpt-dropout");
    let (sim, _) = check(
        &sc,
        "gpt_dropout",
        Layout {
            allocated: 6 << 20,
            ends: 6 << 20,
            ..EXACT
        },
    );
    the_rest_is_the_drivers_addresses(&sc, "gpt_dropout", &sim);
}
