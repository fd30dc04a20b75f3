//! `torch.cuda.memory_summary()` text, laid out as PyTorch lays it out (allocator.md §12).

use super::stats::{Family, Level, MemoryStats, Stat};

const WIDTH: usize = 75;

/// PyTorch's byte cell: the unit is chosen by the `all` row's value in the same
/// column (`reference`), and values are floored.
fn format_bytes_cell(value: i64, reference: i64) -> String {
    const UNITS: [&str; 6] = ["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = value;
    let mut reference = reference as f64;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if reference < 768.0 * 1024.0 {
            break;
        }
        unit = next;
        value = value.div_euclid(1024);
        reference /= 1024.0;
    }
    format!("{value:>6} {unit}")
}

fn format_count_cell(value: i64, reference: i64) -> String {
    const UNITS: [&str; 3] = [" ", "K", "M"];
    let mut value = value;
    let mut reference = reference as f64;
    let mut unit = UNITS[0];
    for next in &UNITS[1..] {
        if reference < 750_000.0 {
            break;
        }
        unit = next;
        value = value.div_euclid(1000);
        reference /= 1000.0;
    }
    format!("{value:>7} {unit} ")
}

fn cells(stat: Stat, reference: Stat, bytes: bool) -> [String; 4] {
    let pairs = [
        (stat.current, reference.current),
        (stat.peak, reference.peak),
        (stat.allocated, reference.allocated),
        (stat.freed, reference.freed),
    ];
    pairs.map(|(v, r)| {
        if bytes {
            format_bytes_cell(v, r)
        } else {
            format_count_cell(v, r)
        }
    })
}

fn row(name: &str, cells: [String; 4]) -> String {
    format!(
        " {name:<21} | {} | {} | {} | {} ",
        cells[0], cells[1], cells[2], cells[3]
    )
}

/// The summary text for one device. `abbreviated` prints only the `all` rows.
pub fn memory_summary(stats: &MemoryStats, device: u32, abbreviated: bool) -> String {
    let mut lines = vec![
        "=".repeat(WIDTH),
        format!(
            "{:18}PyTorch CUDA memory summary, device ID {device:<17} ",
            ""
        ),
        "-".repeat(WIDTH),
        format!(
            "{:12}CUDA OOMs: {:<12} | {:7}cudaMalloc retries: {:<8}  ",
            "", stats.num_ooms, "", stats.num_alloc_retries
        ),
        "=".repeat(WIDTH),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];
    let metrics = [
        (Family::AllocatedBytes, "Allocated memory", true),
        (Family::ActiveBytes, "Active memory", true),
        (Family::RequestedBytes, "Requested memory", true),
        (Family::ReservedBytes, "GPU reserved memory", true),
        (Family::InactiveSplitBytes, "Non-releasable memory", true),
        (Family::Allocation, "Allocations", false),
        (Family::Active, "Active allocs", false),
        (Family::Segment, "GPU reserved segments", false),
        (Family::InactiveSplit, "Non-releasable allocs", false),
    ];
    for (family, name, bytes) in metrics {
        lines.push("-".repeat(WIDTH));
        let all = stats.get(family, Level::All);
        lines.push(row(name, cells(all, all, bytes)));
        if !abbreviated {
            lines.push(row(
                "      from large pool",
                cells(stats.get(family, Level::Large), all, bytes),
            ));
            lines.push(row(
                "      from small pool",
                cells(stats.get(family, Level::Small), all, bytes),
            ));
        }
    }
    for (stat, name) in [
        (stats.oversize_allocations, "Oversize allocations"),
        (stats.oversize_segments, "Oversize GPU segments"),
    ] {
        lines.push("-".repeat(WIDTH));
        lines.push(row(name, cells(stat, stat, false)));
    }
    lines.push("=".repeat(WIDTH));
    let mut out = lines
        .iter()
        .map(|l| format!("|{l}|"))
        .collect::<Vec<_>>()
        .join("\n");
    out.push('\n');
    out
}
