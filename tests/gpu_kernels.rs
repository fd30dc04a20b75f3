//! On a machine with an NVIDIA GPU and NVRTC: the kernels in `kernels/`
//! compute the right numbers on memory the device hands out, through
//! `cuMemAlloc` and through the virtual-memory API of expandable segments.
//! They are ignored by default (`cargo test --test gpu_kernels -- --ignored`
//! on a GPU machine) and fail, saying so, where there is no GPU: a test that
//! checked nothing never counts as passed (`gpu_absent.rs` checks that side).

use cudarc::driver::result;
use vramscope::device::cuda::CudaDevice;
use vramscope::device::gpu::{driver_present, nvrtc_present};
use vramscope::device::kernels::Kernels;
use vramscope::device::Device;

fn gpu() -> (CudaDevice, Kernels) {
    assert!(
        driver_present() && nvrtc_present(),
        "no NVIDIA driver or NVRTC here: these tests need an NVIDIA GPU"
    );
    let dev = CudaDevice::open(0).expect("a driver is present, so device 0 opens");
    let k = Kernels::compile(dev.context().clone()).expect("kernels/ compiles with NVRTC");
    (dev, k)
}

fn upload(dev: &CudaDevice, at: u64, data: &[f32]) {
    dev.context().bind_to_thread().expect("context");
    // SAFETY: `at` holds at least data.len() f32, handed out by this device.
    unsafe { result::memcpy_htod_sync(at, data) }.expect("upload");
}

fn download(dev: &CudaDevice, at: u64, n: usize) -> Vec<f32> {
    dev.context().bind_to_thread().expect("context");
    let mut out = vec![0f32; n];
    // SAFETY: as above; the kernels are synchronised before every read.
    unsafe { result::memcpy_dtoh_sync(&mut out, at) }.expect("download");
    out
}

/// Named `needs_gpu::…` so that CI, which runs the ignored tests where the
/// real-snapshot corpus is, can skip these on a machine without a GPU.
mod needs_gpu {
    use super::*;

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn every_kernel_computes_what_its_cpu_reference_does() {
        let (mut dev, k) = gpu();
        let (m, n, kk) = (37usize, 29usize, 45usize);
        let a: Vec<f32> = (0..m * kk).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..kk * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        let bytes = |len: usize| (len * 4) as u64;
        let pa = dev.malloc(bytes(a.len())).expect("malloc A");
        let pb = dev.malloc(bytes(b.len())).expect("malloc B");
        let pc = dev.malloc(bytes(m * n)).expect("malloc C");
        let ps = dev.malloc(4).expect("malloc sum");
        upload(&dev, pa, &a);
        upload(&dev, pb, &b);

        k.matmul(pa, pb, pc, m as u32, n as u32, kk as u32)
            .expect("matmul launches");
        k.synchronize().expect("matmul runs");
        let c = download(&dev, pc, m * n);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..kk).map(|t| a[i * kk + t] * b[t * n + j]).sum();
                assert_eq!(c[i * n + j], want, "C[{i},{j}]");
            }
        }

        k.relu(pa, pa, a.len() as u64).expect("relu launches");
        k.fill(ps, 0.0, 1).expect("fill launches");
        k.sum(pa, ps, a.len() as u64).expect("sum launches");
        k.synchronize().expect("relu, fill, sum run");
        let relu: Vec<f32> = a.iter().map(|v| v.max(0.0)).collect();
        assert_eq!(download(&dev, pa, a.len()), relu);
        assert_eq!(download(&dev, ps, 1)[0], relu.iter().sum::<f32>());

        k.add(pb, pb, pb, b.len() as u64).expect("add launches");
        k.synchronize().expect("add runs");
        let doubled: Vec<f32> = b.iter().map(|v| v + v).collect();
        assert_eq!(download(&dev, pb, b.len()), doubled);

        for (p, len) in [(pa, a.len()), (pb, b.len()), (pc, m * n), (ps, 1)] {
            dev.free(p, bytes(len));
        }
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn expandable_pages_hold_data_and_go_back_to_the_driver() {
        let (mut dev, k) = gpu();
        let page = 2u64 << 20;
        let (free_before, _) = dev.mem_get_info();
        let base = dev.reserve(4 * page).expect("reserve");
        dev.map(base, 2 * page).expect("map two pages");
        dev.map(base + 2 * page, page).expect("map a third page");
        let n = (3 * page / 4) as usize;
        k.fill(base, 1.5, n as u64)
            .expect("fill across the mapped pages");
        k.synchronize().expect("fill runs");
        let back = download(&dev, base, n);
        assert!(
            back.iter().all(|&v| v == 1.5),
            "every mapped page holds the fill"
        );
        let (free_mapped, _) = dev.mem_get_info();
        assert!(
            free_before - free_mapped >= 3 * page,
            "three pages are physical memory: {free_before} → {free_mapped}"
        );
        dev.unmap(base + page, 2 * page);
        let (free_unmapped, _) = dev.mem_get_info();
        assert!(
            free_unmapped - free_mapped >= 2 * page,
            "unmapped pages go back: {free_mapped} → {free_unmapped}"
        );
        dev.unmap(base, page);
        dev.release_reservation(base, 4 * page);
    }
}
