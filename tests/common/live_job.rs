//! The stand-in training job of the live tests: `python/tests/live_job.py`
//! (the helper in poll mode over the stand-in torch, replaying a snapshot),
//! with its stderr lines as they come.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct Job {
    pub child: Child,
    lines: mpsc::Receiver<String>,
}

impl Job {
    /// The job playing `snapshot` at `address` as rank `rank`, with
    /// live_job.py's `extra` options.
    pub fn start(snapshot: &Path, address: &str, rank: u32, extra: &[&str]) -> Job {
        let mut child = Command::new("python3")
            .arg("python/tests/live_job.py")
            .arg(snapshot)
            .arg(address)
            .args(extra)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("RANK", rank.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("python3 could not be run ({e}): these tests need python3"));
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Job { child, lines }
    }

    /// The next stderr line that contains `what` (20 s at most).
    pub fn wait_for(&self, what: &str) -> String {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(20)) {
                Ok(line) if line.contains(what) => return line,
                Ok(_) => {}
                Err(e) => panic!("the job never said {what:?}: {e}"),
            }
        }
    }

    /// Let the job, waiting after `start()`, play the rest of its trace.
    pub fn go(&mut self) {
        self.child
            .stdin
            .as_mut()
            .expect("stdin")
            .write_all(b"go\n")
            .expect("go");
    }
}
