//! A real GPU under the allocator: segments from `cuMemAlloc`/`cuMemFree`, and
//! expandable segments from the virtual-memory API (`cuMemAddressReserve`,
//! `cuMemCreate`, `cuMemMap`), in 2 MiB chunks so any page the allocator
//! unmaps can be given back on its own. The allocator's decisions are the same
//! as on the simulated device: only where the bytes come from changes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};

use super::gpu::{driver_present, GpuUnavailable};
use super::pci::PciAddress;
use super::{Device, DeviceError};

/// Granularity of physical chunks behind expandable pages (every allocator page is a multiple).
const CHUNK: u64 = 2 << 20;

pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    ordinal: usize,
    pci: Option<PciAddress>,
    name: String,
    total: u64,
    /// Physical chunks mapped into reservations, by address.
    chunks: BTreeMap<u64, sys::CUmemGenericAllocationHandle>,
    reservations: HashMap<u64, u64>,
}

fn driver_error(e: impl std::fmt::Debug) -> DeviceError {
    DeviceError::Driver(format!("{e:?}"))
}

fn check(r: sys::CUresult) -> Result<(), DeviceError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        Err(DeviceError::OutOfMemory {
            requested: 0,
            free: 0,
        })
    } else {
        Err(driver_error(r))
    }
}

impl CudaDevice {
    /// Open device `ordinal`; a plain error (never a panic) without a driver.
    pub fn open(ordinal: usize) -> Result<CudaDevice, GpuUnavailable> {
        if !driver_present() {
            return Err(GpuUnavailable::NoDriver);
        }
        let count = CudaContext::device_count()
            .map_err(|e| GpuUnavailable::Driver(format!("{e:?}")))? as usize;
        if ordinal >= count {
            return Err(GpuUnavailable::NoSuchDevice { ordinal, count });
        }
        let ctx =
            CudaContext::new(ordinal).map_err(|e| GpuUnavailable::Driver(format!("{e:?}")))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".to_string());
        let total = ctx
            .total_mem()
            .map_err(|e| GpuUnavailable::Driver(format!("{e:?}")))? as u64;
        let attribute = |a| ctx.attribute(a).ok().and_then(|v| u32::try_from(v).ok());
        let pci = match (
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID),
        ) {
            (Some(domain), Some(bus), Some(device)) => Some(PciAddress {
                domain,
                bus,
                device,
            }),
            _ => None,
        };
        Ok(CudaDevice {
            ctx,
            ordinal,
            pci,
            name: format!("cuda:{ordinal} {name}"),
            total,
            chunks: BTreeMap::new(),
            reservations: HashMap::new(),
        })
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Where the device sits on the PCI bus: how NVML's reading of it is found.
    pub fn pci(&self) -> Option<PciAddress> {
        self.pci
    }

    fn prop(&self) -> sys::CUmemAllocationProp {
        // SAFETY: a plain C struct; zero is its documented default for unused fields.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = self.ordinal as i32;
        prop
    }

    fn release_chunks(&mut self, addr: u64, size: u64) {
        let inside: Vec<u64> = self
            .chunks
            .range(addr..addr + size)
            .map(|(a, _)| *a)
            .collect();
        for a in inside {
            if let Some(handle) = self.chunks.remove(&a) {
                // SAFETY: `a` was mapped to `handle` by `map` and is unmapped once.
                unsafe {
                    let _ = sys::cuMemUnmap(a, CHUNK as usize);
                    let _ = sys::cuMemRelease(handle);
                }
            }
        }
    }
}

impl Device for CudaDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn total_memory(&self) -> u64 {
        self.total
    }
    fn mem_get_info(&self) -> (u64, u64) {
        let _ = self.ctx.bind_to_thread();
        result::mem_get_info().map_or((0, self.total), |(f, t)| (f as u64, t as u64))
    }
    fn malloc(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.ctx.bind_to_thread().map_err(driver_error)?;
        // SAFETY: a plain device allocation; freed by `free` with the same size.
        unsafe { result::malloc_sync(size as usize) }.map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                DeviceError::OutOfMemory {
                    requested: size,
                    free: self.mem_get_info().0,
                }
            } else {
                driver_error(e)
            }
        })
    }
    fn free(&mut self, addr: u64, _size: u64) {
        // Kernels launched on this segment (`kernels.rs`) finish first.
        let _ = self.ctx.synchronize();
        // SAFETY: `addr` came from `malloc` and the allocator frees it once.
        let _ = unsafe { result::free_sync(addr) };
    }
    fn reserve(&mut self, size: u64) -> Result<u64, DeviceError> {
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: reserves address space only; freed in `release_reservation`.
        check(unsafe { sys::cuMemAddressReserve(&mut ptr, size as usize, CHUNK as usize, 0, 0) })?;
        self.reservations.insert(ptr, size);
        Ok(ptr)
    }
    fn release_reservation(&mut self, addr: u64, size: u64) {
        let _ = self.ctx.synchronize();
        self.release_chunks(addr, size);
        self.reservations.remove(&addr);
        // SAFETY: the range was reserved by `reserve` and nothing is mapped in it now.
        let _ = unsafe { sys::cuMemAddressFree(addr, size as usize) };
    }
    fn map(&mut self, addr: u64, size: u64) -> Result<(), DeviceError> {
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let prop = self.prop();
        let access = sys::CUmemAccessDesc {
            location: prop.location,
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let mut at = addr;
        while at < addr + size {
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: creates one physical chunk and maps it inside our reservation.
            let step = unsafe {
                check(sys::cuMemCreate(&mut handle, CHUNK as usize, &prop, 0)).and_then(|()| {
                    check(sys::cuMemMap(at, CHUNK as usize, 0, handle, 0)).inspect_err(|_| {
                        let _ = sys::cuMemRelease(handle);
                    })
                })
            };
            if let Err(e) = step {
                // All or nothing: give back what this call mapped.
                self.release_chunks(addr, at - addr);
                return Err(match e {
                    DeviceError::OutOfMemory { .. } => DeviceError::OutOfMemory {
                        requested: size,
                        free: self.mem_get_info().0,
                    },
                    other => other,
                });
            }
            self.chunks.insert(at, handle);
            at += CHUNK;
        }
        // SAFETY: the whole range was just mapped.
        check(unsafe { sys::cuMemSetAccess(addr, size as usize, &access, 1) })
    }
    fn unmap(&mut self, addr: u64, size: u64) {
        // cuMemUnmap does not wait for kernels still using the pages.
        let _ = self.ctx.synchronize();
        self.release_chunks(addr, size);
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        let all: Vec<(u64, u64)> = self.reservations.iter().map(|(a, s)| (*a, *s)).collect();
        for (a, s) in all {
            self.release_reservation(a, s);
        }
    }
}
