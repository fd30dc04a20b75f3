//! `attach` against a helper stand-in speaking PROTOCOL.md over a real unix
//! socket or TCP port: the handshake (token, refusal), a stream that loses
//! entries and sends a fresh state, a disconnect, and dead addresses.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;

use serde_json::{json, Value};
use vramscope::job::frame::FrameReader;
use vramscope::job::synth::{hello, StreamWriter};
use vramscope::job::{connect, Address, LiveError};
use vramscope::producers::{job_source, JobMsg, RecordedMsg, RunMsg, SourceMsg};

const BASE: u64 = 0x7f00_0000_0000;
const FIXTURE: &str = "tests/fixtures/live/peak-inside-step-synth.vslive";

use common::temp_dir;

/// A job's stream: hello, a state, a segment and one allocation; then
/// `lost` and a fresh state when `lose`; no `bye` (it disconnects).
fn script(lose: bool) -> Vec<u8> {
    let mut w = StreamWriter::stream();
    w.send(hello(4242, &[(0, 80 << 30)], ""));
    w.send(json!({"t":"state","seq":0,"reason":"start","chunks":0}));
    w.send(json!({"t":"stack","id":1,"frames":[["/home/u/train.py",41,"train_step"]]}));
    w.send(json!({"t":"entries","first":0,"entries":[
        ["segment_alloc",0,BASE,1u64<<30,0,1,null],["alloc",0,BASE,4096,0,2,1]]}));
    if lose {
        w.send(json!({"t":"lost","seq":2,"count":10,"why":"the native ring overflowed"}));
        w.send(json!({"t":"state","seq":12,"reason":"lost","chunks":1}));
        w.send(json!({"t":"segments","segments":[{"device":0,"address":BASE,"total_size":1u64<<30,
            "stream":0,"segment_type":"large","segment_pool_id":[0,0],"is_expandable":false,
            "blocks":[{"address":BASE,"size":1u64<<30,"requested_size":0,"state":"inactive","stack":null}]}]}));
        w.send(json!({"t":"entries","first":12,"entries":[["alloc",0,BASE,8192,0,3,1]]}));
    }
    w.bytes
}

/// Serve one client: read its hello, answer `refused` when the token is
/// not `token`, else send `stream` and close. The client's hello comes back.
fn serve<S: Read + Write + Send + 'static>(
    accept: impl FnOnce() -> S + Send + 'static,
    token: Option<&'static str>,
    stream: Vec<u8>,
) -> JoinHandle<Value> {
    std::thread::spawn(move || {
        let mut s = accept();
        let mut frames = FrameReader::new(&mut s, "server");
        let (_, bytes) = frames.next_frame().expect("read").expect("client hello");
        let client: Value = serde_json::from_slice(bytes).expect("json");
        if token.is_some() && client["token"].as_str() != token {
            let mut w = StreamWriter::stream();
            w.send(json!({"t":"refused","reason":"wrong token"}));
            s.write_all(&w.bytes).expect("write");
        } else {
            s.write_all(&stream).expect("write");
        }
        client
    })
}

/// A job served on a unix socket in a scratch directory (kept while the
/// returned `Scratch` lives).
fn unix_server(tag: &str, stream: Vec<u8>) -> (common::Scratch, PathBuf, JoinHandle<Value>) {
    let dir = temp_dir(tag);
    let path = dir.join("job.sock");
    let l = UnixListener::bind(&path).expect("bind");
    let h = serve(move || l.accept().expect("accept").0, None, stream);
    (dir, path, h)
}

fn drain(source: vramscope::producers::Source) -> Vec<SourceMsg> {
    let mut out = Vec::new();
    while let Some(m) = source.recv() {
        let end = matches!(m, SourceMsg::Run(RunMsg::Finished));
        out.push(m);
        if end {
            break;
        }
    }
    out
}

