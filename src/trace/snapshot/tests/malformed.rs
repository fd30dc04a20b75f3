//! Malformed and non-snapshot input: errors, never panics.

use super::*;

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn malformed_files_are_errors() {
    let (_, bytes) = &real_files()[0];
    for cut in [0, 1, 2, 10, 100, bytes.len() / 2, bytes.len() - 1] {
        assert!(matches!(
            import_bytes(&bytes[..cut]),
            Err(SnapshotError::Pickle(_))
        ));
    }
    let md = std::fs::read(real_dir().join("SCHEMA.md")).expect("SCHEMA.md");
    assert!(matches!(import_bytes(&md), Err(SnapshotError::Pickle(_))));
    let missing = real_dir().join("no-such-file.pickle");
    let err = import_file(&missing)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("no-such-file.pickle"), "{err}");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Damaged files either import or fail with an error; never a panic
    /// (debug builds also check for arithmetic overflow here).
    #[test]
    #[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
    fn damaged_snapshots_never_panic(
        file in 0usize..12,
        cut in proptest::prelude::any::<proptest::sample::Index>(),
        flips in proptest::collection::vec(
            (proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>()),
            0..6,
        ),
    ) {
        let files = real_files();
        let (_, bytes) = &files[file % files.len()];
        let mut b = bytes.clone();
        for (at, val) in flips {
            let i = at.index(b.len());
            b[i] = val;
        }
        let _ = import_bytes(&b);
        let _ = import_bytes(&b[..cut.index(b.len())]);
    }
}

fn schema_err(bytes: Vec<u8>) -> String {
    match import_bytes(&bytes) {
        Err(SnapshotError::Schema(e)) => e.to_string(),
        other => panic!("expected a schema error, got {other:?}"),
    }
}

#[test]
fn valid_pickles_that_are_not_snapshots() {
    let mut w = PickleWriter::new();
    w.int(7);
    assert_eq!(
        schema_err(w.finish()),
        "<root>: expected a dict or a list of segments, got int"
    );

    let mut w = PickleWriter::new();
    w.empty_dict();
    assert_eq!(schema_err(w.finish()), "<root>: missing key \"segments\"");

    // segments[0].blocks[0].size is a str.
    let mut w = PickleWriter::new();
    w.empty_dict();
    w.mark();
    w.str("segments");
    w.list(&[()], |w, _| {
        w.empty_dict();
        w.mark();
        for (k, v) in [("address", 4096), ("total_size", 512)] {
            w.str(k);
            w.int(v);
        }
        w.str("blocks");
        w.list(&[()], |w, _| {
            w.empty_dict();
            w.mark();
            w.str("size");
            w.str("512");
            w.str("state");
            w.str("inactive");
            w.setitems();
        });
        w.setitems();
    });
    w.setitems();
    assert_eq!(
        schema_err(w.finish()),
        "segments[0].blocks[0].size: expected int, got str"
    );
}

/// Builds `{"segments": [], "device_traces": [[entry]]}` for one entry dict.
fn one_entry(entry: &[(&str, Option<i64>, Option<&str>)]) -> Vec<u8> {
    let mut w = PickleWriter::new();
    w.empty_dict();
    w.mark();
    w.str("segments");
    w.empty_list();
    w.str("device_traces");
    w.list(&[()], |w, _| {
        w.list(&[()], |w, _| {
            w.empty_dict();
            w.mark();
            for &(k, i, s) in entry {
                w.str(k);
                match (i, s) {
                    (Some(i), _) => w.int(i),
                    (None, Some(s)) => w.str(s),
                    (None, None) => w.none(),
                }
            }
            w.setitems();
        });
    });
    w.setitems();
    w.finish()
}

#[test]
fn unknown_actions_and_minimal_entries() {
    let s = import_bytes(&one_entry(&[
        ("action", None, Some("teleport")),
        ("addr", Some(1), None),
        ("size", Some(2), None),
    ]))
    .expect("imports");
    let e = &s.device_traces[0][0];
    assert_eq!(e.action, Action::Other);
    assert_eq!(s.action_name(e), "teleport");
    assert_eq!((e.addr, e.size, e.stream, e.time_us()), (1, 2, 0, None));

    let err = schema_err(one_entry(&[
        ("action", None, Some("alloc")),
        ("size", Some(2), None),
    ]));
    assert_eq!(err, "device_traces[0][0]: missing key \"addr\"");
    let err = schema_err(one_entry(&[
        ("action", None, Some("alloc")),
        ("addr", Some(-5), None),
        ("size", Some(2), None),
    ]));
    assert_eq!(
        err,
        "device_traces[0][0].addr: expected a non-negative int below 2^63, got -5 (read as an \
         unsigned 64-bit number: 18446744073709551611)"
    );
    let err = schema_err(one_entry(&[
        ("action", None, Some("alloc")),
        ("addr", Some(5), None),
        ("size", None, None),
    ]));
    assert_eq!(err, "device_traces[0][0].size: expected int, got None");
}

