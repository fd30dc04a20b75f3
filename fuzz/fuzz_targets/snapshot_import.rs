//! A snapshot file through what a user runs on it: the import, the report,
//! the verify replay, the UI's mirror of the trace, and the export.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope::report::snapshot::SnapshotReport;
use vramscope::trace::mirror::trace_events;
use vramscope::trace::replay::from_snapshot;
use vramscope::trace::snapshot::{export_bytes, import_bytes};
use vramscope::trace::Timeline;

fuzz_target!(|data: &[u8]| {
    let Ok(snap) = import_bytes(data) else {
        return;
    };
    let _ = SnapshotReport::new("fuzz.pickle", &snap).to_text();
    let config = from_snapshot::config(&snap);
    for device in from_snapshot::traced_devices(&snap) {
        let entries = from_snapshot::entries(&snap, device);
        let mut timeline = Timeline::new();
        timeline.extend(trace_events(&entries, |_| None, &config));
    }
    let _ = from_snapshot::verify(&snap);
    assert!(import_bytes(&export_bytes(&snap)).is_ok());
});
