//! Decoded pickle → typed [`Snapshot`]. Knows every layout in SCHEMA.md:
//! current dict, older dict, bare segment list, legacy blocks with
//! `history`. Keys beyond the few each record needs are optional.
//!
//! # Streaming
//!
//! A big snapshot is almost all trace entries, and PyTorch never shares an
//! entry dict (only the strings, frame dicts and frames lists inside it).
//! [`import_bytes`] therefore decodes with a [`Sink`]: the lists at
//! `root["segments"]` and `root["device_traces"][d]` are *claimed* when the
//! decoder creates them (recognised by what is on the pickle stack below
//! them, which is how CPython's pickler lays the root dict out), and every
//! batch of items appended to them is converted to [`Segment`]s and
//! [`TraceEntry`]s on the spot. At the end of each `MARK ... APPENDS`
//! batch the decoder drops the converted dicts from its arena
//! ([`Document::compact`]), keeping what the memo can still reach: strings,
//! frame dicts and frames lists. The generic arena thus holds the shared
//! part of the file and one batch (1000 entries), never the whole trace.
//!
//! Anything the streaming path cannot vouch for makes it give up and decode
//! the file again the plain way, so results and errors are those of
//! [`import_document`]: a schema error inside a claimed list (the plain
//! path reports it with the same path, in file order), or a pickle that
//! refers back to a dropped dict through its memo (valid, never written by
//! PyTorch).
//!
//! [`import_file`] maps the file read-only and, as the decoder moves on,
//! tells the kernel it no longer needs the pages behind it, so the input
//! does not stay resident next to the typed result.

use std::path::Path as FsPath;

use rustc_hash::FxHashMap;

use crate::trace::pickle::{self, Document, PickleError, PickleErrorKind, SeqId, Sink, Value};

use super::error::{SchemaError, SnapshotError};
use super::field::{key_table, Fields, Key, KeyTable, Path};
use super::types::{Segment, Snapshot, TraceEntry};

mod records;
mod tap;
mod values;

use records::Importer;
pub use tap::{Tables, Tapped, TraceTap};

/// Marks a container not converted yet in `Importer::converted`.
const NOT_SEEN: u32 = u32::MAX;

/// A small segment is exactly 2 MiB (SCHEMA.md §3); used only when
/// `segment_type` is missing.
const SMALL_SEGMENT: u64 = 2 << 20;

/// Input bytes released to the kernel at a time by [`import_file`].
const RELEASE_STEP: usize = 4 << 20;

/// Decode and import a snapshot pickle held in memory.
pub fn import_bytes(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    import_streaming(bytes, None)
}

/// Read, decode and import a snapshot file; errors name the file. The file
/// is memory-mapped, not copied.
pub fn import_file(path: &FsPath) -> Result<Snapshot, SnapshotError> {
    import_file_reporting(path, &mut |_| {})
}

/// [`import_file`], telling `progress` how many bytes of the file have been
/// decoded as it goes (a bare pickle only: a zip container reports nothing).
pub fn import_file_reporting(
    path: &FsPath,
    progress: &mut dyn FnMut(u64),
) -> Result<Snapshot, SnapshotError> {
    match import_file_tapped(path, progress, None)? {
        Some(t) => Ok(t.snapshot),
        // Without a tap nothing asks to stop.
        None => Err(SnapshotError::Container("the import was stopped".into())),
    }
}

/// [`import_file_reporting`], handing one device's trace to `tap` batch
/// by batch as it is decoded (see [`TraceTap`]). `None`: the tap asked to
/// stop.
pub fn import_file_tapped(
    path: &FsPath,
    progress: &mut dyn FnMut(u64),
    tap: Option<&mut dyn TraceTap>,
) -> Result<Option<Tapped>, SnapshotError> {
    let io = |source| SnapshotError::Io {
        path: path.to_path_buf(),
        source,
    };
    // A pipe or a device is refused before it is opened (reading one would
    // wait for a writer, or never end).
    let (file, meta) = crate::files::open_regular(path).map_err(|e| {
        io(std::io::Error::new(
            e.kind(),
            format!("{e}; a snapshot is a file written by torch.cuda.memory._dump_snapshot"),
        ))
    })?;
    let len = meta.len();
    let result = if len == 0 {
        import_bytes(&[]).map(|snapshot| {
            Some(Tapped {
                snapshot,
                tapped: None,
            })
        })
    } else {
        import_mapped(&file, progress, tap).map_err(io).and_then(|(result, cut)| {
            let changed = cut || changed_since(&file, &meta);
            match result {
                // What the decoder made of a file cut or rewritten under it
                // is no answer: say what happened instead.
                _ if changed => Err(io(std::io::Error::other(format!(
                    "the file changed while it was read (it was {} bytes, it is {} now): \
                     torch.cuda.memory._dump_snapshot may still be writing it; open it again once it is written",
                    crate::units::format_count(len),
                    file.metadata()
                        .map_or("unknown".into(), |m| crate::units::format_count(m.len()))
                )))),
                r => r,
            }
        })
    };
    result.map_err(|e| SnapshotError::File {
        path: path.to_path_buf(),
        source: Box::new(match (&e, other_input(path)) {
            (SnapshotError::Pickle(_), Some(what)) => SnapshotError::OtherInput(what),
            _ => e,
        }),
    })
}

