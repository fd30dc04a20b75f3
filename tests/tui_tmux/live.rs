//! Live views in tmux: NVML's watch, attach to a running job (one rank and
//! every rank), and a traced script at 80x24 with its holders (`h`).

use super::*;

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
