//! The scenario views in tmux: the guided tour (running, and opened
//! paused), the presenter's steps, the sweep chart, a lesson's question and
//! answer, and a comparison on one scale at 80x24.

use super::*;

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
