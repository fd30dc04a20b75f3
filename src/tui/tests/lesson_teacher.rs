//! A teacher's keys in `vramscope lesson` (issue 41), on `TestBackend`
//! through the real loop: skip a question, jump to part N, quit only after
//! a confirmation, resume where the lesson was left (kept on disk), a poll
//! that reveals the answer without recording a key, the checked figures on
//! the answered screen, a failing lesson's warning, the clock, and the run
//! view opened from a lesson.

use std::path::Path;
use std::time::Duration;

use crossterm::event::{Event as CEvent, KeyCode, KeyEvent, KeyModifiers};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

use super::helpers::{leaky_app_with, opts, screen, text};
use super::lesson::{c, k, state, Script};
use crate::lesson::{default_seed, load_lesson_str, verify_part, Progress};
use crate::scratch::temp_dir;
use crate::tui::lesson::{Answer, LessonState, Page, Store};
use crate::tui::screen::{run_screen, Screen};
use crate::tui::views::lesson::render;
use crate::tui::TuiOptions;

fn ctrl_c() -> CEvent {
    CEvent::Key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL))
}

/// Run the loop on `keys`, then Ctrl-C (which leaves at once, so the last
/// screen is the one the keys made), and the screen as it was last drawn.
fn run_keys(s: &mut LessonState, keys: &[CEvent], w: u16, h: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).expect("test backend");
    let mut script: Vec<CEvent> = keys.to_vec();
    script.push(ctrl_c());
    s.quit = false;
    run_screen(&mut t, s, &mut Script(script.into())).expect("runs");
    t.draw(|f| render(f, s)).expect("draws");
    text(t.backend().buffer())
}

/// Where lesson `name`'s place is kept under `dir`, for its own order.
fn store(dir: &Path, name: &str) -> Store {
    Store {
        path: crate::lesson::progress_path(dir, name),
        seed: default_seed(name),
    }
}

#[test]
fn a_teacher_skips_jumps_to_part_7_quits_after_asking_and_resumes_there() {
    for (w, h) in [(80, 24), (120, 40)] {
        let dir = temp_dir("lesson-resume");
        let mut s = state("leaks").with_store(store(&dir, "leaks"));
        let first = s.lesson.parts[0].answer;
        // Part 1 answered, part 2 skipped, then part 7 by number.
        let keys = [c(KeyCode::Enter), k(first), k('s'), k('s'), k('q')];
        let out = run_keys(&mut s, &keys, w, h);
        assert!(s.confirm_quit, "one q asks first:\n{out}");
        assert!(out.contains("Quit the lesson? q/y quit"), "{out}");
        assert_eq!(s.page, Page::Part(2), "s skips part 2 unanswered");
        assert_eq!(s.answers[1], Answer::Open);

        s.confirm_quit = false;
        let keys = [
            k('q'),
            k('x'),
            k('g'),
            k('7'),
            c(KeyCode::Enter),
            k('q'),
            k('q'),
        ];
        let mut t = Terminal::new(TestBackend::new(w, h)).expect("test backend");
        s.quit = false;
        run_screen(&mut t, &mut s, &mut Script(keys.to_vec().into())).expect("runs");
        assert_eq!(
            s.page,
            Page::Part(6),
            "x kept the lesson, g 7 Enter: part 7"
        );
        assert!(s.quit, "q then q quits");
        t.draw(|f| render(f, &s)).expect("draws");
        let out = text(t.backend().buffer());
        assert!(out.contains("part 7 of 11"), "{out}");

        let saved = Progress::load(&store(&dir, "leaks").path, "leaks")
            .expect("reads")
            .expect("the place is kept on disk");
        assert_eq!(saved.place, Page::Part(6));
        assert_eq!(saved.answers[0], Answer::Given(first));

        // Next time: the introduction offers the place, r goes there.
        let mut s = state("leaks").with_store(store(&dir, "leaks"));
        let intro = run_keys(&mut s, &[], w, h);
        assert_eq!(s.page, Page::Intro);
        assert!(
            intro.contains("r resume at part 7"),
            "the offer is on the key line:\n{intro}"
        );
        let mut s = state("leaks").with_store(store(&dir, "leaks"));
        let back = run_keys(&mut s, &[k('r')], w, h);
        assert_eq!(s.page, Page::Part(6), "{back}");
        assert_eq!(s.answers[0], Answer::Given(first), "answers come back");
        assert!(back.contains("answered 1/11"), "{back}");

        // Enter starts afresh instead: part 1, no answers.
        let mut s = state("leaks").with_store(store(&dir, "leaks"));
        run_keys(&mut s, &[c(KeyCode::Enter)], w, h);
        assert_eq!(s.page, Page::Part(0));
        assert!(s.answers.iter().all(|a| *a == Answer::Open));
    }
}

