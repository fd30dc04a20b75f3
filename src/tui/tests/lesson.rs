//! `vramscope lesson`'s screens on `TestBackend`, driven by the real loop
//! with scripted keys: each built-in lesson's first screen, a question
//! before and after it is answered, going back, the summary, quitting.

use std::collections::VecDeque;
use std::time::Duration;

use crossterm::event::{Event as CEvent, KeyCode};
use ratatui::backend::TestBackend;
use ratatui::Terminal;

use super::helpers::{code, key, text};
use crate::lesson::{default_seed, resolve_lesson, shuffled};
use crate::tui::lesson::{Answer, LessonState, Page};
use crate::tui::run::InputSource;
use crate::tui::screen::run_screen;
use crate::tui::theme::{Theme, ThemeName};
use crate::tui::views::lesson::render;

pub(super) struct Script(pub(super) VecDeque<CEvent>);

impl InputSource for Script {
    fn next(&mut self, _timeout: Duration) -> anyhow::Result<Option<CEvent>> {
        // A script that has run out quits (q, then q to confirm), as a
        // learner would.
        Ok(Some(self.0.pop_front().unwrap_or(CEvent::Key(key('q')))))
    }
}

/// The lesson as `vramscope lesson NAME` opens it: its choices in the
/// order of the lesson's own seed.
pub(super) fn state(name: &str) -> LessonState {
    let lesson = resolve_lesson(name).expect("a built-in lesson").lesson;
    let lesson = shuffled(&lesson, default_seed(name));
    LessonState::new(
        lesson,
        Theme::builtin(ThemeName::Dark, false).expect("theme"),
    )
}

/// Run the loop on `keys` (then `q` unless it stopped to open a run), and
/// the screen as it was last drawn.
pub(super) fn run_keys(s: &mut LessonState, keys: &[CEvent], w: u16, h: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).expect("test backend");
    run_screen(&mut t, s, &mut Script(keys.iter().cloned().collect())).expect("runs");
    t.draw(|f| render(f, s)).expect("draws");
    text(t.backend().buffer())
}

pub(super) fn k(c: char) -> CEvent {
    CEvent::Key(key(c))
}

pub(super) fn c(code_: KeyCode) -> CEvent {
    CEvent::Key(code(code_))
}

/// The first part's right letter, and the first letter that is wrong.
fn right_and_wrong(s: &LessonState) -> (char, char) {
    let right = s.lesson.parts[0].answer;
    let wrong = if right == 'a' { 'b' } else { 'a' };
    (right, wrong)
}

#[test]
fn each_lesson_opens_on_its_introduction() {
    for (name, first) in [
        ("caching-allocator", "PyTorch does not call cudaMalloc"),
        ("leaks", "A tensor's GPU block goes back"),
        ("training-peak", "A training step's memory has two"),
        ("efficient-training", "A training step's memory has two"),
    ] {
        let mut s = state(name);
        let out = run_keys(&mut s, &[], 80, 24);
        assert!(s.quit, "q quits");
        assert_eq!(s.page, Page::Intro);
        assert!(
            out.contains(&format!("vramscope lesson │ {name} │ introduction")),
            "{out}"
        );
        assert!(out.contains(first), "{out}");
        assert!(out.contains("Enter/→ start"), "keys on screen:\n{out}");
        insta::assert_snapshot!(format!("lesson_intro_{name}_80x24"), out);
    }
}

#[test]
fn a_question_hides_its_answer_until_a_key_and_then_says_why() {
    for (w, h) in [(80, 24), (200, 60)] {
        let mut s = state("leaks");
        let before = run_keys(&mut s, &[c(KeyCode::Enter)], w, h);
        assert_eq!(s.page, Page::Part(0));
        assert!(before.contains("part 1 of 11"), "{before}");
        let first: String = s.lesson.parts[0].choices[0].chars().take(20).collect();
        assert!(before.contains(&format!("a) {first}")), "{before}");
        assert!(before.contains("Your answer?"), "{before}");
        assert!(
            !before.contains("backward() frees every tensor"),
            "explanation hidden:\n{before}"
        );
        assert!(before.contains("a–d answer"), "{before}");
        insta::assert_snapshot!(format!("lesson_question_{w}x{h}"), before);

        let mut s = state("leaks");
        let (right, wrong) = right_and_wrong(&s);
        let after = run_keys(&mut s, &[c(KeyCode::Enter), k(wrong)], w, h);
        assert_eq!(s.answers[0], Answer::Given(wrong));
        assert!(
            after.contains(&format!(
                "Not quite: you said {wrong}, the answer is {right}."
            )),
            "{after}"
        );
        assert!(
            after.contains(&format!("✗ {wrong})")) && after.contains(&format!("✓ {right})")),
            "{after}"
        );
        assert!(after.contains("Enter run the scenario"), "{after}");
        assert!(after.contains("answered 1/11 · 0 right"), "{after}");
        insta::assert_snapshot!(format!("lesson_answered_{w}x{h}"), after);
    }
}

