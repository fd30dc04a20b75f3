//! The captures where PyTorch 2.11 chose cuDNN attention on the H100 with no
//! backend forced (`sdpa_priority` CudnnFirst: runtime cuDNN > 9.15 on
//! sm90, `check_prefer_cudnn_attention` in sdp_utils.cpp): amp-fp16's GPT
//! (`sdpa_default_fp16`) and the Qwen2.5 LoRA fine-tune
//! (`llama_lora_finetune`). Their traces show what cuDNN attention
//! allocates, in order: seed and offset (8 B each), the output, the fp32
//! stats, the plan's 256 B workspace; in backward dQ, dK, dV, then one
//! workspace (`cudnn_backward_workspace` in src/engine/ops/attention.rs).

use crate::addresses::figures_are_the_simulations;
use crate::harness::*;

/// `requests` with every run of consecutive frees in size order. Leaving
/// `torch.autocast` clears its cast cache (`at::autocast::clear_cache`), a
/// hash map keyed by tensor address: the cached fp16 weights go in the
/// map's order, which no simulation knows. A run of frees is one statement's
/// releases; the allocations around it stay where they are.
fn frees_sorted(requests: &Requests) -> Requests {
    let mut out = requests.clone();
    let mut i = 0;
    while i < out.len() {
        let end = (i..out.len()).find(|&j| out[j].0).unwrap_or(out.len());
        out[i..end].sort_unstable();
        i = end.max(i + 1);
    }
    out
}

#[test]
fn sdpa_default_fp16_matches_the_h100() {
    let sc = "tests/fixtures/pytorch/sdpa-default-fp16.ron";
    let stem = "sdpa_default_fp16";
    // The scenario forces no backend; the engine's dispatcher takes cuDNN
    // for fp16 q, k, v with p = 0 on the H100 under 2.11, as PyTorch did.
    let (built_sc, built) = vramscope::scenario::resolve(sc).expect("resolves");
    assert_eq!(built.engine.sdpa_backend, None, "{}", built_sc.name);
    // Exact on the H100 driver's layout. In request order peak allocated
    // sat 128 KiB under the H100's and iterations 2 and 3 ended 1.5 MiB
    // over it: which cached block served a request (its unsplit tail),
    // shown below to be the addresses.
    let (sim, _) = check(sc, stem, EXACT);
    let real = frees_sorted(&real_requests(stem));
    let simulated = frees_sorted(&simulated_requests(sc, stem));
    let off = out_of_place(&real, &simulated);
    assert!(off.is_empty(), "{stem}: {}", off.join("\n"));
    figures_are_the_simulations(sc, stem, &sim);
}

#[test]
fn llama_lora_finetune_matches_the_h100() {
    // The requests at the peaks and every iteration end are the H100's.
    // Getting there took, besides cuDNN attention, what
    // transformers and PEFT do around it in this capture: the rotary
    // module's second buffer (`original_inv_freq`), the adapters moved in
    // bf16 then upcast one by one, the DynamicCache's k and v copies
    // (`hf_use_cache`, which the scenario states), and the temporaries of
    // RMSNorm's backward (pow, rsqrt, the broadcast mul's sum_to).
    let sc = "llama-lora-finetune";
    let (_, built) = vramscope::scenario::resolve(sc).expect("resolves");
    assert_eq!(built.engine.sdpa_backend, None, "{sc}: PyTorch's choice");
    assert!(
        built.engine.hf_use_cache,
        "{sc}: the program's use_cache=True"
    );
    // Exact, every figure: iteration 1's end was one 2 MiB segment over
    // the H100's reserved until the engine made what the capture's
    // requests held and its own did not: the head views' ViewBackward0
    // copies in backward (one of q's size, one each of k's and v's, a layer
    // and step: the rotation's and the cache's gradients laid out by heads,
    // `view_grad_copies` in modules/decoder.rs).
    check(sc, "llama_lora_finetune", EXACT);
}