#[test]
fn a_part_past_the_end_is_refused_and_said() {
    let mut s = state("leaks");
    let keys = [c(KeyCode::Enter), k('9'), k('9'), c(KeyCode::Enter)];
    let out = run_keys(&mut s, &keys, 80, 24);
    assert_eq!(s.page, Page::Part(0), "it stays");
    assert!(
        out.contains("no part 99: this lesson has parts 1 to 11"),
        "{out}"
    );
    // Esc leaves the number unused.
    let mut s = state("leaks");
    run_keys(&mut s, &[k('3'), c(KeyCode::Esc)], 80, 24);
    assert_eq!(s.page, Page::Intro);
}

#[test]
fn ctrl_c_quits_at_once_and_any_other_key_after_q_stays() {
    let mut s = state("leaks");
    run_keys(&mut s, &[], 80, 24);
    assert!(s.quit && !s.confirm_quit, "Ctrl-C asks nothing");
    let mut s = state("leaks");
    assert!(LessonState::handle_key(&mut s, super::helpers::key('q')));
    assert!(s.confirm_quit && !s.quit);
    LessonState::handle_key(&mut s, super::helpers::key('n'));
    assert!(!s.quit && !s.confirm_quit, "n stays");
}

#[test]
fn a_poll_reveals_the_answer_and_records_no_letter() {
    for (w, h) in [(80, 24), (120, 40)] {
        let mut s = state("leaks");
        let right = s.lesson.parts[0].answer;
        let keys = [c(KeyCode::Enter), k('P'), k(right)];
        let out = run_keys(&mut s, &keys, w, h);
        assert_eq!(
            s.answers[0],
            Answer::Open,
            "a letter in a poll is no answer"
        );
        assert!(out.contains("POLL"), "the header says so:\n{out}");
        assert!(out.contains("v reveal"), "{out}");

        let mut s = state("leaks");
        let keys = [c(KeyCode::Enter), k('P'), k('v')];
        let out = run_keys(&mut s, &keys, w, h);
        assert_eq!(s.answers[0], Answer::Revealed);
        assert!(
            out.contains(&format!("The answer is {right} (revealed for a poll")),
            "{out}"
        );
        assert!(out.contains(&format!("✓ {right})")), "{out}");
        assert_eq!(s.score(), 0, "nobody's letter");
        assert!(
            out.contains("answered 0/11 · 0 right · 1 revealed"),
            "{out}"
        );
        assert!(
            out.contains("Enter run the scenario"),
            "it can run now: {out}"
        );
    }
    // Without poll mode, v reveals one question the same way.
    let mut s = state("leaks");
    run_keys(&mut s, &[c(KeyCode::Enter), k('v'), k('a')], 80, 24);
    assert_eq!(
        s.answers[0],
        Answer::Revealed,
        "a letter after it changes nothing"
    );
}

#[test]
fn the_summary_names_each_part_s_question_and_how_it_went() {
    let mut s = state("training-peak");
    let n = s.lesson.parts.len();
    let mut keys = vec![
        c(KeyCode::Enter),
        k(s.lesson.parts[0].answer),
        k('n'),
        k('v'),
    ];
    keys.push(k('g'));
    keys.extend(n.to_string().chars().map(k));
    keys.extend([c(KeyCode::Enter), k('s')]);
    let out = run_keys(&mut s, &keys, 200, 60);
    assert_eq!(s.page, Page::Summary, "{out}");
    let q1: String = s.lesson.parts[0].question.chars().take(40).collect();
    assert!(out.contains(&format!("✓ 1. {q1}")), "{out}");
    assert!(out.contains("? 2. "), "revealed:\n{out}");
    assert!(out.contains("· 3. "), "skipped:\n{out}");
    assert!(
        out.contains("? revealed in a poll"),
        "the marks' legend:\n{out}"
    );
}

