//! `vramscope lesson`'s state: which screen (the intro, a part's question,
//! the summary), the learner's answers, the scroll. Keys answer a question,
//! move between screens, or ask for a part's scenario in the run view (the
//! caller opens it and comes back). Nothing here runs the engine.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::theme::Theme;
use crate::lesson::{Lesson, Part, LETTERS};

/// Where the learner is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    Intro,
    Part(usize),
    Summary,
}

pub struct LessonState {
    pub lesson: Lesson,
    pub page: Page,
    /// Each part's answer, once given.
    pub answers: Vec<Option<char>>,
    /// Lines the screen's text is scrolled by.
    pub scroll: u16,
    /// A part whose scenario the learner asked to run (Enter after answering).
    pub open: Option<usize>,
    pub theme: Theme,
    pub quit: bool,
    /// The terminal's size at the last frame (scrolling stops at the
    /// text's end there).
    pub area: Option<ratatui::layout::Rect>,
}

impl LessonState {
    pub fn new(lesson: Lesson, theme: Theme) -> LessonState {
        let answers = vec![None; lesson.parts.len()];
        LessonState {
            lesson,
            page: Page::Intro,
            answers,
            scroll: 0,
            open: None,
            theme,
            quit: false,
            area: None,
        }
    }

    pub fn part(&self) -> Option<(usize, &Part)> {
        match self.page {
            Page::Part(i) => self.lesson.parts.get(i).map(|p| (i, p)),
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

    fn go(&mut self, page: Page) {
        self.page = page;
        self.scroll = 0;
    }

    pub fn next(&mut self) {
        let n = self.lesson.parts.len();
        self.go(match self.page {
            Page::Intro => Page::Part(0),
            Page::Part(i) if i + 1 < n => Page::Part(i + 1),
            Page::Part(_) | Page::Summary => Page::Summary,
        });
    }

    pub fn back(&mut self) {
        self.go(match self.page {
            Page::Intro | Page::Part(0) => Page::Intro,
            Page::Part(i) => Page::Part(i - 1),
            Page::Summary => Page::Part(self.lesson.parts.len().saturating_sub(1)),
        });
    }

    /// The run view was closed: on to the next screen.
    pub fn after_run(&mut self) {
        self.next();
    }

    /// The keys the current screen takes, for its hint line.
    pub fn hints(&self) -> String {
        match self.page {
            Page::Intro => "Enter/→ start  ↑/↓ scroll  q quit".into(),
            Page::Part(i) => match self.answers[i] {
                None => {
                    let n = self.lesson.parts[i].choices.len();
                    let last = LETTERS[n.saturating_sub(1).min(LETTERS.len() - 1)];
                    format!("a–{last} answer  ← back  ↑/↓ scroll  q quit")
                }
                Some(_) => "Enter run the scenario  → next part  ← back  ↑/↓ scroll  q quit".into(),
            },
            Page::Summary => "← back  ↑/↓ scroll  q quit".into(),
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
            KeyCode::Enter | KeyCode::Char(' ') => match (self.page, self.answered()) {
                (Page::Intro, _) => self.next(),
                (Page::Part(i), Some(_)) => self.open = Some(i),
                _ => return false,
            },
            KeyCode::Right | KeyCode::Char('n') => match (self.page, self.answered()) {
                (Page::Intro, _) | (Page::Part(_), Some(_)) => self.next(),
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

impl LessonState {
    /// Scrolling stops at the text's end (at the last frame's size), so ↑
    /// answers at once after it.
    fn clamp_scroll(&mut self) {
        if let Some(area) = self.area {
            let most = super::views::lesson::max_scroll(area, self);
            self.scroll = self.scroll.min(most);
        }
    }
}

/// The longest wait for a key: a lesson only changes when the learner acts.
const LESSON_FRAME: std::time::Duration = std::time::Duration::from_millis(100);

/// A lesson's screens in the one loop; it stops when the learner quits or
/// asks for a part's scenario (`open` says which: the caller runs it in the
/// run view and may come back).
impl super::screen::Screen for LessonState {
    fn begin(&mut self) {
        self.open = None;
    }

    fn handle_key(&mut self, key: KeyEvent) -> bool {
        let changed = LessonState::handle_key(self, key);
        self.clamp_scroll();
        changed
    }

    fn frame_wait(&self) -> std::time::Duration {
        LESSON_FRAME
    }

    fn prepare(&mut self, area: ratatui::layout::Rect) {
        self.area = Some(area);
        self.clamp_scroll();
    }

    fn draw(&self, frame: &mut ratatui::Frame) {
        super::views::lesson::render(frame, self);
    }

    fn done(&self) -> bool {
        self.quit || self.open.is_some()
    }
}