/// Import a mapped file, handing its trace to `tap` (see
/// [`import_file_tapped`]): the result, and whether the file was cut short
/// under the map (read as zeros past its new end instead of a SIGBUS).
#[cfg(unix)]
fn import_mapped(
    file: &std::fs::File,
    progress: &mut dyn FnMut(u64),
    tap: Option<&mut dyn TraceTap>,
) -> std::io::Result<(Result<Option<Tapped>, SnapshotError>, bool)> {
    let Some(map) = super::guarded_map::GuardedMap::map(file)? else {
        // No guard to be had: read it (a truncation then just ends the bytes).
        use std::io::Read;
        let mut bytes = Vec::new();
        (&*file).read_to_end(&mut bytes)?;
        return Ok((import_tapped(&bytes, None, tap), false));
    };
    let _ = map.inner().advise(memmap2::Advice::Sequential);
    let mut released = 0usize;
    let mut release = |pos: usize| {
        progress(pos as u64);
        let upto = pos / RELEASE_STEP * RELEASE_STEP;
        if upto > released {
            // SAFETY: DONTNEED on a read-only shared file mapping only
            // drops our reference to page-cache pages; touching them
            // again reads the same bytes back from the file (or the
            // guard's zeros past a new end).
            let _ = unsafe {
                map.inner().unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    released,
                    upto - released,
                )
            };
            released = upto;
        }
    };
    let result = import_tapped(&map, Some(&mut release), tap);
    Ok((result, map.cut_short()))
}

/// Elsewhere the file is read whole.
#[cfg(not(unix))]
fn import_mapped(
    file: &std::fs::File,
    progress: &mut dyn FnMut(u64),
    tap: Option<&mut dyn TraceTap>,
) -> std::io::Result<(Result<Option<Tapped>, SnapshotError>, bool)> {
    use std::io::Read;
    let mut bytes = Vec::new();
    (&*file).read_to_end(&mut bytes)?;
    progress(bytes.len() as u64);
    Ok((import_tapped(&bytes, None, tap), false))
}

/// Whether the open file's size or modification time differs from `before`.
fn changed_since(file: &std::fs::File, before: &std::fs::Metadata) -> bool {
    match file.metadata() {
        Ok(now) => now.len() != before.len() || now.modified().ok() != before.modified().ok(),
        Err(_) => false,
    }
}

/// What a file that is no pickle is instead, when it is one of vramscope's
/// other inputs, and how to open it.
fn other_input(path: &FsPath) -> Option<String> {
    use std::io::Read;
    let mut head = [0u8; 8];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let shown = path.display();
    if head[..n] == super::container::LIVE_RECORDING_MAGIC[..] {
        return Some(format!(
            "a vramscope live recording, not a PyTorch snapshot: play it with `vramscope attach --replay {shown}`"
        ));
    }
    if path.extension().is_some_and(|e| e == "ron") {
        return Some(format!(
            "a RON file, not a PyTorch snapshot: a scenario runs with `vramscope run {shown}`, a lesson with `vramscope lesson {shown}`"
        ));
    }
    None
}

/// The streaming import (module doc), falling back to the plain one.
fn import_streaming(
    bytes: &[u8],
    release: Option<&mut dyn FnMut(usize)>,
) -> Result<Snapshot, SnapshotError> {
    match import_tapped(bytes, release, None)? {
        Some(t) => Ok(t.snapshot),
        None => Err(SnapshotError::Container("the import was stopped".into())),
    }
}

/// [`import_streaming`] with a tap; `None`: the tap asked to stop.
fn import_tapped(
    bytes: &[u8],
    release: Option<&mut dyn FnMut(usize)>,
    tap: Option<&mut dyn TraceTap>,
) -> Result<Option<Tapped>, SnapshotError> {
    let inner = super::container::pickle_bytes(bytes)?;
    // Page-release offsets count from the file's start: only for a bare pickle.
    let release = if inner.len() == bytes.len() {
        release
    } else {
        None
    };
    let bytes = inner;
    match try_streaming(bytes, release, tap)? {
        Streamed::Whole(t) => Ok(Some(*t)),
        Streamed::Stopped => Ok(None),
        Streamed::GaveUp => {
            let doc = pickle::decode(bytes)?;
            let budget = records::record_budget(bytes.len());
            let snapshot = Importer::new(doc.container_count(), false, budget).run(&doc)?;
            Ok(Some(Tapped {
                snapshot,
                tapped: None,
            }))
        }
    }
}

