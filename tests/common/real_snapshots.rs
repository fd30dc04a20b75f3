//! Where the real PyTorch snapshots are: `../shared/snapshots/real` beside the
//! crate (with its SOURCES.md and SCHEMA.md). They are other people's files and
//! stay outside the repository, so every test that reads them is
//! `#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]`:
//! `cargo test -- --ignored` runs them where the corpus is (CI does). Written
//! once, for the integration tests (`tests/common`) and the unit tests
//! (`crate::real_snapshots`, the same file included by path).

use std::path::PathBuf;

/// The folder of real snapshot pickles. A test that reaches here without it
/// fails with a message that says where the corpus belongs.
pub fn real_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/snapshots/real");
    assert!(
        dir.is_dir(),
        "this test needs the real-snapshot corpus at {} (it is not part of the repository); \
         it is ignored by default: run it with `cargo test -- --ignored` where the corpus is",
        dir.display()
    );
    dir
}

/// A file of [`real_dir`].
pub fn real(name: &str) -> PathBuf {
    real_dir().join(name)
}
