//! `vramscope lesson`'s state: which screen (the intro, a part's question,
//! the summary), the learner's answers, the scroll. Keys answer a question,
//! move between screens, or ask for a part's scenario in the run view (the
//! caller opens it and comes back). Nothing here runs the engine.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::theme::Theme;
use crate::lesson::{Lesson, Part, LETTERS};

/// Where the learner is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Screen {
    Intro,
    Part(usize),
    Summary,
}

pub struct LessonState {
    pub lesson: Lesson,
    pub screen: Screen,
    /// Each part's answer, once given.
    pub answers: Vec<Option<char>>,
    /// Lines the screen's text is scrolled by.
    pub scroll: u16,
    /// A part whose scenario the learner asked to run (Enter after answering).
    pub open: Option<usize>,
    pub theme: Theme,
    pub quit: bool,
}

impl LessonState {
    pub fn new(lesson: Lesson, theme: Theme) -> LessonState {
        let answers = vec![None; lesson.parts.len()];
        LessonState {
            lesson,
            screen: Screen::Intro,
            answers,
            scroll: 0,
            open: None,
            theme,
            quit: false,
        }
    }

    pub fn part(&self) -> Option<(usize, &Part)> {
        match self.screen {
            Screen::Part(i) => self.lesson.parts.get(i).map(|p| (i, p)),
            _ => None,
        }
    }

    /// The part on screen has been answered.
    pub fn answered(&self) -> Option<char> {
        self.part().and_then(|(i, _)| self.answers[i])
    }

    /// Answers that match the lesson's.
    pub fn score(&self) -> usize {
        self.lesson
            .parts
            .iter()
            .zip(&self.answers)
            .filter(|(p, a)| **a == Some(p.answer))
            .count()
    }

    fn go(&mut self, screen: Screen) {
        self.screen = screen;
        self.scroll = 0;
    }

    pub fn next(&mut self) {
        let n = self.lesson.parts.len();
        self.go(match self.screen {
            Screen::Intro => Screen::Part(0),
            Screen::Part(i) if i + 1 < n => Screen::Part(i + 1),
            Screen::Part(_) | Screen::Summary => Screen::Summary,
        });
    }

    pub fn back(&mut self) {
        self.go(match self.screen {
            Screen::Intro | Screen::Part(0) => Screen::Intro,
            Screen::Part(i) => Screen::Part(i - 1),
            Screen::Summary => Screen::Part(self.lesson.parts.len().saturating_sub(1)),
        });
    }

    /// The run view was closed: on to the next screen.
    pub fn after_run(&mut self) {
        self.next();
    }

    /// The keys the current screen takes, for its hint line.
    pub fn hints(&self) -> String {
        match self.screen {
            Screen::Intro => "Enter/→ start  ↑/↓ scroll  q quit".into(),
            Screen::Part(i) => match self.answers[i] {
                None => {
                    let n = self.lesson.parts[i].choices.len();
                    let last = LETTERS[n.saturating_sub(1).min(LETTERS.len() - 1)];
                    format!("a–{last} answer  ← back  ↑/↓ scroll  q quit")
                }
                Some(_) => "Enter run the scenario  → next part  ← back  ↑/↓ scroll  q quit".into(),
            },
            Screen::Summary => "← back  ↑/↓ scroll  q quit".into(),
        }
    }

    pub fn handle_key(&mut self, k: KeyEvent) -> bool {
        match k.code {
            KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => self.quit = true,
            KeyCode::Char('q') | KeyCode::Esc => self.quit = true,
            KeyCode::Up | KeyCode::Char('k') => self.scroll = self.scroll.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => self.scroll = self.scroll.saturating_add(1),
            KeyCode::Left | KeyCode::Backspace | KeyCode::Char('p') => self.back(),
            KeyCode::Char(c @ 'a'..='d') => return self.answer(c),
            KeyCode::Enter | KeyCode::Char(' ') => match (self.screen, self.answered()) {
                (Screen::Intro, _) => self.next(),
                (Screen::Part(i), Some(_)) => self.open = Some(i),
                _ => return false,
            },
            KeyCode::Right | KeyCode::Char('n') => match (self.screen, self.answered()) {
                (Screen::Intro, _) | (Screen::Part(_), Some(_)) => self.next(),
                _ => return false,
            },
            _ => return false,
        }
        true
    }

    /// A letter on an unanswered question within its choices; the first
    /// answer stands (the learner sees it revealed when coming back).
    fn answer(&mut self, c: char) -> bool {
        let Some((i, part)) = self.part() else {
            return false;
        };
        let valid = LETTERS[..part.choices.len().min(LETTERS.len())].contains(&c);
        if !valid || self.answers[i].is_some() {
            return false;
        }
        self.answers[i] = Some(c);
        self.scroll = 0;
        true
    }
}
