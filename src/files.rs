//! Files a user names: read without ever blocking on a pipe or a device,
//! written without ever replacing what was there unless it is a plain file,
//! and told apart by identity, not by how the path is spelled.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// Why a path cannot be read as an input file.
fn not_regular(kind: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file ({kind})"),
    )
}

/// What a path that is not a regular file is: "a directory", "a named
/// pipe", "a device", "a socket".
pub fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a named pipe";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a plain file"
}

/// Open `path` for reading if it is a regular file (following symlinks).
/// A named pipe, a device or a directory is refused before anything is
/// read, and the open itself never waits for a pipe's writer.
pub fn open_regular(path: &Path) -> io::Result<(File, Metadata)> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(not_regular(kind_of(&meta)));
    }
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // The path may have become a pipe since the check; a pipe opened
        // without O_NONBLOCK waits for a writer forever.
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(kind_of(&meta)));
    }
    Ok((file, meta))
}

/// Why [`read_bounded`] read nothing.
#[derive(Debug)]
pub enum BoundedReadError {
    Io(io::Error),
    /// The file holds more than the cap.
    TooLong,
}

/// A regular file's bytes ([`open_regular`]), at most `max` of them: a
/// wrong path (`/dev/zero`, a `/proc` file that reports no size, a model
/// checkpoint) never reads forever or fills memory.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, BoundedReadError> {
    use std::io::Read;
    let mut bytes = Vec::new();
    open_regular(path)
        .and_then(|(f, _)| f.take(max.saturating_add(1)).read_to_end(&mut bytes))
        .map_err(BoundedReadError::Io)?;
    if bytes.len() as u64 > max {
        return Err(BoundedReadError::TooLong);
    }
    Ok(bytes)
}

/// Whether two paths name the same file (device and inode, after every
/// symlink), whatever their spelling: `./a`, `/abs/a` and a link to `a` all do.
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(x), Ok(y)) => identity(&x) == identity(&y),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        }
    }
}

#[cfg(unix)]
fn identity(m: &Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

/// Write `bytes` to `path` so that a failure never leaves half a file:
/// into a temporary file beside it, then renamed over it. Only a regular
/// file (or nothing) at `path` may be replaced: a symlink, a pipe, a device
/// or a directory there is refused and left as it is. The temporary file is
/// removed on every failure.
pub fn write_replacing(path: &Path, bytes: &[u8]) -> io::Result<()> {
    check_replaceable(path)?;
    // A file replaced keeps its permissions: a 0600 file stays 0600.
    let keep = std::fs::symlink_metadata(path)
        .ok()
        .filter(Metadata::is_file)
        .map(|m| m.permissions());
    let tmp = temporary_beside(path);
    let written = write_new(&tmp, bytes, keep).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Whether [`write_replacing`] may write `path`: nothing is there, or a
/// regular file (not through a symlink). Ask before the work that makes
/// the bytes.
pub fn check_replaceable(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a symbolic link: refusing to replace it (name the file it points to)",
        )),
        Ok(meta) if !meta.is_file() => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: refusing to replace it", kind_of(&meta)),
        )),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A name beside `path` that no file has: `path.vramscope-tmp-PID[-N]`.
fn temporary_beside(path: &Path) -> PathBuf {
    let base = format!(
        "{}.vramscope-tmp-{}",
        path.file_name()
            .map_or_else(|| "out".to_string(), |n| n.to_string_lossy().into_owned()),
        std::process::id()
    );
    let dir = path.parent().unwrap_or(Path::new(""));
    let mut candidate = dir.join(&base);
    let mut n = 0;
    while std::fs::symlink_metadata(&candidate).is_ok() {
        n += 1;
        candidate = dir.join(format!("{base}-{n}"));
    }
    candidate
}

