//! The real binary in a real terminal (tmux): `vramscope` opens the guided
//! tour, the map, the timeline and a leak finding appear, and `q` leaves the
//! terminal as it was. The tmux helpers are here, the tests by subject in
//! tests/tui_tmux/ (the scenario views, snapshot files, live views).

mod common;
#[path = "tui_tmux/files.rs"]
mod files;
#[path = "tui_tmux/live.rs"]
mod live;
#[path = "tui_tmux/scenario_views.rs"]
mod scenario_views;

use std::process::Command;
use std::time::{Duration, Instant};

use common::live_job::Job;

thread_local! {
    /// The socket of this test's own tmux server (set by [`start`]).
    static SOCKET: std::cell::RefCell<Option<std::path::PathBuf>> =
        const { std::cell::RefCell::new(None) };
}

/// tmux on the running test's own server (`-S`, a socket in the temp dir
/// that [`start`]'s cleanup removes): tests never share a server that exits
/// as its last session ends while another is starting, and leave nothing.
fn tmux(args: &[&str]) -> Option<String> {
    let mut cmd = Command::new("tmux");
    if let Some(socket) = SOCKET.with(|s| s.borrow().clone()) {
        cmd.arg("-S").arg(socket);
    }
    let out = cmd.args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// These tests need tmux: without it they fail and say how to install it
/// (a test that checked nothing never counts as passed).
fn require_tmux() {
    assert!(
        tmux(&["-V"]).is_some(),
        "tmux is not installed: the terminal tests drive the real binary in tmux. \
         Install it (Debian/Ubuntu: sudo apt-get install tmux; macOS: brew install tmux)"
    );
}

/// A detached `width`×`height` session running `command` in a plain bash;
/// returns what kills it.
fn start<'a>(session: &'a str, width: u16, height: u16, command: &str) -> impl Fn() + 'a {
    let (w, h) = (width.to_string(), height.to_string());
    let socket = std::env::temp_dir().join(format!("vramscope-tmux-{session}"));
    SOCKET.with(|s| *s.borrow_mut() = Some(socket.clone()));
    tmux(&[
        "new-session",
        "-d",
        "-s",
        session,
        "-x",
        &w,
        "-y",
        &h,
        "bash",
        "--norc",
        "--noprofile",
    ])
    .expect("tmux session");
    tmux(&["send-keys", "-t", session, command, "Enter"]).expect("send");
    move || {
        let _ = tmux(&["kill-server"]);
        let _ = std::fs::remove_file(&socket);
    }
}

fn wait_for(session: &str, what: impl Fn(&str) -> bool, limit: Duration) -> Option<String> {
    let start = Instant::now();
    while start.elapsed() < limit {
        let screen = tmux(&["capture-pane", "-p", "-t", session]).unwrap_or_default();
        if what(&screen) {
            return Some(screen);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// Press `q` and wait for the shell after vramscope to say it exited 0;
/// the screen then, or `None`.
fn quit_cleanly(session: &str) -> Option<String> {
    tmux(&["send-keys", "-t", session, "q"]).expect("quit");
    wait_for(session, |s| s.contains("EXITED:0"), Duration::from_secs(15))
}

/// The status line says every event is in: the count has no `+` (more to
/// come), and nothing is being read, placed or followed live.
fn all_read(screen: &str) -> bool {
    let status = screen.lines().next().unwrap_or_default();
    let count = status
        .split("event ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next());
    count.is_some_and(|c| !c.ends_with('+'))
        && !["reading", "placing", "LIVE"]
            .iter()
            .any(|w| status.contains(w))
}
