//! Errors of the allocator API.

use super::config::ConfigError;
use crate::device::DeviceError;

/// Everything PyTorch reports when it raises `torch.OutOfMemoryError`, and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomError {
    pub device: u32,
    /// The caller's request `R`.
    pub requested: u64,
    /// `round_size(R)`, as the trace's `oom` entry records it.
    pub rounded: u64,
    /// The segment size the message reports ("Tried to allocate …").
    pub alloc_size: u64,
    pub device_free: u64,
    pub device_total: u64,
    pub allocated: u64,
    pub reserved: u64,
    pub allowed_max: Option<u64>,
    /// PyTorch's message, word for word.
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// PyTorch hands back a null pointer without reaching the allocator.
    #[error(
        "a 0-byte request never reaches the caching allocator (PyTorch returns a null pointer)"
    )]
    ZeroSize,
    #[error("CUDA out of memory. Tried to allocate more than 1EB memory.")]
    TooLarge { size: u64 },
    #[error("{}", .0.message)]
    OutOfMemory(Box<OomError>),
    #[error("free of {addr:#x}: no allocated block starts at this address")]
    UnknownAddress { addr: u64 },
    #[error("double free of {addr:#x}: the block is already free")]
    DoubleFree { addr: u64 },
    #[error("free of {addr:#x}: the block is already waiting for its stream events (freed twice)")]
    PendingFree { addr: u64 },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("device: {0}")]
    Device(#[from] DeviceError),
}

impl AllocError {
    pub fn oom(&self) -> Option<&OomError> {
        match self {
            AllocError::OutOfMemory(info) => Some(info),
            _ => None,
        }
    }
}