/// Create `path` (which must not exist) and write `bytes` to it, with
/// `permissions` when given.
fn write_new(
    path: &Path,
    bytes: &[u8],
    permissions: Option<std::fs::Permissions>,
) -> io::Result<()> {
    use std::io::Write;
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    if let Some(p) = &permissions {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        // Created with the target's mode: never readable by others even
        // for the moment before the permissions below are set.
        options.mode(p.mode() & 0o777);
    }
    let mut f = options.open(path)?;
    if let Some(p) = permissions {
        f.set_permissions(p)?;
    }
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn dir(tag: &str) -> crate::scratch::Scratch {
        crate::scratch::temp_dir(&format!("files-{tag}"))
    }

    fn fifo(path: &Path) {
        let c = std::ffi::CString::new(path.to_str().expect("utf-8")).expect("no nul");
        // SAFETY: a valid NUL-terminated path; mkfifo only creates a node.
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(rc, 0, "mkfifo");
    }

    #[test]
    fn a_pipe_or_a_directory_is_refused_without_waiting() {
        let d = dir("open");
        let pipe = d.join("pipe");
        fifo(&pipe);
        let err = open_regular(&pipe).expect_err("a pipe");
        assert!(err.to_string().contains("a named pipe"), "{err}");
        let err = open_regular(&d).expect_err("a directory");
        assert!(err.to_string().contains("a directory"), "{err}");
        let file = d.join("f");
        std::fs::write(&file, b"x").expect("write");
        assert!(open_regular(&file).is_ok());
    }

    #[test]
    fn a_bounded_read_stops_past_its_cap() {
        let d = dir("bounded");
        let file = d.join("f");
        std::fs::write(&file, b"12345").expect("write");
        assert_eq!(read_bounded(&file, 5).expect("fits"), b"12345");
        assert!(matches!(
            read_bounded(&file, 4),
            Err(BoundedReadError::TooLong)
        ));
        assert!(matches!(
            read_bounded(&d, 4),
            Err(BoundedReadError::Io(e)) if e.kind() == io::ErrorKind::InvalidInput
        ));
    }

    #[test]
    fn a_replaced_file_keeps_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let d = dir("mode");
        let out = d.join("out");
        std::fs::write(&out, b"old").expect("write");
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        write_replacing(&out, b"new").expect("replaced");
        let meta = std::fs::metadata(&out).expect("there");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read(&out).expect("read"), b"new");
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        write_replacing(&out, b"again").expect("replaced");
        let meta = std::fs::metadata(&out).expect("there");
        assert_eq!(meta.permissions().mode() & 0o777, 0o640);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_same_file_however_it_is_spelled() {
        let d = dir("same");
        let file = d.join("f");
        std::fs::write(&file, b"x").expect("write");
        let link = d.join("link");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        let dotted = d.join(".").join("f");
        assert!(same_file(&file, &link));
        assert!(same_file(&file, &dotted));
        let other = d.join("g");
        std::fs::write(&other, b"x").expect("write");
        assert!(!same_file(&file, &other));
        assert!(!same_file(&file, &d.join("missing")));
    }

    #[test]
    fn only_a_plain_file_is_replaced_and_nothing_is_left_behind() {
        let d = dir("write");
        let out = d.join("out");
        write_replacing(&out, b"one").expect("new file");
        write_replacing(&out, b"two").expect("replaced");
        assert_eq!(std::fs::read(&out).expect("read"), b"two");
        let target = d.join("target");
        std::fs::write(&target, b"keep").expect("write");
        let link = d.join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        assert!(write_replacing(&link, b"x").is_err());
        assert!(std::fs::symlink_metadata(&link)
            .expect("still there")
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&target).expect("read"), b"keep");
        let pipe = d.join("pipe");
        fifo(&pipe);
        assert!(write_replacing(&pipe, b"x").is_err());
        assert!(write_replacing(&d, b"x").is_err());
        // A write that fails (no such folder) leaves no temporary file.
        assert!(write_replacing(&d.join("missing").join("out"), b"x").is_err());
        let left: Vec<_> = std::fs::read_dir(&d)
            .expect("read dir")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("vramscope-tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
