//! Placeholder replaced by the snapshot importer.
