//! conv2d and pooling (tables 1.7 and 2.2).

use super::super::amp::CastPolicy;
use super::super::conv_workspace::conv_workspaces;
use super::super::dtype::DType;
use super::super::error::Result;
use super::super::shape::Shape;
use super::super::tag::Category;
use super::super::tensor::TensorId;
use super::super::work::FlopKind;
use super::super::Engine;
use crate::engine::autograd::BwdKind;

impl Engine {
    /// `conv2d(x [N,C,H,W], w [Cout,C,kh,kw], b)`: out [N,Cout,Hout,Wout] and a
    /// transient cuDNN workspace, measured per shape where the scenario
    /// carries it, else min(cap, input bytes) [unc]. Saves input and
    /// weight always; bias only by size.
    pub fn conv2d(
        &mut self,
        x: TensorId,
        w: TensorId,
        b: Option<TensorId>,
        stride: u64,
        pad: u64,
    ) -> Result<TensorId> {
        let prev = self.op_begin("conv2d");
        let r = self.conv_inner(x, w, b, stride, pad);
        self.op_end(prev)?;
        r
    }

    fn conv_inner(
        &mut self,
        x: TensorId,
        w: TensorId,
        b: Option<TensorId>,
        stride: u64,
        pad: u64,
    ) -> Result<TensorId> {
        let [xc, wc] = self.autocast_all([x, w], CastPolicy::Lower)?;
        let (xs, ws) = (self.shape(xc), self.shape(wc));
        let (n, h, wd) = (xs.dim(0), xs.dim(2), xs.dim(3));
        let (cout, kh, kw) = (ws.dim(0), ws.dim(2), ws.dim(3));
        let ho = (h + 2 * pad - kh) / stride + 1;
        let wo = (wd + 2 * pad - kw) / stride + 1;
        let out = self.act(Shape::new(&[n, cout, ho, wo]), self.dtype(xc))?;
        // Implicit GEMM: out[cout, n·ho·wo] = w[cout, cin·kh·kw] · im2col(x).
        let kdim = ws.numel() / cout.max(1);
        self.count_gemm(FlopKind::Convolution, xc, n * cout * ho * wo, kdim);
        self.k_matmul(wc, xc, out, cout, n * ho * wo, kdim);
        let dims = |s: &Shape| [s.dim(0), s.dim(1), s.dim(2), s.dim(3)];
        let estimate = self.cfg.conv_workspace_cap.min(self.nbytes(xc));
        let key = (&dims(&xs), &dims(&ws), stride, pad, self.dtype(xc));
        let spaces = conv_workspaces(&self.cfg.conv_workspaces, key, estimate);
        let tmp = self.transient(spaces.forward, Category::Workspace)?;
        self.free_transient(tmp);
        let mut ins = vec![xc, wc];
        ins.extend(b);
        if self.records(&ins) {
            let node = self.new_node(
                "ConvolutionBackward0",
                BwdKind::Conv {
                    workspace: spaces.backward,
                },
                &[Some(xc), Some(wc), b],
            );
            self.save(node, "input", xc, false);
            self.save(node, "weight", wc, false);
            self.set_grad_fn(out, node, 0);
        }
        self.release(xc);
        self.release(wc);
        Ok(out)
    }

    /// `max_pool2d` on CUDA: out and int64 indices of out's shape (8 B/elem);
    /// saves input and indices.
    pub fn max_pool2d(&mut self, x: TensorId, k: u64, stride: u64, pad: u64) -> Result<TensorId> {
        let prev = self.op_begin("max_pool2d");
        let r = (|| {
            let xs = self.shape(x);
            let ho = (xs.dim(2) + 2 * pad - k) / stride + 1;
            let wo = (xs.dim(3) + 2 * pad - k) / stride + 1;
            let shape = Shape::new(&[xs.dim(0), xs.dim(1), ho, wo]);
            let out = self.act(shape, self.dtype(x))?;
            let idx = self.aux(shape, DType::I64)?;
            self.k_unary(x, out);
            self.k_fill(idx, 0.0);
            if self.records(&[x]) {
                let node =
                    self.new_node("MaxPool2DWithIndicesBackward0", BwdKind::Alloc, &[Some(x)]);
                self.save(node, "self", x, false);
                self.save(node, "result1", idx, true);
                self.set_grad_fn(out, node, 0);
            }
            self.release(idx);
            Ok(out)
        })();
        self.op_end(prev)?;
        r
    }

    /// `adaptive_avg_pool2d(x, 1)`: out [N, C, 1, 1]. For a 1×1 output ATen
    /// computes `x.mean((-1, -2), keepdim=True)` (AdaptiveAveragePooling.cpp),
    /// so the Node is MeanBackward1, which saves no tensor (only sizes) from
    /// 2.2 and x in 2.0–2.1; its backward makes a new grad of x's shape
    /// (expand, then divide).
    pub fn adaptive_avg_pool2d(&mut self, x: TensorId) -> Result<TensorId> {
        let prev = self.op_begin("adaptive_avg_pool2d");
        let r = (|| {
            let xs = self.shape(x);
            let out = self.act(Shape::new(&[xs.dim(0), xs.dim(1), 1, 1]), self.dtype(x))?;
            self.k_sum(x, out);
            if self.records(&[x]) {
                let node = self.new_node("MeanBackward1", BwdKind::Alloc, &[Some(x)]);
                self.set_grad_fn(out, node, 0);
                self.save_mean_input(node, x);
            }
            Ok(out)
        })();
        self.op_end(prev)?;
        r
    }
}
