//! The real binary in a real terminal (tmux): `vramscope` opens the guided
//! tour, the map, the timeline and a leak finding appear, and `q` leaves the
//! terminal as it was.

use std::process::Command;
use std::time::{Duration, Instant};

mod common;

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

#[test]
fn guided_tour_in_a_real_terminal() {
    require_tmux();
    let session = format!("vramscope-test-{}", std::process::id());
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let cleanup = start(&session, 150, 46, &format!("{bin}; echo EXITED:$?"));
    // The tour stops at each narration: space goes on, as a teacher would,
    // once per stop (a screen not yet redrawn after the first press would
    // take a second one as "pause").
    let pressed_at = std::cell::RefCell::new(String::new());
    let shown = wait_for(
        &session,
        |s| {
            let status = s.lines().next().unwrap_or_default();
            if s.contains("narration: space goes on") && *pressed_at.borrow() != status {
                *pressed_at.borrow_mut() = status.to_string();
                let _ = tmux(&["send-keys", "-t", &session, " "]);
            }
            s.contains("Memory map")
                && s.contains("Timeline")
                && s.contains("val_total")
                && s.contains("retained graph")
        },
        Duration::from_secs(60),
    );
    let Some(screen) = shown else {
        let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
        cleanup();
        panic!("the map, the timeline and the val_total leak did not appear:\n{last}");
    };
    assert!(
        screen.contains("large pool"),
        "segments are drawn by pool:\n{screen}"
    );
    assert_eq!(
        tmux(&["display", "-p", "-t", &session, "#{alternate_on}"])
            .as_deref()
            .map(str::trim),
        Some("1"),
        "the UI runs on the alternate screen"
    );
    let back = quit_cleanly(&session);
    let alternate = tmux(&["display", "-p", "-t", &session, "#{alternate_on}"]);
    let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
    cleanup();
    assert!(back.is_some(), "q did not quit cleanly:\n{last}");
    assert_eq!(
        alternate.as_deref().map(str::trim),
        Some("0"),
        "the terminal is back on the main screen"
    );
    assert!(
        !last.contains("Memory map"),
        "no UI is left on screen:\n{last}"
    );
}

/// `vramscope watch` in a terminal: with NVML, the live view appears and `q`
/// leaves with status 0; without a driver, a plain message and status 3
/// (never a panic, never a terminal left in raw mode).
#[test]
fn watch_in_a_real_terminal() {
    require_tmux();
    let session = format!("vramscope-watch-{}", std::process::id());
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let cleanup = start(&session, 120, 40, &format!("{bin} watch; echo EXITED:$?"));
    let nvml = vramscope::device::nvml::available().is_ok();
    if nvml {
        let shown = wait_for(
            &session,
            |s| s.contains("vramscope watch") && s.contains("Reconciliation · GPU 0"),
            Duration::from_secs(20),
        );
        if shown.is_none() {
            let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
            cleanup();
            panic!("the watch view did not appear:\n{last}");
        }
        let _ = tmux(&["send-keys", "-t", &session, "q"]);
    }
    let want = if nvml { "EXITED:0" } else { "EXITED:3" };
    let done = wait_for(&session, |s| s.contains(want), Duration::from_secs(20));
    cleanup();
    let Some(screen) = done else {
        panic!("watch did not exit with {want}");
    };
    assert!(!screen.contains("panicked"), "{screen}");
    if !nvml {
        assert!(screen.contains("no NVIDIA driver found"), "{screen}");
    }
}

