//! `Ops`: a `forward` written op for op (issue 42). The analysis's shapes
//! for its statements ([`shapes`]) and its run on the engine's ops
//! ([`run`]), with CPython's lifetimes: an operand no name holds dies as
//! the op that takes it returns; names live until the module returns.

use super::shape::ShapeError;
use super::spec::Expr;
use crate::engine::error::{EngineError, Result};
use crate::engine::ops::elementwise::Unary;
use crate::engine::tensor::TensorId;
use crate::engine::Engine;

/// The dims of the last statement's value on an input of `x` dims, or the
/// first error: a name not bound yet, an empty list, a broadcast PyTorch
/// refuses, or one the engine does not model (both operands stretched).
pub(crate) fn shapes(
    statements: &[(String, Expr)],
    x: &[u64],
) -> std::result::Result<Vec<u64>, ShapeError> {
    let mut env: Vec<(&str, Vec<u64>)> = Vec::new();
    for (name, expr) in statements {
        let dims = expr_shape(expr, x, &env)?;
        env.retain(|(n, _)| n != name);
        env.push((name, dims));
    }
    env.pop().map(|(_, d)| d).ok_or(ShapeError::OpsEmpty)
}

fn expr_shape(
    e: &Expr,
    x: &[u64],
    env: &[(&str, Vec<u64>)],
) -> std::result::Result<Vec<u64>, ShapeError> {
    let one = |a: &Expr| expr_shape(a, x, env);
    match e {
        Expr::X => Ok(x.to_vec()),
        Expr::Var(n) => env
            .iter()
            .rev()
            .find(|(k, _)| k == n)
            .map(|(_, d)| d.clone())
            .ok_or_else(|| ShapeError::OpsUnbound(n.clone())),
        Expr::Exp(a) | Expr::Sigmoid(a) | Expr::Tanh(a) | Expr::Relu(a) | Expr::Scale(a) => one(a),
        Expr::Max(a) | Expr::Sum(a) => {
            let mut d = one(a)?;
            match d.last_mut() {
                Some(l) => *l = 1,
                None => return Err(ShapeError::OpsReduceScalar),
            }
            Ok(d)
        }
        Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) | Expr::Div(a, b) => {
            broadcast(one(a)?, one(b)?)
        }
    }
}

/// PyTorch's broadcast of two shapes, where one of them is the result (the
/// engine's binary ops make an output of one operand's shape).
fn broadcast(a: Vec<u64>, b: Vec<u64>) -> std::result::Result<Vec<u64>, ShapeError> {
    let n = a.len().max(b.len());
    let at = |s: &[u64], i: usize| {
        (i + s.len())
            .checked_sub(n)
            .map_or(1, |j| s.get(j).copied().unwrap_or(1))
    };
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (p, q) = (at(&a, i), at(&b, i));
        match (p, q) {
            _ if p == q => out.push(p),
            (1, q) => out.push(q),
            (p, 1) => out.push(p),
            _ => return Err(ShapeError::OpsBroadcast { left: a, right: b }),
        }
    }
    if out != a && out != b {
        return Err(ShapeError::OpsBothBroadcast { left: a, right: b });
    }
    Ok(out)
}

/// The statements on `x` (the caller keeps `x`): a new handle on the last
/// value.
pub(crate) fn run(e: &mut Engine, statements: &[(String, Expr)], x: TensorId) -> Result<TensorId> {
    let mut env: Vec<(String, TensorId)> = Vec::new();
    let mut last = None;
    let mut failed = None;
    for (name, expr) in statements {
        match eval(e, expr, x, &env) {
            Ok(v) => {
                // `name = value`: the new value first, then the old one goes.
                match env.iter_mut().find(|(n, _)| n == name) {
                    Some(slot) => e.release(std::mem::replace(&mut slot.1, v)),
                    None => env.push((name.clone(), v)),
                }
                last = Some(v);
            }
            Err(err) => {
                failed = Some(err);
                break;
            }
        }
    }
    let out = match (failed, last) {
        (Some(err), _) => Err(err),
        (None, Some(v)) => Ok(e.local_ref(v)),
        (None, None) => Err(EngineError::Program("Ops: no statement".into())),
    };
    // The frame's names go as it returns, in the order they were bound.
    for (_, t) in env {
        e.release(t);
    }
    out
}

