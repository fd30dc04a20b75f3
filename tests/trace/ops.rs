//! Ops that take their own path under trace: `autograd.grad` through a
//! checkpoint, a backward inside autocast, cuDNN's convolution and LSTM,
//! an extension op's CUDA kernel written in Python, and BCE with logits'
//! backward formula.

use serde_json::Value;

use super::{seen, traced_json, Scratch};

const CHECKPOINTED_GRAD: &str = r#"
import torch, torch.nn as nn
from torch.utils.checkpoint import checkpoint
layer = nn.Linear(256, 256).cuda()
x = torch.randn(64, 256, device="cuda", requires_grad=True)
y = checkpoint(layer, x, use_reentrant=False).sum()
(gx,) = torch.autograd.grad(y, x)
print("GRAD", gx.device, tuple(gx.shape))
compiled = torch.compile(layer)
print("COMPILED", compiled is layer)
"#;
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn autograd_grad_recomputes_on_the_simulated_gpu_and_compile_runs_eagerly() {
    let s = Scratch::new("grad");
    let prog = s.file("grad.py", CHECKPOINTED_GRAD);
    let (v, err) = traced_json(&prog, &["--steps", "0"]);
    assert!(err.contains("GRAD cuda:0 (64, 256)"), "{err}");
    assert!(err.contains("COMPILED True"), "{err}");
    let untraced = v["trace"]["untraced"].to_string();
    assert!(untraced.contains("torch.compile"), "said: {untraced}");
    assert!(untraced.contains("eagerly"), "{untraced}");
}
/// A backward called inside `torch.autocast` runs under it (the engine
/// carries the caller's thread-local state): AddBackward0's `sum_to` of a
/// half bias gradient is a `sum`, on autocast's fp32_set_opt_dtype list, so
/// it sums into fp32 (16 KiB for 4,096 elements) and validate_outputs casts
/// it back to half (8 KiB). Called after the region, the sum stays half.
/// (autocast_around_loop_bug's H100 capture has both.)
const BACKWARD_UNDER_AUTOCAST: &str = r#"
import json, torch
x = torch.zeros(256, 4096, device="cuda", dtype=torch.half, requires_grad=True)
b = torch.zeros(4096, device="cuda", dtype=torch.half, requires_grad=True)
torch.cuda.memory._record_memory_history()
def backward_allocations(inside):
    x.grad = b.grad = None
    start = len(torch.cuda.memory._snapshot()["device_traces"][0])
    with torch.autocast("cuda", dtype=torch.float16):
        loss = (x + b).sum()
        if inside:
            loss.backward()
    if not inside:
        loss.backward()
    trace = torch.cuda.memory._snapshot()["device_traces"][0][start:]
    return {"sizes": [e["size"] for e in trace if e["action"] == "alloc"], "grad": str(b.grad.dtype)}
print("SEEN " + json.dumps({"inside": backward_allocations(True), "outside": backward_allocations(False)}))
"#;
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_backward_called_inside_autocast_runs_under_it() {
    let s = Scratch::new("bwautocast");
    let prog = s.file("bw.py", BACKWARD_UNDER_AUTOCAST);
    let (_, err) = traced_json(&prog, &["--steps", "0"]);
    let seen = seen(&err);
    let sizes = |k: &str| -> Vec<u64> {
        seen[k]["sizes"]
            .as_array()
            .unwrap_or_else(|| panic!("{k}: {seen}"))
            .iter()
            .filter_map(Value::as_u64)
            .collect()
    };
    let (inside, outside) = (sizes("inside"), sizes("outside"));
    // The bias gradient: 4,096 fp32 sums, then their half cast.
    let fp32_sum = inside.windows(2).any(|w| w == [16_384, 8_192]);
    assert!(fp32_sum, "inside autocast: {inside:?}");
    assert!(!outside.contains(&16_384), "after autocast: {outside:?}");
    assert_eq!(inside.len(), outside.len() + 1, "{inside:?} / {outside:?}");
    for k in ["inside", "outside"] {
        assert_eq!(seen[k]["grad"], "torch.float16", "{k}");
    }
}
const CONV_AND_LSTM: &str = r#"
import torch, torch.nn as nn
conv = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()).cuda()
conv(torch.randn(4, 3, 32, 32, device="cuda")).sum().backward()
lstm = nn.LSTM(32, 64, 2, dropout=0.1).cuda()
out, _ = lstm(torch.randn(10, 4, 32, device="cuda"))
out.sum().backward()
print("NODE", type(out.grad_fn).__name__)
"#;
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn cudnn_layers_run_cudnn_s_path_and_unmeasured_sizes_are_named_estimates() {
    let s = Scratch::new("cudnn");
    let prog = s.file("cudnn.py", CONV_AND_LSTM);
    let (v, err) = traced_json(&prog, &["--steps", "0"]);
    assert!(err.contains("NODE CudnnRnnBackward0"), "{err}");
    let estimates = v["trace"]["estimates"].as_array().expect("estimates");
    let said = v["trace"]["estimates"].to_string();
    assert!(said.contains("convolution"), "{said}");
    assert!(said.contains("RNN workspace"), "{said}");
    // The dropout state is measured per GPU (the H100's), whatever the shape.
    assert!(!said.contains("dropout state"), "{said}");
    assert!(estimates.iter().all(|e| e["calls"].as_u64() >= Some(1)));
}
/// An extension op (bitsandbytes' way: `torch.library.define`, a fake
/// kernel, a CUDA kernel written in Python that allocates through torch and
/// then calls native code through ctypes) runs its CUDA kernel on the
/// simulated GPU: its scratch is counted (the fake kernel shows only the
/// output) and its native call is skipped (here `abort()`: had it run, the
/// program would have died). The program's own meta device (transformers'
/// deferred init) holds no GPU memory and stays `meta`; `torch.tensor(…,
/// device="cuda")` is counted as it is made. A kernel that needs what the
/// simulation has not is named and its fake kernel runs instead.
const EXTENSION_OP: &str = r#"
import ctypes, json, torch
torch.library.define("vstest::scale", "(Tensor a) -> Tensor")

