use proptest::prelude::*;

use super::*;
use crate::job::frame::FrameReader;

fn one(json: &str) -> Result<Option<Message>, LiveError> {
    decode("sock", 3, json.as_bytes())
}

fn err(json: &str) -> String {
    one(json).expect_err(json).to_string()
}

#[test]
fn unknown_types_are_skipped() {
    assert_eq!(one(r#"{"t":"telemetry","x":[1,2]}"#).expect("skip"), None);
}

#[test]
fn bad_json_says_where() {
    let e = err("{\"t\":\"step\",\n \"seq\": }");
    assert!(e.contains("frame 3") && e.contains("line 2"), "{e}");
    let e = err("[1,2]");
    assert!(e.contains("an array, not an object"), "{e}");
}

#[test]
fn missing_and_mistyped_fields_are_named() {
    let e = err(r#"{"t":"step","step":1,"source":"mark_step"}"#);
    assert!(
        e.contains("message 3 (\"step\"): field `seq`: missing"),
        "{e}"
    );
    let e = err(r#"{"t":"step","step":1,"seq":"9","source":"x"}"#);
    assert!(
        e.contains("`seq`") && e.contains("found a string \"9\""),
        "{e}"
    );
    let e = err(
        r#"{"t":"entries","first":0,"entries":[["alloc",0,1,2,0,null,null],["alloc",0,-1,2,0,null,null]]}"#,
    );
    assert!(e.contains("entries[1][2] (addr)"), "{e}");
    let e = err(
        r#"{"t":"segments","segments":[{"device":0,"address":1,"total_size":2,"stream":0,
        "segment_type":"large","is_expandable":false,"blocks":[{"address":1,"size":2,"state":"busy"}]}]}"#,
    );
    assert!(
        e.contains("segments[0].blocks[0].state") && e.contains("\"busy\""),
        "{e}"
    );
}

#[test]
fn bounds_are_kept() {
    let e = err(r#"{"t":"entries","first":0,"entries":[["alloc",256,1,2,0,null,null]]}"#);
    assert!(e.contains("device 256 is outside 0..=255"), "{e}");
    let e = err(r#"{"t":"stack","id":16777216,"frames":[]}"#);
    assert!(e.contains("not below 2^24"), "{e}");
    let frames = vec![r#"["a.py",1,"f"]"#; MAX_STACK_FRAMES + 1].join(",");
    let e = err(&format!(r#"{{"t":"stack","id":1,"frames":[{frames}]}}"#));
    assert!(e.contains("1025 frames"), "{e}");
    let long = "x".repeat(MAX_STRING + 1);
    let e = err(&format!(r#"{{"t":"bye","reason":"{long}"}}"#));
    assert!(e.contains("64 KiB"), "{e}");
    let e = err(r#"{"t":"hello","protocol":2,"pid":1,"mode":"agent","devices":[]}"#);
    assert!(e.contains("protocol 2 is not supported"), "{e}");
}

#[test]
fn the_fast_and_the_careful_entry_paths_agree() {
    let text = r#"{"t":"entries","first":7,"entries":[["alloc",1,10,20,3,99,5],["defragment",0,0,0,0,null,null]]}"#;
    let fast = one(text).expect("ok").expect("known");
    let v: Value = serde_json::from_str(text).expect("json");
    let careful = Fields {
        at: "x",
        index: 0,
        kind: "entries",
    }
    .message(v.as_object().expect("object"))
    .expect("ok")
    .expect("known");
    assert_eq!(fast, careful);
    let Message::Entries { entries, .. } = fast else {
        panic!("entries")
    };
    assert_eq!(entries[1].other.as_deref(), Some("defragment"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any bytes at all: frames and messages come out or an error does, and
    /// nothing panics or allocates past the bound.
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut r = FrameReader::new(bytes.as_slice(), "fuzz");
        while let Ok(Some((i, b))) = r.next_frame() {
            let _ = decode("fuzz", i, b);
        }
    }

    /// Well-framed but arbitrary JSON-ish text.
    #[test]
    fn random_messages_never_panic(t in "(hello|state|segments|stack|entries|step|stats|oom|lost|bye)",
                                   body in "[\\[\\]{}\",:0-9a-z -]{0,80}") {
        let text = format!(r#"{{"t":"{t}",{body}}}"#);
        let _ = decode("fuzz", 0, text.as_bytes());
    }
}

#[test]
fn a_hello_device_may_say_where_it_sits_and_an_old_one_need_not() {
    let hello = |devices: &str| {
        one(&format!(
            r#"{{"t":"hello","protocol":1,"pid":7,"mode":"agent","devices":[{devices}]}}"#
        ))
    };
    let Ok(Some(Message::Hello(h))) = hello(
        r#"{"device":0,"pci_bus_id":"0000:3b:00.0","uuid":"GPU-8e3c"},{"device":1,"pci_bus_id":null}"#,
    ) else {
        panic!("a hello");
    };
    let bus = crate::device::PciAddress {
        domain: 0,
        bus: 0x3b,
        device: 0,
    };
    assert_eq!(h.devices[0].pci_bus_id, Some(bus));
    assert_eq!(h.devices[0].uuid.as_deref(), Some("GPU-8e3c"));
    assert_eq!(
        (h.devices[1].pci_bus_id, h.devices[1].uuid.clone()),
        (None, None)
    );
    let e = hello(r#"{"device":0,"pci_bus_id":"bus 3b"}"#)
        .expect_err("not a bus id")
        .to_string();
    assert!(
        e.contains("devices[0].pci_bus_id") && e.contains("\"bus 3b\" is not a PCI bus id"),
        "{e}"
    );
}

/// The typed path and the field-by-field one read every kind of message alike.
#[test]
fn the_typed_and_the_careful_paths_agree_on_every_kind() {
    let texts = [
        r#"{"t":"hello","protocol":1,"pid":7,"rank":0,"world_size":2,"hostname":"h","argv":["a","b"],"torch":"2.11","mode":"poll","stacks":true,"devices":[{"device":1,"name":"H100","total_memory":80,"pci_bus_id":"0000:3b:00.0","uuid":"GPU-1"}],"allocator_settings":{"PYTORCH_CUDA_ALLOC_CONF":"expandable_segments:True","n":3},"started_us":5,"poll_interval_s":0.5,"extra":[1,2]}"#,
        r#"{"t":"refused","reason":"wrong token"}"#,
        r#"{"t":"state","seq":3,"reason":"rebase","chunks":1}"#,
        r#"{"t":"segments","segments":[{"device":0,"address":1,"total_size":4,"stream":0,"segment_type":"small","segment_pool_id":[1,2],"is_expandable":true,"blocks":[{"address":1,"size":2,"requested_size":1,"state":"active_pending_free","stack":4},{"address":3,"size":2,"state":"inactive","stack":null}]}]}"#,
        r#"{"t":"stack","id":4,"frames":[["a.py",-1,"f"]]}"#,
        r#"{"t":"step","step":1,"seq":2,"time_us":null,"source":"mark_step"}"#,
        r#"{"t":"stats","device":2,"seq":9,"stats":{"a":1,"b":-2}}"#,
        r#"{"t":"oom","device":0,"seq":1,"message":"m","device_free":5}"#,
        r#"{"t":"oom_message","seq":1,"device":null,"message":"m"}"#,
        r#"{"t":"lost","seq":1,"count":null}"#,
        r#"{"t":"bye"}"#,
    ];
    for text in texts {
        let typed = one(text).expect(text).expect("known");
        let v: Value = serde_json::from_str(text).expect("json");
        let obj = v.as_object().expect("object");
        let kind = obj["t"].as_str().expect("t");
        let careful = Fields {
            at: "sock",
            index: 3,
            kind,
        }
        .message(obj)
        .expect(text)
        .expect("known");
        assert_eq!(typed, careful, "{text}");
    }
}

/// `stats` for 256 devices with keys of any number and length grew `attach`
/// without end: keys are bounded in number and length.
#[test]
fn stats_keys_are_bounded_in_number_and_length() {
    let many: Vec<String> = (0..MAX_STATS_KEYS + 1)
        .map(|i| format!(r#""k{i}":1"#))
        .collect();
    let e = err(&format!(
        r#"{{"t":"stats","device":255,"seq":0,"stats":{{{}}}}}"#,
        many.join(",")
    ));
    assert!(e.contains("more than 1024 stats keys"), "{e}");
    let long = "k".repeat(300);
    let e = err(&format!(
        r#"{{"t":"stats","device":0,"seq":0,"stats":{{"{long}":1}}}}"#
    ));
    assert!(e.contains("a stats key of 300 bytes"), "{e}");
    assert!(e.len() < 300, "{e}");
}
