//! The ResNet captures (torchvision's ResNet-18 trained with cross-entropy,
//! the `resnet50` preset with `model(x).sum().backward()`) against their
//! test scenarios. Each carries cuDNN's convolution workspaces as measured
//! on the H100 (`engine.conv_workspaces`): with benchmark off PyTorch runs
//! the plan cuDNN's heuristics pick per shape and allocates its
//! `getWorkspaceSize()` (Conv_v8.cpp `run_conv_plan`), a size decided inside
//! cuDNN. Everything else is the engine's own.

use crate::addresses::blocks_are_the_simulations;
use crate::harness::{check, requests_in_place, EXACT};
use vramscope::scenario::resolve;

const RESNET18: &str = "tests/fixtures/pytorch/resnet18-train.ron";
const RESNET50: &str = "tests/fixtures/pytorch/resnet50-sum.ron";

/// The scenario carries a measured workspace for every convolution shape
/// its model runs, and nothing else of cuDNN's.
pub(crate) fn carries_conv_workspaces_as_measured(scenario: &str, shapes: usize) {
    let (_, built) = resolve(scenario).unwrap_or_else(|e| panic!("{scenario}: {e}"));
    let table = &built.engine.conv_workspaces;
    assert_eq!(table.len(), shapes, "{scenario}: measured shapes");
    for c in table {
        assert!(c.forward.is_some() && c.grad_weight.is_some(), "{c:?}");
    }
}

#[test]
fn resnet18_train_matches_the_h100() {
    // 11 shapes: the stem, 3 per stage after the first (3×3 down, 3×3, 1×1
    // down) and the first stage's 3×3.
    carries_conv_workspaces_as_measured(RESNET18, 11);
    // Exact on the H100 driver's layout. In request order the H100 held
    // 448 KiB more of unsplit tails at the ends of iterations 2 and 3 (which
    // of several equal cached blocks served a request follows the
    // addresses: `resnet18_train_differs_from_the_h100_only_in_addresses`).
    check(RESNET18, "resnet18_train", EXACT);
}

#[test]
fn resnet18_train_requests_in_place() {
    requests_in_place(RESNET18, "resnet18_train");
}

#[test]
fn resnet50_sum_matches_the_h100() {
    carries_conv_workspaces_as_measured(RESNET50, 23);
    // Exact on the H100 driver's layout. In request order 192 KiB more
    // unsplit tails at the peak and up to 1.125 MiB at an iteration end, for
    // the same reason (`resnet50_sum_differs_from_the_h100_only_in_addresses`).
    check(RESNET50, "resnet50_sum", EXACT);
}

#[test]
fn resnet50_sum_requests_in_place() {
    requests_in_place(RESNET50, "resnet50_sum");
}

#[test]
fn resnet18_train_differs_from_the_h100_only_in_addresses() {
    blocks_are_the_simulations(RESNET18, "resnet18_train");
}

#[test]
fn resnet50_sum_differs_from_the_h100_only_in_addresses() {
    blocks_are_the_simulations(RESNET50, "resnet50_sum");
}
