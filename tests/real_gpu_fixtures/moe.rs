//! The small mixture of experts (issue 42), captured on an H100 on
//! 2026-12-05 (tests/fixtures/pytorch/moe_small.py: a top-2 router over 8
//! experts per layer, each expert run on its rows with `torch.where`,
//! `index_select` and `index_add`), against the built-in scenario that
//! writes it in the module language (`QkvAttention`, `SparseMoe`). Its
//! routing depends on the data: the scenario gives the run's own counts per
//! expert, read from the capture's `nonzero` results (16 B per routed row;
//! `routing_counts_are_the_captures` reads them again from the trace).

use crate::addresses::{blocks_are_the_simulations, figures_are_the_simulations};
use crate::harness::*;

/// Exact on the H100 driver's layout. In request order the H100 held
/// 1,427,456 B more allocated at the peak and one 4 MiB segment more
/// reserved (up to 4 MiB at an iteration end): which of several equal
/// cached blocks serves a request follows the addresses. The H100's own
/// requests, replayed on the simulated device, reach the simulation's
/// figures exactly (`figures_are_the_simulations` below) and take its
/// blocks one by one (`moe_small_differs_from_the_h100_only_in_addresses`).
#[test]
fn moe_small_matches_the_h100() {
    let (sim, _) = check("moe-small", "moe_small", EXACT);
    figures_are_the_simulations("moe-small", "moe_small", &sim);
}

/// Every request and free of the scenario's run where the capture has it:
/// the router, top-k and the renormalised weights; per expert the mask,
/// nonzero and its cub scratch, the rows gathered, the expert's MLP, the
/// weighted output and the new `out`; in backward each node's gradients
/// and the sort buffers of the weights' `index_put_`.
#[test]
fn moe_small_requests_what_the_h100_requested() {
    requests_in_place("moe-small", "moe_small");
}

#[test]
fn moe_small_differs_from_the_h100_only_in_addresses() {
    blocks_are_the_simulations("moe-small", "moe_small");
}
