//! `vramscope lesson`'s screens: the intro, a question with its choices
//! (then, once answered, right or wrong and the explanation), and the
//! summary with the learner's score. A pure function of `LessonState`: the
//! text is the lesson's own.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;

use crate::lesson::{Part, LETTERS};
use crate::tui::lesson::{place_words, Answer, Checked, LessonState, Page};
use crate::tui::theme::Theme;

/// The widest the lesson's text box grows.
const READABLE: u16 = 100;

/// The screen's status line, text box and key hints.
/// The status line's text, and the clock with the pace: one line where
/// both fit, else the clock on a line of its own below, so neither is cut.
fn header(s: &LessonState, place: &str) -> (String, String) {
    let n = s.lesson.parts.len();
    let (given, revealed) = s.counts();
    let polled = if revealed > 0 {
        format!(" · {revealed} revealed")
    } else {
        String::new()
    };
    let left = format!(
        " vramscope lesson │ {} │ {place} │ answered {given}/{n} · {} right{polled}",
        s.lesson.name,
        s.score()
    );
    let poll = if s.poll {
        "POLL: no key recorded │ "
    } else {
        ""
    };
    (left, format!(" {poll}{} ", s.pace()))
}

/// The place the status line names.
fn place(s: &LessonState) -> String {
    let n = s.lesson.parts.len();
    match s.page {
        Page::Intro => "introduction".to_string(),
        Page::Part(i) => format!("part {} of {n}", i + 1),
        Page::Summary => "summary".to_string(),
    }
}

fn areas(area: Rect, s: &LessonState) -> [Rect; 3] {
    // A notice takes a line of its own above the keys, so neither is cut.
    let keys = if s.notice.is_some() { 2 } else { 1 };
    let (left, pace) = header(s, &place(s));
    let one_line = left.chars().count() + pace.chars().count() <= usize::from(area.width);
    let [status, body, hints] = Layout::vertical([
        Constraint::Length(if one_line { 1 } else { 2 }),
        Constraint::Min(3),
        Constraint::Length(keys),
    ])
    .areas(area);
    // Prose reads badly across a wide screen: at most READABLE columns, centred.
    let body = if body.width > READABLE {
        Rect {
            x: body.x + (body.width - READABLE) / 2,
            width: READABLE,
            ..body
        }
    } else {
        body
    };
    [status, body, hints]
}

fn body_lines(s: &LessonState, width: u16) -> Vec<Line<'_>> {
    let th = &s.theme;
    match s.page {
        Page::Intro => intro(s, th),
        Page::Part(i) => {
            let mut lines = Vec::new();
            if s.checked[i].as_ref().is_some_and(|c| !c.holds()) {
                lines.push(Line::styled(
                    "⚠ This part's checks fail on its run: it states what the run does not show (listed below its answer).",
                    th.fg(th.palette.error).add_modifier(Modifier::BOLD),
                ));
                lines.push(Line::raw(""));
            }
            lines.extend(part(
                &s.lesson.parts[i],
                s.answers[i],
                th,
                width.saturating_sub(2),
            ));
            if s.answers[i] != Answer::Open {
                if let Some(c) = &s.checked[i] {
                    checks(&mut lines, c, th);
                }
            }
            lines
        }
        Page::Summary => summary(s, th),
    }
}

/// How far the current screen's text scrolls on a terminal of `area`: the
/// wrapped lines that do not fit in the text box.
pub fn max_scroll(area: Rect, s: &LessonState) -> u16 {
    let [_, body, _] = areas(area, s);
    let wrapped = Paragraph::new(body_lines(s, body.width))
        .wrap(Wrap { trim: false })
        .line_count(body.width.saturating_sub(2));
    let room = usize::from(body.height.saturating_sub(2));
    u16::try_from(wrapped.saturating_sub(room)).unwrap_or(u16::MAX)
}