/// How a streaming import ended.
pub(super) enum Streamed {
    Whole(Box<Tapped>),
    /// It gave up (see the module doc): decode the plain way.
    GaveUp,
    /// The tap asked to stop.
    Stopped,
}

#[cfg(test)]
impl Streamed {
    /// The snapshot, when the streaming import read the file itself.
    pub(super) fn whole(self) -> Option<Snapshot> {
        match self {
            Streamed::Whole(t) => Some(t.snapshot),
            Streamed::GaveUp | Streamed::Stopped => None,
        }
    }
}

/// The streaming import alone (see the module doc).
pub(super) fn try_streaming(
    bytes: &[u8],
    release: Option<&mut dyn FnMut(usize)>,
    tap: Option<&mut dyn TraceTap>,
) -> Result<Streamed, SnapshotError> {
    let mut stream = Stream {
        im: Importer::new(0, true, records::record_budget(bytes.len())),
        keys: [None; Key::COUNT],
        keys_at: usize::MAX,
        claims: FxHashMap::default(),
        failed: false,
        release,
        tap,
        tapped: None,
        stopped: false,
        batch: Vec::new(),
    };
    match pickle::decode_with(bytes, &mut stream) {
        Ok(doc) => {
            let Stream {
                mut im,
                claims,
                tapped,
                ..
            } = stream;
            im.track = false;
            im.claims = claims;
            im.tapped_list = tapped.as_ref().map(|t| t.list);
            let (snapshot, reused) = im.run_tapped(&doc)?;
            if reused {
                // The pickle puts the tapped list at a second place too
                // (valid, never written by PyTorch): that place got none of
                // its entries, so the file is decoded whole.
                return Ok(Streamed::GaveUp);
            }
            let tapped = tapped.map(|t| (t.device, t.count));
            Ok(Streamed::Whole(Box::new(Tapped { snapshot, tapped })))
        }
        Err(_) if stream.stopped => Ok(Streamed::Stopped),
        Err(PickleError {
            kind: PickleErrorKind::Stopped | PickleErrorKind::Consumed { .. },
            ..
        }) => Ok(Streamed::GaveUp),
        Err(e) => Err(e.into()),
    }
}

/// The list a tap takes, and how far it has got.
struct TapState {
    list: u32,
    device: usize,
    count: usize,
}

/// Import an already decoded document (its records unbounded: the caller
/// decoded it already).
pub fn import_document(doc: &Document) -> Result<Snapshot, SchemaError> {
    Importer::new(doc.container_count(), false, u64::MAX).run(doc)
}

/// What a claimed list holds, converted.
enum Claimed {
    Segments(Vec<Segment>),
    Trace {
        device: usize,
        entries: Vec<TraceEntry>,
    },
    /// Moved into the result already (a list the pickle uses twice).
    Taken,
}

/// The [`Sink`] of a streaming import.
struct Stream<'r, 't> {
    im: Importer,
    keys: KeyTable,
    /// `doc.string_count()` when `keys` were looked up.
    keys_at: usize,
    claims: FxHashMap<u32, Claimed>,
    failed: bool,
    release: Option<&'r mut dyn FnMut(usize)>,
    tap: Option<&'t mut dyn TraceTap>,
    tapped: Option<TapState>,
    /// The tap asked to stop.
    stopped: bool,
    /// The tapped list's batch being converted.
    batch: Vec<TraceEntry>,
}

impl Stream<'_, '_> {
    /// Offer the trace list `list` of `device` to the tap, with the final
    /// segments when they have been read.
    fn offer(&mut self, list: u32, device: usize) {
        let Some(tap) = self.tap.as_mut() else {
            return;
        };
        let segments = self.claims.values().find_map(|c| match c {
            Claimed::Segments(s) => Some(s.as_slice()),
            _ => None,
        });
        let tables = Tables {
            frames: self.im.frames(),
            extras: self.im.extras(),
        };
        if tap.begin(device, segments, tables) {
            self.tapped = Some(TapState {
                list,
                device,
                count: 0,
            });
        }
    }

    /// Convert a batch of the tapped list and hand it to the tap.
    fn tap_batch(&mut self, f: &Fields, items: &[Value], path: &Path) -> Result<(), SchemaError> {
        let (Some(tap), Some(t)) = (self.tap.as_mut(), self.tapped.as_mut()) else {
            return Ok(());
        };
        let im = &mut self.im;
        self.batch.clear();
        for &v in items {
            let e = im.entry(f, v, &path.index(t.count + self.batch.len()))?;
            self.batch.push(e);
        }
        let tables = Tables {
            frames: im.frames(),
            extras: im.extras(),
        };
        if !tap.entries(t.count, &self.batch, tables) {
            self.stopped = true;
        }
        t.count += self.batch.len();
        Ok(())
    }

