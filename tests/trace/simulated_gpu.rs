//! The simulated GPU as the program sees it: `torch.cuda` answered from
//! the simulation, the steps asked, a workspace that no longer fits the
//! program's own OOM, an op that needs data named with its line, a
//! program that never imports torch said to be untraced, and
//! `torch.accelerator` answered as `torch.cuda` is.

use super::{seen, trace, traced_json, Scratch, MLP};

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_program_sees_the_simulated_gpu_and_its_own_questions_are_answered_by_it() {
    let s = Scratch::new("mlp");
    let prog = s.file("mlp.py", MLP);
    let (v, err) = traced_json(&prog, &["--steps", "0"]);
    let seen = seen(&err);
    assert_eq!(seen["device"], "cuda:0");
    assert_eq!(seen["is_cuda"], true);
    assert_eq!(seen["item"], 0.0, "no data on the simulated GPU: zeros");
    assert_eq!(seen["name"], "NVIDIA H100 80GB HBM3");
    assert_eq!(seen["total"], 85_017_493_504u64);
    // What the program asked is what vramscope reports.
    assert_eq!(v["peak_allocated"], seen["peak"]);
    assert_eq!(v["peak_allocated"], seen["stats_peak"]);
    assert_eq!(v["peak_reserved"], seen["reserved_peak"]);
    assert_eq!(v["trace"]["steps"], 4);
    // The OOM was raised in the program with PyTorch's message, and caught there.
    let oom = seen["oom"].as_str().expect("an OOM");
    assert!(
        oom.starts_with("CUDA out of memory. Tried to allocate 4.00 GiB."),
        "{oom}"
    );
    assert_eq!(v["trace"]["ooms"], 1);
    assert_eq!(v["live"]["ooms"][0]["pytorch_message"], oom);
    // The report's by-line view names the program's own lines.
    let text = v.to_string();
    assert!(text.contains("mlp.py"), "the program's lines in the report");
}
/// A program asking `torch.accelerator` (PyTorch 2.6 on), as newer
/// releases' own optimizers do where older ones asked `torch.cuda`.
const ACCELERATOR: &str = r#"
import json, torch
x = torch.empty(1 << 20, device="cuda")
acc = torch.accelerator
acc.synchronize()
seen = {"device": str(acc.current_accelerator(check_available=True)), "count": acc.device_count(),
        "index": acc.current_device_index(), "capturing": acc.current_stream().is_capturing(),
        "allocated": acc.memory_allocated(), "cuda": torch.cuda.memory_allocated(),
        "free_total": list(acc.get_memory_info()), "cuda_free_total": list(torch.cuda.mem_get_info())}
print("SEEN " + json.dumps(seen))
"#;

