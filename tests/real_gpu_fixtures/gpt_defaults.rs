//! The GPT captures of issue 24 against their test scenarios: PyTorch's
//! default workspaces, SDPA left to PyTorch, AdamW's for-loop and fused
//! implementations, `clip_grad_norm_`, dropout. Every request is the
//! H100's, in order (`captured_requests_are_the_h100_s_in_order`'s check),
//! and on the H100 driver's layout (docs/driver_addresses.md) every figure
//! is the H100's. In request order the blocks serving them differed (up to
//! 6 MiB): [`the_rest_is_the_drivers_addresses`] replays the H100's own
//! requests on the simulated device and gets the simulation's figures
//! exactly, so nothing else sets them apart.

use vramscope::scenario::RunResult;

use crate::addresses::figures_are_the_simulations;
use crate::harness::*;

/// Every request is the H100's in order, and the H100's requests on the
/// simulated device's addresses make the simulation's figures exactly:
/// which cached block the addresses make the best fit is the device's,
/// nothing the engine asks for.
fn the_rest_is_the_drivers_addresses(scenario: &str, stem: &str, sim: &RunResult) {
    requests_in_place(scenario, stem);
    figures_are_the_simulations(scenario, stem, sim);
}

fn fixture(name: &str) -> String {
    format!("tests/fixtures/pytorch/{name}.ron")
}

#[test]
fn sdpa_default_fp32_matches_the_h100() {
    // PyTorch 2.11 picks memory-efficient attention for fp32 on the H100,
    // as the engine does.
    let sc = fixture("sdpa-default-fp32");
    let (sim, _) = check(&sc, "sdpa_default_fp32", EXACT);
    the_rest_is_the_drivers_addresses(&sc, "sdpa_default_fp32", &sim);
}

#[test]
fn adamw_forloop_matches_the_h100() {
    let sc = fixture("adamw-forloop");
    let (sim, _) = check(&sc, "adamw_forloop", EXACT);
    the_rest_is_the_drivers_addresses(&sc, "adamw_forloop", &sim);
}

#[test]
fn adamw_fused_matches_the_h100() {
    let sc = fixture("adamw-fused");
    let (sim, _) = check(&sc, "adamw_fused", EXACT);
    the_rest_is_the_drivers_addresses(&sc, "adamw_fused", &sim);
}

#[test]
fn clip_grad_norm_matches_the_h100() {
    let sc = fixture("clip-grad-norm");
    let (sim, _) = check(&sc, "clip_grad_norm", EXACT);
    the_rest_is_the_drivers_addresses(&sc, "clip_grad_norm", &sim);
}

#[test]
fn default_workspaces_matches_the_h100() {
    let sc = fixture("default-workspaces");
    let (sim, _) = check(&sc, "default_workspaces", EXACT);
    the_rest_is_the_drivers_addresses(&sc, "default_workspaces", &sim);
}

#[test]
fn gpt_dropout_matches_the_h100() {
    let sc = fixture("gpt-dropout");
    let (sim, _) = check(&sc, "gpt_dropout", EXACT);
    the_rest_is_the_drivers_addresses(&sc, "gpt_dropout", &sim);
}