#[test]
fn a_unix_socket_job_that_loses_entries_starts_over_and_then_disconnects() {
    let (_dir, path, server) = unix_server("lost", script(true));
    let addr = Address::parse(path.to_str().expect("utf-8")).expect("addr");
    let c = connect(&addr, None, Arc::default()).expect("connects");
    assert_eq!(c.hello.pid, 4242);
    let msgs = drain(job_source(
        c.frames,
        Some(c.hello),
        None,
        Arc::new(AtomicBool::new(false)),
    ));
    let client = server.join().expect("server");
    assert_eq!(client["protocol"], 1);
    assert_eq!(client["token"], Value::Null);

    // The GPU panel's last word on the job: its pid, and its 1 GiB segment reserved.
    let job = msgs
        .iter()
        .rev()
        .find_map(|m| match m {
            SourceMsg::Job(JobMsg::Place(j)) => Some(j),
            _ => None,
        })
        .expect("the job's pid and devices");
    assert_eq!(job.pid, Some(4242));
    assert_eq!(job.devices.len(), 1);
    assert_eq!(job.devices[0].reserved, Some(1 << 30));
    let names: Vec<&str> = msgs
        .iter()
        // The job's pid and devices for the GPU panel come beside the view's messages.
        .filter(|m| !matches!(m, SourceMsg::Job(JobMsg::Place(_))))
        .map(|m| match m {
            SourceMsg::Recorded(RecordedMsg::Opened(_)) => "opened",
            SourceMsg::Run(RunMsg::Start(_)) => "start",
            SourceMsg::Run(RunMsg::Part(_)) => "part",
            SourceMsg::Run(RunMsg::Restarted) => "restarted",
            SourceMsg::Job(JobMsg::Note(_)) => "note",
            SourceMsg::Run(RunMsg::FindingsNow(_)) => "findings",
            SourceMsg::Run(RunMsg::Finished) => "finished",
            _ => "other",
        })
        .collect();
    // The job sends no steps: its entries are analysed as they come (at
    // most once a second: how often depends on the machine's pace), and
    // always once at the end.
    assert_eq!(names[names.len() - 2..], ["findings", "finished"]);
    assert!(names[..3] == ["opened", "start", "part"], "{names:?}");
    let order: Vec<&str> = names.iter().copied().filter(|n| *n != "findings").collect();
    assert_eq!(
        order,
        [
            "opened",
            "start",
            "part",
            "restarted",
            "note",
            "start",
            "part",
            "note",
            "finished"
        ]
    );
    let notes: Vec<&String> = msgs
        .iter()
        .filter_map(|m| match m {
            SourceMsg::Job(JobMsg::Note(n)) => Some(n),
            _ => None,
        })
        .collect();
    assert!(
        notes[0].contains("lost 10 entries from seq 2"),
        "{}",
        notes[0]
    );
    assert!(notes[1].contains("disconnected"), "{}", notes[1]);
    // The second start is the job's fresh state: one free segment.
    let starts: Vec<_> = msgs
        .iter()
        .filter_map(|m| match m {
            SourceMsg::Run(RunMsg::Start(map)) => Some(map),
            _ => None,
        })
        .collect();
    assert_eq!(starts[1].reserved, 1 << 30);
    assert_eq!(starts[1].allocated, 0);
}

#[test]
fn tcp_needs_the_right_token() {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let server = serve(
        move || l.accept().expect("accept").0,
        Some("s3cret"),
        script(false),
    );
    let addr = Address::parse(&format!("127.0.0.1:{port}")).expect("addr");
    let err = connect(&addr, Some("wrong"), Arc::default())
        .err()
        .expect("refused");
    assert!(matches!(err, LiveError::Refused { .. }), "{err}");
    assert!(err.to_string().contains("wrong token"), "{err}");
    assert_eq!(server.join().expect("server")["token"], "wrong");

    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let server = serve(
        move || l.accept().expect("accept").0,
        Some("s3cret"),
        script(false),
    );
    let addr = Address::parse(&format!("tcp:127.0.0.1:{port}")).expect("addr");
    let c = connect(&addr, Some("s3cret"), Arc::default()).expect("accepted");
    assert_eq!(c.hello.mode, "agent");
    server.join().expect("server");
}

#[test]
fn headless_attach_reports_the_job_and_says_it_disconnected() {
    let (_dir, path, server) = unix_server("headless", script(false));
    let (code, out, err) = common::vramscope(&["attach", path.to_str().expect("utf-8"), "--json"]);
    server.join().expect("server");
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["live"]["pid"], 4242);
    assert_eq!(v["devices"][0]["allocated"], 4096);
    assert_eq!(
        v["devices"][0]["top_allocations"][0]["site"],
        "/home/u/train.py:41 in train_step"
    );
    assert!(v["live"]["ended"]
        .as_str()
        .expect("ended")
        .contains("disconnected"));
}

#[test]
fn dead_addresses_exit_2_at_once() {
    let dir = temp_dir("dead");
    let missing = dir.join("nobody.sock");
    // A socket file nobody listens on any more.
    let stale = dir.join("stale.sock");
    drop(UnixListener::bind(&stale).expect("bind"));
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let tcp = format!("127.0.0.1:{closed}");
    let snapshot = common::capture("peak_inside_step").display().to_string();
    for (args, says) in [
        (
            vec!["attach", missing.to_str().expect("utf-8"), "--json"],
            "no socket there",
        ),
        (
            vec!["attach", stale.to_str().expect("utf-8"), "--json"],
            "nothing is listening",
        ),
        (
            vec!["attach", &tcp, "--token", "t", "--json"],
            "nothing is listening",
        ),
        (vec!["attach", &tcp, "--json"], "TCP needs a token"),
        (
            vec!["attach", "--replay", missing.to_str().expect("utf-8")],
            "cannot open the recording",
        ),
        (
            vec!["attach", "/nonexistent-dir/job-{rank}.sock", "--json"],
            "no socket for rank 0 (/nonexistent-dir/job-0.sock does not exist)",
        ),
        (
            vec!["attach", "--replay", FIXTURE, "--json", "--device", "3"],
            "no device 3; it has device 0",
        ),
        (
            vec!["attach", "--replay", &snapshot, "--json"],
            "it is a pickle: a PyTorch snapshot opens with `vramscope open ",
        ),
    ] {
        let t = std::time::Instant::now();
        let (code, _, err) = common::vramscope(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(3),
            "{args:?} took {:?}",
            t.elapsed()
        );
    }
}

