//! Work on the bytes the allocator hands out: the engine describes each kernel
//! it would run as a [`Launch`] (raw device addresses, element counts) and gives
//! it to a [`KernelLauncher`]. This is separate from [`super::Device`], which
//! is only the allocator's `cudaMalloc`/`cudaFree`: launching never changes an
//! allocator decision. [`super::kernels::Kernels`] launches on a real GPU;
//! [`RecordingLauncher`] only writes the launches down (tests, dry runs).

use std::sync::{Arc, Mutex};

use serde::Serialize;

/// The kernels in `kernels/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Kernel {
    Fill,
    Add,
    Relu,
    Matmul,
    Sum,
}

impl Kernel {
    pub const ALL: [Kernel; 5] = [
        Kernel::Fill,
        Kernel::Add,
        Kernel::Relu,
        Kernel::Matmul,
        Kernel::Sum,
    ];

    /// The `extern "C"` name in `kernels/`.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Fill => "fill_f32",
            Kernel::Add => "add_f32",
            Kernel::Relu => "relu_f32",
            Kernel::Matmul => "matmul_f32",
            Kernel::Sum => "sum_f32",
        }
    }
}

/// One kernel launch on f32 elements at raw device addresses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Launch {
    /// `out[..n] = value`.
    Fill { out: u64, value: f32, n: u64 },
    /// `out[..n] = a[..n] + b[..n]`.
    Add { a: u64, b: u64, out: u64, n: u64 },
    /// `out[..n] = relu(x[..n])`.
    Relu { x: u64, out: u64, n: u64 },
    /// `c[m,n] = a[m,k] · b[k,n]`.
    Matmul {
        a: u64,
        b: u64,
        c: u64,
        m: u32,
        n: u32,
        k: u32,
    },
    /// `*out += sum(x[..n])`.
    Sum { x: u64, out: u64, n: u64 },
}

/// Bytes of `n` f32 elements.
const fn f32s(n: u64) -> u64 {
    n * 4
}

impl Launch {
    pub fn kernel(&self) -> Kernel {
        match self {
            Launch::Fill { .. } => Kernel::Fill,
            Launch::Add { .. } => Kernel::Add,
            Launch::Relu { .. } => Kernel::Relu,
            Launch::Matmul { .. } => Kernel::Matmul,
            Launch::Sum { .. } => Kernel::Sum,
        }
    }

    /// Every `(address, bytes)` range the kernel reads or writes.
    pub fn extents(&self) -> Vec<(u64, u64)> {
        match *self {
            Launch::Fill { out, n, .. } => vec![(out, f32s(n))],
            Launch::Add { a, b, out, n } => vec![(a, f32s(n)), (b, f32s(n)), (out, f32s(n))],
            Launch::Relu { x, out, n } => vec![(x, f32s(n)), (out, f32s(n))],
            Launch::Matmul { a, b, c, m, n, k } => {
                let (m, n, k) = (u64::from(m), u64::from(n), u64::from(k));
                vec![(a, f32s(m * k)), (b, f32s(k * n)), (c, f32s(m * n))]
            }
            Launch::Sum { x, out, n } => vec![(x, f32s(n)), (out, f32s(1))],
        }
    }
}

/// A launch the device refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kernel} launch failed: {message}")]
pub struct LaunchError {
    pub kernel: &'static str,
    pub message: String,
}

/// Runs [`Launch`]es (a real GPU, or a recorder).
pub trait KernelLauncher {
    fn launch(&mut self, l: &Launch) -> Result<(), LaunchError>;
    /// Wait for every launch so far; errors of asynchronous work surface here.
    fn synchronize(&mut self) -> Result<(), LaunchError> {
        Ok(())
    }
}

/// The launcher an engine owns, if any.
pub type AnyLauncher = Box<dyn KernelLauncher + Send>;

/// Writes every launch down; the list is shared so it can be read while an
/// engine owns the launcher. `fail_every` makes every k-th launch fail.
#[derive(Debug, Clone, Default)]
pub struct RecordingLauncher {
    pub launches: Arc<Mutex<Vec<Launch>>>,
    pub fail_every: Option<u64>,
    seen: u64,
}

impl RecordingLauncher {
    pub fn new() -> RecordingLauncher {
        RecordingLauncher::default()
    }

    /// A handle on the list of launches.
    pub fn log(&self) -> Arc<Mutex<Vec<Launch>>> {
        Arc::clone(&self.launches)
    }
}

impl KernelLauncher for RecordingLauncher {
    fn launch(&mut self, l: &Launch) -> Result<(), LaunchError> {
        self.seen += 1;
        if let Ok(mut v) = self.launches.lock() {
            v.push(*l);
        }
        match self.fail_every {
            Some(k) if k > 0 && self.seen.is_multiple_of(k) => Err(LaunchError {
                kernel: l.kernel().name(),
                message: "injected failure".into(),
            }),
            _ => Ok(()),
        }
    }
}
