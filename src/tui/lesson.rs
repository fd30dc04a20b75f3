//! `vramscope lesson`'s state: which screen (the intro, a part's question,
//! the summary), the room's answers, the scroll, the clock, and where the
//! lesson is saved. Keys answer a question (or, in a poll, reveal it with
//! no letter recorded), skip it, jump to part N, move between screens, ask
//! for a part's scenario in the run view (the caller opens it and comes
//! back to the same part), or quit after a confirmation. Nothing here runs
//! the engine.

use std::path::PathBuf;
use std::time::Duration;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::theme::Theme;
pub use crate::lesson::{Answer, Place as Page};
use crate::lesson::{Lesson, Part, PartVerdict, Progress, LETTERS};
use crate::scenario::ExpectationResult;

/// A part's checks on its run, as the answered screen lists them.
#[derive(Debug, Clone, Default)]
pub struct Checked {
    /// The part's `check`, `figures`, `compare` and `says` entries.
    pub checks: Vec<ExpectationResult>,
    /// Sizes the text states that the run shows.
    pub prose_held: usize,
    /// Sizes the text states that the run does not show.
    pub prose_failed: Vec<ExpectationResult>,
}

impl Checked {
    pub fn holds(&self) -> bool {
        self.checks.iter().all(|c| c.passed) && self.prose_failed.is_empty()
    }
}

impl From<&PartVerdict> for Checked {
    fn from(v: &PartVerdict) -> Checked {
        Checked {
            checks: v.checks.clone(),
            prose_held: v.prose.iter().filter(|c| c.passed).count(),
            prose_failed: v.prose.iter().filter(|c| !c.passed).cloned().collect(),
        }
    }
}

/// Where a lesson's place is kept, and the seed its letters belong to.
#[derive(Debug, Clone)]
pub struct Store {
    pub path: PathBuf,
    pub seed: u64,
}

pub struct LessonState {
    pub lesson: Lesson,
    pub page: Page,
    /// Each part's answer: a letter, revealed in a poll, or none yet.
    pub answers: Vec<Answer>,
    /// Lines the screen's text is scrolled by.
    pub scroll: u16,
    /// A part whose scenario the learner asked to run (Enter after answering).
    pub open: Option<usize>,
    pub theme: Theme,
    pub quit: bool,
    /// The terminal's size at the last frame (scrolling stops at the
    /// text's end there).
    pub area: Option<ratatui::layout::Rect>,
    /// Poll mode: the room answers by show of hands, letters are not
    /// recorded, `v` reveals the answer.
    pub poll: bool,
    /// `q` was pressed once: `q` or `y` quits, any other key stays.
    pub confirm_quit: bool,
    /// The digits typed after `g` (or a digit): the part to go to.
    pub goto: Option<String>,
    /// The place saved last time, offered on the introduction (`r`).
    pub resume: Option<Progress>,
    /// Where the place is saved as the lesson goes; none in tests.
    pub store: Option<Store>,
    /// A line answering the last key (a jump refused, a save that failed).
    pub notice: Option<String>,
    /// Time since the lesson opened, the run view's included.
    pub elapsed: Duration,
    /// Each part's checks on its run, once verified (none: not run).
    pub checked: Vec<Option<Checked>>,
    /// The introduction's and summary's stated sizes that the runs do not show.
    pub framing_failed: Vec<ExpectationResult>,
}

impl LessonState {
    pub fn new(lesson: Lesson, theme: Theme) -> LessonState {
        let n = lesson.parts.len();
        LessonState {
            lesson,
            page: Page::Intro,
            answers: vec![Answer::Open; n],
            scroll: 0,
            open: None,
            theme,
            quit: false,
            area: None,
            poll: false,
            confirm_quit: false,
            goto: None,
            resume: None,
            store: None,
            notice: None,
            elapsed: Duration::ZERO,
            checked: vec![None; n],
            framing_failed: Vec::new(),
        }
    }