#[test]
fn a_hostile_recording_is_a_clear_error_with_exit_2() {
    let dir = temp_dir("hostile");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            b"not a recording".to_vec(),
            "not a vramscope live recording",
        ),
        (
            [&b"VSLIVE1\n"[..], &u32::MAX.to_le_bytes()].concat(),
            "over the 64 MiB bound",
        ),
        (
            [&b"VSLIVE1\n"[..], &5u32.to_le_bytes(), b"{\"t\":"].concat(),
            "not a JSON object",
        ),
    ];
    for (i, (bytes, says)) in cases.into_iter().enumerate() {
        let path = dir.join(format!("{i}.vslive"));
        std::fs::write(&path, bytes).expect("write");
        let (code, _, err) = common::vramscope(&[
            "attach",
            "--replay",
            path.to_str().expect("utf-8"),
            "--json",
        ]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(says), "{says}: {err}");
    }
}

/// A helper that sends its hello one byte at a time: the old hello timeout
/// stopped at the first byte, so `attach` waited for ever. The whole
/// handshake now has one deadline.
#[test]
fn a_hello_sent_a_byte_at_a_time_times_out() {
    let dir = common::Scratch::new("attach-slow-hello");
    let path = dir.join("job.sock");
    let l = UnixListener::bind(&path).expect("bind");
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut w = StreamWriter::stream();
        w.send(hello(4242, &[(0, 80 << 30)], ""));
        // At most 8 s of trickle, then the server gives up.
        for b in w.bytes.iter().take(40) {
            if s.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    });
    let addr = Address::parse(path.to_str().expect("utf-8")).expect("addr");
    let t = std::time::Instant::now();
    let err = vramscope::job::connect::connect_within(
        &addr,
        None,
        Arc::default(),
        std::time::Duration::from_millis(1500),
    )
    .err()
    .expect("no hello in time");
    assert!(
        err.to_string()
            .contains("did not complete the handshake within 1.5 s"),
        "{err}"
    );
    assert!(
        t.elapsed() < std::time::Duration::from_secs(4),
        "{:?}",
        t.elapsed()
    );
    server.join().expect("server");
}

/// `attach` refused a socket in another user's directory, but not a link to
/// it from one of the user's own: the path is resolved, then checked.
#[cfg(unix)]
#[test]
fn a_link_to_another_users_socket_is_refused_as_the_socket_itself() {
    use std::os::unix::fs::symlink;
    let base = common::Scratch::new("attach-linked-socket");
    let theirs = base.join("theirs");
    std::fs::create_dir(&theirs).expect("mkdir");
    let sock = theirs.join("job.sock");
    let l = UnixListener::bind(&sock).expect("bind");
    let mine = base.join("mine");
    std::fs::create_dir(&mine).expect("mkdir");
    let link = mine.join("job.sock");
    symlink(&sock, &link).expect("symlink");
    // SAFETY: geteuid takes no argument and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        // Without root no directory can be another user's here: the link
        // is followed to the socket and the attach gets as far as the hello.
        drop(l);
        let (code, _, err) =
            common::vramscope(&["attach", link.to_str().expect("utf-8"), "--json"]);
        assert_eq!(code, 2);
        assert!(err.contains("nothing is listening"), "{err}");
        eprintln!("not root: the other-user half of this test needs root (CI runs as root)");
        return;
    }
    let c = std::ffi::CString::new(theirs.to_str().expect("utf-8")).expect("no nul");
    // SAFETY: a valid NUL-terminated path; chown changes only its owner.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), 4321, 4321) }, 0, "chown");
    for p in [&sock, &link] {
        let (code, _, err) = common::vramscope(&["attach", p.to_str().expect("utf-8"), "--json"]);
        assert_eq!(code, 2, "{p:?}: {err}");
        assert!(
            err.contains("is owned by uid 4321, not by you"),
            "{p:?}: {err}"
        );
        assert!(err.contains("theirs"), "the real directory is named: {err}");
    }
    drop(l);
}
