//! LSTM (engine.md §8): the cuDNN `_cudnn_rnn` path with one flat weight buffer
//! and an opaque reserve, and the unfused LSTMCell loop (§8.4).

use super::amp::CastPolicy;
use super::dtype::DType;
use super::error::Result;
use super::shape::Shape;
use super::storage::StorageId;
use super::tag::Category;
use super::tensor::{Layout, TensorId};
use super::Engine;
use crate::engine::autograd::BwdKind;

/// `nn.LSTM` parameters: per layer (w_ih [4H, I_l], w_hh [4H, H], b_ih, b_hh).
#[derive(Debug, Clone)]
pub(crate) struct Lstm {
    #[allow(dead_code)]
    pub input: u64,
    pub hidden: u64,
    pub layers: u64,
    pub dropout: f64,
    pub cudnn: bool,
    pub params: Vec<[TensorId; 4]>,
    /// The flat weight buffer every parameter views (cuDNN path, §8.1).
    #[allow(dead_code)]
    pub flat: Option<StorageId>,
    pub module: u32,
}

impl Engine {
    /// Build an LSTM. On the cuDNN path, `.cuda()` first makes per-parameter
    /// storages, then the flat buffer they are copied into (transient 2×, §8.1).
    #[allow(clippy::too_many_arguments)] // mirrors nn.LSTM's signature
    pub(crate) fn new_lstm(
        &mut self,
        path: &str,
        input: u64,
        hidden: u64,
        layers: u64,
        dropout: f64,
        cudnn: bool,
        params: &mut Vec<TensorId>,
    ) -> Result<Lstm> {
        let module = self.tags.module(path);
        let mut ps = Vec::new();
        let first = params.len();
        for l in 0..layers {
            let il = if l == 0 { input } else { hidden };
            let w_ih = self.new_param(&[4 * hidden, il], module, params)?;
            let w_hh = self.new_param(&[4 * hidden, hidden], module, params)?;
            let b_ih = self.new_param(&[4 * hidden], module, params)?;
            let b_hh = self.new_param(&[4 * hidden], module, params)?;
            ps.push([w_ih, w_hh, b_ih, b_hh]);
        }
        let mut flat = None;
        if cudnn {
            let total: u64 = params[first..].iter().map(|p| self.nbytes(*p)).sum();
            let prev = self.enter_module(module);
            let op = self.op_begin("flatten_parameters");
            let s = self.new_storage(total, Category::Parameter);
            self.exit_module(prev);
            self.op_end(op)?;
            let s = s?;
            // Re-point every parameter at the flat buffer; the old storages die.
            // `param.set_(view of the flat buffer)`: one in-place op on each
            // parameter, which keeps its own version counter (its version is
            // 1 from here; seen in PyTorch's in-place error on an H100).
            self.storages[s.0].engine_refs += 1;
            for p in &params[first..] {
                let old = self.t(*p).storage;
                self.storages[s.0].tensor_refs += 1;
                let t = self.t_mut(*p);
                t.storage = s;
                t.is_view = true;
                self.own_version_counter(*p, 1);
                self.release_storage_tensor(old);
            }
            flat = Some(s);
        }
        Ok(Lstm {
            input,
            hidden,
            layers,
            dropout,
            cudnn,
            params: ps,
            flat,
            module,
        })
    }

    /// `lstm(x [T, B, I], (h0, c0))` → (output [T, B, H], h_n, c_n).
    pub(crate) fn lstm(
        &mut self,
        m: &Lstm,
        x: TensorId,
        h0: TensorId,
        c0: TensorId,
    ) -> Result<(TensorId, TensorId, TensorId)> {
        let prev = self.enter_module(m.module);
        let op = self.op_begin("lstm");
        let r = if m.cudnn {
            self.lstm_cudnn(m, x, h0, c0)
        } else {
            self.lstm_unfused(m, x, h0, c0)
        };
        self.exit_module(prev);
        self.op_end(op)?;
        r
    }