pub fn render(frame: &mut Frame, s: &LessonState) {
    let area = frame.area();
    let th = &s.theme;
    frame.render_widget(Block::default().style(th.text()), area);
    let [status, body, hints] = areas(area, s);
    let title = match s.page {
        Page::Part(i) => format!("scenario {}", s.lesson.parts[i].scenario),
        Page::Intro | Page::Summary => s.lesson.title.clone(),
    };
    let (left, pace) = header(s, &place(s));
    let line = if status.height > 1 {
        Text::from(vec![
            Line::raw(left),
            Line::styled(pace, th.status().add_modifier(Modifier::BOLD)),
        ])
    } else {
        let gap =
            usize::from(status.width).saturating_sub(left.chars().count() + pace.chars().count());
        Text::from(Line::raw(format!("{left}{}{pace}", " ".repeat(gap))))
    };
    frame.render_widget(Paragraph::new(line).style(th.status()), status);
    let mut hint = Vec::new();
    if let Some(n) = &s.notice {
        hint.push(Line::styled(format!(" {n}"), th.title()));
    }
    hint.push(Line::styled(format!(" {}", s.hints()), th.dim()));
    frame.render_widget(Paragraph::new(hint).wrap(Wrap { trim: false }), hints);
    let most = max_scroll(area, s);
    let scroll = s.scroll.min(most);
    let mut block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(true))
        .title(Span::styled(format!(" {title} "), th.title()));
    // Text that runs past the box says so, or a learner never reads it;
    // on the bottom border, where it covers no title.
    let more = match (scroll > 0, scroll < most) {
        (true, true) => Some(" ↑ more · ↓ more (↓/j) "),
        (true, false) => Some(" ↑ more (↑/k) "),
        (false, true) => Some(" ↓ more (↓/j) "),
        (false, false) => None,
    };
    if let Some(more) = more {
        block = block.title_bottom(Line::styled(more, th.dim()).right_aligned());
    }
    frame.render_widget(
        Paragraph::new(body_lines(s, body.width))
            .block(block)
            .wrap(Wrap { trim: false })
            .scroll((scroll, 0)),
        body,
    );
}

fn paragraphs<'a>(lines: &mut Vec<Line<'a>>, ps: &'a [String], th: &Theme) {
    for p in ps {
        lines.push(Line::styled(p.as_str(), th.text()));
        lines.push(Line::raw(""));
    }
}

fn intro<'a>(s: &'a LessonState, th: &Theme) -> Vec<Line<'a>> {
    let mut lines = Vec::new();
    failing(&mut lines, s, th);
    if let Some(p) = &s.resume {
        let given = p
            .answers
            .iter()
            .filter(|a| matches!(a, Answer::Given(_)))
            .count();
        lines.push(Line::styled(
            format!(
                "Last time this lesson stopped at {} ({given} answered): r resumes there, Enter starts afresh.",
                place_words(p.place)
            ),
            th.title().add_modifier(Modifier::BOLD),
        ));
        lines.push(Line::raw(""));
    }
    let minutes = s
        .lesson
        .minutes
        .map(|m| format!(" · about {m} minutes"))
        .unwrap_or_default();
    lines.push(Line::styled(
        format!("{} questions{minutes}", s.lesson.parts.len()),
        th.dim(),
    ));
    lines.push(Line::raw(""));
    paragraphs(&mut lines, &s.lesson.intro, th);
    lines.push(Line::styled(
        "Each part asks a question before its scenario runs: answer with a key (or v reveals it for a show of hands; P makes that the rule), read why, then watch it in the run view (q there comes back here). s skips a question, g and a number jump to that part, and q saves the place for next time.",
        th.dim(),
    ));
    lines
}

/// `text` in lines of at most `width` columns, broken at spaces, the
/// first after `first`, the rest indented by as many columns.
fn hanging(text: &str, width: usize, first: usize) -> Vec<String> {
    let room = width.saturating_sub(first).max(10);
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let used = line.chars().count();
        if used > 0 && used + 1 + word.chars().count() > room {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines
}

fn part<'a>(p: &'a Part, given: Answer, th: &Theme, width: u16) -> Vec<Line<'a>> {
    let mut lines = Vec::new();
    paragraphs(&mut lines, &p.setup, th);
    lines.push(Line::styled(
        p.question.as_str(),
        th.title().add_modifier(Modifier::BOLD),
    ));
    lines.push(Line::raw(""));
    for (letter, choice) in LETTERS.iter().zip(&p.choices) {
        let mark = match given {
            Answer::Given(_) | Answer::Revealed if *letter == p.answer => {
                ("✓ ", th.fg(th.palette.allocated))
            }
            Answer::Given(g) if g == *letter => ("✗ ", th.fg(th.palette.error)),
            _ => ("  ", th.text()),
        };
        // Marks and letters take 5 columns; wrapped lines start under the text.
        for (j, text) in hanging(choice, usize::from(width), 5)
            .into_iter()
            .enumerate()
        {
            let lead = if j == 0 {
                vec![
                    Span::styled(mark.0, mark.1),
                    Span::styled(format!("{letter}) "), th.title()),
                ]
            } else {
                vec![Span::raw("     ")]
            };
            let mut spans = lead;
            spans.push(Span::styled(text, th.text()));
            lines.push(Line::from(spans));
        }
    }
    lines.push(Line::raw(""));
    let right = th.fg(th.palette.allocated);
    let verdict = match given {
        Answer::Open => {
            lines.push(Line::styled("Your answer?", th.dim()));
            return lines;
        }
        Answer::Given(g) if g == p.answer => Line::styled(format!("Right: {g}."), right),
        Answer::Given(g) => Line::styled(
            format!("Not quite: you said {g}, the answer is {}.", p.answer),
            th.fg(th.palette.error),
        ),
        Answer::Revealed => Line::styled(
            format!(
                "The answer is {} (revealed for a poll; no letter recorded as the room's).",
                p.answer
            ),
            right,
        ),
    };
    lines.push(verdict.patch_style(Modifier::BOLD));
    lines.push(Line::raw(""));
    paragraphs(&mut lines, &p.explanation, th);
    lines
}

