//! `vramscope lesson`'s screens: the intro, a question with its choices
//! (then, once answered, right or wrong and the explanation), and the
//! summary with the learner's score. A pure function of `LessonState`: the
//! text is the lesson's own.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;

use crate::lesson::{Part, LETTERS};
use crate::tui::lesson::{LessonState, Page};
use crate::tui::theme::Theme;

/// The widest the lesson's text box grows.
const READABLE: u16 = 100;

/// The screen's status line, text box and key hints.
fn areas(area: Rect) -> [Rect; 3] {
    let [status, body, hints] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(1),
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
        Page::Part(i) => part(
            &s.lesson.parts[i],
            s.answers[i],
            th,
            width.saturating_sub(2),
        ),
        Page::Summary => summary(s, th),
    }
}

/// How far the current screen's text scrolls on a terminal of `area`: the
/// wrapped lines that do not fit in the text box.
pub fn max_scroll(area: Rect, s: &LessonState) -> u16 {
    let [_, body, _] = areas(area);
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
    let [status, body, hints] = areas(area);
    let n = s.lesson.parts.len();
    let (place, title) = match s.page {
        Page::Intro => ("introduction".to_string(), s.lesson.title.clone()),
        Page::Part(i) => (
            format!("part {} of {n}", i + 1),
            format!("scenario {}", s.lesson.parts[i].scenario),
        ),
        Page::Summary => ("summary".to_string(), s.lesson.title.clone()),
    };
    let answered = s.answers.iter().filter(|a| a.is_some()).count();
    let status_text = format!(
        " vramscope lesson │ {} │ {place} │ answered {answered}/{n} · {} right",
        s.lesson.name,
        s.score()
    );
    frame.render_widget(
        Paragraph::new(Span::styled(status_text, th.status())).style(th.status()),
        status,
    );
    frame.render_widget(
        Paragraph::new(Span::styled(format!(" {}", s.hints()), th.dim())),
        hints,
    );
    let most = max_scroll(area, s);
    let scroll = s.scroll.min(most);
    let mut block = Block::default()
        .borders(Borders::ALL)
        .border_style(th.border(true))
        .title(Span::styled(format!(" {title} "), th.title()));
    // Text that runs past the box says so, or a learner never reads it.
    if scroll > 0 {
        block = block.title_top(Line::styled(" ↑ more ", th.dim()).right_aligned());
    }
    if scroll < most {
        block = block.title_bottom(Line::styled(" ↓ more (↓/j) ", th.dim()).right_aligned());
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
        "Each part asks a question before its scenario runs: answer with a key, read why, then watch it in the run view (q there comes back here).",
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

fn part<'a>(p: &'a Part, given: Option<char>, th: &Theme, width: u16) -> Vec<Line<'a>> {
    let mut lines = Vec::new();
    paragraphs(&mut lines, &p.setup, th);
    lines.push(Line::styled(
        p.question.as_str(),
        th.title().add_modifier(Modifier::BOLD),
    ));
    lines.push(Line::raw(""));
    for (letter, choice) in LETTERS.iter().zip(&p.choices) {
        let mark = match given {
            Some(_) if *letter == p.answer => ("✓ ", th.fg(th.palette.allocated)),
            Some(g) if g == *letter => ("✗ ", th.fg(th.palette.error)),
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
    match given {
        None => lines.push(Line::styled("Your answer?", th.dim())),
        Some(g) => {
            let verdict = if g == p.answer {
                format!("Right: {g}.")
            } else {
                format!("Not quite: you said {g}, the answer is {}.", p.answer)
            };
            let style = if g == p.answer {
                th.fg(th.palette.allocated)
            } else {
                th.fg(th.palette.error)
            };
            lines.push(Line::styled(verdict, style.add_modifier(Modifier::BOLD)));
            lines.push(Line::raw(""));
            paragraphs(&mut lines, &p.explanation, th);
        }
    }
    lines
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
            Some(g) if *g == p.answer => ("✓", th.fg(th.palette.allocated)),
            Some(_) => ("✗", th.fg(th.palette.error)),
            None => ("·", th.dim()),
        };
        lines.push(Line::from(vec![
            Span::styled(format!("{mark} {}. ", i + 1), style),
            Span::styled(p.scenario.as_str(), th.text()),
        ]));
    }
    lines.push(Line::raw(""));
    paragraphs(&mut lines, &s.lesson.summary, th);
    lines
}