    /// `_cudnn_rnn` (§8.2): output, hy, cy, a transient workspace and — in
    /// training — the reserve (uint8, L·T·B·H·k·elem [unc]), saved for backward.
    fn lstm_cudnn(
        &mut self,
        m: &Lstm,
        x: TensorId,
        h0: TensorId,
        c0: TensorId,
    ) -> Result<(TensorId, TensorId, TensorId)> {
        let xs = self.shape(x);
        let (t, b) = (xs.dim(0), xs.dim(1));
        let dtype = self.dtype(x);
        let h = m.hidden;
        if m.dropout > 0.0
            && m.layers > 1
            && self.ctx.training
            && self.cudnn_dropout_state.is_none()
        {
            // Created once per device and cached (§10.3) [unc size], and only
            // when dropout applies (`get_dropout_state(p, train)`: not in eval;
            // seen on PyTorch 2.11, rnn_hidden_eval_bug).
            // `get_dropout_state` draws the state's seed through a 0-dim
            // int64 CUDA tensor first (seen on PyTorch 2.11, rnn_hidden_fixed).
            let seed = self.transient(8, Category::Temporary)?;
            self.free_transient(seed);
            let bytes = self.cfg.cudnn_dropout_state_bytes;
            let s = self.transient(bytes, Category::Workspace)?;
            self.cudnn_dropout_state = s;
        }
        let out = self.act(Shape::new(&[t, b, h]), dtype)?;
        let hy = self.act(Shape::new(&[m.layers, b, h]), dtype)?;
        let cy = self.act(Shape::new(&[m.layers, b, h]), dtype)?;
        self.k_unary(x, out);
        self.k_unary(h0, hy);
        self.k_unary(c0, cy);
        let weights: Vec<Shape> = m.params.iter().flatten().map(|p| self.shape(*p)).collect();
        self.count_rnn(xs, dtype, &weights);
        let ws_bytes = self.cfg.rnn_workspace_bytes;
        let ws = self.transient(ws_bytes, Category::Workspace)?;
        let training = self.ctx.training;
        let reserve = if training {
            let bytes = self.cfg.rnn_reserve_bytes.unwrap_or_else(|| {
                m.layers * t * b * h * self.cfg.lstm_reserve_factor * dtype.size()
            });
            Some(self.aux(Shape::new(&[bytes]), DType::U8)?)
        } else {
            None
        };
        self.free_transient(ws);
        let flat_params: Vec<TensorId> = m.params.iter().flatten().copied().collect();
        let mut ins = vec![x, h0, c0];
        ins.extend(&flat_params);
        if self.records(&ins) {
            let flat_bytes = flat_params.iter().map(|p| self.nbytes(*p)).sum();
            let ins_opt: Vec<Option<TensorId>> = ins.iter().map(|t| Some(*t)).collect();
            let kind = BwdKind::CudnnRnn {
                workspace: ws_bytes,
                flat_bytes,
                training,
            };
            let node = self.new_node("CudnnRnnBackward0", kind, &ins_opt);
            self.save(node, "input", x, false);
            if let Some(p) = flat_params.first() {
                self.save(node, "weight_buf", *p, false);
            }
            self.save(node, "hx", h0, false);
            self.save(node, "cx", c0, false);
            self.save(node, "result0", out, true);
            if let Some(r) = reserve {
                self.save(node, "result3", r, true);
            }
            self.set_grad_fn(out, node, 0);
            self.set_grad_fn(hy, node, 1);
            self.set_grad_fn(cy, node, 2);
        }
        if let Some(r) = reserve {
            self.release(r);
        }
        Ok((out, hy, cy))
    }

