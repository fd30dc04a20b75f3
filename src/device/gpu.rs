//! Is there an NVIDIA driver at all? Asked before any CUDA or NVML call, so a
//! machine without one gets a plain message, never a panic.

/// Why the GPU parts cannot run here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuUnavailable {
    #[error("no NVIDIA driver found: the CUDA driver library (libcuda) could not be loaded on this machine")]
    NoDriver,
    #[error("no NVIDIA driver found: {0}")]
    NoNvml(String),
    #[error(
        "the CUDA runtime compiler (NVRTC) could not be loaded, so kernels/ cannot be compiled"
    )]
    NoNvrtc,
    #[error("CUDA device {ordinal} does not exist ({count} found)")]
    NoSuchDevice { ordinal: usize, count: usize },
    #[error("CUDA: {0}")]
    Driver(String),
}

/// Whether the CUDA driver library can be loaded (checked without calling into it).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library; calls nothing in it.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether NVRTC can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: as above.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}