@torch.library.register_fake("vstest::scale")
def _(a):
    return torch.empty_like(a)

libc = ctypes.CDLL(None)

@torch.library.register_kernel("vstest::scale", "cuda")
def _(a):
    scratch = torch.empty(1 << 20, dtype=torch.uint8, device=a.device)
    out = torch.empty_like(a)
    libc.abort()
    return out

seen = {}
with torch.device("meta"):
    big = torch.nn.Linear(8192, 8192)
seen["own_device"] = str(big.weight.device)
seen["own_bytes"] = torch.cuda.memory_allocated()
a = torch.empty(1 << 18, device="cuda")
torch.cuda.reset_peak_memory_stats()
b = torch.ops.vstest.scale(a)
seen["peak"] = torch.cuda.max_memory_allocated()
seen["after"] = torch.cuda.memory_allocated()
code = torch.tensor([1.0, 2.0, 3.0, 4.0], device="cuda")
seen["tensor"] = torch.cuda.memory_allocated() - seen["after"]
seen["device"] = str(code.device)
print("SEEN " + json.dumps(seen))

torch.library.define("vstest::asks_more", "(Tensor a) -> Tensor")

@torch.library.register_fake("vstest::asks_more")
def _(a):
    return torch.empty_like(a)

@torch.library.register_kernel("vstest::asks_more", "cuda")
def _(a):
    torch.cuda.get_device_properties(0).not_simulated
    return torch.empty_like(a)

c = torch.ops.vstest.asks_more(a)
"#;
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn an_extensions_cuda_kernel_runs_on_the_simulated_gpu_and_the_programs_meta_is_its_own() {
    let s = Scratch::new("extension");
    let prog = s.file("extension.py", EXTENSION_OP);
    let (v, err) = traced_json(&prog, &["--steps", "0"]);
    let seen = seen(&err);
    const MIB: u64 = 1 << 20;
    // A kernel that asks for what the simulation lacks: named, then the
    // fake kernel (the program goes on).
    let untraced = v["trace"]["untraced"].to_string();
    assert!(untraced.contains("vstest.asks_more"), "{untraced}");
    assert!(untraced.contains("fake kernel"), "{untraced}");
    assert_eq!(seen["own_device"], "meta", "{err}");
    assert_eq!(
        seen["own_bytes"], 0,
        "the program's own meta tensors are not GPU memory"
    );
    assert_eq!(
        seen["peak"].as_u64(),
        Some(3 * MIB),
        "the input, the kernel's scratch and its output"
    );
    assert_eq!(
        seen["after"].as_u64(),
        Some(2 * MIB),
        "the scratch goes as the kernel returns"
    );
    assert_eq!(
        seen["tensor"], 512,
        "torch.tensor on the device, counted as made"
    );
    assert_eq!(seen["device"], "cuda:0");
}
/// BCE with logits with a weight and a pos_weight: the backward takes the
/// formula's CUDA branch (FunctionsManual.cpp
/// `binary_cross_entropy_with_logits_backward`: `t = pos_weight.mul(target)`,
/// then `t.add(1).sub_(target).mul_(input.sigmoid()).sub_(t)`, `mul_(grad)`,
/// `mul_(weight)`, `div_`): at most `t`, `t + 1` (the gradient) and the
/// sigmoid at once, three full-size buffers. Under `create_graph` it takes
/// the out-of-place branch and the gradient has a graph of its own.
const BCE_WEIGHTED: &str = r#"
import json, torch
import torch.nn.functional as F
N, C = 1024, 256
full = N * C * 4
x = torch.randn(N, C, device="cuda", requires_grad=True)
t = torch.rand(N, C, device="cuda")
w = torch.rand(C, device="cuda")
pw = torch.rand(C, device="cuda")
seen = {}
loss = F.binary_cross_entropy_with_logits(x, t, weight=w, pos_weight=pw)
base = torch.cuda.memory_allocated()
torch.cuda.reset_peak_memory_stats()
loss.backward()
seen["backward_peak_over"] = (torch.cuda.max_memory_allocated() - base) / full
seen["grad_kept"] = (torch.cuda.memory_allocated() - base) / full
x.grad = None
loss = F.binary_cross_entropy_with_logits(x, t)
(g,) = torch.autograd.grad(loss, x, create_graph=True)
seen["double"] = g.grad_fn is not None
g.sum().backward()
seen["x_grad"] = list(x.grad.shape)
print("SEEN " + json.dumps(seen))
"#;
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn bce_with_logits_backward_takes_the_cuda_branch_of_its_formula() {
    let s = Scratch::new("bce");
    let prog = s.file("bce.py", BCE_WEIGHTED);
    let (_, err) = traced_json(&prog, &["--steps", "0"]);
    let seen = seen(&err);
    let peak = seen["backward_peak_over"].as_f64().expect("a peak");
    // Three full-size buffers and the 4-byte incoming gradient's block.
    assert!((3.0..3.01).contains(&peak), "{peak}: {err}");
    assert_eq!(seen["grad_kept"], 1.0, "the gradient stays, in x.grad");
    assert_eq!(seen["double"], true, "{err}");
    assert_eq!(seen["x_grad"], serde_json::json!([1024, 256]));
}