/// `torch.accelerator` answers from the simulated GPU as `torch.cuda` does,
/// never from the machine's CUDA runtime (here: none), so a PyTorch whose
/// `optimizer.step()` asks it for the current stream (2.15) runs.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn torch_accelerator_is_the_simulated_gpu() {
    let s = Scratch::new("accelerator");
    let prog = s.file("accelerator.py", ACCELERATOR);
    let (v, err) = traced_json(&prog, &[]);
    assert_eq!(v["trace"]["ended"], "the program ended", "{err}");
    let seen = seen(&err);
    assert_eq!(seen["device"], "cuda");
    assert_eq!(seen["count"], 1);
    assert_eq!(seen["index"], 0);
    assert_eq!(seen["capturing"], false);
    assert_eq!(seen["allocated"], 4 << 20);
    assert_eq!(seen["allocated"], seen["cuda"]);
    assert_eq!(seen["free_total"], seen["cuda_free_total"]);
}
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn the_trace_stops_after_the_steps_asked() {
    let s = Scratch::new("steps");
    let prog = s.file(
        "loop.py",
        "import torch\nw = torch.nn.Linear(64, 64).cuda()\nopt = torch.optim.AdamW(w.parameters())\n\
         for i in range(1000):\n    w(torch.randn(8, 64, device='cuda')).sum().backward()\n    opt.step()\n\
         raise SystemExit('the loop ran to its end')\n",
    );
    let (v, _) = traced_json(&prog, &["--steps", "2"]);
    assert_eq!(v["trace"]["steps"], 2);
    let ended = v["trace"]["ended"].as_str().expect("why it ended");
    assert!(ended.contains("stopped after 2 optimizer steps"), "{ended}");
    assert_eq!(v["trace"]["exit_status"], 0);
}
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_workspace_that_no_longer_fits_after_a_clear_is_the_programs_oom() {
    // `_cuda_clearCublasWorkspaces` (and the cache emptied) means the next
    // GEMM takes its workspace again; where that does not fit, the program
    // gets its OOM at that line (a GEMM sent without waiting could not).
    let s = Scratch::new("clear-ws");
    let prog = s.file(
        "ws.py",
        "import torch\na = torch.randn(512, 512, device='cuda')\nb = torch.randn(512, 512, device='cuda')\n\
         for _ in range(3):\n    c = a @ b\ndel c\ntorch._C._cuda_clearCublasWorkspaces()\n\
         torch.cuda.empty_cache()\n\
         torch.cuda.set_per_process_memory_fraction(24 * 2**20 / torch.cuda.get_device_properties(0).total_memory)\n\
         try:\n    c = a @ b\n    print('NO OOM')\nexcept torch.cuda.OutOfMemoryError as e:\n    print('CAUGHT', e)\n",
    );
    let (v, err) = traced_json(&prog, &["--steps", "0"]);
    assert!(err.contains("CAUGHT CUDA out of memory"), "{err}");
    assert_eq!(v["trace"]["ooms"], 1, "{v}");
    let untraced = v["trace"]["untraced"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !untraced
            .iter()
            .any(|u| u.to_string().contains("sent without waiting")),
        "{untraced:?}"
    );
}
/// An op whose output size depends on the data runs with a size vramscope
/// assumes, named with its line and the assumption (`trace.assumed`): a
/// mask that is no router's counts as all true. An op meta has no kernel
/// for (`unique`) is named untraced with its line, and the program gets
/// `NotImplementedError`.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn an_op_that_needs_data_is_named_with_its_line() {
    let s = Scratch::new("nonzero");
    let prog = s.file(
        "nz.py",
        "import torch\nx = torch.randn(100, device='cuda')\nidx = torch.nonzero(x > 0)\n\
         print('ROWS', idx.shape[0])\ntry:\n    u = torch.unique(x)\n\
         except NotImplementedError as e:\n    print('CAUGHT', e)\n",
    );
    let (v, err) = traced_json(&prog, &["--steps", "0"]);
    assert!(err.contains("ROWS 100"), "every element true: {err}");
    let a = &v["trace"]["assumed"][0];
    assert_eq!(a["what"], "aten.nonzero", "{a}");
    assert!(
        a["at"].as_str().is_some_and(|at| at.contains("nz.py:3")),
        "{a}"
    );
    assert!(
        a["assumption"]
            .as_str()
            .is_some_and(|w| w.contains("upper bound")),
        "{a}"
    );
    assert!(
        err.contains("CAUGHT vramscope trace: aten._unique2"),
        "{err}"
    );
    let u = &v["trace"]["untraced"][0];
    assert!(
        u["what"].as_str().is_some_and(|w| w.contains("unique")),
        "{u}"
    );
    assert!(
        u["at"].as_str().is_some_and(|at| at.contains("nz.py:6")),
        "{u}"
    );
}
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_program_that_never_imports_torch_is_said_to_be_untraced() {
    let s = Scratch::new("notorch");
    let prog = s.file("hello.py", "print('hello')\n");
    let (code, out, _) = trace(&["--headless"], &prog, &[]);
    assert_eq!(code, 2);
    assert!(out.contains("nothing was traced"), "{out}");
}