/// Text past the box says "more" below; scrolled to its end, the last
/// paragraph shows, the marker moves up, and scrolling stops there.
#[test]
fn text_longer_than_the_box_says_more_and_scrolls_to_its_end() {
    let mut s = state("leaks");
    let answered = run_keys(&mut s, &[c(KeyCode::Enter), k('a')], 80, 24);
    assert!(answered.contains("↓ more (↓/j)"), "{answered}");
    assert!(!answered.contains("↑ more"), "{answered}");
    let last = s.lesson.parts[0]
        .explanation
        .last()
        .and_then(|p| p.split(' ').next_back())
        .expect("an explanation");
    assert!(!answered.contains(last), "the last word is below the box");

    let mut s = state("leaks");
    let mut keys = vec![c(KeyCode::Enter), k('a')];
    keys.extend(std::iter::repeat_n(k('j'), 60));
    let bottom = run_keys(&mut s, &keys, 80, 24);
    assert!(bottom.contains(last), "{bottom}");
    assert!(
        bottom.contains("↑ more") && !bottom.contains("↓ more"),
        "{bottom}"
    );
    // On the bottom border: the box's title above stays whole.
    let title = bottom
        .lines()
        .find(|l| l.starts_with('┌'))
        .unwrap_or_default();
    assert!(
        title.contains("scenario accumulate-loss-train-bug") && !title.contains("more"),
        "{title}"
    );
    let at_end = s.scroll;
    assert!(
        at_end > 0 && at_end < 60,
        "scrolling stops at the end: {at_end}"
    );
    keys.push(k('k'));
    let mut s = state("leaks");
    run_keys(&mut s, &keys, 80, 24);
    assert_eq!(s.scroll, at_end - 1, "one ↑ moves up at once");

    let mut s = state("leaks");
    let wide = run_keys(&mut s, &[c(KeyCode::Enter), k('a')], 200, 60);
    assert!(
        !wide.contains("↓ more"),
        "all of it fits at 200×60:\n{wide}"
    );
}

#[test]
fn a_right_answer_stands_and_enter_asks_for_the_part_s_run() {
    let mut s = state("leaks");
    let (right, wrong) = right_and_wrong(&s);
    // 'e' is no choice; Enter before an answer does nothing.
    let keys = [
        c(KeyCode::Enter),
        k('e'),
        c(KeyCode::Enter),
        k(right),
        k(wrong),
        c(KeyCode::Enter),
    ];
    let out = run_keys(&mut s, &keys, 120, 40);
    assert_eq!(
        s.answers[0],
        Answer::Given(right),
        "the first answer stands"
    );
    assert_eq!(
        s.open,
        Some(0),
        "Enter after answering opens the part's scenario"
    );
    assert!(!s.quit);
    assert!(out.contains(&format!("Right: {right}.")), "{out}");
    s.after_run();
    assert_eq!(
        s.page,
        Page::Part(0),
        "back from the run: the part just watched"
    );
}

#[test]
fn back_returns_to_an_answered_part_and_the_summary_scores() {
    let mut s = state("efficient-training");
    let n = s.lesson.parts.len();
    let mut keys = vec![c(KeyCode::Enter)];
    for p in s.lesson.parts.clone() {
        keys.push(k(p.answer));
        keys.push(c(KeyCode::Right));
    }
    let summary = run_keys(&mut s, &keys, 100, 40);
    assert_eq!(s.page, Page::Summary);
    assert!(
        summary.contains(&format!("You answered {n} of {n} questions right.")),
        "{summary}"
    );
    s.quit = false;
    let back = run_keys(&mut s, &[c(KeyCode::Left)], 100, 40);
    assert_eq!(s.page, Page::Part(n - 1));
    let last = s.lesson.parts[n - 1].answer;
    assert!(
        back.contains(&format!("Right: {last}.")),
        "the answer is still shown:\n{back}"
    );
    s.quit = false;
    let first = run_keys(&mut s, &vec![k('p'); n + 2], 100, 40);
    assert_eq!(s.page, Page::Intro, "{first}");
}