    /// Save the place at `store` as the lesson goes, and offer the one
    /// saved there before (if it is this lesson's, and not at its start).
    pub fn with_store(mut self, store: Store) -> LessonState {
        match Progress::load(&store.path, &self.lesson.name) {
            Ok(Some(p)) if p.place != Page::Intro => self.resume = Some(p),
            Ok(_) => {}
            Err(e) => self.notice = Some(format!("{e}; starting afresh")),
        }
        self.store = Some(store);
        self
    }

    /// Each part's verdict on its run (and the framing's failures).
    pub fn with_checks(mut self, verdicts: &[PartVerdict], framing: &[ExpectationResult]) -> Self {
        for (slot, v) in self.checked.iter_mut().zip(verdicts) {
            *slot = Some(Checked::from(v));
        }
        self.framing_failed = framing.iter().filter(|c| !c.passed).cloned().collect();
        self
    }

    /// The parts whose checks fail on their run (1-based).
    pub fn failing_parts(&self) -> Vec<usize> {
        self.checked
            .iter()
            .enumerate()
            .filter(|(_, c)| c.as_ref().is_some_and(|c| !c.holds()))
            .map(|(i, _)| i + 1)
            .collect()
    }

    pub fn part(&self) -> Option<(usize, &Part)> {
        match self.page {
            Page::Part(i) => self.lesson.parts.get(i).map(|p| (i, p)),
            _ => None,
        }
    }

    /// The part on screen, once its answer is shown (given or revealed).
    pub fn shown(&self) -> Option<Answer> {
        self.part()
            .map(|(i, _)| self.answers[i])
            .filter(|a| *a != Answer::Open)
    }

    /// Letters the room gave that match the lesson's.
    pub fn score(&self) -> usize {
        self.lesson
            .parts
            .iter()
            .zip(&self.answers)
            .filter(|(p, a)| **a == Answer::Given(p.answer))
            .count()
    }

    /// How many parts have a letter, and how many were revealed in a poll.
    pub fn counts(&self) -> (usize, usize) {
        let given = self
            .answers
            .iter()
            .filter(|a| matches!(a, Answer::Given(_)))
            .count();
        let revealed = self
            .answers
            .iter()
            .filter(|a| **a == Answer::Revealed)
            .count();
        (given, revealed)
    }

    fn go(&mut self, page: Page) {
        self.page = page;
        self.scroll = 0;
    }

    /// On to the next screen; from an unanswered question this skips it.
    pub fn next(&mut self) {
        let n = self.lesson.parts.len();
        self.go(match self.page {
            Page::Intro if n > 0 => Page::Part(0),
            Page::Part(i) if i + 1 < n => Page::Part(i + 1),
            Page::Intro | Page::Part(_) | Page::Summary => Page::Summary,
        });
    }

    pub fn back(&mut self) {
        self.go(match self.page {
            Page::Intro | Page::Part(0) => Page::Intro,
            Page::Part(i) => Page::Part(i - 1),
            Page::Summary => Page::Part(self.lesson.parts.len().saturating_sub(1)),
        });
    }

    /// Part `n` (1-based), or why not.
    pub fn jump(&mut self, n: usize) -> Result<(), String> {
        let parts = self.lesson.parts.len();
        if n == 0 || n > parts {
            return Err(format!("no part {n}: this lesson has parts 1 to {parts}"));
        }
        self.resume = None;
        self.go(Page::Part(n - 1));
        Ok(())
    }

    /// The place saved last time, with its answers where their letters
    /// still mean the same choices.
    pub fn resume(&mut self) {
        let Some(p) = self.resume.take() else {
            return;
        };
        let seed = self.store.as_ref().map_or(p.seed, |s| s.seed);
        match p.answers_for(self.lesson.parts.len(), seed) {
            Some(a) => self.answers = a,
            None => {
                self.notice = Some(
                    "the saved answers were for another order of the choices (--seed): not kept"
                        .into(),
                )
            }
        }
        let page = match p.place {
            Page::Part(i) if i >= self.lesson.parts.len() => Page::Summary,
            other => other,
        };
        self.go(page);
    }

