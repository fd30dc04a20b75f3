//! The CUDA C sources in `kernels/`, compiled at run time with NVRTC and
//! launched on the memory the allocator hands out, so a scenario run on a GPU
//! does real work on real bytes.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, LaunchConfig, PushKernelArg};

use super::gpu::{driver_present, nvrtc_present, GpuUnavailable};

/// `(file, source)` of every kernel file, compiled into the binary.
pub const SOURCES: [(&str, &str); 4] = [
    ("fill.cu", include_str!("../../kernels/fill.cu")),
    (
        "elementwise.cu",
        include_str!("../../kernels/elementwise.cu"),
    ),
    ("matmul.cu", include_str!("../../kernels/matmul.cu")),
    ("reduce.cu", include_str!("../../kernels/reduce.cu")),
];

/// Every `extern "C" __global__` function name in a source, in order.
pub fn kernel_names(source: &str) -> Vec<&str> {
    source
        .split("extern \"C\" __global__ void ")
        .skip(1)
        .filter_map(|rest| rest.split('(').next())
        .map(str::trim)
        .collect()
}

/// The compiled kernels, ready to launch on one device.
pub struct Kernels {
    ctx: Arc<CudaContext>,
    fill: CudaFunction,
    add: CudaFunction,
    relu: CudaFunction,
    matmul: CudaFunction,
    sum: CudaFunction,
}

fn cuda(e: impl std::fmt::Debug) -> GpuUnavailable {
    GpuUnavailable::Driver(format!("{e:?}"))
}

/// `kernels/` compiled for `dev` as the engine's launcher, or why not: a
/// run on `dev` still measures memory without them.
pub fn launcher_for(dev: &super::cuda::CudaDevice) -> Result<super::AnyLauncher, GpuUnavailable> {
    Kernels::compile(dev.context().clone()).map(|k| Box::new(k) as super::AnyLauncher)
}

impl Kernels {
    pub fn compile(ctx: Arc<CudaContext>) -> Result<Kernels, GpuUnavailable> {
        if !driver_present() {
            return Err(GpuUnavailable::NoDriver);
        }
        if !nvrtc_present() {
            return Err(GpuUnavailable::NoNvrtc);
        }
        let mut modules = Vec::new();
        for (file, src) in SOURCES {
            let ptx = cudarc::nvrtc::compile_ptx(src)
                .map_err(|e| GpuUnavailable::Driver(format!("{file}: {e:?}")))?;
            modules.push(ctx.load_module(ptx).map_err(cuda)?);
        }
        let f = |m: usize, name: &str| modules[m].load_function(name).map_err(cuda);
        Ok(Kernels {
            fill: f(0, "fill_f32")?,
            add: f(1, "add_f32")?,
            relu: f(1, "relu_f32")?,
            matmul: f(2, "matmul_f32")?,
            sum: f(3, "sum_f32")?,
            ctx,
        })
    }

    /// `out[..n] = value` on raw device memory from the allocator.
    pub fn fill(&self, out: u64, value: f32, n: u64) -> Result<(), GpuUnavailable> {
        let stream = self.ctx.default_stream();
        let mut b = stream.launch_builder(&self.fill);
        b.arg(&out).arg(&value).arg(&n);
        // SAFETY: `out` points at ≥ n f32 the allocator handed out on this device.
        unsafe { b.launch(LaunchConfig::for_num_elems(n as u32)) }
            .map(|_| ())
            .map_err(cuda)
    }

    pub fn add(&self, a: u64, b_: u64, out: u64, n: u64) -> Result<(), GpuUnavailable> {
        let stream = self.ctx.default_stream();
        let mut b = stream.launch_builder(&self.add);
        b.arg(&a).arg(&b_).arg(&out).arg(&n);
        // SAFETY: all three buffers hold ≥ n f32.
        unsafe { b.launch(LaunchConfig::for_num_elems(n as u32)) }
            .map(|_| ())
            .map_err(cuda)
    }

