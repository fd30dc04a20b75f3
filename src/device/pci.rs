//! Where a GPU sits on the PCI bus: the one name CUDA and NVML share. A CUDA
//! ordinal and an NVML index differ under `CUDA_VISIBLE_DEVICES` (CUDA
//! renumbers what it is shown) and by default order (CUDA puts the fastest
//! device first, NVML follows the bus), so readings are matched by address.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
}

impl std::fmt::Display for PciAddress {
    /// `0000:3b:00`, as `nvidia-smi` and `lspci` write it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}",
            self.domain, self.bus, self.device
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_as_nvidia_smi_writes_it() {
        let a = PciAddress {
            domain: 0,
            bus: 0x3b,
            device: 0,
        };
        assert_eq!(a.to_string(), "0000:3b:00");
    }
}
