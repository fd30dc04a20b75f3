//! Snapshot files in tmux: every real snapshot ends where the report says,
//! an opened file leaves the CPU idle, and several files open as tabs.

use super::*;

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