    pub fn relu(&self, x: u64, out: u64, n: u64) -> Result<(), GpuUnavailable> {
        let stream = self.ctx.default_stream();
        let mut b = stream.launch_builder(&self.relu);
        b.arg(&x).arg(&out).arg(&n);
        // SAFETY: both buffers hold ≥ n f32.
        unsafe { b.launch(LaunchConfig::for_num_elems(n as u32)) }
            .map(|_| ())
            .map_err(cuda)
    }

    /// `C[m,n] = A[m,k] · B[k,n]`.
    pub fn matmul(
        &self,
        a: u64,
        b_: u64,
        c: u64,
        m: u32,
        n: u32,
        k: u32,
    ) -> Result<(), GpuUnavailable> {
        let stream = self.ctx.default_stream();
        let mut b = stream.launch_builder(&self.matmul);
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        b.arg(&a).arg(&b_).arg(&c).arg(&mi).arg(&ni).arg(&ki);
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(16), m.div_ceil(16), 1),
            block_dim: (16, 16, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: A holds m·k, B k·n and C m·n f32.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda)
    }

    /// `*out += sum(x[..n])`.
    pub fn sum(&self, x: u64, out: u64, n: u64) -> Result<(), GpuUnavailable> {
        let stream = self.ctx.default_stream();
        let mut b = stream.launch_builder(&self.sum);
        b.arg(&x).arg(&out).arg(&n);
        let mut cfg = LaunchConfig::for_num_elems(n as u32);
        cfg.shared_mem_bytes = cfg.block_dim.0 * 4;
        // SAFETY: x holds ≥ n f32, out one f32.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda)
    }

    pub fn synchronize(&self) -> Result<(), GpuUnavailable> {
        self.ctx.default_stream().synchronize().map_err(cuda)
    }
}

/// Largest element count one launch takes (grid sizes are 32-bit, indices in
/// the matmul kernel are `int`).
pub const MAX_ELEMS: u64 = i32::MAX as u64;

/// Most rows one matmul launch covers: 16-row tiles along grid y (≤ 65,535 blocks).
pub const MAX_GEMM_ROWS: u64 = 65_535 * 16;

impl super::launch::KernelLauncher for Kernels {
    fn launch(&mut self, l: &super::launch::Launch) -> Result<(), super::launch::LaunchError> {
        use super::launch::{Launch, LaunchError};
        let kernel = l.kernel().name();
        let too_big = match *l {
            Launch::Fill { n, .. }
            | Launch::Add { n, .. }
            | Launch::Relu { n, .. }
            | Launch::Sum { n, .. } => n > MAX_ELEMS,
            Launch::Matmul { m, n, k, .. } => {
                let (m, n, k) = (u64::from(m), u64::from(n), u64::from(k));
                m > MAX_GEMM_ROWS || m * k > MAX_ELEMS || k * n > MAX_ELEMS || m * n > MAX_ELEMS
            }
        };
        if too_big {
            return Err(LaunchError {
                kernel,
                message: format!("more than {MAX_ELEMS} elements"),
            });
        }
        let r = match *l {
            Launch::Fill { out, value, n } => self.fill(out, value, n),
            Launch::Add { a, b, out, n } => self.add(a, b, out, n),
            Launch::Relu { x, out, n } => self.relu(x, out, n),
            Launch::Matmul { a, b, c, m, n, k } => self.matmul(a, b, c, m, n, k),
            Launch::Sum { x, out, n } => self.sum(x, out, n),
        };
        r.map_err(|e| LaunchError {
            kernel,
            message: e.to_string(),
        })
    }

    fn synchronize(&mut self) -> Result<(), super::launch::LaunchError> {
        Kernels::synchronize(self).map_err(|e| super::launch::LaunchError {
            kernel: "synchronize",
            message: e.to_string(),
        })
    }
}
