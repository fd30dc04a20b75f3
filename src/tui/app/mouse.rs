//! Mouse input: clicks focus and select, drags seek the timeline or pan the
//! map, the wheel zooms the timeline and scrolls the map and the log.

use crossterm::event::{MouseButton, MouseEvent, MouseEventKind};

use super::{App, Drag};
use crate::tui::input::PopupAction;
use crate::tui::layout::{self, Focus};

impl App {
    pub fn handle_mouse(&mut self, ev: MouseEvent) -> bool {
        if self.areas.too_small || self.show_help {
            return false;
        }
        let (x, y) = (ev.column, ev.row);
        if let Some(p) = self.popup.as_mut() {
            // A popup is modal: the wheel scrolls it, the rest waits.
            let by = match ev.kind {
                MouseEventKind::ScrollDown => 3,
                MouseEventKind::ScrollUp => -3,
                _ => return false,
            };
            p.key(PopupAction::Scroll(by));
            return true;
        }
        match ev.kind {
            MouseEventKind::Down(MouseButton::Left) => self.click(x, y),
            MouseEventKind::Drag(MouseButton::Left) => self.drag_to(x, y),
            MouseEventKind::Up(_) => {
                self.drag = None;
                false
            }
            MouseEventKind::ScrollDown => self.scroll(x, y, 1),
            MouseEventKind::ScrollUp => self.scroll(x, y, -1),
            _ => false,
        }
    }

    fn click(&mut self, x: u16, y: u16) -> bool {
        if self
            .areas
            .tab_bar
            .is_some_and(|b| layout::contains(b, x, y))
        {
            return self.click_tab(x);
        }
        for i in 0..self.areas.runs.len() {
            let ra = self.areas.runs[i];
            if layout::contains(ra.timeline, x, y) {
                self.active = i;
                self.focus = Focus::Timeline;
                self.drag = Some(Drag::Timeline(i));
                return self.seek_timeline_column(i, x);
            }
            if let Some(pane) = ra.by_line.filter(|p| layout::contains(*p, x, y)) {
                self.active = i;
                self.focus = Focus::Map;
                let row = usize::from(y.saturating_sub(pane.y + 1));
                let Some(r) = self.runs.get_mut(i) else {
                    return false;
                };
                let first = r.by_line.as_ref().map_or(0, |p| p.scroll);
                return row < r.frame.by_line.rows.len() && r.select_site(first + row);
            }
            let callouts = [ra.narration, ra.error];
            if callouts
                .iter()
                .flatten()
                .any(|c| layout::contains(*c, x, y))
            {
                self.active = i;
                return self.show_message();
            }
            if ra.map.is_some_and(|m| layout::contains(m, x, y)) {
                self.active = i;
                self.focus = Focus::Map;
                let scroll = self.runs.get(i).map_or(0, |r| r.map_scroll_x);
                self.drag = Some(Drag::Map { run: i, x, scroll });
                if let Some(r) = self.runs.get_mut(i) {
                    if let Some(addr) = r.frame.map.block_at_cell(x, y) {
                        r.sel_block = Some(addr);
                    }
                }
                return true;
            }
        }
        if let Some(l) = self.areas.leaks.filter(|l| layout::contains(*l, x, y)) {
            self.focus = Focus::Leaks;
            let row = usize::from(y.saturating_sub(l.y + 1));
            if let Some(r) = self.active_mut() {
                if row < r.findings.len() {
                    r.sel_finding = Some(row);
                }
            }
            return true;
        }
        if self.areas.log.is_some_and(|l| layout::contains(l, x, y)) {
            self.focus = Focus::Log;
            return true;
        }
        if self.areas.stats.iter().any(|s| layout::contains(*s, x, y)) {
            self.focus = Focus::Stats;
            return true;
        }
        false
    }

    fn drag_to(&mut self, x: u16, _y: u16) -> bool {
        match self.drag {
            Some(Drag::Timeline(i)) => self.seek_timeline_column(i, x),
            Some(Drag::Map { run, x: x0, scroll }) => {
                let Some(r) = self.runs.get_mut(run) else {
                    return false;
                };
                // Dragging right pulls the content right, like a map.
                let delta = i64::from(x0) - i64::from(x);
                r.map_scroll_x = (scroll as i64 + delta).max(0) as usize;
                true
            }
            None => false,
        }
    }

    fn seek_timeline_column(&mut self, run: usize, x: u16) -> bool {
        let Some(r) = self.runs.get(run) else {
            return false;
        };
        let Some(idx) = r.frame.timeline.event_at_x(x) else {
            return false;
        };
        self.active = run;
        self.playing = false;
        self.set_active_pos(idx + 1);
        true
    }

    fn scroll(&mut self, x: u16, y: u16, dir: i32) -> bool {
        for i in 0..self.areas.runs.len() {
            let ra = self.areas.runs[i];
            if layout::contains(ra.timeline, x, y) {
                self.active = i;
                // Wheel on the timeline zooms around the mouse.
                if let Some(idx) = self.runs[i].frame.timeline.event_at_x(x) {
                    self.runs[i].tl_anchor = idx;
                }
                return self.zoom_timeline(i, dir < 0);
            }
            if ra.map.is_some_and(|m| layout::contains(m, x, y)) {
                let r = &mut self.runs[i];
                r.map_scroll_y = if dir > 0 {
                    r.map_scroll_y + 3
                } else {
                    r.map_scroll_y.saturating_sub(3)
                };
                return true;
            }
        }
        if self.areas.log.is_some_and(|l| layout::contains(l, x, y)) {
            if let Some(r) = self.active_mut() {
                r.scroll_log(dir as isize * 3);
            }
            return true;
        }
        false
    }
}
