//! Import speed and memory (ignored; run with `cargo test --release -- --ignored --nocapture`).

use super::*;

#[test]
#[ignore]
fn decode_and_import_speed() {
    let (name, bytes) = real_files()
        .iter()
        .max_by_key(|(_, b)| b.len())
        .expect("files");
    let mb = bytes.len() as f64 / 1e6;
    // Best of N: the machine is shared, the minimum is the least disturbed.
    let best = |f: &dyn Fn()| {
        (0..40)
            .map(|_| {
                let t = std::time::Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::MAX, f64::min)
    };
    let decode_s = best(&|| {
        std::hint::black_box(crate::trace::pickle::decode(bytes).expect("decodes"));
    });
    let import_s = best(&|| {
        std::hint::black_box(import_bytes(bytes).expect("imports"));
    });
    let arena = crate::trace::pickle::decode(bytes)
        .expect("decodes")
        .heap_bytes();
    println!(
        "{name}: {mb:.2} MB; decode {:.0} MB/s; decode+import {:.0} MB/s; arena {:.2}x file",
        mb / decode_s,
        mb / import_s,
        arena as f64 / bytes.len() as f64
    );
}

#[test]
#[ignore]
fn import_phase_timing() {
    let (_, bytes) = real_files()
        .iter()
        .max_by_key(|(_, b)| b.len())
        .expect("files");
    let doc = crate::trace::pickle::decode(bytes).expect("decodes");
    let best = (0..50)
        .map(|_| {
            let t = std::time::Instant::now();
            std::hint::black_box(import_document(&doc).expect("imports"));
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min);
    println!("import only (best of 50): {:.2} ms", best * 1000.0);
}

/// Peak memory on a big synthetic snapshot named by `SNAPSCRATCH_BIG`
/// (run alone: `cargo test --release big_file -- --ignored --nocapture`).
#[test]
#[ignore]
fn big_file_memory() {
    let Some(path) = std::env::var_os("SNAPSCRATCH_BIG") else {
        println!("note: set SNAPSCRATCH_BIG to a large snapshot to run this");
        return;
    };
    fn hwm_mb() -> f64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }
    let base = hwm_mb();
    let bytes = std::fs::read(&path).expect("read");
    let mb = bytes.len() as f64 / (1 << 20) as f64;
    let after_read = hwm_mb();
    let t = std::time::Instant::now();
    let doc = crate::trace::pickle::decode(&bytes).expect("decodes");
    let decode_s = t.elapsed().as_secs_f64();
    let after_decode = hwm_mb();
    let t = std::time::Instant::now();
    let snap = import_document(&doc).expect("imports");
    let import_s = t.elapsed().as_secs_f64();
    let after_import = hwm_mb();
    println!(
        "file {mb:.0} MiB; decode {:.0} MB/s, import {:.2} s; peak RSS above start: \
         after read {:.0} MiB, after decode {:.0} MiB (arena {:.0} MiB), after import {:.0} MiB; \
         {} entries",
        bytes.len() as f64 / 1e6 / decode_s,
        import_s,
        after_read - base,
        after_decode - base,
        doc.heap_bytes() as f64 / (1 << 20) as f64,
        after_import - base,
        snap.device_traces.iter().map(Vec::len).sum::<usize>()
    );
}