/// Every real snapshot, every device it holds, opened in a real terminal:
/// at its last event the Stats panel shows the reserved bytes and the
/// segment count that `open --json` reports for that device.
#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn every_real_snapshot_ends_in_the_terminal_where_the_report_says() {
    require_tmux();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let mut files: Vec<_> = std::fs::read_dir(common::real_dir())
        .expect("the real snapshots")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    files.sort();
    let mut wrong = Vec::new();
    for (n, file) in files.iter().enumerate() {
        let path = file.to_str().expect("utf-8 path");
        let (code, out, err) = common::vramscope(&["open", path, "--json"]);
        assert_eq!(code, 0, "{path}: {err}");
        let report = common::json(&out);
        for d in report["devices"].as_array().expect("devices") {
            let device = d["device"].as_u64().expect("device");
            let reserved = vramscope::alloc::format_size(d["reserved"].as_u64().expect("reserved"));
            let segments = d["segments"].as_u64().expect("segments");
            let session = format!("vramscope-real-{}-{n}-{device}", std::process::id());
            let cleanup = start(
                &session,
                200,
                60,
                &format!("{bin} open '{path}' --device {device}; echo EXITED:$?"),
            );
            let done = wait_for(&session, all_read, Duration::from_secs(60));
            tmux(&["send-keys", "-t", &session, " "]).expect("pause");
            tmux(&["send-keys", "-t", &session, "G"]).expect("end");
            let want_reserved = format!("reserved {reserved}");
            let want_segments = format!("segments {segments} (");
            let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
            let shown = wait_for(
                &session,
                |s| {
                    let s = flat(s);
                    s.contains(&want_reserved) && s.contains(&want_segments)
                },
                Duration::from_secs(10),
            );
            let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
            let quit = quit_cleanly(&session);
            cleanup();
            let name = file.file_name().unwrap_or_default().to_string_lossy();
            if done.is_none() || shown.is_none() || quit.is_none() {
                wrong.push(format!(
                    "{name} device {device}: want {want_reserved:?} and {want_segments:?}; loaded {}, quit {}:\n{last}",
                    done.is_some(),
                    quit.is_some()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

/// A teacher opens the tour paused at 80×24: seconds later the cursor is
/// still at the start with the premise on screen; space starts it, and
/// auto-pause (on for the tour) holds it at the next narration.
#[test]
fn paused_tour_waits_for_space() {
    require_tmux();
    let (tour, _) = vramscope::scenario::resolve("tour").expect("the tour");
    let words = |k: usize| -> String { tour.narration[k].text.chars().take(24).collect() };
    let session = format!("vramscope-paused-{}", std::process::id());
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let cleanup = start(&session, 80, 24, &format!("{bin} --paused; echo EXITED:$?"));
    let premise = words(0);
    let opened = wait_for(
        &session,
        |s| s.contains("⏸ paused") && s.contains(&premise) && all_read(s),
        Duration::from_secs(60),
    );
    std::thread::sleep(Duration::from_secs(3));
    let later = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
    let status = later.lines().next().unwrap_or_default().to_string();
    tmux(&["send-keys", "-t", &session, " "]).expect("space");
    let next = words(1);
    let held = wait_for(
        &session,
        |s| s.contains(&next) && s.contains("narration: space goes on"),
        Duration::from_secs(20),
    );
    let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
    let quit = quit_cleanly(&session);
    cleanup();
    assert!(opened.is_some(), "the paused tour did not open:\n{last}");
    assert!(
        status.contains("⏸ paused") && status.contains("event 0/") && status.contains("? help"),
        "moved while paused: {status}"
    );
    assert!(
        later.contains(&premise),
        "the premise left the screen:\n{later}"
    );
    assert!(
        held.is_some(),
        "space did not play to the next narration:\n{last}"
    );
    assert!(
        !last.lines().next().unwrap_or_default().contains("event 0/"),
        "{last}"
    );
    assert!(quit.is_some(), "q did not quit");
}

/// A teacher's walk: the tour in the presenter layout, opened paused, stepped
/// by phase (`p`) to the first backward; the code pane marks
/// `loss.backward()` with `▶` and draws it in reverse video.
#[test]
fn presenter_steps_by_phase_to_loss_backward() {
    require_tmux();
    let session = format!("vramscope-presenter-{}", std::process::id());
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let command = format!("{bin} --layout presenter --paused; echo EXITED:$?");
    let cleanup = start(&session, 100, 30, &command);
    let opened = wait_for(
        &session,
        |s| s.contains("┌ code") && all_read(s),
        Duration::from_secs(60),
    );
    let mut backward = None;
    for _ in 0..12 {
        tmux(&["send-keys", "-t", &session, "p"]).expect("p");
        let at_backward = |s: &str| s.lines().next().is_some_and(|l| l.contains(" backward"));
        backward = wait_for(&session, at_backward, Duration::from_millis(600));
        if backward.is_some() {
            break;
        }
    }
    let styled = tmux(&["capture-pane", "-p", "-e", "-t", &session]).unwrap_or_default();
    let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
    let quit = quit_cleanly(&session);
    cleanup();
    assert!(
        opened.is_some(),
        "the presenter layout has no code pane:\n{last}"
    );
    let Some(screen) = backward else {
        panic!("p never reached the backward phase:\n{last}");
    };
    assert!(
        !screen.contains("Stats ·") && !screen.contains("Events ·"),
        "the presenter shows no stats or event log:\n{screen}"
    );
    let lit = screen
        .lines()
        .find(|l| l.contains("│▶"))
        .unwrap_or_default();
    assert!(lit.contains("loss.backward()"), "{screen}");
    let reversed = styled
        .lines()
        .find(|l| l.contains("loss.backward()"))
        .and_then(|l| l.split_once("loss.backward()"))
        .is_some_and(|(before, _)| before.contains("\u{1b}[7m"));
    assert!(
        reversed,
        "loss.backward() is not in reverse video:\n{styled}"
    );
    assert!(quit.is_some(), "q did not quit");
}

/// CPU seconds (user + system) the process `pid` has used so far.
#[cfg(target_os = "linux")]
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command's closing parenthesis; utime and stime
    // are the 14th and 15th of the line, in clock ticks (100 a second).
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Once a file is read and playback has reached its end, the UI waits for
/// keys: it does not spin.
#[cfg(target_os = "linux")]
#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn an_opened_file_leaves_the_cpu_idle() {
    require_tmux();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let file = common::real_dir().join("code-location_expandable_3gpu_oom.pickle");
    let path = file.to_str().expect("utf-8 path");
    let session = format!("vramscope-idle-{}", std::process::id());
    let cleanup = start(&session, 120, 40, &format!("exec {bin} open '{path}'"));
    let loaded = wait_for(&session, all_read, Duration::from_secs(60));
    tmux(&["send-keys", "-t", &session, "G"]).expect("end");
    std::thread::sleep(Duration::from_millis(500));
    let pid = tmux(&["display-message", "-p", "-t", &session, "#{pane_pid}"])
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let before = cpu_seconds(&pid);
    std::thread::sleep(Duration::from_secs(2));
    let after = cpu_seconds(&pid);
    cleanup();
    assert!(loaded.is_some(), "never read the whole file");
    let (Some(before), Some(after)) = (before, after) else {
        panic!("no process {pid:?} to measure");
    };
    assert!(
        after - before < 0.3,
        "{:.2} CPU seconds in 2 s of waiting for keys",
        after - before
    );
}

/// `vramscope sweep` in a terminal: the chart of the scenario's own points
/// appears with the fit, → selects the next point, Enter opens that point's
/// run in the run view, q comes back to the chart and q again leaves.
#[test]
fn sweep_chart_in_a_real_terminal() {
    require_tmux();
    let session = format!("vramscope-sweep-{}", std::process::id());
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let cleanup = start(
        &session,
        140,
        44,
        &format!("{bin} sweep resnet50-batch-sweep; echo EXITED:$?"),
    );
    let chart = wait_for(
        &session,
        |s| s.contains("7 of 7 points") && s.contains("Peak allocated ≈"),
        Duration::from_secs(30),
    );
    let step = |keys: &[&str], what: &dyn Fn(&str) -> bool| {
        for k in keys {
            tmux(&["send-keys", "-t", &session, k]).expect("keys");
        }
        wait_for(&session, what, Duration::from_secs(30))
    };
    let second = chart.and_then(|_| step(&["Right"], &|s| s.contains("batch 2 │ peak allocated")));
    let run = second.and_then(|_| {
        step(&["Enter"], &|s| {
            s.contains("resnet50-batch-sweep · batch 2") && s.contains("Memory map")
        })
    });
    let back = run.and_then(|_| step(&["q"], &|s| s.contains("batch 2 │ peak allocated")));
    let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
    let quit = back.and_then(|_| quit_cleanly(&session));
    cleanup();
    assert!(
        quit.is_some(),
        "chart → point → run → chart → quit broke here:\n{last}"
    );
}

/// A teacher's class in a real terminal, at 80×24 and 120×40: intro →
/// question → answer → the part's run (its status says `lesson · part 1`)
/// → `q` back to the same part → `g 7 Enter` to part 7 → `q` asks, `q`
/// quits; opened again, the introduction offers part 7 and `r` goes there.
/// The place is kept under a scratch `XDG_STATE_HOME`, removed after.
#[test]
fn lesson_in_a_real_terminal() {
    require_tmux();
    for (w, h) in [(80u16, 24u16), (120, 40)] {
        let state = common::temp_dir(&format!("lesson-state-{w}"));
        let session = format!("vramscope-lesson-{w}-{}", std::process::id());
        let bin = env!("CARGO_BIN_EXE_vramscope");
        let command = format!(
            "export XDG_STATE_HOME={}; {bin} lesson leaks; echo EXITED:$?",
            state.display()
        );
        let cleanup = start(&session, w, h, &command);
        let (path, last) = lesson_class(&session);
        let resumed = path.and_then(|_| {
            tmux(&["send-keys", "-t", &session, "clear", "Enter"]).expect("clear");
            tmux(&["send-keys", "-t", &session, &command, "Enter"]).expect("again");
            wait_for(
                &session,
                |s| s.contains("r resume at part 7"),
                Duration::from_secs(30),
            )
        });
        let resumed = resumed.and_then(|_| {
            tmux(&["send-keys", "-t", &session, "r"]).expect("r");
            wait_for(
                &session,
                |s| s.contains("part 7 of 11") && s.contains("answered 1/11 · 1 right"),
                Duration::from_secs(15),
            )
        });
        let saved = std::fs::read_to_string(state.join("vramscope/lessons/leaks.json"));
        let end = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
        if resumed.is_some() {
            tmux(&["send-keys", "-t", &session, "q", "q"]).expect("quit");
        }
        cleanup();
        assert!(
            resumed.is_some(),
            "at {w}×{h}: the class broke here:\n{last}\nthen:\n{end}"
        );
        assert!(
            saved.is_ok_and(|t| t.contains("\"Part\": 6")),
            "the place is on disk"
        );
    }
}

/// The first sitting of [`lesson_in_a_real_terminal`]: the screen it
/// ended on if it went all the way, and the last screen seen.
fn lesson_class(session: &str) -> (Option<String>, String) {
    let step = |keys: &[&str], what: &dyn Fn(&str) -> bool| {
        for k in keys {
            tmux(&["send-keys", "-t", session, k]).expect("keys");
        }
        wait_for(session, what, Duration::from_secs(30))
    };
    let intro = wait_for(
        session,
        |s| s.contains("leaks │ introduction"),
        Duration::from_secs(30),
    );
    let question = intro.and_then(|_| {
        step(&["Enter"], &|s| {
            s.contains("part 1 of 11") && s.contains("Your answer?")
        })
    });
    // The choices in the order the lesson's own seed gives (as the text and
    // the JSON show them); the answer is revealed only after its key.
    let shown = vramscope::lesson::shuffled(
        &vramscope::lesson::resolve_lesson("leaks")
            .expect("built-in")
            .lesson,
        vramscope::lesson::default_seed("leaks"),
    );
    let right = shown.parts[0].answer;
    let right_at = (right as u8 - b'a') as usize;
    let opening: String = shown.parts[0].choices[right_at].chars().take(24).collect();
    let question = question.filter(|s| s.contains(&format!("{right}) {opening}")));
    let key = right.to_string();
    let answered = question.and_then(|_| {
        step(&[key.as_str()], &|s| {
            s.contains(&format!("Right: {right}."))
        })
    });
    let run = answered.and_then(|_| {
        step(&["Enter"], &|s| {
            // Taught like the tour: the run stops at its first narration;
            // its status says which lesson part it is, its keys that q goes back.
            s.contains("lesson · part 1")
                && s.contains("Memory map")
                && s.contains("narration: space goes on")
                && s.contains("q lesson")
        })
    });
    let back = run.and_then(|_| {
        step(&["q"], &|s| {
            s.contains("part 1 of 11")
                && s.contains("back from part 1's run")
                && s.contains("answered 1/11 · 1 right")
        })
    });
    let seventh = back.and_then(|_| {
        step(&["g", "7", "Enter"], &|s| {
            s.contains("part 7 of 11") && s.contains("Your answer?")
        })
    });
    let asked = seventh.and_then(|_| step(&["q"], &|s| s.contains("Quit the lesson?")));
    let gone = asked.and_then(|_| step(&["q"], &|s| s.contains("EXITED:0")));
    let last = tmux(&["capture-pane", "-p", "-t", session]).unwrap_or_default();
    (gone, last)
}

/// The scale labels (`140.80 MiB┤`) at the top left of each timeline.
fn scale_labels(screen: &str) -> Vec<String> {
    screen
        .lines()
        .flat_map(|l| l.split('│'))
        .filter_map(|cell| {
            cell.split_once('┤')
                .map(|(label, _)| label.trim().to_string())
        })
        .filter(|label| label.ends_with("B"))
        .collect()
}

/// Compare in a real terminal: both timelines on one y scale (the same
/// label on each), then `?` at 80×24 scrolls down to the quit key, and `q`
/// quits.
#[test]
fn compare_shares_one_scale_and_help_reaches_quit_at_80x24() {
    require_tmux();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let session = format!("vramscope-compare-{}", std::process::id());
    let cleanup = start(
        &session,
        160,
        44,
        &format!(
            "{bin} compare accumulate-loss-eval-bug accumulate-loss-eval-fixed --speed 1000000; echo EXITED:$?"
        ),
    );
    let shown = wait_for(
        &session,
        |s| all_read(s) && scale_labels(s).len() == 2,
        Duration::from_secs(60),
    );
    let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
    let quit = quit_cleanly(&session);
    cleanup();
    let screen = shown.unwrap_or_else(|| panic!("two timelines with scales:\n{last}"));
    let status = screen.lines().next().unwrap_or_default();
    assert!(
        status.contains("⏸ paused") && status.contains("event 0/"),
        "compare opens paused at the start: {status}"
    );
    let labels = scale_labels(&screen);
    assert_eq!(labels[0], labels[1], "one scale for both runs:\n{screen}");
    assert!(quit.is_some(), "q did not quit compare");

    let session = format!("vramscope-help-{}", std::process::id());
    let cleanup = start(&session, 80, 24, &format!("{bin} --paused; echo EXITED:$?"));
    let opened = wait_for(&session, |s| s.contains("? help"), Duration::from_secs(60));
    tmux(&["send-keys", "-t", &session, "?"]).expect("help");
    let help = wait_for(&session, |s| s.contains("help"), Duration::from_secs(10));
    let mut reached = false;
    for _ in 0..60 {
        let s = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
        // The key's own entry, not the box's footer or the hint line.
        if s.lines().any(|l| l.contains("q  ctrl-c  quit")) {
            reached = true;
            break;
        }
        tmux(&["send-keys", "-t", &session, "j"]).expect("scroll");
        std::thread::sleep(Duration::from_millis(150));
    }
    let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
    tmux(&["send-keys", "-t", &session, "Escape"]).expect("close help");
    // Wait for the help to close: Esc and q sent together read as Alt-q,
    // and q in the help closes the help rather than quitting.
    let closed = wait_for(&session, |s| !s.contains(" Keys "), Duration::from_secs(10));
    assert!(closed.is_some(), "Esc closes the help");
    let quit = quit_cleanly(&session);
    cleanup();
    assert!(opened.is_some() && help.is_some(), "{last}");
    assert!(reached, "help never showed the quit key:\n{last}");
    assert!(quit.is_some(), "q did not quit after help:\n{last}");
}

/// `open a b c`: one tab per file on the top line; `w` shows the next, `T`
/// the table across them, `A` the diff against the tab before, and `q`
/// leaves from there.
#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn several_files_open_as_tabs_in_a_real_terminal() {
    require_tmux();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let dir = common::real_dir();
    let files: Vec<String> = [
        "adam-step_closed-trace_annotations.pickle",
        "code-location_expandable_3gpu_oom.pickle",
        "no-such-file.pickle",
    ]
    .iter()
    .map(|f| dir.join(f).display().to_string())
    .collect();
    let session = format!("vramscope-tabs-{}", std::process::id());
    let cleanup = start(
        &session,
        160,
        44,
        &format!(
            "{bin} open '{}' '{}' '{}'; echo EXITED:$?",
            files[0], files[1], files[2]
        ),
    );
    let bar = |s: &str| {
        s.lines().next().is_some_and(|l| {
            l.contains("1 adam-step") && l.contains("OOM") && l.contains("3 no-such-file.pickle ✗")
        })
    };
    let opened = wait_for(&session, bar, Duration::from_secs(30));
    tmux(&["send-keys", "-t", &session, "w"]).expect("next tab");
    let second = wait_for(
        &session,
        |s| s.contains("Memory map · code-location"),
        Duration::from_secs(10),
    );
    tmux(&["send-keys", "-t", &session, "T"]).expect("table");
    let table = wait_for(
        &session,
        |s| s.contains("Across tabs") && s.contains("yes @421") && s.contains("No such file"),
        Duration::from_secs(10),
    );
    tmux(&["send-keys", "-t", &session, "A"]).expect("diff");
    let diff = wait_for(
        &session,
        |s| s.contains("Alive in tab 2 and not in tab 1"),
        Duration::from_secs(10),
    );
    let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
    let quit = quit_cleanly(&session);
    cleanup();
    assert!(opened.is_some(), "the tab bar\n{last}");
    assert!(second.is_some(), "w: the second tab\n{last}");
    assert!(table.is_some(), "T: the table\n{last}");
    assert!(diff.is_some(), "A: the diff\n{last}");
    assert!(quit.is_some(), "q leaves with status 0\n{last}");
}

/// `attach` in a real 80×24 terminal to a job the Python helper serves
/// (python/tests/live_job.py: the stand-in torch replaying one of the
/// project's H100 captures): the view grows live, the by-line pane shows what grew since
/// the last step, the status says when the job ended, and `q` leaves.
#[test]
fn attach_to_a_running_job_in_a_real_terminal() {
    require_tmux();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let dir = common::temp_dir("tmux-attach");
    let socket = dir.join("job.sock").display().to_string();
    let snapshot = common::capture("peak_inside_step");
    let mut job = Job::start(&snapshot, &socket, 0, &[]);
    job.wait_for("vramscope attach ");
    let session = format!("vramscope-attach-{}", std::process::id());
    let cleanup = start(
        &session,
        80,
        24,
        &format!("{bin} attach '{socket}'; echo EXITED:$?"),
    );
    job.wait_for("vramscope attached");
    job.go();
    let ended = wait_for(
        &session,
        |s| s.contains("the job ended: the job finished"),
        Duration::from_secs(30),
    );
    // The job's last step ended after its last entry: nothing has grown
    // since it; S shows everything live, by the line that allocated it.
    tmux(&["send-keys", "-t", &session, "S"]).expect("S");
    let all_live = wait_for(
        &session,
        |s| s.contains("Live by Python line") && s.contains("_seed_train.py:"),
        Duration::from_secs(10),
    );
    let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
    let quit = quit_cleanly(&session);
    cleanup();
    let _ = job.child.wait();
    let Some(screen) = ended else {
        panic!("the status says the job ended\n{last}");
    };
    assert!(screen.contains("Memory map · pid "), "{screen}");
    assert!(screen.contains("Grown since step"), "{screen}");
    assert!(all_live.is_some(), "S: every live block by line\n{last}");
    assert!(quit.is_some(), "q leaves with status 0\n{last}");
}

/// `attach` to a two-rank job through a `{rank}` address in a real 80×24
/// terminal: one tab per rank, `T` the table across ranks labelled by rank.
#[test]
fn attach_to_every_rank_in_a_real_terminal() {
    require_tmux();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let dir = common::temp_dir("tmux-ranks");
    let pattern = dir.join("job-{rank}.sock").display().to_string();
    let snapshot = common::capture("peak_inside_step");
    let mut jobs: Vec<Job> = (0..2)
        .map(|rank| Job::start(&snapshot, &pattern, rank, &[]))
        .collect();
    for job in &jobs {
        job.wait_for("vramscope attach ");
    }
    let session = format!("vramscope-ranks-{}", std::process::id());
    let cleanup = start(
        &session,
        80,
        24,
        &format!("{bin} attach '{pattern}'; echo EXITED:$?"),
    );
    for job in &mut jobs {
        job.wait_for("vramscope attached");
        job.go();
    }
    let bar = wait_for(
        &session,
        |s| {
            s.lines()
                .next()
                .is_some_and(|l| l.contains("1 rank 0 · pid") && l.contains("2 rank 1 · pid"))
                && s.contains("the job ended")
        },
        Duration::from_secs(30),
    );
    tmux(&["send-keys", "-t", &session, "T"]).expect("table");
    let table = wait_for(
        &session,
        |s| s.contains("Across tabs") && s.contains("▶ rank 0") && s.contains("  rank 1"),
        Duration::from_secs(10),
    );
    let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
    let quit = quit_cleanly(&session);
    cleanup();
    for job in &mut jobs {
        let _ = job.child.wait();
    }
    assert!(bar.is_some(), "a tab per rank\n{last}");
    assert!(table.is_some(), "T: the table by rank\n{last}");
    assert!(quit.is_some(), "q leaves with status 0\n{last}");
}

/// The Python with PyTorch for the `trace` test (`VRAMSCOPE_PYTHON`, else
/// `python3`), or a failure saying what to install.
fn python_with_torch() -> String {
    let py = std::env::var("VRAMSCOPE_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", "import torch"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "`{py} -c 'import torch'` failed: install torch (pip install torch==2.11.*), or point \
         VRAMSCOPE_PYTHON at a Python that has it"
    );
    py
}

/// `vramscope trace` in a real 80×24 terminal: a tiny training script runs
/// on the simulated GPU, the map and the program's own lines show, the
/// status says the stream is all in, and `q` leaves with the trace's
/// summary (stopped after the steps asked) printed after the terminal is
/// restored.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn trace_a_script_in_a_real_terminal_at_80x24() {
    require_tmux();
    let py = python_with_torch();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let dir = common::temp_dir("tmux-trace");
    let script = dir.join("tiny.py");
    std::fs::write(
        &script,
        "import torch, torch.nn as nn\n\
         model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 10)).cuda()\n\
         opt = torch.optim.AdamW(model.parameters())\n\
         for step in range(10):\n\
         \x20   x = torch.randn(64, 512, device='cuda')\n\
         \x20   loss = model(x).sum()\n\
         \x20   loss.backward()\n\
         \x20   opt.step()\n\
         \x20   opt.zero_grad(set_to_none=True)\n",
    )
    .expect("the script");
    let session = format!("vramscope-trace-{}", std::process::id());
    let cleanup = start(
        &session,
        80,
        24,
        &format!(
            "{bin} trace --steps 2 -- {py} '{}'; echo EXITED:$?",
            script.display()
        ),
    );
    // The stream is all in (the program stopped after its steps): the
    // status says done, and the map's title names the simulated GPU.
    let ended = wait_for(
        &session,
        |s| {
            s.contains("Memory map · trace · H100-SXM-80GB")
                && s.lines().next().is_some_and(|l| l.contains("done"))
        },
        Duration::from_secs(120),
    );
    tmux(&["send-keys", "-t", &session, "S"]).expect("S");
    let by_line = wait_for(
        &session,
        |s| s.contains("Live by Python line") && s.contains("tiny.py:"),
        Duration::from_secs(10),
    );
    let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
    let quit = quit_cleanly(&session);
    cleanup();
    let Some(screen) = ended else {
        panic!("the map, and the status saying the stream is all in\n{last}");
    };
    assert!(
        screen.lines().all(|l| l.chars().count() <= 80),
        "fits 80 columns\n{screen}"
    );
    assert!(
        by_line.is_some(),
        "S: live blocks by the script's lines\n{last}"
    );
    let after = quit.unwrap_or_else(|| panic!("q leaves with status 0\n{last}"));
    assert!(
        after.contains("stopped after 2 optimizer steps"),
        "the trace's summary after the terminal UI\n{after}"
    );
}

/// `H` in `vramscope trace`'s view: the traced program's helper walks its
/// holders at its next op (no optimizer step here, so nothing else would
/// walk), and the leak panel lists the variable that holds the tensor, as
/// `attach` lists a running job's.
#[test]
#[ignore = "needs PyTorch (pip install torch==2.11.*)"]
fn h_in_a_traces_view_names_the_programs_holders() {
    require_tmux();
    let py = python_with_torch();
    let bin = env!("CARGO_BIN_EXE_vramscope");
    let dir = common::temp_dir("tmux-trace-holders");
    let script = dir.join("holds.py");
    let stop = dir.join("stop");
    std::fs::write(
        &script,
        "import os, sys, time, torch\n\
         kept_weights = torch.empty(1 << 22, device='cuda')\n\
         deadline = time.time() + 90\n\
         while not os.path.exists(sys.argv[1]) and time.time() < deadline:\n\
         \x20   y = kept_weights[:1024] * 2\n\
         \x20   torch.cuda.memory_allocated()\n",
    )
    .expect("the script");
    let session = format!("vramscope-trace-h-{}", std::process::id());
    let cleanup = start(
        &session,
        120,
        40,
        &format!(
            "{bin} trace -- {py} '{}' '{}'; echo EXITED:$?",
            script.display(),
            stop.display()
        ),
    );
    let running = wait_for(
        &session,
        |s| s.contains("Memory map · trace") && s.contains("holds.py:2"),
        Duration::from_secs(60),
    );
    tmux(&["send-keys", "-t", &session, "H"]).expect("H");
    std::thread::sleep(Duration::from_secs(1));
    // The walk lands where the stream is now: the view goes to the end.
    tmux(&["send-keys", "-t", &session, "End"]).expect("End");
    let named = wait_for(
        &session,
        |s| s.contains("kept_weights python holder"),
        Duration::from_secs(30),
    );
    let last = tmux(&["capture-pane", "-p", "-t", &session]).unwrap_or_default();
    std::fs::write(&stop, b"").expect("the stop file");
    let quit = quit_cleanly(&session);
    cleanup();
    assert!(running.is_some(), "the trace's view\n{last}");
    assert!(
        named.is_some(),
        "H: the leak panel names kept_weights\n{last}"
    );
    assert!(quit.is_some(), "q leaves with status 0\n{last}");
}