    fn fields<'d>(&mut self, doc: &'d Document) -> Fields<'d> {
        if self.keys_at != doc.string_count() {
            self.keys = key_table(doc);
            self.keys_at = doc.string_count();
        }
        Fields::with_keys(doc, self.keys)
    }
}

impl Sink for Stream<'_, '_> {
    fn claim(&mut self, doc: &Document, stack: &[Value], marks: &[usize]) -> bool {
        if self.failed {
            return false;
        }
        let f = self.fields(doc);
        let Some(p) = stack.len().checked_sub(1) else {
            return false;
        };
        let Some(id) = stack.get(p).and_then(|&v| Document::list_id(v)) else {
            return false;
        };
        // A value slot of the root dict's first SETITEMS batch: the root is
        // the only thing under that batch's MARK.
        let root_value = |pos: usize| {
            marks.first() == Some(&1)
                && stack.first().and_then(|&v| Document::dict_id(v)).is_some()
                && pos >= 2
                && (pos - 1) % 2 == 1
        };
        let is_key =
            |pos: usize, key: Key| f.key(key).is_some() && stack.get(pos).copied() == f.key(key);
        let claim = if marks.len() == 1 && root_value(p) && is_key(p - 1, Key::Segments) {
            Some(Claimed::Segments(Vec::new()))
        } else {
            // root["device_traces"] = O, and this list is an item of O:
            // inside O's MARK ... APPENDS batch, or about to be APPENDed.
            let outer = match marks {
                [_, m] if *m >= 1 && *m <= p => Some((m - 1, p - m)),
                [_] if p >= 1 => Some((p - 1, 0)),
                _ => None,
            };
            outer.and_then(|(o, offset)| {
                let list = stack.get(o).and_then(|&v| Document::list_id(v))?;
                (root_value(o) && is_key(o - 1, Key::DeviceTraces)).then(|| Claimed::Trace {
                    device: doc.items(list).len() + offset,
                    entries: Vec::new(),
                })
            })
        };
        match claim {
            Some(c) => {
                self.claims.insert(id.0, c);
                true
            }
            None => false,
        }
    }

    fn append(
        &mut self,
        doc: &Document,
        list: SeqId,
        items: &[Value],
        consumed: &mut Vec<SeqId>,
    ) -> Result<(), ()> {
        let f = self.fields(doc);
        std::mem::swap(&mut self.im.consumed, consumed);
        self.im.consumed.clear();
        if self.tapped.is_none() && !items.is_empty() {
            // A trace list's first entries: offered to the tap.
            if let Some(Claimed::Trace { device, entries }) = self.claims.get(&list.0) {
                if entries.is_empty() {
                    let device = *device;
                    self.offer(list.0, device);
                }
            }
        }
        if self.tapped.as_ref().is_some_and(|t| t.list == list.0) {
            let device = self.tapped.as_ref().map_or(0, |t| t.device);
            let root = Path::ROOT;
            let traces = root.key("device_traces");
            let path = traces.index(device);
            let r = self.tap_batch(&f, items, &path);
            std::mem::swap(&mut self.im.consumed, consumed);
            if self.stopped {
                return Err(());
            }
            return r.map_err(|_| self.failed = true);
        }
        let im = &mut self.im;
        let r = match self.claims.get_mut(&list.0) {
            Some(Claimed::Segments(out)) => {
                let root = Path::ROOT;
                let path = root.key("segments");
                items.iter().try_for_each(|&v| {
                    let seg = im.segment(&f, v, &path.index(out.len()))?;
                    out.push(seg);
                    Ok(())
                })
            }
            Some(Claimed::Trace { device, entries }) => {
                let root = Path::ROOT;
                let traces = root.key("device_traces");
                let path = traces.index(*device);
                items.iter().try_for_each(|&v| {
                    let e = im.entry(&f, v, &path.index(entries.len()))?;
                    entries.push(e);
                    Ok(())
                })
            }
            _ => Ok(()),
        };
        std::mem::swap(&mut im.consumed, consumed);
        r.map_err(|_: SchemaError| self.failed = true)
    }

    fn relocate(&mut self, first: u32, map: &[u32]) {
        let conv = &mut self.im.converted;
        let mut kept = first as usize;
        for (i, &m) in map.iter().enumerate() {
            if m == u32::MAX {
                continue;
            }
            let old = conv.get(first as usize + i).copied().unwrap_or(NOT_SEEN);
            if let Some(slot) = conv.get_mut(m as usize) {
                *slot = old;
            }
            kept = m as usize + 1;
        }
        conv.truncate(kept);
    }

    fn progress(&mut self, pos: usize) {
        if let Some(release) = self.release.as_mut() {
            release(pos);
        }
    }
}
