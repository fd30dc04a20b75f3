//! word_language_model's RNNModel (engine.md §10.3): encoder → dropout →
//! LSTM → dropout → decoder → log_softmax.

use super::super::error::{EngineError, Result};
use super::super::presets::ModelKind;
use super::super::rnn::Lstm;
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::TensorId;
use super::super::Engine;
use super::{Embedding, Linear};

#[derive(Debug)]
pub(crate) struct LstmLm {
    pub encoder: Embedding,
    pub rnn: Lstm,
    pub decoder: Linear,
    pub dropout: f64,
    pub drop_module: u32,
}

impl LstmLm {
    pub fn build(e: &mut Engine, kind: &ModelKind, params: &mut Vec<TensorId>) -> Result<LstmLm> {
        let ModelKind::LstmLm {
            vocab,
            emb,
            hidden,
            layers,
            dropout,
            cudnn,
            ..
        } = *kind
        else {
            return Err(EngineError::Program("not an LSTM config".into()));
        };
        let encoder = e.new_embedding("encoder", vocab, emb, params)?;
        let rnn = e.new_lstm("rnn", emb, hidden, layers, dropout, cudnn, params)?;
        let decoder = e.new_linear("decoder", hidden, vocab, true, params)?;
        let drop_module = e.tags.module("drop");
        Ok(LstmLm {
            encoder,
            rnn,
            decoder,
            dropout,
            drop_module,
        })
    }

    /// `init_hidden(bsz)`: zero (h0, c0) of [L, B, H].
    pub fn init_hidden(&self, e: &mut Engine, b: u64) -> Result<(TensorId, TensorId)> {
        let s = Shape::new(&[self.rnn.layers, b, self.rnn.hidden]);
        // `weight.new_zeros(...)`: the model's dtype.
        let h = e.factory(s, e.param_dtype, Category::Activation)?;
        let c = e.factory(s, e.param_dtype, Category::Activation)?;
        Ok((h, c))
    }

    pub fn forward(
        &self,
        e: &mut Engine,
        input: TensorId,
        hidden: Option<(TensorId, TensorId)>,
    ) -> Result<(TensorId, (TensorId, TensorId))> {
        let (h0, c0) = match hidden {
            Some((h, c)) => (e.local_ref(h), e.local_ref(c)),
            None => self.init_hidden(e, e.shape(input).dim(1))?,
        };
        let emb = e.in_module(self.encoder.module, |e| e.embedding(self.encoder.w, input))?;
        let d = e.in_module(self.drop_module, |e| e.dropout(emb, self.dropout));
        let emb = e.rebind(emb, d)?;
        let r = e.lstm(&self.rnn, emb, h0, c0);
        e.release(emb);
        e.release(h0);
        e.release(c0);
        let (out, hn, cn) = r?;
        let d = e.in_module(self.drop_module, |e| e.dropout(out, self.dropout));
        let out = e.rebind(out, d)?;
        let dec = e.apply_linear(&self.decoder, out);
        let dec = e.rebind(out, dec)?;
        let s = e.shape(dec);
        let flat = e.reshape(dec, Shape::new(&[s.leading(), s.last()]));
        let flat = e.rebind(dec, flat)?;
        let logp = e.in_module(self.decoder.module, |e| e.softmax(flat, true));
        let logp = e.rebind(flat, logp)?;
        Ok((logp, (hn, cn)))
    }
}
