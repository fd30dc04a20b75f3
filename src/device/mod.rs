//! Where segments come from: a simulated address space with a capacity, or a
//! real GPU. The allocator asks a [`Device`] for memory exactly where PyTorch
//! calls `cudaMalloc`, `cudaFree` and the virtual-memory API, so switching the
//! device never changes an allocator decision.

pub mod budget;
pub mod cuda;
mod driver_va;
pub mod gpu;
pub mod kernels;
pub mod launch;
pub mod nvml;
pub mod pci;
pub mod profiles;
pub mod reconcile;
mod sim;

pub use driver_va::Placement;
pub use gpu::GpuUnavailable;
pub use launch::{AnyLauncher, Kernel, KernelLauncher, Launch, LaunchError, RecordingLauncher};
pub use pci::PciAddress;
pub use profiles::{profile, GpuArch, GpuProfile};
pub use sim::SimDevice;

/// A device call that failed, in the driver's terms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("out of device memory: {requested} bytes requested, {free} bytes free")]
    OutOfMemory { requested: u64, free: u64 },
    #[error("virtual address space exhausted reserving {0} bytes")]
    AddressSpace(u64),
    #[error("{0}")]
    Driver(String),
}

/// The calls the caching allocator makes on a CUDA device (allocator.md §1.6).
pub trait Device {
    /// A short human name, e.g. "sim:A100-80GB" or "cuda:0 NVIDIA H100".
    fn name(&self) -> &str;
    /// `cudaDeviceProp.totalGlobalMem`.
    fn total_memory(&self) -> u64;
    /// `cudaMemGetInfo`: (free, total).
    fn mem_get_info(&self) -> (u64, u64);
    /// `cudaMalloc`: the address of `size` new bytes, or an error when they do not fit.
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError>;
    /// `cudaFree` of a whole segment.
    fn free(&mut self, addr: u64, size: u64);
    /// Reserve virtual address space for an expandable segment; nothing is backed yet.
    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError>;
    /// Give back a reservation that has no mapped page left.
    fn release_reservation(&mut self, addr: u64, size: u64);
    /// Back `[addr, addr+size)` (whole pages) with memory: all or nothing.
    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError>;
    /// Return the pages of `[addr, addr+size)` to the device.
    fn unmap(&mut self, addr: u64, size: u64);
    /// The program launched its first kernel (the first request not made by
    /// a module's `.to()`): a model of the driver's layout may change where
    /// later segments go (`Placement::H100Driver`). Real devices need
    /// nothing; called once or more.
    fn kernels_started(&mut self) {}
}

/// A device chosen at run time (simulated or real) behind one type.
impl<T: Device + ?Sized> Device for Box<T> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn total_memory(&self) -> u64 {
        (**self).total_memory()
    }
    fn mem_get_info(&self) -> (u64, u64) {
        (**self).mem_get_info()
    }
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        (**self).malloc(size)
    }
    fn free(&mut self, addr: u64, size: u64) {
        (**self).free(addr, size)
    }
    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        (**self).reserve(size)
    }
    fn release_reservation(&mut self, addr: u64, size: u64) {
        (**self).release_reservation(addr, size)
    }
    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        (**self).map(addr, size)
    }
    fn unmap(&mut self, addr: u64, size: u64) {
        (**self).unmap(addr, size)
    }
    fn kernels_started(&mut self) {
        (**self).kernels_started()
    }
}

/// The device an engine runs on: simulated, or a real GPU.
pub type AnyDevice = Box<dyn Device + Send>;