    /// The run view was closed: back to the part just watched.
    pub fn after_run(&mut self) {
        if let Page::Part(i) = self.page {
            self.notice = Some(format!("back from part {}'s run", i + 1));
        }
    }

    /// Time spent in the run view counts on the lesson's clock.
    pub fn add_time(&mut self, d: Duration) {
        self.elapsed += d;
    }

    /// The keys the current screen takes, for its hint line.
    pub fn hints(&self) -> String {
        if self.confirm_quit {
            return "Quit the lesson? q/y quit (the place is saved)  any other key stays".into();
        }
        if let Some(typed) = &self.goto {
            return format!("go to part: {typed}▏  Enter go  Esc cancel");
        }
        match self.page {
            Page::Intro => match &self.resume {
                Some(p) => format!(
                    "r resume at {}  Enter/→ start afresh  ↑/↓ scroll  q quit",
                    place_words(p.place)
                ),
                None => "Enter/→ start  g part N  ↑/↓ scroll  q quit".into(),
            },
            Page::Part(i) => match self.answers[i] {
                Answer::Open if self.poll => {
                    "poll: v reveal  s/→ skip  ← back  g part N  P poll off  q quit".into()
                }
                Answer::Open => {
                    let n = self.lesson.parts[i].choices.len();
                    let last = LETTERS[n.saturating_sub(1).min(LETTERS.len() - 1)];
                    format!("a–{last} answer  v reveal  s/→ skip  ← back  g part N  P poll  q quit")
                }
                _ => "Enter run the scenario  → next  ← back  g part N  ↑/↓ scroll  q quit".into(),
            },
            Page::Summary => "← back  g part N  ↑/↓ scroll  q quit".into(),
        }
    }

