//! Scratch directories for tests, removed when dropped: a test run leaves
//! nothing behind. Written once, for the integration tests (`tests/common`)
//! and the unit tests (`crate::scratch`, the same file included by path).

use std::path::{Path, PathBuf};

/// A fresh directory under the system's temp dir for one test's files.
pub fn temp_dir(tag: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("vramscope-tests-{tag}-{}", std::process::id()));
    // A run killed before its drop, whose process had this id, left files here.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    Scratch(dir)
}

/// A test's scratch directory (see [`temp_dir`]), removed with everything in
/// it when dropped; derefs to its path.
#[derive(Debug)]
pub struct Scratch(PathBuf);

#[allow(dead_code)] // the unit tests use temp_dir only
impl Scratch {
    /// [`temp_dir`] under another name.
    pub fn new(tag: &str) -> Scratch {
        temp_dir(tag)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
