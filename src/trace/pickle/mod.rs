//! Placeholder replaced by the pickle reader.
