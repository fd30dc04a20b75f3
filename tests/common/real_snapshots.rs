//! Where the real PyTorch snapshots are (`../shared/snapshots/real`, with
//! its SOURCES.md and SCHEMA.md): written once, for the integration tests
//! (`tests/common`) and the unit tests (`crate::real_snapshots`, the same
//! file included by path).

use std::path::PathBuf;

/// The folder of real snapshot pickles: beside the crate, or where this
/// workplace keeps it.
pub fn real_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/snapshots/real");
    if dir.exists() {
        dir
    } else {
        PathBuf::from("/work/shared/snapshots/real")
    }
}

/// A file of [`real_dir`].
pub fn real(name: &str) -> PathBuf {
    real_dir().join(name)
}