/// A Python value to write as a pickle.
enum Py {
    Int(i64),
    Str(&'static str),
    None,
    List(Vec<Py>),
    Dict(Vec<(&'static str, Py)>),
}

fn write_py(w: &mut PickleWriter, v: &Py) {
    match v {
        Py::Int(i) => w.int(*i),
        Py::Str(s) => w.str(s),
        Py::None => w.none(),
        Py::List(items) => {
            w.list(items, write_py);
        }
        Py::Dict(pairs) => {
            w.empty_dict();
            w.mark();
            for (k, x) in pairs {
                w.str(k);
                write_py(w, x);
            }
            w.setitems();
        }
    }
}

fn py_bytes(v: &Py) -> Vec<u8> {
    let mut w = PickleWriter::new();
    write_py(&mut w, v);
    w.finish()
}

fn alloc_entry(extra: Vec<(&'static str, Py)>) -> Py {
    let mut pairs = vec![
        ("action", Py::Str("alloc")),
        ("addr", Py::Int(4096)),
        ("size", Py::Int(512)),
    ];
    pairs.extend(extra);
    Py::Dict(pairs)
}

#[test]
fn optional_fields_written_as_none_read_as_absent() {
    let snap = Py::Dict(vec![
        (
            "segments",
            Py::List(vec![Py::Dict(vec![
                ("address", Py::Int(4096)),
                ("total_size", Py::Int(2 << 20)),
                ("stream", Py::None),
                ("frames", Py::None),
                ("is_expandable", Py::None),
                (
                    "blocks",
                    Py::List(vec![Py::Dict(vec![
                        ("size", Py::Int(2 << 20)),
                        ("state", Py::Str("inactive")),
                        ("frames", Py::None),
                        ("requested_size", Py::None),
                    ])]),
                ),
            ])]),
        ),
        (
            "device_traces",
            Py::List(vec![Py::List(vec![alloc_entry(vec![
                ("time_us", Py::None),
                ("stream", Py::None),
                ("frames", Py::None),
                ("user_metadata", Py::None),
                ("compile_context", Py::None),
            ])])]),
        ),
        ("allocator_settings", Py::None),
        ("external_annotations", Py::None),
    ]);
    let s = import_bytes(&py_bytes(&snap)).expect("imports");
    let e = &s.device_traces[0][0];
    assert_eq!(
        (e.addr, e.size, e.stream, e.time_us()),
        (4096, 512, 0, None)
    );
    assert!(s.frames.stack(e.frames).is_empty());
    assert_eq!(s.segments[0].blocks[0].address, 4096);
    assert!(s.allocator_settings.is_none());
    assert!(s.external_annotations.is_empty());
}

#[test]
fn partial_frames_and_annotations_are_kept_as_far_as_they_go() {
    let snap = Py::Dict(vec![
        ("segments", Py::List(vec![])),
        (
            "device_traces",
            Py::List(vec![Py::List(vec![alloc_entry(vec![(
                "frames",
                Py::List(vec![
                    Py::Dict(vec![("name", Py::Str("forward"))]),
                    Py::Dict(vec![
                        ("filename", Py::Str("train.py")),
                        ("line", Py::Int(7)),
                    ]),
                ]),
            )])])]),
        ),
        (
            "external_annotations",
            Py::List(vec![
                Py::Dict(vec![("name", Py::Str("no stage")), ("device", Py::Int(0))]),
                Py::Dict(vec![
                    ("stage", Py::Str("START")),
                    ("name", Py::Str("Optimizer.step#AdamW.step")),
                    ("device", Py::Int(0)),
                    ("time_us", Py::Int(5)),
                ]),
            ]),
        ),
    ]);
    let s = import_bytes(&py_bytes(&snap)).expect("imports");
    let stack: Vec<(String, i64, String)> = s
        .frames
        .stack(s.device_traces[0][0].frames)
        .iter()
        .map(|&id| {
            let f = s.frames.frame(id).expect("interned");
            (f.filename.to_string(), f.line, f.name.to_string())
        })
        .collect();
    assert_eq!(
        stack,
        [
            ("??".to_string(), 0, "forward".to_string()),
            ("train.py".to_string(), 7, "??".to_string())
        ]
    );
    let names: Vec<&str> = s.external_annotations.iter().map(|a| &*a.name).collect();
    assert_eq!(names, ["Optimizer.step#AdamW.step"]);
}
