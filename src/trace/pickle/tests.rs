//! Reader tests: hand-written opcode streams, malformed input, the real
//! snapshot files, and a fuzz-style proptest.

use proptest::prelude::*;

use super::{decode, Document, PickleErrorKind as K, Value, ValueRef};

pub(crate) use crate::real_snapshots::real_dir;

/// Every `*.pickle` in [`real_dir`], sorted by name, with its bytes; read
/// once per test process.
pub(crate) fn real_files() -> &'static [(String, Vec<u8>)] {
    static FILES: std::sync::OnceLock<Vec<(String, Vec<u8>)>> = std::sync::OnceLock::new();
    FILES.get_or_init(read_real_files)
}

fn read_real_files() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let dir = real_dir();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "pickle") {
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((name, bytes));
        }
    }
    out.sort();
    out
}

/// A compact rendering for assertions: Python-like repr.
fn repr(doc: &Document, v: Value) -> String {
    match doc.get(v) {
        ValueRef::None => "None".into(),
        ValueRef::Bool(b) => if b { "True" } else { "False" }.into(),
        ValueRef::Int(i) => i.to_string(),
        ValueRef::Float(f) => format!("{f:?}"),
        ValueRef::Str(s) => format!("{:?}", &**s),
        ValueRef::Bytes(b) => format!("b{:?}", String::from_utf8_lossy(b)),
        ValueRef::List(id) => {
            let items: Vec<_> = doc.items(id).iter().map(|&x| repr(doc, x)).collect();
            format!("[{}]", items.join(", "))
        }
        ValueRef::Tuple(id) => {
            let items: Vec<_> = doc.items(id).iter().map(|&x| repr(doc, x)).collect();
            format!("({})", items.join(", "))
        }
        ValueRef::Set(id) | ValueRef::FrozenSet(id) => {
            let items: Vec<_> = doc.items(id).iter().map(|&x| repr(doc, x)).collect();
            format!("{{{}}}", items.join(", "))
        }
        ValueRef::Dict(id) => {
            let items: Vec<_> = doc
                .pairs(id)
                .map(|(k, x)| format!("{}: {}", repr(doc, k), repr(doc, x)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

fn decode_repr(bytes: &[u8]) -> String {
    let doc = decode(bytes).unwrap_or_else(|e| panic!("{e}"));
    repr(&doc, doc.root())
}

#[test]
fn protocol_4_dict_with_memo() {
    // pickle.dumps({"a": [1, "x", "x"], "b": (True, None)}, protocol=4),
    // without FRAME.
    let p =
        b"\x80\x04}\x94(\x8c\x01a\x94]\x94(K\x01\x8c\x01x\x94h\x03e\x8c\x01b\x94\x88N\x86\x94u.";
    assert_eq!(decode_repr(p), r#"{"a": [1, "x", "x"], "b": (True, None)}"#);
}

#[test]
fn shared_containers_are_one_object() {
    // l = [1]; pickle.dumps([l, l], 4)
    let p = b"\x80\x04]\x94(]\x94K\x01ah\x01e.";
    let doc = decode(p).expect("decodes");
    let ValueRef::List(outer) = doc.get(doc.root()) else {
        panic!("list");
    };
    let items = doc.items(outer);
    assert_eq!(items.len(), 2);
    assert_eq!(items[0], items[1]);
    assert_eq!(repr(&doc, doc.root()), "[[1], [1]]");
}

#[test]
fn integers_in_every_encoding() {
    // BININT1, BININT2, BININT, LONG1 (5 and 8 bytes), LONG4, INT, LONG.
    let mut p = b"\x80\x02(K\x07M\x00\x01J\xff\xff\xff\xff".to_vec();
    p.extend_from_slice(b"\x8a\x05\x00\x00\x00\x00\x01");
    p.extend_from_slice(b"\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80");
    p.extend_from_slice(b"\x8b\x03\x00\x00\x00\x00\x80\x00");
    p.extend_from_slice(b"I-5\nL12L\nI01\nl.");
    assert_eq!(
        decode_repr(&p),
        format!(
            "[7, 256, -1, {}, {}, 32768, -5, 12, True]",
            1u64 << 32,
            i64::MIN
        )
    );
}

#[test]
fn floats_strings_bytes_sets() {
    let mut p = b"\x80\x04(G?\xf8\x00\x00\x00\x00\x00\x00F2.5\n".to_vec();
    p.extend_from_slice(b"X\x03\x00\x00\x00h\xc3\xa9"); // BINUNICODE "hé"
    p.extend_from_slice(b"\x8d\x01\x00\x00\x00\x00\x00\x00\x00z"); // BINUNICODE8
    p.extend_from_slice(b"Vab\\u00e9\n"); // UNICODE
    p.extend_from_slice(b"S'q\\n'\n"); // STRING
    p.extend_from_slice(b"T\x01\x00\x00\x00sU\x01t"); // BINSTRING, SHORT_BINSTRING
    p.extend_from_slice(b"C\x01\x00B\x01\x00\x00\x00\x01\x8e\x00\x00\x00\x00\x00\x00\x00\x00");
    p.extend_from_slice(b"\x8f(K\x01K\x02\x90(K\x03\x91)\x85"); // set, frozenset, (())
    p.extend_from_slice(b"t.");
    assert_eq!(
        decode_repr(&p),
        r#"(1.5, 2.5, "hé", "z", "abé", "q\n", "s", "t", b"\0", b"\u{1}", b"", {1, 2}, {3}, (()))"#
    );
}

#[test]
fn dict_list_setitem_append_dup_pop_put_get() {
    // Protocol 0/1 style: MARK ... DICT, LIST, SETITEM, APPEND, PUT/GET,
    // BINPUT/BINGET, LONG_BINPUT/LONG_BINGET, DUP, POP, POP_MARK, TUPLE1/3.
    let mut p = b"(S'k'\np0\nI1\nd".to_vec(); // {"k": 1}
    p.extend_from_slice(b"S'k2'\n(lK\x05aK\x06aK\x06aK\x090"); // [5, 6, 6]; 9 pushed and popped
    p.extend_from_slice(b"s20"); // SETITEM, then DUP + POP of the dict
    p.extend_from_slice(b"q\x01r\x02\x00\x00\x00"); // BINPUT 1, LONG_BINPUT 2
    p.extend_from_slice(b"(K\x011"); // POP_MARK discards
    p.extend_from_slice(b"g0\nh\x01j\x02\x00\x00\x00.");
    // Stack is now: dict, "k", dict, dict -> STOP returns the last dict.
    let doc = decode(&p).expect("decodes");
    assert_eq!(repr(&doc, doc.root()), r#"{"k": 1, "k2": [5, 6, 6]}"#);

    let p = b"K\x01\x85K\x02K\x03K\x04\x87\x86.";
    assert_eq!(decode_repr(p), "((1), (2, 3, 4))");
    let p = b"K\x012\x86.";
    assert_eq!(decode_repr(p), "(1, 1)");
    // POP with nothing above the mark drops the mark.
    let p = b"K\x01(0K\x02\x86.";
    assert_eq!(decode_repr(p), "(1, 2)");
}

#[test]
fn frame_opcode_is_skipped() {
    let p = b"\x80\x04\x95\x03\x00\x00\x00\x00\x00\x00\x00K\x07.";
    assert_eq!(decode_repr(p), "7");
}

fn err_kind(bytes: &[u8]) -> (usize, K) {
    match decode(bytes) {
        Ok(doc) => panic!("decoded: {}", repr(&doc, doc.root())),
        Err(e) => (e.offset, e.kind),
    }
}

#[test]
fn malformed_inputs_are_errors_with_offsets() {
    assert_eq!(err_kind(b""), (0, K::Empty));
    assert_eq!(err_kind(b"\x80\x04K\x01"), (4, K::MissingStop));
    assert_eq!(err_kind(b"\x80\x04\xff"), (2, K::UnknownOpcode(0xff)));
    assert_eq!(err_kind(b"\x80\x09N."), (0, K::Protocol(9)));
    assert_eq!(
        err_kind(b"\x80\x04\x8c\x01a\x94c__builtin__\nint\n."),
        (6, K::Unsupported("GLOBAL"))
    );
    assert_eq!(
        err_kind(b"\x80\x04\x93."),
        (2, K::Unsupported("STACK_GLOBAL"))
    );
    assert_eq!(
        err_kind(b"N\x86."),
        (
            1,
            K::StackUnderflow {
                op: "TUPLE2",
                need: 2,
                have: 1
            }
        )
    );
    assert_eq!(err_kind(b"e."), (0, K::NoMark { op: "APPENDS" }));
    assert_eq!(
        err_kind(b"h\x05."),
        (
            0,
            K::MemoMissing {
                op: "BINGET",
                index: 5
            }
        )
    );
    assert_eq!(
        err_kind(b"}(K\x01e."),
        (
            4,
            K::WrongType {
                op: "APPENDS",
                expected: "list",
                got: "dict"
            }
        )
    );
    assert_eq!(
        err_kind(b"}(K\x01u."),
        (
            4,
            K::OddItems {
                op: "SETITEMS",
                count: 1
            }
        )
    );
    assert_eq!(
        err_kind(b"\x80\x04X\x00\x09\x3d\x00abcdefghijkl"),
        (
            2,
            K::LengthTooLarge {
                op: "BINUNICODE",
                len: 4_000_000,
                left: 12
            }
        )
    );
    assert_eq!(
        err_kind(b"\x8d\xff\xff\xff\xff\xff\xff\xff\xff"),
        (
            0,
            K::LengthTooLarge {
                op: "BINUNICODE8",
                len: u64::MAX,
                left: 0
            }
        )
    );
    assert_eq!(
        err_kind(b"J\x01\x02"),
        (
            0,
            K::Truncated {
                op: "BININT",
                what: "argument",
                need: 4,
                left: 2
            }
        )
    );
    assert_eq!(
        err_kind(b"\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01."), // 2^64
        (
            0,
            K::IntTooWide {
                op: "LONG1",
                bytes: 9
            }
        )
    );
    // Values below a MARK cannot be popped.
    assert_eq!(
        err_kind(b"K\x01(\x86."),
        (
            3,
            K::StackUnderflow {
                op: "TUPLE2",
                need: 2,
                have: 0
            }
        )
    );
    assert_eq!(
        err_kind(b"K\x01(."),
        (
            3,
            K::StackUnderflow {
                op: "STOP",
                need: 1,
                have: 0
            }
        )
    );
    let msg = decode(b"\x80\x04X\x00\x09\x3d\x00abcdefghijkl")
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        msg.as_deref(),
        Some("byte 2: truncated BINUNICODE: length 4000000 exceeds the 12 bytes left")
    );
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn every_real_file_decodes_with_sharing() {
    let files = real_files();
    assert_eq!(files.len(), 12, "expected the 12 real snapshots");
    for (name, bytes) in files {
        let doc = decode(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            matches!(doc.get(doc.root()), ValueRef::Dict(_) | ValueRef::List(_)),
            "{name}"
        );
        // The arena stays near the file size thanks to memo sharing (tiny
        // files are dominated by fixed overheads).
        if bytes.len() < 100_000 {
            continue;
        }
        let ratio = doc.heap_bytes() as f64 / bytes.len() as f64;
        assert!(ratio < 3.0, "{name}: arena is {ratio:.2}x the file");
    }
}

/// Python, when installed, is the oracle for the text/binary opcode mix of
/// every protocol.
#[test]
fn matches_python_for_all_protocols() {
    let script = r#"
import pickle, sys
obj = {"i": [0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31, 2**40, -2**63, 2**63 - 1],
       "f": [0.5, -1e300], "s": ["", "a", "é" * 3, "x" * 300], "b": [True, False, None],
       "t": [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)], "n": [[[]], {"k": {}}],
       "big": list(range(2500)), "bigd": {str(i): i for i in range(1500)}}
shared = ["shared"]
obj["sh"] = [shared, shared]
# Protocols 0-3 write sets and bytes through GLOBAL, so only 4 and 5 get them.
extra = dict(obj, by=[b"", b"\x00\xff"], set=[{1}, frozenset([2])])
for p in range(0, 6):
    data = pickle.dumps(extra if p >= 4 else obj, protocol=p)
    sys.stdout.buffer.write(len(data).to_bytes(4, "little"))
    sys.stdout.buffer.write(data)
"#;
    let out = match std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .output()
    {
        Ok(o) if o.status.success() => o.stdout,
        Ok(o) => panic!(
            "the pickle oracle failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!(
            "{e}: python3 is needed for this test (Debian/Ubuntu: sudo apt-get install python3)"
        ),
    };
    let mut rest = &out[..];
    let mut reprs = Vec::new();
    while rest.len() >= 4 {
        let n = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let (p, r) = rest[4..].split_at(n);
        reprs.push(decode_repr(p));
        rest = r;
    }
    assert_eq!(reprs.len(), 6);
    for r in &reprs[1..4] {
        assert_eq!(r, &reprs[0]);
    }
    assert_eq!(reprs[4], reprs[5]);
    assert!(reprs[4].starts_with(&reprs[0][..reprs[0].len() - 1]));
    assert!(reprs[4].ends_with(r#""set": [{1}, {2}]}"#));
    assert!(reprs[4].contains(r#""by": [b"", "#));
    assert!(reprs[0].contains(r#""sh": [["shared"], ["shared"]]"#));
    assert!(reprs[0].contains("-9223372036854775808, 9223372036854775807"));
}

/// Decoding must never panic, however the input is cut or damaged.
fn must_not_panic(bytes: &[u8]) {
    let _ = decode(bytes);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn truncated_real_files_are_errors() {
    for (name, bytes) in real_files() {
        // Every offset in the first 2 KiB and the last 32 bytes, and ~60
        // spread over the rest (kept small: each cut decodes up to the
        // whole file): a pickle cut anywhere lacks its STOP.
        let n = bytes.len();
        let step = (n / 60).max(1);
        let cuts = (0..n.min(2048))
            .chain((0..n).step_by(step))
            .chain(n.saturating_sub(32)..n);
        for cut in cuts {
            assert!(decode(&bytes[..cut]).is_err(), "{name} cut at {cut}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    #[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
    fn flipped_bytes_never_panic(file in 0usize..12, flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
        let files = real_files();
        let (_, bytes) = &files[file % files.len()];
        let mut b = bytes.clone();
        for (at, val) in flips {
            let i = at.index(b.len());
            b[i] = val;
        }
        must_not_panic(&b);
    }

    #[test]
    fn random_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..512)) {
        must_not_panic(&b);
    }

    #[test]
    fn opcode_soup_never_panics(b in prop::collection::vec(prop::sample::select(vec![
        0x28u8, 0x2e, 0x30, 0x31, 0x32, 0x4b, 0x4e, 0x5d, 0x7d, 0x29, 0x61, 0x65, 0x73, 0x75,
        0x74, 0x85, 0x86, 0x87, 0x88, 0x8f, 0x90, 0x91, 0x94, 0x68, 0x00, 0x01, 0x8c, 0x8a,
    ]), 0..256)) {
        must_not_panic(&b);
    }
}