    pub fn handle_key(&mut self, k: KeyEvent) -> bool {
        if k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL) {
            self.quit = true;
            return true;
        }
        if self.confirm_quit {
            self.confirm_quit = false;
            self.quit = matches!(k.code, KeyCode::Char('q' | 'y' | 'Q'));
            return true;
        }
        if self.goto.is_some() {
            self.goto_key(k);
            return true;
        }
        let had_notice = self.notice.take().is_some();
        self.key(k) || had_notice
    }

    fn key(&mut self, k: KeyEvent) -> bool {
        match k.code {
            KeyCode::Char('q') | KeyCode::Esc => self.confirm_quit = true,
            KeyCode::Up | KeyCode::Char('k') => self.scroll = self.scroll.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => self.scroll = self.scroll.saturating_add(1),
            KeyCode::Left | KeyCode::Backspace | KeyCode::Char('p') => self.back(),
            KeyCode::Char('g') => self.goto = Some(String::new()),
            KeyCode::Char(d @ '1'..='9') => self.goto = Some(d.to_string()),
            KeyCode::Char('P') => {
                self.poll = !self.poll;
                self.notice = Some(if self.poll {
                    "poll mode: ask the room, v reveals; no key is recorded as the room's".into()
                } else {
                    "poll mode off: a–d record the room's answer".into()
                });
            }
            KeyCode::Char('v') => return self.reveal(),
            KeyCode::Char('r') if self.page == Page::Intro && self.resume.is_some() => {
                self.resume()
            }
            KeyCode::Char(c @ 'a'..='d') => return self.answer(c),
            KeyCode::Enter | KeyCode::Char(' ') => match (self.page, self.shown()) {
                (Page::Intro, _) => self.start(),
                (Page::Part(i), Some(_)) => self.open = Some(i),
                (Page::Part(_), None) => {
                    self.notice = Some("answer first (a–d), v reveals, s skips".into())
                }
                _ => return false,
            },
            KeyCode::Right | KeyCode::Char('n' | 's') => match self.page {
                Page::Intro => self.start(),
                Page::Part(_) => self.next(),
                Page::Summary => return false,
            },
            _ => return false,
        }
        true
    }

    /// From the introduction to part 1, with no saved place taken.
    fn start(&mut self) {
        self.resume = None;
        self.next();
    }

    fn goto_key(&mut self, k: KeyEvent) {
        let Some(typed) = self.goto.as_mut() else {
            return;
        };
        match k.code {
            KeyCode::Char(d) if d.is_ascii_digit() && typed.len() < 4 => typed.push(d),
            KeyCode::Backspace => {
                typed.pop();
            }
            KeyCode::Enter => {
                let typed = self.goto.take().unwrap_or_default();
                if let Ok(n) = typed.parse::<usize>() {
                    if let Err(why) = self.jump(n) {
                        self.notice = Some(why);
                    }
                }
            }
            _ => self.goto = None,
        }
    }

    /// A letter on an unanswered question within its choices; the first
    /// answer stands (the learner sees it revealed when coming back).
    fn answer(&mut self, c: char) -> bool {
        let Some((i, part)) = self.part() else {
            return false;
        };
        let valid = LETTERS[..part.choices.len().min(LETTERS.len())].contains(&c);
        if !valid || self.answers[i] != Answer::Open {
            return false;
        }
        if self.poll {
            self.notice = Some("poll mode: letters are not recorded; v reveals the answer".into());
            return true;
        }
        self.answers[i] = Answer::Given(c);
        self.scroll = 0;
        true
    }

    /// Show the answer with no letter recorded as the room's.
    fn reveal(&mut self) -> bool {
        let Some((i, _)) = self.part() else {
            return false;
        };
        if self.answers[i] != Answer::Open {
            return false;
        }
        self.answers[i] = Answer::Revealed;
        self.scroll = 0;
        true
    }

    /// Keep the place on disk (nothing on the introduction, where a saved
    /// place is still on offer); a failure is said, never fatal.
    fn save(&mut self) {
        let Some(store) = &self.store else {
            return;
        };
        if self.page == Page::Intro {
            return;
        }
        let p = Progress {
            lesson: self.lesson.name.clone(),
            seed: store.seed,
            place: self.page,
            answers: self.answers.clone(),
        };
        if let Err(e) = p.save(&store.path) {
            self.notice = Some(format!("the place is not saved: {e}"));
        }
    }

    /// The clock for the header: elapsed, and where the lesson's own
    /// length says the class would be by now.
    pub fn pace(&self) -> String {
        let secs = self.elapsed.as_secs();
        let clock = format!("⏱ {}:{:02}", secs / 60, secs % 60);
        let n = self.lesson.parts.len();
        match self.lesson.minutes {
            Some(m) if m > 0 && n > 0 => {
                let due = (secs as f64 / (f64::from(m) * 60.0) * n as f64).floor() as usize + 1;
                let due = due.min(n);
                format!("{clock} of ~{m} min · on time at part {due}")
            }
            _ => clock,
        }
    }
}

/// `part 7 of 11`, `the summary`, for the resume offer.
pub fn place_words(p: Page) -> String {
    match p {
        Page::Intro => "the introduction".into(),
        Page::Part(i) => format!("part {}", i + 1),
        Page::Summary => "the summary".into(),
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

/// The longest wait for a key: a lesson only changes when the learner acts
/// (and the clock, once a second).
const LESSON_FRAME: std::time::Duration = std::time::Duration::from_millis(100);

/// A lesson's screens in the one loop; it stops when the learner quits or
/// asks for a part's scenario (`open` says which: the caller runs it in the
/// run view and may come back).
impl super::screen::Screen for LessonState {
    fn begin(&mut self) {
        self.open = None;
    }

    fn handle_key(&mut self, key: KeyEvent) -> bool {
        let (page, answers) = (self.page, self.answers.clone());
        let changed = LessonState::handle_key(self, key);
        if self.page != page || self.answers != answers {
            self.save();
        }
        self.clamp_scroll();
        changed
    }

    fn tick(&mut self, elapsed: Duration) -> bool {
        let before = self.elapsed.as_secs();
        self.elapsed += elapsed;
        self.elapsed.as_secs() != before
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
