//! A model of PyTorch's CUDA caching allocator (`c10/cuda/CUDACachingAllocator.cpp`),
//! number for number: see `shared/spec/allocator.md`. It takes sizes and streams and
//! returns addresses; it knows nothing of tensors. Attribution travels beside each
//! request as an opaque [`Tag`].

mod active;
mod adopt;
mod block;
mod caching;
pub mod config;
pub mod constants;
mod error;
mod event;
mod expandable;
mod format;
mod free;
mod free_set;
mod malloc;
mod release;
pub mod rounding;
mod snapshot;
mod stats;
mod summary;
pub mod version;

pub use adopt::{AdoptBlock, AdoptError};
pub use caching::CachingAllocator;
pub use config::{AllocConfig, Backend, ConfigError};
pub use error::{AllocError, OomError};
pub use event::{Action, AllocEvent};
pub use format::{format_size, oom_message};
pub use malloc::should_split;
pub use rounding::{alloc_size, round_size, Pool};
pub use snapshot::{BlockInfo, BlockState, SegmentInfo};
pub use stats::{fragmentation, Family, Level, MemoryStats, Stat, FRAGMENTATION_DEFINITION};
pub use summary::memory_summary;
pub use version::TorchVersion;

/// Who asked for a block: an id the caller interprets (op, tensor category,
/// iteration, frames). The allocator only carries it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(pub u64);

impl Tag {
    pub const NONE: Tag = Tag(0);
}
