//! The traced program's start: a private folder (0700) holding the helper
//! package (and the live helper's holder walk beside it),
//! a `sitecustomize.py` that loads it, and the socket vramscope listens on;
//! the program started with that folder first on `PYTHONPATH`. The folder is
//! removed when the [`Launch`] is dropped.

use std::io::Read;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use super::error::TraceError;

/// The helper the program runs under: the package python/vramscope_trace/,
/// carried in the binary so `vramscope trace` works wherever it is
/// installed. Written as this folder in the private one.
pub const HELPER_PACKAGE: &str = "vramscope_trace";

/// Each of the helper's modules, as (file name, text), from
/// python/vramscope_trace/ (a test fails on a module left out).
macro_rules! helper_modules {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../python/vramscope_trace/", $name)))),*]
    };
}
pub const HELPER_MODULES: &[(&str, &str)] = helper_modules![
    "__init__.py",
    "_activate.py",
    "_allocations.py",
    "_autocast.py",
    "_boot.py",
    "_channel.py",
    "_cuda.py",
    "_cuda_paths.py",
    "_dispatch.py",
    "_known.py",
    "_meta_kernels.py",
    "_own_meta.py",
    "_patches.py",
    "_relabel.py",
    "_reports.py",
    "_session.py",
    "_stack_walk.py",
    "_steps.py",
];
/// The holder walk the helper runs at step boundaries and OOMs: the live
/// helper's own file (python/vramscope_live/holders.py), one copy for both,
/// written beside the helper's package under the name it looks for.
pub const HOLDERS_SOURCE: &str = include_str!("../../python/vramscope_live/holders.py");
pub const HOLDERS_FILE: &str = "vramscope_trace_holders.py";
const SITECUSTOMIZE: &str = "import vramscope_trace\nvramscope_trace._boot()\n";
/// What the helper reads (python/vramscope_trace/_boot.py).
pub const ENV_SOCKET: &str = "VRAMSCOPE_TRACE_SOCKET";
pub const ENV_BOOT: &str = "VRAMSCOPE_TRACE_BOOT";
/// What the program printed, kept for after the terminal UI (the last bytes).
const CAPTURE_KEEP: usize = 64 << 10;

/// Where the program's own output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildOutput {
    /// Its stdout and stderr are ours.
    Inherit,
    /// Both to our stderr (our stdout carries the report).
    ToStderr,
    /// Kept (the terminal UI owns the screen); the last 64 KiB are shown after.
    Capture,
}

pub struct Launch {
    dir: PathBuf,
    pub listener: UnixListener,
    pub child: Arc<Mutex<Child>>,
    pub pid: u32,
    pub captured: Arc<Mutex<Vec<u8>>>,
}

impl Drop for Launch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The folders a trace left when its vramscope was killed by a signal
/// (its drop never ran): those whose process is gone go now.
fn remove_orphans(temp: &Path) {
    let Ok(entries) = std::fs::read_dir(temp) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("vramscope-trace-"))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        if pid > 0 && !process_alive(pid) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Whether process `pid` exists (a signal 0 reaches it, or it is another
/// user's).
fn process_alive(pid: libc::pid_t) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only checks the pid.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Make `dir` (0700), or say which folder could not be made.
fn make_dir(dir: &Path) -> Result<(), TraceError> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|source| TraceError::Folder {
            path: dir.to_path_buf(),
            source,
        })
}

fn private_dir() -> Result<PathBuf, TraceError> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    remove_orphans(&std::env::temp_dir());
    let dir = std::env::temp_dir().join(format!("vramscope-trace-{}-{nanos}", std::process::id()));
    make_dir(&dir)?;
    Ok(dir)
}

fn write(dir: &Path, name: &str, text: &str) -> Result<(), TraceError> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|source| TraceError::Folder { path, source })
}

/// The helper's package, its holder walk beside it, and the
/// `sitecustomize.py` that loads it, written into `dir`.
fn write_helper(dir: &Path) -> Result<(), TraceError> {
    let package = dir.join(HELPER_PACKAGE);
    make_dir(&package)?;
    for (name, text) in HELPER_MODULES {
        write(&package, name, text)?;
    }
    write(dir, HOLDERS_FILE, HOLDERS_SOURCE)?;
    write(dir, "sitecustomize.py", SITECUSTOMIZE)
}

