//! The streaming import and the synthetic generator.

use super::*;

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn streaming_import_matches_the_plain_one_on_every_real_file() {
    for (name, bytes) in real_files() {
        let plain = super::import_document(&crate::trace::pickle::decode(bytes).expect("decodes"))
            .expect("imports");
        let streamed = super::import::try_streaming(bytes, None, None)
            .map(super::import::Streamed::whole)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .unwrap_or_else(|| panic!("{name}: streaming gave up"));
        assert!(streamed == plain, "{name}: streamed import differs");
    }
}

#[test]
fn streaming_gives_up_on_a_reused_entry_dict() {
    // A valid pickle that refers back to a trace entry through the memo
    // after its batch: the streaming path drops the dict and must hand over
    // to the plain path, which reads it fine.
    let mut w = crate::trace::pickle::PickleWriter::new();
    w.empty_dict();
    w.memoize();
    w.mark();
    w.str("segments");
    w.empty_list();
    w.memoize();
    w.str("device_traces");
    w.empty_list();
    w.memoize();
    w.mark();
    w.empty_list();
    w.memoize();
    w.mark();
    w.empty_dict();
    let entry = w.memoize();
    w.mark();
    for (k, v) in [("addr", 1), ("size", 2)] {
        w.str(k);
        w.int(v);
    }
    w.str("action");
    w.str("alloc");
    w.setitems();
    w.appends();
    w.empty_list();
    w.memoize();
    w.mark();
    w.get(entry);
    w.appends();
    w.appends();
    w.setitems();
    let bytes = w.finish();
    assert!(super::import::try_streaming(&bytes, None, None)
        .map(super::import::Streamed::whole)
        .expect("decodes")
        .is_none());
    let s = import_bytes(&bytes).expect("imports");
    assert_eq!(trace_lens(&s), [1, 1]);
    assert_eq!(s.device_traces[1][0], s.device_traces[0][0]);
}

#[test]
fn synthetic_snapshot_imports_streamed_and_replays_exactly() {
    let mut bytes = Vec::new();
    let stats = super::synthetic_snapshot(&mut bytes, 3 << 20, 7).expect("writes");
    assert_eq!(stats.bytes, bytes.len() as u64);
    assert!(stats.bytes >= (3u64 << 20) * 9 / 10, "{stats:?}");
    let mut again = Vec::new();
    super::synthetic_snapshot(&mut again, 3 << 20, 7).expect("writes");
    assert!(again == bytes, "same seed, same bytes");

    let s = super::import::try_streaming(&bytes, None, None)
        .map(super::import::Streamed::whole)
        .expect("imports")
        .expect("streams");
    let plain = super::import_document(&crate::trace::pickle::decode(&bytes).expect("decodes"))
        .expect("imports");
    assert!(s == plain);
    assert_eq!(s.layout, Layout::CurrentDict);
    assert_eq!(trace_lens(&s), [stats.entries as usize]);
    assert_eq!(s.segments.len() as u64, stats.segments);
    assert!(stats.entries > 10_000, "{stats:?}");
    let a = actions(&s);
    assert_eq!(a["alloc"] as u64, stats.allocs);
    assert_eq!(a["free_requested"], a["free_completed"]);
    assert!(a["segment_alloc"] > 0);
    for e in &s.device_traces[0] {
        assert_eq!(s.extra(e).compile_context.as_deref(), Some("N/A"));
    }
    let t: Vec<i64> = s.device_traces[0]
        .iter()
        .filter_map(|e| e.time_us())
        .collect();
    assert_eq!(t.len(), s.device_traces[0].len());
    assert!(t.windows(2).all(|w| w[0] < w[1]));
    // Alloc and its frees share one frames list, hence one id; stacks are
    // drawn from the pool.
    assert!(s.frames.stack_count() as u64 <= stats.stacks + 1);

    let replays = crate::trace::replay::from_snapshot::verify(&s);
    assert_eq!(replays.len(), 1);
    let o = &replays[0].outcome;
    assert_eq!(o.replayable_from, 0, "a closed trace");
    assert!(o.all_matched(), "{:?}", o.differences);
    assert_eq!(o.allocs as u64, stats.allocs);
    assert_eq!(o.final_state_match, Some(true));
}

/// A dict snapshot with no segments and one device trace: one entry per
/// `(action, frame name, frame filename, frame line)`, at `time_us` 1, 2, …
fn one_device_trace(entries: &[(&str, &str, &str, i64)]) -> Vec<u8> {
    let mut w = crate::trace::pickle::PickleWriter::new();
    w.empty_dict();
    w.mark();
    w.str("segments");
    w.empty_list();
    w.str("device_traces");
    w.empty_list();
    w.mark();
    w.empty_list();
    w.mark();
    for (i, (action, name, filename, line)) in entries.iter().enumerate() {
        w.empty_dict();
        w.mark();
        for (k, v) in [
            ("addr", 0),
            ("size", 0),
            ("stream", 0),
            ("time_us", i as i64 + 1),
        ] {
            w.str(k);
            w.int(v);
        }
        w.str("action");
        w.str(action);
        w.str("frames");
        w.empty_list();
        w.mark();
        w.empty_dict();
        w.mark();
        w.str("name");
        w.str(name);
        w.str("filename");
        w.str(filename);
        w.str("line");
        w.int(*line);
        w.setitems();
        w.appends();
        w.setitems();
    }
    w.appends();
    w.appends();
    w.setitems();
    w.finish()
}

#[test]
fn a_frame_line_pickled_as_uint64_minus_one_imports_as_minus_one() {
    // pytorch/pytorch#115234: 2.1+ stores a frame's unknown line (-1) in a
    // uint64 and pickles 2^64 - 1, a 9-byte LONG1. It must not fail the file.
    const SENTINEL: i64 = 0x7ead_beef;
    let mut bytes = one_device_trace(&[("alloc", "<module>", "train.py", SENTINEL)]);
    let mut binint = vec![b'J'];
    binint.extend_from_slice(&(SENTINEL as i32).to_le_bytes());
    let at = bytes
        .windows(binint.len())
        .position(|win| win == binint.as_slice())
        .expect("the sentinel is written as BININT");
    let mut long1 = vec![0x8a, 9];
    long1.extend_from_slice(&[0xff; 8]);
    long1.push(0x00);
    bytes.splice(at..at + binint.len(), long1);

    let s = import_bytes(&bytes).expect("imports");
    let entry = &s.device_traces[0][0];
    let frame = s.frames.stack(entry.frames)[0];
    assert_eq!(s.frames.frame(frame).expect("frame").line, -1);
}

#[test]
fn torch_2_4_user_defined_entries_become_annotations() {
    // 2.4's `_initRecordAnnotations`: a record_function region is a trace
    // entry `user_defined` with the frame {name: START|END, filename: region}.
    let region = "Optimizer.step#AdamW.step";
    let bytes = one_device_trace(&[
        ("user_defined", "START", region, 0),
        ("alloc", "step", "train.py", 7),
        ("user_defined", "END", region, 0),
    ]);
    let s = import_bytes(&bytes).expect("imports");
    let got: Vec<(&str, &str, i64, i64)> = s
        .external_annotations
        .iter()
        .map(|a| (&*a.stage, &*a.name, a.device, a.time_us))
        .collect();
    assert_eq!(got, [("START", region, 0, 1), ("END", region, 0, 3)]);
    assert_eq!(s.device_traces[0].len(), 3, "the entries stay in the trace");
}
