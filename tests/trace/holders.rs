//! The program's holder walks under trace: the budget (`--holders-budget`)
//! refused when it is no time, none walked at zero, and a walk the view
//! asks for reaching the traced program.

use std::path::PathBuf;

use serde_json::Value;

use super::{common, python, traced_json, Scratch};

/// `--holders-budget` is milliseconds, 0 or more; refused before anything runs.
#[test]
fn a_holder_budget_that_is_no_time_is_refused() {
    for bad in ["-1", "NaN", "inf"] {
        let (code, _, err) = common::vramscope(&[
            "trace",
            &format!("--holders-budget={bad}"),
            "--",
            "python3",
            "-c",
            "pass",
        ]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains("--holders-budget"), "{bad}: {err}");
    }
}
/// `--holders-budget 0`: the program runs as before, and no walk is made.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_holder_budget_of_zero_makes_no_walk() {
    let program = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/gpu/holders_job.py");
    let (off, err) = traced_json(&program, &["--steps", "4", "--holders-budget", "0"]);
    assert_eq!(off["trace"]["steps"], 4, "{err}");
    assert_eq!(off["live"]["holders"], serde_json::json!([]), "{err}");
    let (on, err) = traced_json(&program, &["--steps", "4"]);
    assert_eq!(
        on["live"]["holders"].as_array().map(Vec::len),
        Some(3),
        "{err}"
    );
    assert_eq!(on["live"]["growth"], off["live"]["growth"]);
}
/// A program whose globals hold a ctypes library loader (it loads a library
/// named after any attribute asked of it, and raises OSError for "func")
/// and that keeps each step's loss with its graph.
const LOADER_AND_LEAK: &str = r#"
import sys
from ctypes import cdll
import torch
model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
history = []
for _ in range(5):
    x = torch.randn(1024, 1024, device="cuda")
    history.append(torch.relu(model(x)).sum())
    opt.step()
print("ended", len(history), file=sys.stderr)
"#;
/// The walk reads the program's objects: one that raises when read neither
/// ends the program (it ran to its end, its own output says so) nor hides
/// the holder that grew.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn an_object_that_raises_when_read_does_not_end_the_program() {
    let dir = Scratch::new("holders-loader");
    let program = dir.file("loader_and_leak.py", LOADER_AND_LEAK);
    let (code, out, err) = super::trace(&["--json", "--steps", "0"], &program, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("ended 5"), "{err}");
    assert!(!err.contains("could not find what holds"), "{err}");
    let v = common::json(&out);
    assert_eq!(v["trace"]["steps"], 5, "{err}");
    let walks = v["live"]["holders"].as_array().expect("holders");
    assert!(!walks.is_empty(), "{err}");
    for w in walks {
        let chains = w["chains"].as_array().expect("chains");
        assert!(chains.iter().any(|c| c["path"][0] == "history"), "{w}");
    }
}
/// A program that holds a tensor in a named variable and runs ops, with no
/// optimizer step (so no walk of its own), until told to stop.
const HOLDS_AND_RUNS: &str = r#"
import os, sys, time, torch
kept_weights = torch.empty(1 << 22, device="cuda")
deadline = time.time() + 60
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    y = kept_weights[:1024] * 2
    torch.cuda.memory_allocated()
"#;
/// A shared sink for the trace's live stream.
#[derive(Clone, Default)]
struct Stream(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
impl std::io::Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
impl Stream {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }

    fn wait_for(&self, what: &str) -> bool {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < until {
            if self.text().contains(what) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        false
    }
}
/// `H` in a trace's view: the view's request (PROTOCOL.md `find_holders`,
/// through the same `Requester` `attach` writes to) reaches the traced
/// program's helper ahead of its next answer, which walks at its next op
/// boundary: the stream gets a `holders` message, `reason: "requested"`,
/// naming the variable that holds the tensor, as `attach` shows a job's.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn a_walk_asked_by_the_view_reaches_the_traced_program() {
    let s = Scratch::new("walk-asked");
    let prog = s.file("holds.py", HOLDS_AND_RUNS);
    let stop = s.0.join("stop");
    let opts = vramscope::traced::TraceOptions {
        gpu: vramscope::device::profile("H100-SXM-80GB").expect("H100"),
        steps: None,
        conf: None,
        command: vec![
            python(),
            prog.to_string_lossy().into_owned(),
            stop.to_string_lossy().into_owned(),
        ],
        output: vramscope::traced::ChildOutput::Capture,
        want_snapshot: false,
        save_requests: None,
        holders_budget_ms: vramscope::traced::HOLDERS_BUDGET_MS,
    };
    let stream = Stream::default();
    let run = vramscope::traced::start(opts, Box::new(stream.clone())).expect("the trace starts");
    let running = stream.wait_for("\"entries\"");
    let asked = running && run.requester().find_holders().is_ok();
    let walked = asked && stream.wait_for("\"requested\"");
    std::fs::write(&stop, b"").expect("the stop file");
    let output = String::from_utf8_lossy(&run.output()).into_owned();
    let (outcome, _) = run.join().expect("the trace ends");
    assert!(running, "the program never ran: {output}");
    assert!(walked, "no walk came: {}", stream.text());
    assert_eq!(
        outcome.steps, 0,
        "no optimizer step: the walk was asked for"
    );
    let bytes = stream.0.lock().expect("not poisoned").clone();
    let mut frames = vramscope::job::FrameReader::new(bytes.as_slice(), "the stream");
    let mut holders = Vec::new();
    while let Some((_, b)) = frames.next_frame().expect("framed") {
        let v: Value = serde_json::from_slice(b).expect("JSON");
        if v["t"] == "holders" {
            holders.push(v);
        }
    }
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0]["reason"], "requested");
    assert!(
        holders[0].to_string().contains("kept_weights"),
        "{}",
        holders[0]
    );
}
