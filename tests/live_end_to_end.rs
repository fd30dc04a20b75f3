//! `vramscope attach` against the Python helper serving a job, as a user runs
//! them: `python/tests/live_job.py` (the helper in poll mode over the
//! stand-in torch, replaying one of the project's H100 captures) prints the attach command;
//! the binary connects and, once the job stops, reports what `open` reports
//! for the snapshot.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use common::live_job::Job;
use common::{capture, devices_without_boundaries, temp_dir};

/// The job: three AdamW steps of a small MLP, captured on an H100.
const SNAPSHOT: &str = "peak_inside_step";

fn vramscope() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
}

/// The job playing the capture as rank `rank`, with a token if given.
fn start_rank(address: &str, token: Option<&str>, rank: u32) -> Job {
    let extra: Vec<&str> = token.map_or_else(Vec::new, |t| vec!["--token", t]);
    Job::start(&capture(SNAPSHOT), address, rank, &extra)
}

/// Tell the waiting job to go on, and the JSON `attach` printed once the
/// job ended (both must succeed).
fn go_and_report(job: &mut Job, attach: Child) -> Value {
    job.go();
    let out = attach.wait_with_output().expect("attach ends with the job");
    assert!(job.child.wait().expect("job").success());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// `vramscope attach ADDRESS --json` started, its output piped.
fn attach_json(address: &str, env: &[(&str, &str)]) -> Child {
    let mut cmd = vramscope();
    cmd.args(["attach", address, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("attach")
}

#[test]
fn attach_to_a_running_job_reports_what_its_snapshot_holds() {
    let dir = temp_dir("live-e2e");
    let socket = dir.join("job.sock");
    let mut job = start_rank(socket.to_str().expect("utf-8"), None, 0);
    let told = job.wait_for("vramscope attach ");
    let address = told
        .trim()
        .trim_start_matches("vramscope attach ")
        .to_string();
    assert_eq!(
        Path::new(&address),
        socket,
        "the helper prints the command to run"
    );
    let attach = attach_json(&address, &[]);
    job.wait_for("vramscope attached");
    let live = go_and_report(&mut job, attach);
    let (code, open, err) =
        common::vramscope(&["open", "--json", capture(SNAPSHOT).to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{err}");
    let mut open = common::json(&open);
    // Three entries were made before start(): they are in its start state;
    // the capture's own `snapshot` marks are not replayed.
    let unseen = 3 + common::snapshot_marks(&capture(SNAPSHOT));
    for d in open["devices"].as_array_mut().expect("devices") {
        let n = d["trace_entries"].as_u64().expect("entries");
        d["trace_entries"] = (n - unseen).into();
    }
    assert_eq!(
        devices_without_boundaries(&live),
        devices_without_boundaries(&open)
    );
    let facts = &live["live"];
    assert_eq!(facts["mode"], "poll");
    assert_eq!(facts["ended"], "the job finished");
    assert_eq!(
        facts["steps_seen"], 4,
        "mark_step and the file's three Optimizer.steps"
    );
    assert_eq!(facts["lost"], serde_json::json!([]));
}

#[test]
fn tcp_needs_the_token_the_job_printed() {
    let mut job = start_rank("127.0.0.1:0", Some("s3cret-token"), 0);
    let told = job.wait_for("--token");
    // vramscope attach 127.0.0.1:PORT --token s3cret-token
    let words: Vec<&str> = told.split_whitespace().collect();
    assert_eq!(words[..2], ["vramscope", "attach"], "{told}");
    let address = words[2].to_string();
    assert_eq!(words[3..], ["--token", "s3cret-token"], "{told}");

    let wrong = vramscope()
        .args(["attach", &address, "--token", "guess", "--json"])
        .output()
        .expect("attach");
    assert_eq!(wrong.status.code(), Some(2));
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(err.contains("wrong token"), "{err}");

    let none = vramscope()
        .args(["attach", &address, "--json"])
        .env_remove("VRAMSCOPE_TOKEN")
        .output()
        .expect("attach");
    assert_eq!(none.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("token"),
        "{}",
        String::from_utf8_lossy(&none.stderr)
    );

    let right = attach_json(&address, &[("VRAMSCOPE_TOKEN", "s3cret-token")]);
    job.wait_for("vramscope attached");
    let live = go_and_report(&mut job, right);
    assert_eq!(live["live"]["ended"], "the job finished");
}

/// Two ranks serving `job-{rank}.sock`: one attach finds both sockets, reads
/// both jobs and reports each rank, then a table across ranks.
#[test]
fn a_rank_pattern_attaches_to_every_rank_and_tables_them() {
    let dir = temp_dir("live-ranks");
    let pattern = dir.join("job-{rank}.sock").display().to_string();
    let mut jobs = Vec::new();
    for rank in 0..2 {
        let job = start_rank(&pattern, None, rank);
        let told = job.wait_for("vramscope attach ");
        assert!(told.ends_with(&format!("job-{rank}.sock")), "{told}");
        jobs.push(job);
    }
    let attach = vramscope()
        .args(["attach", &pattern, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("attach");
    for job in &mut jobs {
        job.wait_for("vramscope attached");
        job.go();
    }
    let out = attach.wait_with_output().expect("attach");
    for job in &mut jobs {
        assert!(job.child.wait().expect("job").success());
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let ranks = v["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 2);
    let (_, open, _) =
        common::vramscope(&["open", "--json", capture(SNAPSHOT).to_str().expect("utf-8")]);
    let open = common::json(&open);
    for (rank, r) in ranks.iter().enumerate() {
        assert_eq!(r["live"]["rank"], rank, "rank order");
        assert_eq!(r["live"]["ended"], "the job finished");
        assert_eq!(r["devices"][0]["reserved"], open["devices"][0]["reserved"]);
    }
    let rows = v["table"]["rows"].as_array().expect("rows");
    let labels: Vec<&str> = rows.iter().filter_map(|r| r["label"].as_str()).collect();
    assert_eq!(labels, ["rank 0", "rank 1"], "{}", v["table"]);
    for row in rows {
        let reserved = &row["reserved"];
        assert!(reserved.as_u64().is_some_and(|b| b > 0), "{row}");
        assert_eq!(reserved, &open["devices"][0]["reserved"], "{row}");
    }
}

#[test]
fn a_rank_pattern_with_no_socket_or_over_tcp_without_ranks_is_refused() {
    let dir = temp_dir("live-no-ranks");
    let pattern = dir.join("job-{rank}.sock").display().to_string();
    let out = vramscope()
        .args(["attach", &pattern, "--json"])
        .output()
        .expect("attach");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("job-0.sock does not exist"), "{err}");
    let out = vramscope()
        .args(["attach", "127.0.0.1:70{rank}", "--json", "--token", "t"])
        .output()
        .expect("attach");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--ranks N"), "{err}");
}

/// Ctrl-C during a headless attach prints the report of what came so far
/// (the log up to the moment) and exits 0; the job goes on.
#[test]
fn ctrl_c_prints_the_report_so_far() {
    let dir = temp_dir("live-ctrl-c");
    let socket = dir.join("job.sock");
    let mut job = start_rank(socket.to_str().expect("utf-8"), None, 0);
    job.wait_for("vramscope attach ");
    let attach = vramscope()
        .args(["attach", socket.to_str().expect("utf-8"), "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("attach");
    job.wait_for("vramscope attached");
    // The job waits for "go": attach has the log so far and nothing more.
    std::thread::sleep(Duration::from_millis(500));
    let pid = libc::pid_t::try_from(attach.id()).expect("pid");
    // SAFETY: kill only sends a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let out = attach.wait_with_output().expect("attach");
    job.go();
    assert!(job.child.wait().expect("job").success(), "the job goes on");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["live"]["ended"], "stopped by Ctrl-C while the job ran");
    // The three entries made before start() are the start state; none since.
    assert_eq!(v["devices"][0]["trace_entries"], 0, "{}", v["devices"][0]);
    assert!(v["devices"][0]["reserved"].as_u64().is_some_and(|b| b > 0));
}

/// A loop captured on an H100 that keeps every step's output (8 MiB a step,
/// `vramscope open` flags `_mnist_mlp.py:25 in forward`), played live: the
/// job's own Optimizer.step hook delimits the steps, and attach flags the
/// same line with the same growth; the fixed loop gets no finding.
#[test]
fn a_captured_leak_played_live_is_flagged_as_open_flags_it() {
    let captured = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch/captured");
    let mut flagged = Vec::new();
    for name in ["store_outputs_bug", "store_outputs_fixed"] {
        let file = captured.join(format!("{name}.pickle"));
        let dir = temp_dir(&format!("live-{name}"));
        let socket = dir.join("job.sock").display().to_string();
        let mut job = Job::start(
            &file,
            &socket,
            0,
            &["--no-mark-step", "--poll", "50", "--pause-ms", "5"],
        );
        job.wait_for("vramscope attach ");
        let attach = attach_json(&socket, &[]);
        job.wait_for("vramscope attached");
        let live = go_and_report(&mut job, attach);
        let (code, open, err) =
            common::vramscope(&["open", "--json", file.to_str().expect("utf-8")]);
        assert_eq!(code, 0, "{err}");
        let open = common::json(&open);
        let leaks = |r: &Value| -> Vec<(String, i64)> {
            r["devices"][0]["leaks"]["findings"]
                .as_array()
                .map(|f| {
                    f.iter()
                        .map(|f| {
                            (
                                f["root"].as_str().unwrap_or_default().to_string(),
                                f["growth_per_iter"].as_i64().unwrap_or_default(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(leaks(&live), leaks(&open), "{name}");
        assert_eq!(live["live"]["step_source"], "Optimizer.step", "{name}");
        // The job's own memory_stats() after its steps (at most 10 a
        // second) tell the same creep, whatever the trace kept.
        let trend = &live["live"]["memory_per_step"][0];
        assert!(trend["readings"].as_u64() >= Some(2), "{name}: {trend}");
        let slope = trend["allocated_per_step"].as_i64().expect("a slope");
        let expected: i64 = if name.ends_with("bug") { 8 << 20 } else { 0 };
        assert!(
            (slope - expected).abs() < 1 << 20,
            "{name}: {slope} bytes a step, {expected} expected: {trend}"
        );
        flagged.push(leaks(&live));
    }
    assert_eq!(
        flagged[0],
        [("_mnist_mlp.py:25 in forward".to_string(), 8 << 20)],
        "the bug's leak"
    );
    assert!(flagged[1].is_empty(), "the fixed loop: {:?}", flagged[1]);
}

/// The view's request reaches the job: `find_holders` over the connection
/// makes the helper walk at its next step and send a `holders` report
/// answering it (the stand-in job holds no tensors of its own: the walk
/// finds no chain, and says so).
#[test]
fn a_request_for_holders_is_answered_at_the_next_step() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;
    use vramscope::job::{connect, decode, Address, Session};

    let dir = temp_dir("live-holders");
    let socket = dir.join("job.sock");
    let mut job = start_rank(socket.to_str().expect("utf-8"), None, 0);
    job.wait_for("vramscope attach ");
    let addr = Address::parse(socket.to_str().expect("utf-8")).expect("address");
    let c = connect(&addr, None, Arc::new(AtomicBool::new(false))).expect("connects");
    job.wait_for("vramscope attached");
    c.requests.find_holders().expect("sent");
    // The helper reads a client's frames between its sends (every 0.5 s at most).
    std::thread::sleep(Duration::from_millis(1500));
    job.go();
    let mut frames = c.frames;
    let mut session = Session::new("job");
    while let Ok(Some((i, bytes))) = frames.next_frame() {
        if let Ok(Some(m)) = decode("job", i, bytes) {
            session.apply(i, m).expect("applies");
        }
        if session.ended().is_some() {
            break;
        }
    }
    assert!(job.child.wait().expect("job").success());
    let asked: Vec<_> = session
        .holders()
        .iter()
        .filter(|h| h.reason == "requested")
        .collect();
    assert_eq!(asked.len(), 1, "{:?}", session.holders());
    // At the job's first step: its mark_step().
    assert_eq!(asked[0].step, Some(0));
    assert!(asked[0].complete);
}
