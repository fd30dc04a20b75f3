//! torchvision's pieces (engine.md §10.4): convolutions, batch norms and
//! the BasicBlock; ResNet-18 itself is written in the language
//! (`model_lang::presets::resnet`).

use super::super::dtype::DType;
use super::super::error::Result;
use super::super::tensor::TensorId;
use super::super::Engine;

#[derive(Debug)]
pub(crate) struct Conv {
    pub w: TensorId,
    pub b: Option<TensorId>,
    pub stride: u64,
    pub pad: u64,
    pub module: u32,
}

#[derive(Debug)]
pub(crate) struct BatchNorm {
    pub w: TensorId,
    pub b: TensorId,
    pub running_mean: TensorId,
    pub running_var: TensorId,
    pub module: u32,
}

#[derive(Debug)]
pub(crate) struct BasicBlock {
    pub conv1: Conv,
    pub bn1: BatchNorm,
    pub conv2: Conv,
    pub bn2: BatchNorm,
    pub downsample: Option<(Conv, BatchNorm)>,
    pub module: u32,
}

pub(crate) type Bufs = Vec<(String, TensorId)>;

impl Engine {
    /// torchvision's bias-free conv.
    #[allow(clippy::too_many_arguments)] // mirrors nn.Conv2d's signature
    fn new_conv(
        &mut self,
        path: &str,
        cin: u64,
        cout: u64,
        k: u64,
        stride: u64,
        pad: u64,
        params: &mut Vec<TensorId>,
    ) -> Result<Conv> {
        self.new_conv2d(path, [cin, cout, k, stride, pad], false, params)
    }

    /// `nn.Conv2d(cin, cout, k, stride, pad, bias)`: weight, then bias.
    pub(crate) fn new_conv2d(
        &mut self,
        path: &str,
        [cin, cout, k, stride, pad]: [u64; 5],
        bias: bool,
        params: &mut Vec<TensorId>,
    ) -> Result<Conv> {
        let module = self.tags.module(path);
        let w = self.new_param(&[cout, cin, k, k], module, params)?;
        let b = if bias {
            Some(self.new_param(&[cout], module, params)?)
        } else {
            None
        };
        Ok(Conv {
            w,
            b,
            stride,
            pad,
            module,
        })
    }

    /// BatchNorm2d: weight, bias, then buffers running_mean, running_var and
    /// num_batches_tracked (int64 0-dim) — `_apply` order.
    pub(crate) fn new_bn(
        &mut self,
        path: &str,
        c: u64,
        params: &mut Vec<TensorId>,
        bufs: &mut Bufs,
    ) -> Result<BatchNorm> {
        let module = self.tags.module(path);
        let w = self.new_param(&[c], module, params)?;
        let b = self.new_param(&[c], module, params)?;
        let running_mean = self.new_buffer(
            format!("{path}.running_mean"),
            &[c],
            self.param_dtype,
            module,
            bufs,
        )?;
        let running_var = self.new_buffer(
            format!("{path}.running_var"),
            &[c],
            self.param_dtype,
            module,
            bufs,
        )?;
        self.new_buffer(
            format!("{path}.num_batches_tracked"),
            &[],
            DType::I64,
            module,
            bufs,
        )?;
        Ok(BatchNorm {
            w,
            b,
            running_mean,
            running_var,
            module,
        })
    }

    pub(crate) fn apply_conv(&mut self, c: &Conv, x: TensorId) -> Result<TensorId> {
        self.in_module(c.module, |e| e.conv2d(x, c.w, c.b, c.stride, c.pad))
    }

    pub(crate) fn apply_bn(&mut self, n: &BatchNorm, x: TensorId) -> Result<TensorId> {
        self.in_module(n.module, |e| {
            e.batch_norm(x, n.w, n.b, (n.running_mean, n.running_var))
        })
    }
}

impl BasicBlock {
    /// `BasicBlock(inplanes, planes, stride)` at `path`, with torchvision's
    /// downsample (1×1 conv + BN) when the stride or the width changes.
    pub(crate) fn build(
        e: &mut Engine,
        p: &str,
        [inplanes, planes, stride]: [u64; 3],
        params: &mut Vec<TensorId>,
        bufs: &mut Bufs,
    ) -> Result<BasicBlock> {
        let conv1 = e.new_conv(
            &format!("{p}.conv1"),
            inplanes,
            planes,
            3,
            stride,
            1,
            params,
        )?;
        let bn1 = e.new_bn(&format!("{p}.bn1"), planes, params, bufs)?;
        let conv2 = e.new_conv(&format!("{p}.conv2"), planes, planes, 3, 1, 1, params)?;
        let bn2 = e.new_bn(&format!("{p}.bn2"), planes, params, bufs)?;
        let downsample = if stride != 1 || inplanes != planes {
            let c = e.new_conv(
                &format!("{p}.downsample.0"),
                inplanes,
                planes,
                1,
                stride,
                0,
                params,
            )?;
            let b = e.new_bn(&format!("{p}.downsample.1"), planes, params, bufs)?;
            Some((c, b))
        } else {
            None
        };
        Ok(BasicBlock {
            conv1,
            bn1,
            conv2,
            bn2,
            downsample,
            module: e.tags.module(p),
        })
    }

    /// conv1 → bn1 → relu_ → conv2 → bn2 → (+= identity) → relu_ (§10.4).
    pub(crate) fn forward(&self, e: &mut Engine, x: TensorId) -> Result<TensorId> {
        let o1 = e.apply_conv(&self.conv1, x)?;
        let o2 = e.apply_bn(&self.bn1, o1);
        let o2 = e.rebind(o1, o2)?;
        e.relu_(o2)?;
        let o3 = e.apply_conv(&self.conv2, o2);
        let o3 = e.rebind(o2, o3)?;
        let o4 = e.apply_bn(&self.bn2, o3);
        let o4 = e.rebind(o3, o4)?;
        let identity = match &self.downsample {
            Some((c, n)) => {
                let d = e.apply_conv(c, x)?;
                let i = e.apply_bn(n, d);
                e.rebind(d, i)?
            }
            None => e.local_ref(x),
        };
        e.add_inplace(o4, identity)?;
        e.release(identity);
        e.relu_(o4)?;
        Ok(o4)
    }
}