#[test]
fn the_answered_screen_lists_the_figures_checked_on_the_run() {
    let loaded = crate::lesson::resolve_lesson("leaks").expect("built-in");
    let lesson = crate::lesson::shuffled(&loaded.lesson, default_seed("leaks"));
    let verdict = verify_part(&loaded, &loaded.lesson.parts[0]).expect("runs");
    assert!(verdict.holds(), "the built-in lesson holds");
    let first = verdict.checks[0].clone();
    let mut s = state("leaks").with_checks(&[verdict], &[]);
    assert_eq!(s.lesson, lesson);
    let before = run_keys(&mut s, &[c(KeyCode::Enter)], 120, 40);
    assert!(!before.contains("Checked on"), "hidden before the answer");
    s.quit = false;
    let mut keys = vec![k('v')];
    keys.extend(std::iter::repeat_n(k('j'), 40));
    let out = run_keys(&mut s, &keys, 120, 40);
    assert!(out.contains("Checked on this part's run:"), "{out}");
    let shown: String = format!("✓ {}", first.expectation)
        .chars()
        .take(30)
        .collect();
    assert!(out.contains(&shown), "{shown} in\n{out}");
    assert!(!out.contains("⚠"), "{out}");
}

/// A lesson file whose answer its run does not show: `store-outputs-bug`
/// runs out of memory, so `check: [NoOom]` fails.
const WRONG: &str = r#"Lesson(
    name: "mine",
    title: "A teacher's lesson",
    description: "one part",
    intro: ["Hello."],
    parts: [
        (
            scenario: "store-outputs-bug",
            question: "Does it run out of memory?",
            choices: ["yes", "no"],
            answer: 'b',
            explanation: ["It fits."],
            check: [NoOom],
        ),
    ],
    summary: ["Bye."],
)
"#;

#[test]
fn a_lesson_whose_check_fails_warns_before_the_room_sees_it() {
    let loaded = load_lesson_str(WRONG, "mine.ron", None).expect("parses");
    let verdict = verify_part(&loaded, &loaded.lesson.parts[0]).expect("runs");
    assert!(!verdict.holds());
    let theme = crate::tui::theme::Theme::builtin(crate::tui::theme::ThemeName::Dark, false)
        .expect("theme");
    for (w, h) in [(80, 24), (120, 40)] {
        let mut s = LessonState::new(loaded.lesson.clone(), theme.clone())
            .with_checks(std::slice::from_ref(&verdict), &[]);
        let intro = run_keys(&mut s, &[], w, h);
        assert!(
            intro.contains("⚠ This lesson's checks fail on its runs (part 1)"),
            "{intro}"
        );
        let mut s = LessonState::new(loaded.lesson.clone(), theme.clone())
            .with_checks(std::slice::from_ref(&verdict), &[]);
        let part = run_keys(&mut s, &[c(KeyCode::Enter), k('b')], w, h);
        assert!(part.contains("⚠ This part's checks fail"), "{part}");
        assert!(part.contains("✗ FAILED no OOM"), "{part}");
    }
}

#[test]
fn the_header_keeps_a_clock_and_the_pace_the_lesson_s_length_sets() {
    let mut s = state("leaks");
    assert_eq!(s.lesson.minutes, Some(45));
    assert_eq!(s.lesson.parts.len(), 11);
    // 12 minutes of 45: 12/45 of 11 parts is 2.9 parts done, so part 3 is due.
    assert!(Screen::tick(&mut s, Duration::from_secs(12 * 60)));
    assert!(
        !Screen::tick(&mut s, Duration::from_millis(10)),
        "same second"
    );
    for (w, h) in [(80, 24), (120, 40)] {
        let out = run_keys(&mut s, &[], w, h);
        assert!(
            out.contains("⏱ 12:00 of ~45 min · on time at part 3"),
            "{out}"
        );
        assert!(
            out.contains("vramscope lesson │ leaks │ introduction"),
            "the status is whole beside or above it:\n{out}"
        );
    }
}

#[test]
fn the_run_view_opened_from_a_lesson_says_so_and_q_goes_back() {
    let mut app = leaky_app_with(&TuiOptions {
        context: Some("lesson · part 3".into()),
        ..opts()
    });
    for (w, h) in [(80, 24), (120, 40)] {
        let out = screen(&mut app, w, h);
        let top = out.lines().next().unwrap_or_default();
        assert!(top.contains("lesson · part 3"), "{top}");
        let bottom = out.lines().last().unwrap_or_default();
        assert!(bottom.contains("q lesson"), "{bottom}");
    }
    // Back in the lesson, the part just watched.
    let mut s = state("leaks");
    let right = s.lesson.parts[0].answer;
    run_keys(
        &mut s,
        &[c(KeyCode::Enter), k(right), c(KeyCode::Enter)],
        80,
        24,
    );
    assert_eq!(s.open, Some(0));
    s.after_run();
    let out = run_keys(&mut s, &[], 80, 24);
    assert_eq!(s.page, Page::Part(0));
    assert!(out.contains("back from part 1's run"), "{out}");
}
