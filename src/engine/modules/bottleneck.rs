//! torchvision's `Bottleneck` (ResNet-50 v1.5, models.md §7): 1×1 → 3×3
//! (the stride here) → 1×1 ×4, one `ReLU(inplace=True)` reused three times.

use super::super::error::Result;
use super::super::tensor::TensorId;
use super::super::Engine;
use super::resnet::{BatchNorm, Bufs, Conv};
use crate::engine::model_lang::spec::BOTTLENECK_EXPANSION;

#[derive(Debug)]
pub(crate) struct Bottleneck {
    pub conv1: Conv,
    pub bn1: BatchNorm,
    pub conv2: Conv,
    pub bn2: BatchNorm,
    pub conv3: Conv,
    pub bn3: BatchNorm,
    pub downsample: Option<(Conv, BatchNorm)>,
    pub module: u32,
}

impl Bottleneck {
    /// `Bottleneck(inplanes, planes, stride)` at `p`: children in
    /// registration order (conv1, bn1, conv2, bn2, conv3, bn3, downsample),
    /// the downsample when `stride != 1 or inplanes != planes * 4`.
    pub(crate) fn build(
        e: &mut Engine,
        p: &str,
        [inplanes, planes, stride]: [u64; 3],
        params: &mut Vec<TensorId>,
        bufs: &mut Bufs,
    ) -> Result<Bottleneck> {
        // width = planes * (base_width / 64) * groups = planes for ResNet-50.
        let width = planes;
        let out = planes * BOTTLENECK_EXPANSION;
        let path = |c: &str| format!("{p}.{c}");
        let conv1 = e.new_conv2d(&path("conv1"), [inplanes, width, 1, 1, 0], false, params)?;
        let bn1 = e.new_bn(&path("bn1"), width, params, bufs)?;
        let conv2 = e.new_conv2d(&path("conv2"), [width, width, 3, stride, 1], false, params)?;
        let bn2 = e.new_bn(&path("bn2"), width, params, bufs)?;
        let conv3 = e.new_conv2d(&path("conv3"), [width, out, 1, 1, 0], false, params)?;
        let bn3 = e.new_bn(&path("bn3"), out, params, bufs)?;
        let downsample = if stride != 1 || inplanes != out {
            let c = e.new_conv2d(
                &path("downsample.0"),
                [inplanes, out, 1, stride, 0],
                false,
                params,
            )?;
            let b = e.new_bn(&path("downsample.1"), out, params, bufs)?;
            Some((c, b))
        } else {
            None
        };
        Ok(Bottleneck {
            conv1,
            bn1,
            conv2,
            bn2,
            conv3,
            bn3,
            downsample,
            module: e.tags.module(p),
        })
    }

    /// models.md §7.5: conv1 → bn1 → relu_ → conv2 → bn2 → relu_ → conv3 →
    /// bn3 → [downsample conv → BN] → `out += identity` → relu_. Each conv
    /// output stays as its BN's saved input; the downsample BN's output (the
    /// identity) dies after the add.
    pub(crate) fn forward(&self, e: &mut Engine, x: TensorId) -> Result<TensorId> {
        e.in_module(self.module, |e| {
            let h = conv_bn(e, &self.conv1, &self.bn1, x)?;
            e.relu_(h)?;
            let h2 = conv_bn(e, &self.conv2, &self.bn2, h);
            let h = e.rebind(h, h2)?;
            e.relu_(h)?;
            let h3 = conv_bn(e, &self.conv3, &self.bn3, h);
            let out = e.rebind(h, h3)?;
            let identity = match &self.downsample {
                Some((c, n)) => conv_bn(e, c, n, x)?,
                None => e.local_ref(x),
            };
            e.add_inplace(out, identity)?;
            e.release(identity);
            e.relu_(out)?;
            Ok(out)
        })
    }
}

/// `bn(conv(x))`, the conv output's handle dropped once BN has saved it.
fn conv_bn(e: &mut Engine, c: &Conv, n: &BatchNorm, x: TensorId) -> Result<TensorId> {
    let o = e.apply_conv(c, x)?;
    let b = e.apply_bn(n, o);
    e.rebind(o, b)
}
