//! The presenter's figures strip: allocated, reserved, the peak so far and
//! the step (iteration and phase) at the cursor, in glyphs large enough to
//! read from the back of a room (`tui-big-text`'s 8×8 font, a quarter
//! cell a pixel), each under its name spelled out. The values are the
//! ones the timeline's title gives exactly, rounded for the room; `prepare`
//! takes them from the run, `render` only draws.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;
use tui_big_text::{BigText, PixelSize};

use crate::tui::app::App;
use crate::tui::run_view::RunView;

/// Rows the strip takes: the names, then four rows of large glyphs.
pub const HEIGHT: u16 = 5;
/// Columns one large character takes (8 pixels, two a cell).
const CHAR_W: usize = 4;

/// One figure: its name, spelled out, and its value for the large glyphs
/// (rounded; the timeline's title has it exactly).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BigFigure {
    pub name: String,
    pub value: String,
}

/// `591 MiB`, `1.4 GiB`, `12 KiB`: three figures at most, for the room.
pub fn room_size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    let (v, unit) = if b >= KIB * KIB * KIB {
        (b / (KIB * KIB * KIB), "GiB")
    } else if b >= KIB * KIB {
        (b / (KIB * KIB), "MiB")
    } else if b >= KIB {
        (b / KIB, "KiB")
    } else {
        return format!("{bytes} B");
    };
    if v < 10.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.0} {unit}")
    }
}

/// The figures at the run's cursor.
pub fn prepare(r: &RunView) -> Vec<BigFigure> {
    let peak = r.timeline.peak_until(r.pos).allocated;
    let step = match (r.frame.iteration, r.frame.phase) {
        (Some(k), Some(p)) => (format!("iteration {k} · {p}"), format!("{k} {}", short(p))),
        (Some(k), None) => (format!("iteration {k}"), k.to_string()),
        (None, Some(p)) => (p.to_string(), short(p).to_string()),
        (None, None) => ("step".to_string(), "–".to_string()),
    };
    vec![
        BigFigure {
            name: "allocated".into(),
            value: room_size(r.map.allocated),
        },
        BigFigure {
            name: "reserved".into(),
            value: room_size(r.map.reserved),
        },
        BigFigure {
            name: "peak so far".into(),
            value: room_size(peak),
        },
        BigFigure {
            name: step.0,
            value: step.1,
        },
    ]
}

/// A phase in three letters for the large glyphs (its name is spelled
/// out above them).
fn short(phase: &str) -> &str {
    match phase {
        "forward" => "fwd",
        "backward" => "bwd",
        "optimizer" => "opt",
        "zero_grad" => "zero",
        "setup" => "set",
        other => other,
    }
}

pub fn render(frame: &mut Frame, area: Rect, app: &App, run: usize) {
    let Some(r) = app.runs.get(run) else { return };
    let th = &app.theme;
    let figures = &r.frame.big;
    if figures.is_empty() {
        return;
    }
    let cells = Layout::horizontal(vec![Constraint::Fill(1); figures.len()]).split(area);
    for (f, cell) in figures.iter().zip(cells.iter()) {
        let [name, value] =
            Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(*cell);
        frame.render_widget(
            Paragraph::new(Line::from(Span::styled(format!(" {}", f.name), th.dim()))),
            name,
        );
        let fits = f.value.chars().count() * CHAR_W < usize::from(value.width) && value.height >= 4;
        if fits {
            let big = BigText::builder()
                .pixel_size(PixelSize::Quadrant)
                .style(th.title())
                .lines(vec![Line::from(f.value.clone())])
                .build();
            let inset = Rect {
                x: value.x + 1,
                width: value.width.saturating_sub(1),
                ..value
            };
            frame.render_widget(big, inset);
        } else {
            // Too narrow for the large glyphs: the value in bold.
            frame.render_widget(
                Paragraph::new(Line::from(Span::styled(
                    format!(" {}", f.value),
                    th.title().add_modifier(ratatui::style::Modifier::BOLD),
                ))),
                value,
            );
        }
    }
}
