//! A narrated walkthrough of the allocator model, printed to the terminal.

use std::process::ExitCode;

use anyhow::Context;
use vramscope::alloc::{format_size, memory_summary, AllocConfig, CachingAllocator, Tag};
use vramscope::device::SimDevice;

const MIB: u64 = 1 << 20;

pub fn run(conf: &str) -> anyhow::Result<ExitCode> {
    let config = AllocConfig::parse(conf).context("--conf")?;
    let mut a = CachingAllocator::new(SimDevice::new("sim: 100 MiB", 100 * MIB, 0), config);
    let say = |a: &CachingAllocator<SimDevice>, what: &str| {
        let s = a.stats();
        sayln!(
            "{what:<26} allocated {:>10}  reserved {:>10}  largest free block {:>10}",
            format_size(s.allocated_bytes()),
            format_size(s.reserved_bytes()),
            format_size(a.largest_free_block())
        );
    };
    sayln!("vramscope allocator walkthrough (PYTORCH_CUDA_ALLOC_CONF=\"{conf}\") on a simulated 100 MiB GPU\n");
    let mut blocks = Vec::new();
    for i in 0..10 {
        blocks.push(a.malloc(8 * MIB, 0, Tag(i)).context("malloc")?);
    }
    say(&a, "malloc(8 MiB) x10");
    for addr in blocks.iter().skip(1).step_by(2) {
        a.free(*addr).context("free")?;
    }
    say(&a, "free every second tensor");
    match a.malloc(16 * MIB, 0, Tag(10)) {
        Ok(_) => say(&a, "malloc(16 MiB) fits"),
        Err(err) => sayln!("\nmalloc(16 MiB) fails:\n  torch.OutOfMemoryError: {err}\n"),
    }
    a.empty_cache();
    say(&a, "empty_cache()");
    for addr in blocks.iter().step_by(2) {
        a.free(*addr).context("free")?;
    }
    say(&a, "free the other tensors");
    a.empty_cache();
    say(&a, "empty_cache()");
    sayln!("\n{}", memory_summary(a.stats(), 0, false));
    sayln!("Try: vramscope demo --conf expandable_segments:True");
    Ok(ExitCode::SUCCESS)
}
