//! On a machine without an NVIDIA driver (CI, laptops) the GPU parts say so
//! plainly and exit 3; nothing panics. On a machine with one, these tests
//! check the other side instead.

use std::process::Command;

use vramscope::device::cuda::CudaDevice;
use vramscope::device::gpu::{driver_present, nvrtc_present, GpuUnavailable};
use vramscope::device::kernels::{kernel_names, SOURCES};
use vramscope::device::nvml;

#[test]
fn cuda_device_without_driver_is_a_plain_error() {
    match CudaDevice::open(0) {
        Err(GpuUnavailable::NoDriver) => assert!(!driver_present()),
        Err(other) => assert!(driver_present(), "unexpected: {other}"),
        Ok(dev) => assert!(driver_present() && vramscope::device::Device::total_memory(&dev) > 0),
    }
    if !driver_present() {
        let msg = GpuUnavailable::NoDriver.to_string();
        assert!(msg.starts_with("no NVIDIA driver found"), "{msg}");
    }
}

#[test]
fn nvml_without_driver_is_a_plain_error() {
    match nvml::read_all(true) {
        Err(GpuUnavailable::NoNvml(detail)) => {
            // in words a user acts on, not the library loader's own
            assert!(!detail.is_empty());
            assert!(!detail.contains("libloading"), "{detail}");
        }
        Err(other) => panic!("unexpected: {other}"),
        Ok(gpus) => assert!(gpus.iter().all(|g| g.total.is_none_or(|t| t > 0))),
    }
}

#[test]
fn watch_exits_3_without_a_driver() {
    if nvml::available().is_ok() {
        eprintln!("NVML present: the no-driver path cannot be exercised here");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["watch", "--once"])
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no NVIDIA driver found"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn every_kernel_source_is_shipped_and_named() {
    let names: Vec<&str> = SOURCES
        .iter()
        .flat_map(|(_, src)| kernel_names(src))
        .collect();
    assert_eq!(
        names,
        vec!["fill_f32", "add_f32", "relu_f32", "matmul_f32", "sum_f32"]
    );
    for (file, src) in SOURCES {
        let on_disk = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("kernels")
                .join(file),
        )
        .expect("kernels/ file");
        assert_eq!(
            on_disk, src,
            "{file} is compiled into the binary as it is on disk"
        );
        assert_eq!(
            src.matches('{').count(),
            src.matches('}').count(),
            "{file} braces balance"
        );
    }
    if !nvrtc_present() {
        eprintln!("NVRTC absent: kernels are compiled at run time on a GPU machine only");
    }
}
