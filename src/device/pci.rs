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

impl PciAddress {
    /// Read a bus id as CUDA, NVML and `nvidia-smi` write it:
    /// `DOMAIN:BUS:DEVICE[.FUNCTION]` in hex (`0000:3b:00.0`,
    /// `00000000:3B:00.0`); `None` for anything else.
    pub fn parse(text: &str) -> Option<PciAddress> {
        let mut parts = text.trim().split(':');
        let (domain, bus, rest) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let (device, function) = rest.split_once('.').unwrap_or((rest, "0"));
        let hex = |s: &str, most: usize| {
            (!s.is_empty() && s.len() <= most)
                .then(|| u32::from_str_radix(s, 16).ok())
                .flatten()
        };
        hex(function, 1)?;
        Some(PciAddress {
            domain: hex(domain, 8)?,
            bus: hex(bus, 2)?,
            device: hex(device, 2)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_bus_id_as_torch_nvml_and_nvidia_smi_write_it() {
        let a = PciAddress {
            domain: 0,
            bus: 0x3b,
            device: 0,
        };
        assert_eq!(PciAddress::parse("0000:3b:00.0"), Some(a));
        assert_eq!(PciAddress::parse("00000000:3B:00.0"), Some(a));
        assert_eq!(PciAddress::parse("0000:3b:00"), Some(a));
        for bad in [
            "",
            "3b:00.0",
            "0000:3b",
            "0000:3b:00:0",
            "0000:zz:00.0",
            "0000:3b:100.0",
        ] {
            assert_eq!(PciAddress::parse(bad), None, "{bad:?}");
        }
    }

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
