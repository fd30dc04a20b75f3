//! The snapshot benches' generated files: made once by the library's
//! generator into `std::env::temp_dir()` (`vramscope-synth-<size>-<seed>`),
//! and reused while their size matches the `.stats` file beside them.

use std::path::PathBuf;
use std::time::Instant;

use vramscope::trace::snapshot::synthetic_snapshot;

/// The generated file of about `target` bytes for `seed`, and its size.
pub fn generated(target: u64, seed: u64) -> (PathBuf, u64) {
    let path = std::env::temp_dir().join(format!("vramscope-synth-{target}-{seed}.pickle"));
    let stats = path.with_extension("stats");
    let recorded: Option<u64> = std::fs::read_to_string(&stats)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let len = std::fs::metadata(&path).map(|m| m.len()).ok();
    if recorded.is_none() || recorded != len {
        let t = Instant::now();
        let file = std::fs::File::create(&path).expect("temp file");
        let s = synthetic_snapshot(
            std::io::BufWriter::with_capacity(1 << 20, file),
            target,
            seed,
        )
        .expect("generates");
        std::fs::write(&stats, s.bytes.to_string()).expect("stats file");
        eprintln!(
            "generated {} ({:.0} MB, {} entries) in {:.1} s",
            path.display(),
            s.bytes as f64 / 1e6,
            s.entries,
            t.elapsed().as_secs_f64()
        );
    }
    let len = std::fs::metadata(&path).expect("generated").len();
    (path, len)
}