/// What the part's run was checked against: each check with what the run
/// showed, and the sizes the text states.
fn checks<'a>(lines: &mut Vec<Line<'a>>, c: &'a Checked, th: &Theme) {
    if c.checks.is_empty() && c.prose_held == 0 && c.prose_failed.is_empty() {
        return;
    }
    lines.push(Line::styled(
        "Checked on this part's run:",
        th.title().add_modifier(Modifier::BOLD),
    ));
    for r in c.checks.iter().chain(&c.prose_failed) {
        let (mark, style) = if r.passed {
            ("✓ ", th.fg(th.palette.allocated))
        } else {
            ("✗ FAILED ", th.fg(th.palette.error))
        };
        lines.push(Line::from(vec![
            Span::styled(mark, style),
            Span::styled(format!("{} — {}", r.expectation, r.observed), th.text()),
        ]));
    }
    if c.prose_held > 0 {
        lines.push(Line::from(vec![
            Span::styled("✓ ", th.fg(th.palette.allocated)),
            Span::styled(
                format!(
                    "{} the text states {} the run shows",
                    crate::units::counted(c.prose_held as u32, "other size"),
                    if c.prose_held == 1 {
                        "is one"
                    } else {
                        "are ones"
                    }
                ),
                th.text(),
            ),
        ]));
    }
    lines.push(Line::raw(""));
}

/// A warning for a lesson whose checks fail: it teaches what its runs do
/// not show there.
fn failing<'a>(lines: &mut Vec<Line<'a>>, s: &LessonState, th: &Theme) {
    let parts = s.failing_parts();
    if parts.is_empty() && s.framing_failed.is_empty() {
        return;
    }
    let mut what: Vec<String> = Vec::new();
    if !parts.is_empty() {
        let list: Vec<String> = parts.iter().map(usize::to_string).collect();
        what.push(format!("part {}", list.join(", ")));
    }
    if !s.framing_failed.is_empty() {
        what.push("the introduction or summary".into());
    }
    lines.push(Line::styled(
        format!(
            "⚠ This lesson's checks fail on its runs ({}): it states what the run does not show. `vramscope lesson {} --headless` lists them.",
            what.join("; "),
            s.lesson.name
        ),
        th.fg(th.palette.error).add_modifier(Modifier::BOLD),
    ));
    lines.push(Line::raw(""));
}

fn summary<'a>(s: &'a LessonState, th: &Theme) -> Vec<Line<'a>> {
    let mut lines = vec![
        Line::styled(
            format!(
                "You answered {} of {} questions right.",
                s.score(),
                s.lesson.parts.len()
            ),
            th.title().add_modifier(Modifier::BOLD),
        ),
        Line::raw(""),
    ];
    for (i, (p, a)) in s.lesson.parts.iter().zip(&s.answers).enumerate() {
        let (mark, style) = match a {
            Answer::Given(g) if *g == p.answer => ("✓", th.fg(th.palette.allocated)),
            Answer::Given(_) => ("✗", th.fg(th.palette.error)),
            Answer::Revealed => ("?", th.dim()),
            Answer::Open => ("·", th.dim()),
        };
        // The question names the part's topic; its scenario's name is
        // the engine's, not the room's.
        lines.push(Line::from(vec![
            Span::styled(format!("{mark} {}. ", i + 1), style),
            Span::styled(p.question.as_str(), th.text()),
        ]));
    }
    lines.push(Line::styled(
        "✓ right  ✗ wrong  ? revealed in a poll  · skipped",
        th.dim(),
    ));
    lines.push(Line::raw(""));
    paragraphs(&mut lines, &s.lesson.summary, th);
    lines
}
