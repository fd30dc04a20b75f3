//! Hugging Face's `ForCausalLMLoss` (models.md §5.2, loss/loss_utils.py).

use super::super::config::HfCausalLoss;
use super::super::dtype::DType;
use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::{Layout, TensorId};
use super::super::Engine;
use crate::engine::autograd::BwdKind;

impl Engine {
    /// `ForCausalLMLoss(logits [B, T, V], labels [B, T])`, reduction "mean".
    /// ≥ 4.49 (`PadLabels`): `logits.float()`, labels padded with -100 and
    /// shifted (a copy unless B is 1), cross-entropy over all B·T rows.
    /// ≤ 4.48 (`ShiftCopy`): also `logits[..., :-1, :].contiguous()` and
    /// `labels[..., 1:].contiguous()`, copies unless B is 1 (a slice of a
    /// contiguous tensor's middle dimension is contiguous when the first is 1,
    /// and `.contiguous()` returns it as it is).
    pub fn hf_causal_lm_loss(&mut self, logits: TensorId, labels: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("ForCausalLMLoss");
        let r = self.scoped(|e| e.causal_loss_body(logits, labels));
        // The model's forward returns with its loss: its locals go.
        self.loss_made_from(logits);
        self.op_end(prev)?;
        r
    }

    fn causal_loss_body(&mut self, logits: TensorId, labels: TensorId) -> Result<TensorId> {
        let s = self.shape(logits);
        let (b, t, v) = (s.dim(0), s.dim(1), s.last());
        let lf = self.to_dtype(logits, DType::F32)?;
        let (rows_logits, shift_labels, padded) = match self.cfg.hf_causal_loss {
            HfCausalLoss::PadLabels => {
                let padded =
                    self.factory(Shape::new(&[b, t + 1]), DType::I64, Category::Activation)?;
                self.k_unary(labels, padded);
                // `labels[..., 1:]` of [B, T+1] is contiguous only when B is 1.
                let shifted = if b > 1 {
                    self.factory(Shape::new(&[b, t]), DType::I64, Category::Activation)?
                } else {
                    self.view_as(padded, Shape::new(&[b, t]), Layout::Contiguous)
                };
                let rows = self.view_as(lf, Shape::new(&[b * t, v]), Layout::Contiguous);
                (rows, shifted, Some(padded))
            }
            HfCausalLoss::ShiftCopy => {
                // SliceBackward0 makes a zero-filled gradient of the full logits.
                let layout = if b == 1 {
                    Layout::Contiguous
                } else {
                    Layout::Strided
                };
                let sliced = self.view_with_node(
                    lf,
                    Shape::new(&[b, t.saturating_sub(1), v]),
                    layout,
                    "SliceBackward0",
                    BwdKind::Alloc,
                );
                let shift_logits = if b == 1 {
                    sliced
                } else {
                    let copy = self.contiguous(sliced);
                    self.release(sliced);
                    copy?
                };
                let label_shape = Shape::new(&[b, t.saturating_sub(1)]);
                let shifted = if b == 1 {
                    self.view_as(labels, label_shape, Layout::Contiguous)
                } else {
                    let s = self.factory(label_shape, DType::I64, Category::Activation)?;
                    self.k_unary(labels, s);
                    s
                };
                let n = b * t.saturating_sub(1);
                let rows = self.view_as(shift_logits, Shape::new(&[n, v]), Layout::Contiguous);
                self.release(shift_logits);
                (rows, shifted, None)
            }
        };
        let n = self.shape(shift_labels).numel();
        let flat = self.view_as(shift_labels, Shape::new(&[n]), Layout::Contiguous);
        let loss = self.cross_entropy(rows_logits, flat);
        for local in [
            Some(lf),
            padded,
            Some(shift_labels),
            Some(rows_logits),
            Some(flat),
        ]
        .into_iter()
        .flatten()
        {
            self.release(local);
        }
        loss
    }
}
