//! The scratch memory ATen's kernels take from the caching allocator for
//! themselves (never a tensor a user sees): reductions' staging buffers and
//! semaphores, the backward kernels' workspaces, embedding sorts, layer-norm
//! statistics. Each file mirrors one kernel family's sizing rule.

pub(crate) mod backward;
pub(crate) mod embedding;
pub(crate) mod index_put;
pub(crate) mod layer_norm;
pub mod reduce;
pub(crate) mod reduce_split;
pub(crate) mod softmax;
