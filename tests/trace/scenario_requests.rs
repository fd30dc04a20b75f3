//! Issue 38's rule for the built-ins: where a built-in scenario and a
//! capture program describe the same training, `vramscope trace` of the
//! program (real PyTorch on the CPU, a simulated GPU) and the scenario
//! (`vramscope export`) make the same requests, byte for byte and in
//! order (the frees of one moment compared as a set, as `captures` does).
//! The capture programs of issue 39's leak patterns are written before a
//! GPU is lent: this is the strong check they get until then.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::captures::requests;
use super::{trace, Scratch};

/// [`requests`]' groups: (an allocation?, its sizes).
type Requests = Vec<(bool, Vec<u64>)>;

/// (capture program, built-in scenario): each pair must agree exactly.
pub const PAIRS: &[(&str, &str)] = &[
    ("adversarial_input_graph_bug", "adversarial-input-graph-bug"),
    (
        "adversarial_input_detach_fixed",
        "adversarial-input-detach-fixed",
    ),
    (
        "forward_hook_activations_bug",
        "forward-hook-activations-bug",
    ),
    ("forward_hook_removed_fixed", "forward-hook-removed-fixed"),
    ("input_grad_create_graph_bug", "input-grad-create-graph-bug"),
    (
        "input_grad_create_graph_detach_fixed",
        "input-grad-create-graph-detach-fixed",
    ),
    ("teacher_forward_grad_bug", "teacher-forward-grad-bug"),
    (
        "teacher_forward_no_grad_fixed",
        "teacher-forward-no-grad-fixed",
    ),
    (
        "model_recreated_stale_optimizer_bug",
        "model-recreated-stale-optimizer-bug",
    ),
    (
        "model_recreated_with_optimizer_fixed",
        "model-recreated-with-optimizer-fixed",
    ),
    ("gan_retain_graph_log_bug", "gan-retain-graph-log-bug"),
    ("gan_detach_item_fixed", "gan-detach-item-fixed"),
    ("wgan_gp_grad_maps_bug", "wgan-gp-grad-maps-bug"),
    ("wgan_gp_grad_maps_cpu_fixed", "wgan-gp-grad-maps-cpu-fixed"),
    ("hvp_grad_history_bug", "hvp-grad-history-bug"),
    ("hvp_grad_history_cpu_fixed", "hvp-grad-history-cpu-fixed"),
];

/// Where the two request lists part, if they do.
fn parting(
    program: &str,
    traced: &[(bool, Vec<u64>)],
    scenario: &[(bool, Vec<u64>)],
) -> Option<String> {
    match traced.iter().zip(scenario).position(|(a, b)| a != b) {
        None if traced.len() == scenario.len() => None,
        None => Some(format!(
            "{program}: {} request groups traced, {} in the scenario",
            traced.len(),
            scenario.len()
        )),
        Some(i) => Some(format!(
            "{program}: the requests part at group {i} (an allocation is one group, the frees \
             between two allocations another): traced {:?}, scenario {:?}",
            traced[i], scenario[i]
        )),
    }
}