    /// LSTMCell loop (§8.4): per step and layer two matmuls (saving x_t and
    /// h_{t-1}) and `_thnn_fused_lstm_cell` (hy, cy, workspace [B, 4H]; saving
    /// the gates, cx, cy and the workspace).
    fn lstm_unfused(
        &mut self,
        m: &Lstm,
        x: TensorId,
        h0: TensorId,
        c0: TensorId,
    ) -> Result<(TensorId, TensorId, TensorId)> {
        let xs = self.shape(x);
        let (t, b) = (xs.dim(0), xs.dim(1));
        let h = m.hidden;
        let mut layer_in = self.local_ref(x);
        let mut last_h = Vec::new();
        let mut last_c = Vec::new();
        for (l, p) in m.params.iter().enumerate() {
            let mut hcur = self.view_as(h0, Shape::new(&[b, h]), Layout::Contiguous);
            let mut ccur = self.view_as(c0, Shape::new(&[b, h]), Layout::Contiguous);
            let mut outs = Vec::with_capacity(t as usize);
            let il = self.shape(layer_in).last();
            for _ in 0..t {
                let xt = self.view_as(layer_in, Shape::new(&[b, il]), Layout::Contiguous);
                let wt_ih = self.transpose(p[0], 0, 1);
                let ig = self.mm(xt, wt_ih);
                self.release(wt_ih);
                self.release(xt);
                let wt_hh = self.transpose(p[1], 0, 1);
                let hg = self.mm(hcur, wt_hh);
                self.release(wt_hh);
                let (ig, hg) = (ig?, hg?);
                let (hy, cy) = self.fused_lstm_cell(ig, hg, ccur, p[2], p[3])?;
                self.release(ig);
                self.release(hg);
                self.release(ccur);
                self.release(hcur);
                outs.push(hy);
                hcur = self.local_ref(hy);
                ccur = cy;
            }
            let lo = self.stack(&outs, Shape::new(&[t, b, h]))?;
            for o in outs {
                self.release(o);
            }
            last_h.push(hcur);
            last_c.push(ccur);
            let lo = if l + 1 < m.params.len() {
                self.rebind_dropout(lo, m.dropout)?
            } else {
                lo
            };
            layer_in = self.rebind(layer_in, Ok(lo))?;
        }
        let hn = self.stack(&last_h, Shape::new(&[m.layers, b, h]))?;
        let cn = self.stack(&last_c, Shape::new(&[m.layers, b, h]))?;
        for x in last_h.into_iter().chain(last_c) {
            self.release(x);
        }
        Ok((layer_in, hn, cn))
    }

    fn rebind_dropout(&mut self, x: TensorId, p: f64) -> Result<TensorId> {
        let y = self.dropout(x, p);
        self.rebind(x, y)
    }

    fn stack(&mut self, xs: &[TensorId], shape: Shape) -> Result<TensorId> {
        self.cat(xs, shape)
    }

    fn fused_lstm_cell(
        &mut self,
        ig: TensorId,
        hg: TensorId,
        cx: TensorId,
        b_ih: TensorId,
        b_hh: TensorId,
    ) -> Result<(TensorId, TensorId)> {
        let op = self.op_begin("_thnn_fused_lstm_cell");
        let r = (|| {
            let cxc = self.autocast_arg(cx, CastPolicy::Lower)?;
            let bi = self.autocast_arg(b_ih, CastPolicy::Lower)?;
            let bh = self.autocast_arg(b_hh, CastPolicy::Lower)?;
            let cs = self.shape(cxc);
            let dtype = self.dtype(ig);
            let hy = self.act(cs, dtype)?;
            let cy = self.act(cs, dtype)?;
            let ws = self.aux(self.shape(ig), dtype)?;
            self.k_binary(ig, hg, hy);
            self.k_unary(cxc, cy);
            if self.records(&[ig, hg, cxc, bi, bh]) {
                let node = self.new_node(
                    "ThnnFusedLstmCellBackward0",
                    BwdKind::Alloc,
                    &[Some(ig), Some(hg), Some(cxc), Some(bi), Some(bh)],
                );
                self.save(node, "input_gates", ig, false);
                self.save(node, "hidden_gates", hg, false);
                self.save(node, "cx", cxc, false);
                self.save(node, "result1", cy, true);
                self.save(node, "result2", ws, true);
                self.set_grad_fn(hy, node, 0);
                self.set_grad_fn(cy, node, 1);
            }
            self.release(ws);
            for t in [cxc, bi, bh] {
                self.release(t);
            }
            Ok((hy, cy))
        })();
        self.op_end(op)?;
        r
    }
}
