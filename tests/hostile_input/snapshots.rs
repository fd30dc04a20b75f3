//! Snapshots and exports, written by an adversary: a named pipe, an export
//! over its own input, over a special or a private file, a shared-entry
//! bomb, control sequences meant for the terminal, a bad pickle, and a file
//! cut short while it is read.

use super::*;

/// A named pipe given where a file belongs was opened, and waited for a
/// writer forever.
#[cfg(unix)]
#[test]
fn a_named_pipe_is_refused_not_waited_on() {
    let dir = temp_dir("fifo");
    let pipe = dir.join("snapshot.pickle");
    mkfifo(&pipe);
    let pipe = pipe.to_str().expect("utf-8");
    let out = dir.join("out.pickle");
    let out = out.to_str().expect("utf-8");
    for args in [
        vec!["open", pipe, "--headless"],
        vec!["replay", pipe, "--verify"],
        vec!["check", pipe],
        vec!["run", pipe, "--headless"],
        vec!["export", pipe, "-o", out],
        vec!["compare", pipe, "tour", "--headless"],
        vec!["attach", "--replay", pipe, "--json"],
    ] {
        let (code, _, err) = vramscope(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("a named pipe"), "{args:?}: {err}");
    }
}
#[cfg(unix)]
#[test]
fn export_never_replaces_the_input_however_it_is_named() {
    let dir = temp_dir("export-self");
    let input = dir.join("in.pickle");
    let (code, _, err) = vramscope(&["export", "tour", "-o", input.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{err}");
    let before = std::fs::read(&input).expect("written");
    let link = dir.join("link.pickle");
    std::os::unix::fs::symlink(&input, &link).expect("symlink");
    let dotted = dir.join(".").join("in.pickle");
    for (from, to) in [(&input, &dotted), (&dotted, &input), (&input, &link)] {
        let (code, _, err) = vramscope(&[
            "export",
            from.to_str().expect("utf-8"),
            "-o",
            to.to_str().expect("utf-8"),
        ]);
        assert_eq!(code, 2, "{from:?} -> {to:?}: {err}");
        assert!(err.contains("refusing to overwrite the input"), "{err}");
    }
    assert_eq!(std::fs::read(&input).expect("still there"), before);
    assert!(std::fs::symlink_metadata(&link)
        .expect("link kept")
        .file_type()
        .is_symlink());
}
#[cfg(unix)]
#[test]
fn export_writes_only_over_a_plain_file_and_leaves_no_temporary_file() {
    let dir = temp_dir("export-targets");
    let target = dir.join("keep.txt");
    std::fs::write(&target, b"keep").expect("write");
    let link = dir.join("link.pickle");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let pipe = dir.join("pipe.pickle");
    mkfifo(&pipe);
    for (out, why) in [
        (link.as_path(), "symbolic link"),
        (pipe.as_path(), "a named pipe"),
        (&*dir, "a directory"),
    ] {
        let (code, _, err) = vramscope(&["export", "tour", "-o", out.to_str().expect("utf-8")]);
        assert_eq!(code, 2, "{out:?}: {err}");
        assert!(err.contains(why), "{out:?}: {err}");
    }
    assert_eq!(std::fs::read(&target).expect("read"), b"keep");
    assert!(std::fs::symlink_metadata(&link)
        .expect("kept")
        .file_type()
        .is_symlink());
    let (code, _, err) = vramscope(&[
        "export",
        "tour",
        "-o",
        dir.join("no-such-dir")
            .join("x.pickle")
            .to_str()
            .expect("utf-8"),
    ]);
    assert_eq!(code, 2, "{err}");
    let left: Vec<String> = std::fs::read_dir(&dir)
        .expect("read dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("vramscope-tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
/// A snapshot whose trace is one `oom` entry dict, written once and then
/// referred to `n` times (2 bytes each): cheap input that used to make
/// millions of report lines and a file many times its size.
fn shared_entry_bomb(n: usize) -> Vec<u8> {
    use vramscope::trace::pickle::{PickleWriter, BATCH};
    let mut w = PickleWriter::new();
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
    let mut entry = None;
    let mut left = n;
    while left > 0 {
        w.mark();
        for _ in 0..left.min(BATCH) {
            match entry {
                Some(memo) => w.get(memo),
                None => {
                    w.empty_dict();
                    entry = Some(w.memoize());
                    w.mark();
                    for (k, v) in [
                        ("action", None),
                        ("size", Some(1 << 20)),
                        ("stream", Some(0)),
                    ] {
                        w.str(k);
                        match v {
                            Some(v) => w.uint(v),
                            None => w.str("oom"),
                        }
                    }
                    w.str("device_free");
                    w.uint(0);
                    w.str("frames");
                    w.empty_list();
                    w.setitems();
                }
            }
        }
        w.appends();
        left -= left.min(BATCH);
    }
    w.appends();
    w.setitems();
    w.finish()
}
#[test]
fn millions_of_references_to_one_record_are_refused() {
    let dir = temp_dir("bomb-refused");
    let file = dir.join("bomb.pickle");
    let bytes = shared_entry_bomb(3_000_000);
    assert!(bytes.len() < 7 << 20, "{} bytes", bytes.len());
    std::fs::write(&file, &bytes).expect("write");
    let file = file.to_str().expect("utf-8");
    let out = dir.join("out.pickle");
    for args in [
        vec!["open", file, "--headless"],
        vec!["export", file, "-o", out.to_str().expect("utf-8")],
    ] {
        let (code, out, err) = vramscope(&args);
        assert_eq!(code, 2, "{args:?}: {out}");
        assert!(err.contains("refers to the same records"), "{err}");
        assert!(out.len() < 1024, "{}", out.len());
    }
}
#[test]
fn a_repeated_record_is_summarised_in_reports_and_shared_in_exports() {
    let dir = temp_dir("bomb-summarised");
    let file = dir.join("bomb.pickle");
    let n = 300_000;
    let bytes = shared_entry_bomb(n);
    std::fs::write(&file, &bytes).expect("write");
    let file = file.to_str().expect("utf-8");
    let (code, out, err) = vramscope(&["open", file, "--headless"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.lines().count() < 60, "{out}");
    assert!(
        out.contains("… and 299,990 more OOM entries (300,000 OOMs in all"),
        "{out}"
    );
    let (code, out, err) = vramscope(&["open", file, "--json"]);
    assert_eq!(code, 0, "{err}");
    let v = common::json(&out);
    assert_eq!(v["devices"][0]["oom_count"], n);
    assert_eq!(v["devices"][0]["ooms"].as_array().map(Vec::len), Some(100));
    // The export refers to the one record too: about the input's size.
    let exported = dir.join("out.pickle");
    let (code, _, err) = vramscope(&["export", file, "-o", exported.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{err}");
    let size = std::fs::metadata(&exported).expect("written").len();
    assert!(size < 2 * bytes.len() as u64, "{size} from {}", bytes.len());
    let (code, out, _) = vramscope(&["open", exported.to_str().expect("utf-8"), "--json"]);
    assert_eq!(code, 0);
    assert_eq!(common::json(&out)["devices"][0]["oom_count"], n);
}
#[test]
fn control_sequences_in_a_snapshot_never_reach_the_terminal() {
    let dir = temp_dir("escapes");
    let file = fixture("escapes.pickle");
    let file = file.as_str();
    let (code, out, err) = vramscope(&["open", file, "--headless"]);
    assert_eq!(code, 0, "{err}");
    assert_no_controls("open", &out);
    assert!(out.contains("\\u{1b}]0;pwned\\u{7}evil.py"), "{out}");
    for args in [
        vec!["replay", file, "--verify"],
        vec!["replay", file, "--conf", "expandable_segments:True"],
        vec!["compare", file, "tour", "--headless"],
        vec!["open", file, "--json"],
    ] {
        let (_, out, err) = vramscope(&args);
        assert_no_controls(&format!("{args:?} stdout"), &out);
        assert_no_controls(&format!("{args:?} stderr"), &err);
    }
    // A scenario file's own text, and a file name, likewise.
    let evil_ron = VALID
        .replace("name: \"ok\"", "name: \"ok\\u{1b}[2J\"")
        .replace(
            "    iterations: 3,\n",
            "    iterations: 3,\n    narration: [(at: Start, text: \"\\u{1b}]0;t\\u{7}hello\")],\n",
        );
    let ron = dir.join("evil\x1b[2J.ron");
    std::fs::write(&ron, evil_ron).expect("write");
    let ron = ron.to_str().expect("utf-8");
    for args in [vec!["run", ron, "--headless"], vec!["check", ron]] {
        let (code, out, err) = vramscope(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert_no_controls(&format!("{args:?}"), &out);
        assert_no_controls(&format!("{args:?}"), &err);
    }
    let (code, _, err) = vramscope(&["check", &format!("{ron}.missing")]);
    assert_eq!(code, 2);
    assert_no_controls("a missing file's name", &err);
}
#[test]
fn a_bad_pickle_is_described_in_a_line_not_echoed() {
    let (code, _, err) = vramscope(&["open", &fixture("bad-text-opcode.pickle"), "--headless"]);
    assert_eq!(code, 2);
    assert!(err.contains("INT: malformed text argument"), "{err}");
    assert!(err.contains("… (5,865 bytes)"), "{err}");
    assert!(err.len() < 400, "{} bytes: {err}", err.len());
    assert_no_controls("bad text", &err);

    let (code, _, err) = vramscope(&["open", &fixture("address-above-2-63.pickle"), "--headless"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("got -4096 (read as an unsigned 64-bit number: 18446744073709547520)"),
        "{err}"
    );

    // A 16 MB string where a segment type belongs is named, not printed.
    use vramscope::trace::pickle::PickleWriter;
    let mut w = PickleWriter::new();
    w.empty_dict();
    w.memoize();
    w.mark();
    w.str("segments");
    w.empty_list();
    w.memoize();
    w.mark();
    w.empty_dict();
    w.memoize();
    w.mark();
    for (k, v) in [("device", 0), ("address", 1 << 40), ("total_size", 2 << 20)] {
        w.str(k);
        w.uint(v);
    }
    w.str("segment_type");
    w.str(&"x".repeat(16 << 20));
    w.str("blocks");
    w.empty_list();
    w.setitems();
    w.appends();
    w.setitems();
    let dir = temp_dir("long-string");
    let file = dir.join("long.pickle");
    std::fs::write(&file, w.finish()).expect("write");
    let (code, _, err) = vramscope(&["open", file.to_str().expect("utf-8"), "--headless"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("… (16,777,216 bytes)"),
        "{}",
        &err[..err.len().min(400)]
    );
    assert!(err.len() < 400, "{} bytes", err.len());
}
/// `export -o` over a 0600 file left a 0644 one: the target keeps its mode.
#[cfg(unix)]
#[test]
fn export_over_a_private_file_keeps_it_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = common::Scratch::new("export-mode");
    let out = dir.join("private.pickle");
    std::fs::write(&out, b"old").expect("write");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let (code, _, err) = vramscope(&["export", "tour", "-o", out.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{err}");
    let meta = std::fs::metadata(&out).expect("written");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(meta.len() > 3, "replaced");
}
/// PyTorch's `_dump_snapshot` rewrites its file in place: a snapshot cut
/// short while `open` read it killed the process with SIGBUS (a mapped page
/// past the new end). The import now ends in an error naming the file.
#[cfg(unix)]
#[test]
fn a_snapshot_cut_short_while_it_is_read_is_an_error_not_a_signal() {
    use vramscope::trace::snapshot::{import_file_reporting, synthetic_snapshot};
    let dir = common::Scratch::new("cut-short");
    let path = dir.join("growing.pickle");
    let file = std::fs::File::create(&path).expect("create");
    let stats = synthetic_snapshot(std::io::BufWriter::new(file), 8 << 20, 7).expect("synth");
    assert!(stats.bytes > 4 << 20, "{stats:?}");
    let mut cut = false;
    let result = import_file_reporting(&path, &mut |_| {
        if !cut {
            cut = true;
            // Another process truncates it as it starts writing anew.
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_len(4096))
                .expect("truncate");
        }
    });
    assert!(cut, "the import reported progress");
    let err = result.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("growing.pickle"), "{err}");
    assert!(
        err.contains("the file changed while it was read") && err.contains("it is 4,096 now"),
        "{err}"
    );
}
