//! A read-only memory map of a snapshot that survives the file being cut
//! short while it is read. PyTorch's `_dump_snapshot` rewrites its file in
//! place, so `open` can meet a file that another process truncates under
//! it: touching a mapped page past the new end raises SIGBUS, which killed
//! the process (issue 40).
//!
//! While a [`GuardedMap`] lives, its address range is registered with a
//! SIGBUS handler installed once per process. A fault inside a registered
//! range maps zero-filled pages over the rest of that range and marks it
//! cut; the read that faulted then sees zeros (the decoder fails on them or
//! reads garbage), and the caller asks [`GuardedMap::cut_short`] afterwards
//! and reports the truncation instead of whatever the decoder said. A fault
//! anywhere else goes on to the handler that was there before (Rust's own
//! stack-overflow handler, or the default action).

use std::fs::File;
use std::io;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

/// Maps guarded at the same time (threads opening files side by side); a
/// map that finds no free slot is not made: the caller reads the file.
const SLOTS: usize = 64;

/// One registered range: `start == 0` marks a free slot.
struct Slot {
    start: AtomicUsize,
    len: AtomicUsize,
    cut: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    cut: AtomicBool::new(false),
};
static RANGES: [Slot; SLOTS] = [FREE; SLOTS];

/// The handler that was installed before ours, called for faults elsewhere.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
static INSTALL: Once = Once::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A file mapped read-only, its range guarded against truncation.
pub struct GuardedMap {
    map: memmap2::Mmap,
    slot: usize,
}

impl GuardedMap {
    /// Map `file` (not empty). `Ok(None)` when no guard can be had (the
    /// handler could not be installed, or every slot is taken): the caller
    /// reads the file into memory instead.
    pub fn map(file: &File) -> io::Result<Option<GuardedMap>> {
        install();
        if !INSTALLED.load(Ordering::Acquire) {
            return Ok(None);
        }
        // SAFETY: a read-only map private to this value; a truncation by
        // another process while it lives is caught by the handler below
        // (the range is registered before the map is handed out).
        let map = unsafe { memmap2::Mmap::map(file) }?;
        let start = map.as_ptr() as usize;
        for (i, slot) in RANGES.iter().enumerate() {
            if slot
                .start
                .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                slot.cut.store(false, Ordering::Release);
                slot.len.store(map.len(), Ordering::Release);
                slot.start.store(start, Ordering::Release);
                return Ok(Some(GuardedMap { map, slot: i }));
            }
        }
        Ok(None)
    }

    /// Whether the file was cut short under the map (a page past its new
    /// end was touched and read as zeros).
    pub fn cut_short(&self) -> bool {
        RANGES[self.slot].cut.load(Ordering::Acquire)
    }

    /// The map itself, for advice.
    pub fn inner(&self) -> &memmap2::Mmap {
        &self.map
    }
}

impl Deref for GuardedMap {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for GuardedMap {
    fn drop(&mut self) {
        // The slot is freed before the map is unmapped (the field drops
        // after this): a later map at the same address gets a fresh slot.
        let slot = &RANGES[self.slot];
        slot.len.store(0, Ordering::Release);
        slot.start.store(0, Ordering::Release);
    }
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: sigaction with a zeroed struct, our handler and an empty
        // mask; the previous action is kept for chaining before ours can run
        // (it is written once, here, before the handler is installed).
        unsafe {
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
                return;
            }
            let _ = PREVIOUS.set(previous);
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut()) == 0 {
                INSTALLED.store(true, Ordering::Release);
            }
        }
    });
}

/// The SIGBUS handler: only atomics and `mmap`, no allocation or lock.
extern "C" fn on_sigbus(
    signal: libc::c_int,
    info: *mut libc::siginfo_t,
    context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in &RANGES {
        let start = slot.start.load(Ordering::Acquire);
        let len = slot.len.load(Ordering::Acquire);
        if start == 0 || start == usize::MAX || addr < start || addr >= start + len {
            continue;
        }
        // SAFETY: sysconf is async-signal-safe in practice (a read of a
        // value the C library holds).
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let from = addr & !(page - 1);
        let end = start + len;
        // SAFETY: MAP_FIXED over pages of our own registered read-only
        // file map (from..end lies inside it): they become zero-filled
        // private pages, which the map's own munmap later releases.
        let zeroed = unsafe {
            libc::mmap(
                from as *mut libc::c_void,
                end - from,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if zeroed != libc::MAP_FAILED {
            slot.cut.store(true, Ordering::Release);
            return;
        }
    }
    // Not ours: what would have happened without this handler.
    match PREVIOUS.get().copied() {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    // SAFETY: an SA_SIGINFO handler has this signature.
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(signal, info, context);
            } else {
                // SAFETY: a plain handler takes the signal number.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(signal);
            }
        }
        _ => {
            // SAFETY: restoring the default action and returning re-runs the
            // faulting access, which then ends the process as before.
            unsafe {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &default, std::ptr::null_mut());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_cut_short_under_the_map_reads_as_zeros_and_says_so() {
        let dir = std::env::temp_dir().join(format!("vramscope-guarded-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("f");
        let mut f = File::create(&path).expect("create");
        f.write_all(&vec![7u8; 5 * 4096]).expect("write");
        drop(f);
        let file = File::open(&path).expect("open");
        let map = GuardedMap::map(&file).expect("map").expect("a slot");
        assert_eq!(map[0], 7);
        assert!(!map.cut_short());
        // Another writer cuts it to one page: the pages after it are gone.
        File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(4096))
            .expect("truncate");
        let tail: u64 = map[3 * 4096..].iter().map(|b| u64::from(*b)).sum();
        assert_eq!(tail, 0, "read as zeros, not a SIGBUS");
        assert!(map.cut_short());
        drop(map);
        // A fresh map of the file as it is now is not marked.
        let map = GuardedMap::map(&file).expect("map").expect("a slot");
        assert_eq!(map.len(), 4096);
        assert!(!map.cut_short());
        drop(map);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