/// `vramscope export SCENARIO -o TO` (a built-in's name or a scenario
/// file): the requests the scenario makes. `label` names it on failure.
fn exported_requests(label: &str, scenario: &OsStr, to: &Path) -> Requests {
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .arg("export")
        .arg(scenario)
        .arg("-o")
        .arg(to)
        .output()
        .expect("vramscope runs");
    assert!(
        out.status.success(),
        "{label}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    requests(to)
}

/// A program written here, traced with its snapshot exported, and the
/// scenario beside it exported: (traced, scenario) requests.
fn traced_and_scenario(name: &str, program: &str, ron: &str) -> (Requests, Requests) {
    let scratch = Scratch::new(name);
    let program = scratch.file(&format!("{name}.py"), program);
    let scenario = scratch.file(&format!("{name}.ron"), ron);
    let traced = scratch.0.join("traced.pickle");
    let (code, _, err) = trace(
        &[
            "--json",
            "--steps",
            "0",
            "--export",
            &traced.to_string_lossy(),
        ],
        &program,
        &[],
    );
    assert!(traced.exists(), "{name}: exit {code}: {err}");
    let exported = scratch.0.join("scenario.pickle");
    let s = exported_requests(name, scenario.as_os_str(), &exported);
    (requests(&traced), s)
}

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn traced_capture_programs_make_their_built_ins_requests() {
    super::python();
    let scratch = Scratch::new("scenario-requests");
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch");
    let mut faults = Vec::new();
    for (program, scenario) in PAIRS {
        let traced = scratch.0.join(format!("{program}.pickle"));
        let (code, _, err) = trace(
            &["--json", "--steps", "0"],
            &fixtures.join(format!("{program}.py")),
            &[&traced.to_string_lossy()],
        );
        if !traced.exists() {
            faults.push(format!("{program}: traced nothing (exit {code}): {err}"));
            continue;
        }
        let exported = scratch.0.join(format!("{scenario}.pickle"));
        let s = exported_requests(&format!("export {scenario}"), scenario.as_ref(), &exported);
        let t = requests(&traced);
        assert!(
            t.len() > 100,
            "{program}: only {} request groups traced",
            t.len()
        );
        faults.extend(parting(program, &t, &s));
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

#[test]
fn every_pair_names_a_program_and_its_built_in() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch");
    for (program, scenario) in PAIRS {
        let source = std::fs::read_to_string(fixtures.join(format!("{program}.py")))
            .unwrap_or_else(|e| panic!("{program}.py: {e}"));
        assert!(
            source.contains(&format!("\"{scenario}\"")),
            "{program}.py does not name {scenario}"
        );
        assert!(
            vramscope::scenario::builtins()
                .iter()
                .any(|b| b.name == *scenario),
            "{scenario} is not a built-in"
        );
    }
}

/// The attack of `pgd-autograd-grad-bug` on a model that is not frozen:
/// `torch.autograd.grad(loss, x)` then runs only toward `x` (engine.cpp's
/// `exec_info`): the Linear backwards compute their input's gradient and
/// not their weight's, no AccumulateGrad runs. Traced and as a scenario,
/// the same requests.
const UNFROZEN: &str = r#"
import os
os.environ.update({"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8", "CUBLASLT_WORKSPACE_SIZE": "1024",
                   "TORCH_CUBLAS_WORKSPACE_CACHE": "1"})
import torch, torch.nn as nn, torch.nn.functional as F
torch.cuda.memory._record_memory_history(max_entries=100000)
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                      nn.Linear(1024, 10)).cuda()
x = torch.randn(256, 784, device="cuda")
y = torch.randint(0, 10, (256,), device="cuda")
x.requires_grad_()
for it in range(4):
    out = model(x)
    loss = F.cross_entropy(out, y)
    g = torch.autograd.grad(loss, x)[0]
    x = (x + 0.01 * g.sign()).clamp(0, 1)
"#;

const UNFROZEN_RON: &str = r#"Scenario(
    name: "unfrozen", description: "pgd-autograd-grad-bug, the model not frozen",
    device: (gpu: "H100-SXM-80GB"), torch: "2.11",
    env: {"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8", "CUBLASLT_WORKSPACE_SIZE": "1024", "TORCH_CUBLAS_WORKSPACE_CACHE": "1"},
    model: Preset("mlp-mnist"),
    setup: [LoadBatch(x: "x", y: "y"), RequiresGrad(name: "x")],
    steps: [
        Forward(input: "x", output: "out"),
        Loss(output: "out", target: "y", into: "loss"),
        AutogradGrad(output: "loss", input: "x", into: "g", retain_graph: false),
        GradSignStep(input: "x", grad: "g", clamp: true, detach: false),
    ],
    iterations: 4,
)"#;

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn autograd_grad_on_a_trained_model_runs_only_toward_its_input() {
    super::python();
    let (t, s) = traced_and_scenario("unfrozen", UNFROZEN, UNFROZEN_RON);
    assert!(t.len() > 100, "only {} request groups traced", t.len());
    if let Some(f) = parting("unfrozen", &t, &s) {
        panic!("{f}");
    }
}