fn eval(e: &mut Engine, expr: &Expr, x: TensorId, env: &[(String, TensorId)]) -> Result<TensorId> {
    let unary = |e: &mut Engine, op: Unary, a: &Expr| -> Result<TensorId> {
        let a = eval(e, a, x, env)?;
        let out = e.unary(op, a);
        e.release(a);
        out
    };
    match expr {
        Expr::X => Ok(e.local_ref(x)),
        Expr::Var(n) => match env.iter().rev().find(|(k, _)| k == n) {
            Some((_, t)) => Ok(e.local_ref(*t)),
            None => Err(EngineError::Program(format!("Ops: `{n}` is not bound"))),
        },
        Expr::Exp(a) => unary(e, Unary::Exp, a),
        Expr::Sigmoid(a) => unary(e, Unary::Sigmoid, a),
        Expr::Tanh(a) => unary(e, Unary::Tanh, a),
        Expr::Relu(a) => unary(e, Unary::Relu, a),
        Expr::Scale(a) => one(e, a, x, env, Engine::mul_scalar),
        Expr::Max(a) => one(e, a, x, env, Engine::max_last_keepdim),
        Expr::Sum(a) => one(e, a, x, env, Engine::sum_last_keepdim),
        Expr::Add(a, b) => two(e, [a, b], x, env, Engine::add),
        Expr::Sub(a, b) => two(e, [a, b], x, env, Engine::sub),
        Expr::Mul(a, b) => two(e, [a, b], x, env, Engine::mul),
        Expr::Div(a, b) => two(e, [a, b], x, env, Engine::div),
    }
}

type OneOp = fn(&mut Engine, TensorId) -> Result<TensorId>;
type TwoOp = fn(&mut Engine, TensorId, TensorId) -> Result<TensorId>;

fn one(
    e: &mut Engine,
    a: &Expr,
    x: TensorId,
    env: &[(String, TensorId)],
    op: OneOp,
) -> Result<TensorId> {
    let a = eval(e, a, x, env)?;
    let out = op(e, a);
    e.release(a);
    out
}

/// Operands left to right, then the op; both die as it returns.
fn two(
    e: &mut Engine,
    [a, b]: [&Expr; 2],
    x: TensorId,
    env: &[(String, TensorId)],
    op: TwoOp,
) -> Result<TensorId> {
    let a = eval(e, a, x, env)?;
    let b = match eval(e, b, x, env) {
        Ok(b) => b,
        Err(err) => {
            e.release(a);
            return Err(err);
        }
    };
    let out = op(e, a, b);
    e.release(a);
    e.release(b);
    out
}

#[cfg(test)]
mod tests {
    use super::{broadcast, ShapeError};

    #[test]
    fn broadcasting_follows_pytorch_and_stays_within_one_operand() {
        // Aligned from the right; a 1 stretches.
        assert_eq!(broadcast(vec![4, 8, 16], vec![4, 8, 1]), Ok(vec![4, 8, 16]));
        assert_eq!(broadcast(vec![16], vec![4, 8, 16]), Ok(vec![4, 8, 16]));
        assert!(matches!(
            broadcast(vec![4, 8], vec![4, 16]),
            Err(ShapeError::OpsBroadcast { .. })
        ));
        // [4, 1] and [1, 16] make [4, 16], neither operand's shape.
        assert!(matches!(
            broadcast(vec![4, 1], vec![1, 16]),
            Err(ShapeError::OpsBothBroadcast { .. })
        ));
    }
}
