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
        let hidden = match hidden {
            Some((h, c)) => (e.local_ref(h), e.local_ref(c)),
            None => self.init_hidden(e, e.shape(input).dim(1))?,
        };
        let mut frame = Frame {
            hidden: Some(hidden),
            ..Frame::default()
        };
        let r = self.forward_in(e, input, &mut frame);
        // The frame drops its locals in co_varnames order as forward()
        // returns or raises: hidden (unless returned), emb, output, decoded.
        if let Some((h, c)) = frame.hidden {
            e.release(h);
            e.release(c);
        }
        for t in [frame.emb, frame.output, frame.decoded]
            .into_iter()
            .flatten()
        {
            e.release(t);
        }
        r
    }

    /// forward()'s body; each rebinding of a local frees what it held.
    fn forward_in(
        &self,
        e: &mut Engine,
        input: TensorId,
        f: &mut Frame,
    ) -> Result<(TensorId, (TensorId, TensorId))> {
        let emb = e.in_module(self.encoder.module, |e| e.embedding(self.encoder.w, input))?;
        f.emb = Some(emb);
        let d = e.in_module(self.drop_module, |e| e.dropout(emb, self.dropout))?;
        f.emb = Some(d);
        e.release(emb);
        let Some((h0, c0)) = f.hidden else {
            return Err(EngineError::Program("forward without hidden state".into()));
        };
        // `output, hidden = self.rnn(emb, hidden)`
        let (out, hn, cn) = e.lstm(&self.rnn, d, h0, c0)?;
        f.output = Some(out);
        f.hidden = Some((hn, cn));
        e.release(h0);
        e.release(c0);
        let d = e.in_module(self.drop_module, |e| e.dropout(out, self.dropout))?;
        f.output = Some(d);
        e.release(out);
        let dec = e.apply_linear(&self.decoder, d)?;
        f.decoded = Some(dec);
        let s = e.shape(dec);
        let flat = e.reshape(dec, Shape::new(&[s.leading(), s.last()]))?;
        f.decoded = Some(flat);
        e.release(dec);
        let logp = e.in_module(self.decoder.module, |e| e.softmax(flat, true))?;
        let hidden = f.hidden.take().unwrap_or((hn, cn));
        Ok((logp, hidden))
    }
}

/// forward()'s locals that hold tensors.
#[derive(Default)]
struct Frame {
    hidden: Option<(TensorId, TensorId)>,
    emb: Option<TensorId>,
    output: Option<TensorId>,
    decoded: Option<TensorId>,
}