/// `torch.autograd.grad(…, x, create_graph=True)` through Linears whose
/// weights require grad (issue 39: a WGAN-GP critic's gradient penalty
/// begins so): each MmBackward0 of the gradient's graph saves the incoming
/// gradient too, for the weight's gradient a second backward would make.
/// Two programs, traced and as scenarios, make the same requests: a
/// critic (784 → 1024 → 1, its score `out.sum()`, SumBackward0's rule) and
/// input-grad-create-graph-bug's loop with the model not frozen.
const TRAINED_CREATE_GRAPH: &[(&str, &str, &str)] = &[
    (
        "critic",
        r#"
import os
os.environ.update({"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8", "CUBLASLT_WORKSPACE_SIZE": "1024",
                   "TORCH_CUBLAS_WORKSPACE_CACHE": "1"})
import torch, torch.nn as nn
torch.cuda.memory._record_memory_history(max_entries=100000)
critic = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1)).cuda()
gs = []
for it in range(4):
    x_hat = torch.randn(256, 784, device="cuda")
    x_hat.requires_grad_()
    out = critic(x_hat)
    score = out.sum()
    g = torch.autograd.grad(score, x_hat, create_graph=True)[0]
    gs.append(g)
"#,
        r#"Scenario(
    name: "critic", description: "a trained critic's input gradient with create_graph=True, kept",
    device: (gpu: "H100-SXM-80GB"), torch: "2.11",
    env: {"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8", "CUBLASLT_WORKSPACE_SIZE": "1024", "TORCH_CUBLAS_WORKSPACE_CACHE": "1"},
    model: Mlp(dims: [784, 1024, 1]), criterion: Sum,
    setup: [NewList(name: "gs")],
    steps: [
        LoadBatch(x: "x_hat", y: "y"),
        RequiresGrad(name: "x_hat"),
        Forward(input: "x_hat", output: "out"),
        Loss(output: "out", target: "y", into: "score"),
        AutogradGrad(output: "score", input: "x_hat", into: "g", retain_graph: false, create_graph: true),
        Append(from: "g", list: "gs", what: Tensor),
    ],
    iterations: 4,
)"#,
    ),
    (
        "trained",
        r#"
import os
os.environ.update({"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8", "CUBLASLT_WORKSPACE_SIZE": "1024",
                   "TORCH_CUBLAS_WORKSPACE_CACHE": "1"})
import torch, torch.nn as nn, torch.nn.functional as F
torch.cuda.memory._record_memory_history(max_entries=100000)
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                      nn.Linear(1024, 10)).cuda()
maps = []
for it in range(4):
    x = torch.randn(256, 784, device="cuda")
    y = torch.randint(0, 10, (256,), device="cuda")
    x.requires_grad_()
    out = model(x)
    loss = F.cross_entropy(out, y)
    g = torch.autograd.grad(loss, x, create_graph=True)[0]
    maps.append(g)
"#,
        r#"Scenario(
    name: "trained", description: "input-grad-create-graph-bug, the model trained",
    device: (gpu: "H100-SXM-80GB"), torch: "2.11",
    env: {"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8", "CUBLASLT_WORKSPACE_SIZE": "1024", "TORCH_CUBLAS_WORKSPACE_CACHE": "1"},
    model: Preset("mlp-mnist"),
    setup: [NewList(name: "maps")],
    steps: [
        LoadBatch(x: "x", y: "y"),
        RequiresGrad(name: "x"),
        Forward(input: "x", output: "out"),
        Loss(output: "out", target: "y", into: "loss"),
        AutogradGrad(output: "loss", input: "x", into: "g", retain_graph: false, create_graph: true),
        Append(from: "g", list: "maps", what: Tensor),
    ],
    iterations: 4,
)"#,
    ),
];

