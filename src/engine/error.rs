//! Engine errors. Messages that PyTorch raises are reproduced word for word
//! (engine.md Appendix A), so scenarios can show them verbatim.

use serde::{Deserialize, Serialize};

/// The backward-twice message of current releases (engine.md §2.4).
pub const BACKWARD_TWICE: &str = "Trying to backward through the graph a second time (or directly access saved tensors after they have already been freed). Saved intermediate values of the graph are freed when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or if you need to access saved tensors after calling backward.";
/// `SavedVariable`'s check (engine.md §4): a tensor made under `inference_mode`
/// met an op that records a graph and saves it.
pub const INFERENCE_TENSOR_SAVED: &str = "Inference tensors cannot be saved for backward. To work around you can make a clone to get a normal tensor and use it in autograd.";

/// Coarse error classes carried by [`crate::engine::EngineEvent::Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// `torch.OutOfMemoryError`.
    OutOfMemory,
    /// A `RuntimeError` PyTorch would raise (backward twice, in-place, …).
    Runtime,
    /// A `ValueError` (GradScaler).
    Value,
    /// The program itself is wrong (unknown binding, wrong value kind).
    Program,
    /// An internal failure (a panic inside the engine thread).
    Internal,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The allocator's `torch.OutOfMemoryError`; `message` is PyTorch's text.
    #[error("torch.OutOfMemoryError: {message}")]
    OutOfMemory { message: String, requested: u64 },
    /// A PyTorch `RuntimeError`; `message` excludes the `RuntimeError: ` prefix.
    #[error("RuntimeError: {0}")]
    Runtime(String),
    #[error("ValueError: {0}")]
    Value(String),
    #[error("program error: {0}")]
    Program(String),
    /// A model in the language the build refuses (its check, with where it is).
    #[error("{0}")]
    Model(crate::engine::model_lang::ModelError),
    #[error("allocator error: {0}")]
    Alloc(String),
    /// Internal: checkpoint recomputation reached every tensor it needs
    /// (engine.md §7.2 early stop). Never escapes the engine.
    #[error("checkpoint recomputation stopped early")]
    StopRecompute,
}

impl EngineError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::OutOfMemory { .. } => ErrorKind::OutOfMemory,
            EngineError::Runtime(_) => ErrorKind::Runtime,
            EngineError::Value(_) => ErrorKind::Value,
            EngineError::Program(_) | EngineError::Model(_) => ErrorKind::Program,
            EngineError::Alloc(_) | EngineError::StopRecompute => ErrorKind::Internal,
        }
    }

    /// The text a Python traceback would end with.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;
