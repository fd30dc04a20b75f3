//! Mixed parameter dtypes in the model language (issue 42): `dtypes` gives
//! the parameters under a module path their own dtype (fp32 norms in a bf16
//! model); each is allocated once, in it, and its gradient follows it.

use super::super::dtype::DType;
use super::super::model_lang::{LangModel, ModelInput, Module};
use super::super::LossKind;
use super::*;

fn model(dtypes: Vec<(String, DType)>) -> ModelConfig {
    let net = Module::Sequential(vec![
        ("emb".into(), Module::Embedding { num: 100, dim: 16 }),
        (
            "ln".into(),
            Module::LayerNorm {
                dim: 16,
                bias: true,
            },
        ),
        (
            "fc".into(),
            Module::Linear {
                input: 16,
                out: 4,
                bias: true,
            },
        ),
    ]);
    ModelConfig {
        loss: LossKind::Sum,
        param_dtype: DType::BF16,
        ..ModelConfig::modules(
            LangModel {
                dtypes,
                ..LangModel::new(ModelInput::Tokens { seq: 8 }, net)
            },
            2,
        )
    }
}

#[test]
fn an_fp32_norm_in_a_bf16_model_is_moved_in_fp32() {
    let mut e = engine(model(vec![("ln".into(), DType::F32)]));
    // emb [100, 16] bf16; ln weight, bias [16] fp32; fc [4, 16], [4] bf16.
    assert_eq!(
        requests(&e.take_events()),
        vec![100 * 16 * 2, 16 * 4, 16 * 4, 4 * 16 * 2, 4 * 2]
    );
    let dtypes: Vec<DType> = e.parameters().iter().map(|p| e.dtype(*p)).collect();
    assert_eq!(
        dtypes,
        [
            DType::BF16,
            DType::F32,
            DType::F32,
            DType::BF16,
            DType::BF16
        ]
    );
    // A training step: the norm's gradients come back in fp32.
    run(
        &mut e,
        &program(
            {
                let mut s = forward_steps();
                s.push(Step::Backward {
                    loss: "loss".into(),
                    retain_graph: false,
                });
                s
            },
            1,
        ),
    );
    let grads: Vec<Option<DType>> = e
        .parameters()
        .iter()
        .map(|p| e.tensors[p.0].grad.map(|g| e.dtype(g)))
        .collect();
    assert_eq!(grads[1..3], [Some(DType::F32), Some(DType::F32)]);
    assert_eq!(grads[3], Some(DType::BF16));
}

#[test]
fn without_dtypes_the_model_is_all_its_dtype() {
    let e = engine(model(Vec::new()));
    assert!(e.parameters().iter().all(|p| e.dtype(*p) == DType::BF16));
}
