//! One file per panel, each a pure `render(frame, area, app, …)` reading the
//! data `App::prepare` built. `draw` places them by the layout.

pub mod by_line;
pub mod code;
pub mod error;
pub mod error_marker;
pub mod event_log;
pub mod figures;
pub mod gpu;
pub mod help;
pub mod leaks;
mod legend;
pub mod lesson;
pub mod narration;
pub mod popup;
pub mod segment_map;
pub mod stats;
pub mod status;
pub mod sweep;
pub mod tabs;
pub mod timeline;
pub mod too_small;
pub mod watch;

use ratatui::layout::Rect;
use ratatui::widgets::Block;
use ratatui::Frame;

use super::app::{App, TabView};

pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    let a = &app.areas;
    frame.render_widget(Block::default().style(app.theme.text()), area);
    if a.too_small {
        too_small::render(frame, area, app);
        return;
    }
    if a.full != area {
        // Resized between prepare and draw: the Resize event that follows
        // redraws; a layout for another size would be garbage.
        return;
    }
    status::render(frame, a.status, app);
    status::render_hints(frame, a.hints, app);
    for (i, ra) in a.runs.iter().enumerate() {
        if let Some(c) = ra.code {
            code::render(frame, c, app, i);
        }
        if let Some(m) = ra.map {
            segment_map::render(frame, m, app, i);
        }
        if let Some(b) = ra.by_line {
            by_line::render(frame, b, app, i);
        }
        if let Some(n) = ra.narration {
            narration::render(frame, n, app, i);
        }
        if let Some(e) = ra.error {
            error_marker::render(frame, e, app, i);
        }
        if let Some(f) = ra.figures {
            figures::render(frame, f, app, i);
        }
        timeline::render(frame, ra.timeline, app, i);
        let fail_area = ra.map.unwrap_or(ra.timeline);
        error::render(frame, fail_area, app, i);
    }
    for (i, s) in a.stats.iter().enumerate() {
        let run = if a.stats.len() > 1 { i } else { app.active };
        stats::render(frame, *s, app, run);
    }
    if a.leak_panels.is_empty() {
        if let Some(l) = a.leaks {
            leaks::render(frame, l, app);
        }
    }
    for (i, l) in a.leak_panels.iter().enumerate() {
        leaks::render_run(frame, *l, app, i);
    }
    if let Some(l) = a.log {
        event_log::render(frame, l, app, app.active);
    }
    if let Some(t) = &app.tabs {
        if let Some(bar) = a.tab_bar {
            tabs::render_bar(frame, bar, t, &app.theme);
        }
        let below = a.status.y.saturating_add(1);
        let over = Rect {
            x: area.x,
            y: below,
            width: area.width,
            height: a.hints.y.saturating_sub(below),
        };
        let shown = app.runs.first().map_or("", |r| r.title.as_str());
        match (t.view, &t.table, &t.diff) {
            (Some(TabView::Table), Some(table), _) => {
                tabs::render_table(frame, over, table, shown, t.scroll, &app.theme);
            }
            (Some(TabView::Diff), _, Some(d)) => {
                tabs::render_diff(frame, over, d, t.scroll, &app.theme);
            }
            _ => {}
        }
    }
    if app.gpu.shown {
        gpu::render(frame, area, app);
    }
    if app.popup.is_some() {
        popup::render(frame, app);
    }
    if app.show_help {
        help::render(frame, area, app);
    }
}

/// A message as one paragraph: PyTorch breaks some of its messages over
/// lines (the autocast BCE ban), and a terminal line drops the breaks
/// without leaving a space.
pub(crate) fn one_line(text: &str) -> String {
    text.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The start of `text` in `width` characters, `…` where it was cut.
pub(crate) fn fit_head(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let keep: String = text.chars().take(width.saturating_sub(1)).collect();
    format!("{keep}…")
}

/// The end of `text` in `width` characters, `…` where it was cut.
pub(crate) fn fit_tail(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n <= width || width < 2 {
        return text.to_string();
    }
    let keep: String = text.chars().skip(n - (width - 1)).collect();
    format!("…{keep}")
}

/// A call site (`path:line in name`) in `width` characters: whole where it
/// fits, else without as many leading folders as it takes (file, line and
/// function are what a reader looks for; the stack popup shows it whole),
/// else its end.
pub(crate) fn fit_site(site: &str, width: usize) -> String {
    if site.chars().count() <= width {
        return site.to_string();
    }
    let loc_end = site.find(" in ").unwrap_or(site.len());
    let cuts = site[..loc_end].match_indices(['/', '\\']).map(|(i, _)| i);
    let mut last = None;
    for cut in cuts {
        let short = format!("…{}", &site[cut..]);
        if short.chars().count() <= width {
            return short;
        }
        last = Some(short);
    }
    fit_tail(last.as_deref().unwrap_or(site), width)
}

#[cfg(test)]
mod tests {
    use super::fit_site;

    #[test]
    fn a_long_site_keeps_its_file_line_and_function() {
        let site = "/home/u/project/src/model.py:42 in forward";
        assert_eq!(fit_site(site, 60), site);
        assert_eq!(fit_site(site, 27), "…/model.py:42 in forward");
        assert_eq!(fit_site(site, 28), "…/src/model.py:42 in forward");
        assert!(fit_site(site, 12).ends_with(" in forward"));
        assert_eq!(fit_site(site, 12).chars().count(), 12);
        assert_eq!(fit_site("(no stack recorded)", 10).chars().count(), 10);
    }
}