#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn create_graph_through_trained_linears_makes_pytorchs_requests() {
    super::python();
    let mut faults = Vec::new();
    for (name, program, ron) in TRAINED_CREATE_GRAPH {
        let (t, s) = traced_and_scenario(name, program, ron);
        assert!(
            t.len() > 50,
            "{name}: only {} request groups traced",
            t.len()
        );
        faults.extend(parting(name, &t, &s));
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
}

/// moe_small.py routes with `torch.where(chosen == e)` (`nonzero`, whose
/// size the data decide and the simulated GPU does not hold): the trace
/// assumes balanced top-2 routing there and says so (`trace.assumed`, with
/// the line, every call counted). The `moe-small` built-in with its
/// measured counts replaced by `Routing::Balanced` makes the same
/// assumption: the two make the same requests, byte for byte and in order.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn moe_small_traced_under_balanced_routing_makes_the_built_ins_requests() {
    super::python();
    let scratch = Scratch::new("moe-balanced");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let ron = std::fs::read_to_string(root.join("scenarios/moe-small.ron")).expect("moe-small");
    let (start, end) = (
        ron.find("routing: Counts(")
            .expect("moe-small gives its counts"),
        ron.find("]),\n                    )),")
            .expect("the counts' end"),
    );
    let balanced = format!(
        "{}routing: Balanced,{}",
        &ron[..start],
        &ron[end + "]),".len()..]
    );
    assert!(!balanced.contains("Counts"), "{balanced}");
    let scenario = scratch.file("moe-balanced.ron", &balanced);
    let s = exported_requests(
        "moe-small, balanced",
        scenario.as_os_str(),
        &scratch.0.join("scenario.pickle"),
    );
    let traced = scratch.0.join("traced.pickle");
    let (code, out, err) = trace(
        &["--json", "--steps", "0"],
        &root.join("tests/fixtures/pytorch/moe_small.py"),
        &[&traced.to_string_lossy()],
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("--json");
    assert_eq!(v["trace"]["untraced"], serde_json::json!([]), "{err}");
    let assumed = v["trace"]["assumed"].as_array().expect("trace.assumed");
    assert_eq!(assumed.len(), 1, "{assumed:?}");
    assert_eq!(assumed[0]["what"], "aten.nonzero");
    // 8 experts × 4 layers × 3 iterations.
    assert_eq!(assumed[0]["calls"], 96);
    let at = assumed[0]["at"].as_str().unwrap_or_default();
    assert!(at.contains("moe_small.py:46 in forward"), "{at}");
    let said = assumed[0]["assumption"].as_str().unwrap_or_default();
    assert!(
        said.contains("balanced top-2 routing over 8 experts"),
        "{said}"
    );
    assert!(said.contains("512 rows of 2048 tokens × 2"), "{said}");
    let t = requests(&traced);
    assert!(t.len() > 1000, "only {} request groups traced", t.len());
    // The program rebinds `idx` (line 21 of _lm_train.py) and then `tgt`,
    // each freeing the last iteration's as the new one is made; the
    // built-in says so (`LoadBatch(..., assign: InTurn)`).
    let batch = 8 * 256 * 8;
    let in_turn = t
        .windows(4)
        .filter(|w| {
            w[0] == (true, vec![batch])
                && w[1] == (false, vec![batch])
                && w[2] == (true, vec![batch])
                && !w[3].0
                && w[3].1.contains(&batch)
        })
        .count();
    assert_eq!(in_turn, 2, "the batch is made anew in iterations 2 and 3");
    if let Some(f) = parting("moe_small", &t, &s) {
        let i = t.iter().zip(&s).position(|(a, b)| a != b).unwrap_or(0);
        let around = |r: &Requests| r[i.saturating_sub(12)..(i + 6).min(r.len())].to_vec();
        panic!("{f}\ntraced {:?}\nscenario {:?}", around(&t), around(&s));
    }
}
