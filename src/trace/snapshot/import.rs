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
mod values;

use records::Importer;

/// Marks a container not converted yet in `Importer::converted`.
const NOT_SEEN: u32 = u32::MAX;

/// A small segment is exactly 2 MiB (SCHEMA.md §3); used only when
/// `segment_type` is missing.
const SMALL_SEGMENT: u64 = 2 << 20;

/// Input bytes released to the kernel at a time by [`import_file`].
const RELEASE_STEP: usize = 32 << 20;

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
        import_bytes(&[])
    } else {
        import_mapped(&file, progress).map_err(io).and_then(|(result, cut)| {
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

/// Import a mapped file: the result, and whether the file was cut short
/// under the map (read as zeros past its new end instead of a SIGBUS).
#[cfg(unix)]
fn import_mapped(
    file: &std::fs::File,
    progress: &mut dyn FnMut(u64),
) -> std::io::Result<(Result<Snapshot, SnapshotError>, bool)> {
    let Some(map) = super::guarded_map::GuardedMap::map(file)? else {
        // No guard to be had: read it (a truncation then just ends the bytes).
        use std::io::Read;
        let mut bytes = Vec::new();
        (&*file).read_to_end(&mut bytes)?;
        return Ok((import_bytes(&bytes), false));
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
    let result = import_streaming(&map, Some(&mut release));
    Ok((result, map.cut_short()))
}

/// Elsewhere the file is read whole.
#[cfg(not(unix))]
fn import_mapped(
    file: &std::fs::File,
    progress: &mut dyn FnMut(u64),
) -> std::io::Result<(Result<Snapshot, SnapshotError>, bool)> {
    use std::io::Read;
    let mut bytes = Vec::new();
    (&*file).read_to_end(&mut bytes)?;
    progress(bytes.len() as u64);
    Ok((import_bytes(&bytes), false))
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
    let inner = super::container::pickle_bytes(bytes)?;
    // Page-release offsets count from the file's start: only for a bare pickle.
    let release = if inner.len() == bytes.len() {
        release
    } else {
        None
    };
    let bytes = inner;
    match try_streaming(bytes, release)? {
        Some(snap) => Ok(snap),
        None => {
            let doc = pickle::decode(bytes)?;
            let budget = records::record_budget(bytes.len());
            Ok(Importer::new(doc.container_count(), false, budget).run(&doc)?)
        }
    }
}

/// The streaming import alone: `None` when it gave up (see the module doc).
pub(super) fn try_streaming(
    bytes: &[u8],
    release: Option<&mut dyn FnMut(usize)>,
) -> Result<Option<Snapshot>, SnapshotError> {
    let mut stream = Stream {
        im: Importer::new(0, true, records::record_budget(bytes.len())),
        keys: [None; Key::COUNT],
        keys_at: usize::MAX,
        claims: FxHashMap::default(),
        failed: false,
        release,
    };
    match pickle::decode_with(bytes, &mut stream) {
        Ok(doc) => {
            let Stream { mut im, claims, .. } = stream;
            im.track = false;
            im.claims = claims;
            Ok(Some(im.run(&doc)?))
        }
        Err(PickleError {
            kind: PickleErrorKind::Stopped | PickleErrorKind::Consumed { .. },
            ..
        }) => Ok(None),
        Err(e) => Err(e.into()),
    }
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
struct Stream<'r> {
    im: Importer,
    keys: KeyTable,
    /// `doc.string_count()` when `keys` were looked up.
    keys_at: usize,
    claims: FxHashMap<u32, Claimed>,
    failed: bool,
    release: Option<&'r mut dyn FnMut(usize)>,
}

impl Stream<'_> {
    fn fields<'d>(&mut self, doc: &'d Document) -> Fields<'d> {
        if self.keys_at != doc.string_count() {
            self.keys = key_table(doc);
            self.keys_at = doc.string_count();
        }
        Fields::with_keys(doc, self.keys)
    }
}

impl Sink for Stream<'_> {
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
        let im = &mut self.im;
        std::mem::swap(&mut im.consumed, consumed);
        im.consumed.clear();
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
