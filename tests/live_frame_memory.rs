//! What one frame of a live stream can cost to decode (issue 40): a frame
//! under the 64 MiB bound once became a generic JSON tree of 30 M values
//! (about 1 GB). Decoding reads straight into the message types now; this
//! crate counts the heap to hold it to that (one test: nothing else
//! allocates beside it).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use vramscope::job::decode;

struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call goes to the system allocator unchanged; only counts are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: a pointer this allocator returned, with its layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Peak heap bytes above what was live before `f` ran.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = NOW.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed).saturating_sub(base))
}

/// `{"t":KIND,FIELD:[0,0,…]}` of about `n` bytes.
fn zeros_frame(kind: &str, field: &str, n: usize) -> Vec<u8> {
    let mut v = format!(r#"{{"t":"{kind}","{field}":["#).into_bytes();
    let count = n / 2;
    v.reserve(count * 2 + 4);
    for i in 0..count {
        if i > 0 {
            v.push(b',');
        }
        v.push(b'0');
    }
    v.extend_from_slice(b"]}");
    v
}

#[test]
fn a_frame_under_the_bound_costs_a_bounded_heap_to_decode() {
    const MIB: usize = 1 << 20;
    let n = 8 * MIB;
    // A type the reader skips, a known type whose field is wrong, a
    // `stack` of 30 M frames, `stats` of too many keys, a hello whose argv
    // is 30 M strings.
    let mut cases: Vec<(Vec<u8>, Option<&str>)> = vec![
        (zeros_frame("telemetry", "x", n), None),
        (zeros_frame("segments", "segments", n), Some("segments")),
        (zeros_frame("stack", "frames", n), Some("stack")),
    ];
    let mut stats = br#"{"t":"stats","device":0,"seq":0,"stats":{"#.to_vec();
    for i in 0..100_000 {
        if i > 0 {
            stats.push(b',');
        }
        stats.extend_from_slice(format!(r#""k{i}":0"#).as_bytes());
    }
    stats.extend_from_slice(b"}}");
    cases.push((stats, Some("more than 1024 stats keys")));
    let mut hello =
        br#"{"t":"hello","protocol":1,"pid":1,"mode":"agent","devices":[],"argv":["#.to_vec();
    for i in 0..1_000_000 {
        if i > 0 {
            hello.push(b',');
        }
        hello.extend_from_slice(b"\"a\"");
    }
    hello.extend_from_slice(b"]}");
    cases.push((hello, Some("more than 4096 items")));
    for (bytes, says) in cases {
        assert!(bytes.len() < 64 * MIB, "{} bytes", bytes.len());
        let (result, peak) = peak_of(|| decode("job", 3, &bytes).map(|m| m.is_some()));
        match says {
            None => assert!(matches!(result, Ok(false)), "skipped"),
            Some(what) => {
                let err = result.err().map(|e| e.to_string()).unwrap_or_default();
                assert!(err.contains(what), "{}", &err[..err.len().min(300)]);
                assert!(err.len() < 400, "{} bytes of error", err.len());
            }
        }
        eprintln!(
            "{says:?}: {} KiB of heap for {} bytes",
            peak >> 10,
            bytes.len()
        );
        // As a generic JSON tree the 8 MiB of zeros alone took 128 MiB.
        assert!(
            peak < 16 * MIB,
            "{:?}: {} MiB of heap for a {} MiB frame",
            says,
            peak / MIB,
            bytes.len() / MIB
        );
    }
}