impl Launch {
    /// Start `command` (the program and its arguments) traced.
    pub fn spawn(command: &[String], output: ChildOutput) -> Result<Launch, TraceError> {
        let (program, args) = command.split_first().ok_or(TraceError::NoCommand)?;
        let dir = private_dir()?;
        // From here the folder goes with `Launch`'s drop, or by hand on error.
        let cleanup = |e: TraceError, dir: &Path| {
            let _ = std::fs::remove_dir_all(dir);
            e
        };
        write_helper(&dir).map_err(|e| cleanup(e, &dir))?;
        let socket = dir.join("trace.sock");
        let listener = UnixListener::bind(&socket).map_err(|source| {
            cleanup(
                TraceError::Folder {
                    path: socket.clone(),
                    source,
                },
                &dir,
            )
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| cleanup(TraceError::Channel(e.to_string()), &dir))?;
        let pythonpath = match std::env::var_os("PYTHONPATH") {
            Some(p) if !p.is_empty() => {
                let mut v = dir.clone().into_os_string();
                v.push(":");
                v.push(p);
                v
            }
            _ => dir.clone().into_os_string(),
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("PYTHONPATH", pythonpath)
            .env(ENV_SOCKET, &socket)
            .env(ENV_BOOT, &dir)
            // The program runs on the simulated GPU only: a real one here
            // is never touched.
            .env("CUDA_VISIBLE_DEVICES", "")
            .stdin(Stdio::null());
        match output {
            ChildOutput::Inherit => {}
            ChildOutput::ToStderr => {
                cmd.stdout(Stdio::from(std::io::stderr()));
            }
            ChildOutput::Capture => {
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
        }
        let mut child = cmd.spawn().map_err(|source| {
            cleanup(
                TraceError::Spawn {
                    program: program.clone(),
                    source,
                },
                &dir,
            )
        })?;
        let captured = Arc::new(Mutex::new(Vec::new()));
        for pipe in [
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            keep_tail(pipe, captured.clone());
        }
        let pid = child.id();
        Ok(Launch {
            dir,
            listener,
            child: Arc::new(Mutex::new(child)),
            pid,
            captured,
        })
    }

    /// Stop the program (the view was closed before it ended).
    pub fn kill(&self) {
        if let Ok(mut c) = self.child.lock() {
            let _ = c.kill();
        }
    }
}

/// Read `pipe` to its end, keeping the last [`CAPTURE_KEEP`] bytes.
fn keep_tail(mut pipe: Box<dyn Read + Send>, into: Arc<Mutex<Vec<u8>>>) {
    let _ = std::thread::Builder::new()
        .name("traced output".into())
        .spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut v) = into.lock() {
                    v.extend_from_slice(&buf[..n]);
                    if v.len() > CAPTURE_KEEP {
                        let cut = v.len() - CAPTURE_KEEP;
                        v.drain(..cut);
                    }
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_whose_vramscope_is_gone_is_removed_and_a_living_ones_kept() {
        let temp = crate::scratch::temp_dir("trace-orphans");
        // No Linux pid reaches 2^31 - 1 (pid_max is at most 2^22).
        let gone = temp.join(format!("vramscope-trace-{}-1", libc::pid_t::MAX));
        let mine = temp.join(format!("vramscope-trace-{}-2", std::process::id()));
        let other = temp.join("not-ours-123-4");
        for d in [&gone, &mine, &other] {
            std::fs::create_dir(d).expect("a folder");
        }
        remove_orphans(&temp);
        assert!(!gone.exists(), "its process is gone");
        assert!(mine.exists(), "this process lives");
        assert!(other.exists(), "not a trace's");
    }

    /// Every module of python/vramscope_trace/ is carried (a new module
    /// left out of `HELPER_MODULES` would be missing where the program runs).
    #[test]
    fn every_module_of_the_helper_package_is_carried() {
        let folder = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("python")
            .join(HELPER_PACKAGE);
        let mut present: Vec<String> = std::fs::read_dir(&folder)
            .expect("the helper's folder")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".py"))
            .collect();
        present.sort();
        let mut carried: Vec<String> = HELPER_MODULES.iter().map(|(n, _)| n.to_string()).collect();
        carried.sort();
        assert_eq!(
            present, carried,
            "python/{HELPER_PACKAGE}/'s modules and HELPER_MODULES"
        );
        assert!(carried.contains(&"__init__.py".to_string()));
    }

    /// The folder a trace writes: the package's modules under
    /// `vramscope_trace/` with their text, the holder walk and
    /// `sitecustomize.py` beside it.
    #[test]
    fn the_helper_is_written_as_a_package_beside_its_holder_walk() {
        let temp = crate::scratch::temp_dir("trace-helper");
        write_helper(&temp).expect("written");
        for (name, text) in HELPER_MODULES {
            let got =
                std::fs::read_to_string(temp.join(HELPER_PACKAGE).join(name)).expect("a module");
            assert_eq!(&got, text, "{name}");
        }
        assert!(temp.join(HOLDERS_FILE).is_file());
        let site = std::fs::read_to_string(temp.join("sitecustomize.py")).expect("sitecustomize");
        assert!(site.contains(&format!("import {HELPER_PACKAGE}")), "{site}");
    }
}
