//! `format_size` and the OOM message (allocator.md §5.6, §14).

use super::error::OomError;
use super::version::TorchVersion;

/// PyTorch's `format_size`: bytes up to 1024, then KiB/MiB/GiB with two
/// decimals rounded like glibc's `%.2f` (to nearest, ties to even on the exact value).
pub fn format_size(size: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if size <= KIB {
        format!("{size} bytes")
    } else if size <= MIB {
        format!("{} KiB", two_decimals(size, KIB))
    } else if size <= GIB {
        format!("{} MiB", two_decimals(size, MIB))
    } else {
        format!("{} GiB", two_decimals(size, GIB))
    }
}

/// `size / unit` with two decimals, rounded half to even on the exact rational
/// value (what glibc does for the exact binary double, which these quotients are).
fn two_decimals(size: u64, unit: u64) -> String {
    let num = u128::from(size) * 100;
    let den = u128::from(unit);
    let (mut q, r) = (num / den, num % den);
    if r * 2 > den || (r * 2 == den && q % 2 == 1) {
        q += 1;
    }
    format!("{}.{:02}", q / 100, q % 100)
}

/// The text of `torch.OutOfMemoryError` for these numbers, in the given
/// release's wording. `this_process` is NVML's reading for this process, if any.
pub fn oom_message(info: &OomError, version: TorchVersion, this_process: Option<u64>) -> String {
    let proc_info = this_process
        .map(|used| {
            format!(
                "Including non-PyTorch memory, this process has {} memory in use. ",
                format_size(used)
            )
        })
        .unwrap_or_default();
    let allowed_info = info
        .allowed_max
        .map(|max| format!("{} allowed; ", format_size(max)))
        .unwrap_or_default();
    // 2.11 as 2.12 (its real OOM text in the H100 captures); 2.10 named the
    // new variable.
    let (env, link) = if version.0 >= 11 {
        (
            "PYTORCH_CUDA_ALLOC_CONF",
            "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf",
        )
    } else if version.0 >= 10 {
        (
            "PYTORCH_ALLOC_CONF",
            "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables",
        )
    } else {
        (
            "PYTORCH_CUDA_ALLOC_CONF",
            "https://pytorch.org/docs/stable/notes/cuda.html#environment-variables",
        )
    };
    format!(
        "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. {}{}Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting {}=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  ({})",
        format_size(info.alloc_size),
        info.device,
        format_size(info.device_total),
        format_size(info.device_free),
        proc_info,
        allowed_info,
        format_size(info.allocated),
        format_size(info.reserved.saturating_sub(info.allocated)),
        env,
        link,
    )
}
