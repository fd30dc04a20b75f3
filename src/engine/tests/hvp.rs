//! A Hessian-vector product's first step, `torch.autograd.grad(loss,
//! model.parameters(), create_graph=True)` on a trained MLP under `out.sum()`
//! (engine.md §2; the rules PyTorch 2.11's derivatives.yaml gives, cited in
//! autograd/second_order.rs): what each gradient's recorded graph is and
//! what its nodes save, written from the formulas, not from the engine.

use super::super::autograd::NodeId;
use super::super::presets::LossKind;
use super::super::{Step, TensorId, Value};
use super::*;

fn hvp_first_step() -> Engine {
    let model = ModelConfig {
        loss: LossKind::Sum,
        batch: 256,
        ..ModelConfig::mlp(&[784, 1024, 1], false)
    };
    let mut e = engine(model);
    let mut steps = forward_steps();
    steps.push(Step::AutogradGradParams {
        output: s("loss"),
        into: s("g"),
        retain_graph: false,
        create_graph: true,
        allow_unused: false,
    });
    run(&mut e, &program(steps, 1));
    e
}

fn grad_fn(e: &Engine, t: TensorId) -> Option<NodeId> {
    e.tensors[t.0].grad_fn
}

/// The names of the saved slots a node still holds.
fn saved(e: &Engine, n: NodeId) -> Vec<&'static str> {
    let node = &e.nodes[n.0];
    node.saved
        .iter()
        .filter(|s| s.storage.is_some())
        .map(|s| s.name)
        .collect()
}

/// The names of the nodes a node's inputs lead to (None: no edge).
fn next(e: &Engine, n: NodeId) -> Vec<Option<&'static str>> {
    e.nodes[n.0]
        .inputs
        .iter()
        .map(|m| m.edge.map(|x| e.nodes[x.node.0].name))
        .collect()
}

/// The node `n`'s first input leads to.
fn first_next(e: &Engine, n: NodeId) -> NodeId {
    e.nodes[n.0].inputs[0].edge.expect("an edge").node
}

#[test]
fn parameter_gradients_with_create_graph_record_their_formulas() {
    let e = hvp_first_step();
    let Some(Value::List(g)) = e.binding("g").cloned() else {
        panic!("g is a tuple");
    };
    assert_eq!(g.len(), 4, "weight and bias of two Linears");
    let t = |i: usize| match g[i] {
        Value::Tensor(t) => t,
        ref v => panic!("g[{i}] is {v:?}"),
    };
    // fc1.weight: the forward's weight.t() runs grad.t() (TBackward0), on
    // mm_mat2_backward's column-major `grad.t().mm(x).t()`: MmBackward0,
    // saving `mat2` (x) because `self` (the incoming gradient, recorded by
    // ThresholdBackwardBackward0) requires grad, and not `self`, x needing
    // none.
    let tb = grad_fn(&e, t(0)).expect("fc1.weight's gradient has a history");
    assert_eq!(e.nodes[tb.0].name, "TBackward0");
    assert!(saved(&e, tb).is_empty());
    let mm = first_next(&e, tb);
    assert_eq!(e.nodes[mm.0].name, "MmBackward0");
    assert_eq!(saved(&e, mm), ["mat2"]);
    assert_eq!(e.nodes[mm.0].saved[0].shape.dims(), &[256, 784]);
    assert_eq!(next(&e, mm), [Some("ThresholdBackwardBackward0"), None]);
    // fc1.bias: sum_to of the incoming gradient, SumBackward1 (sizes only).
    let sb = grad_fn(&e, t(1)).expect("fc1.bias's gradient has a history");
    assert_eq!(e.nodes[sb.0].name, "SumBackward1");
    assert!(saved(&e, sb).is_empty());
    assert_eq!(next(&e, sb), [Some("ThresholdBackwardBackward0")]);
    // fc2.weight: the incoming gradient is the expanded seed (no history),
    // so MmBackward0 saves `self` (that seed, 4 bytes of storage) for the
    // ReLU's result, which requires grad, and not `mat2`.
    let tb = grad_fn(&e, t(2)).expect("fc2.weight's gradient has a history");
    let mm = first_next(&e, tb);
    assert_eq!(e.nodes[mm.0].name, "MmBackward0");
    assert_eq!(saved(&e, mm), ["self"]);
    let seed = e.nodes[mm.0].saved[0]
        .storage
        .map(|s| e.storages[s.0].bytes);
    assert_eq!(seed, Some(4));
    assert_eq!(next(&e, mm), [None, Some("ReluBackward0")]);
    // fc2.bias: the seed summed, with no history: no graph, no curvature.
    assert!(grad_fn(&e, t(3)).is_none());
}
