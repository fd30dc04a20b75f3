//! Zoom and pan: `z` / `Z` and `<` / `>` (and the mouse wheel) on the map
//! or the timeline, by focus.

use super::{App, MAX_MAP_ZOOM};
use crate::tui::layout::Focus;

impl App {
    pub(super) fn zoom_timeline(&mut self, run: usize, zoom_in: bool) -> bool {
        let Some(r) = self.runs.get_mut(run) else {
            return false;
        };
        let before = r.tl_zoom;
        r.tl_zoom = if zoom_in {
            (r.tl_zoom * 2).min(1 << 20)
        } else {
            (r.tl_zoom / 2).max(1)
        };
        if before == 1 && zoom_in && r.tl_anchor == 0 {
            r.tl_anchor = r.pos;
        }
        r.tl_zoom != before
    }

    pub(super) fn zoom(&mut self, zoom_in: bool) -> bool {
        let active = self.active;
        match self.focus {
            Focus::Timeline => {
                if let Some(r) = self.runs.get_mut(active) {
                    r.tl_anchor = r.pos;
                }
                self.zoom_timeline(active, zoom_in)
            }
            _ => {
                let Some(r) = self.active_mut() else {
                    return false;
                };
                let before = r.map_zoom;
                r.map_zoom = if zoom_in {
                    (r.map_zoom * 2).min(MAX_MAP_ZOOM)
                } else {
                    (r.map_zoom / 2).max(1)
                };
                // Keep the same part in view.
                r.map_scroll_x = if zoom_in {
                    r.map_scroll_x * 2
                } else {
                    r.map_scroll_x / 2
                };
                r.map_zoom != before
            }
        }
    }

    pub(super) fn pan(&mut self, dir: isize) -> bool {
        let focus = self.focus;
        let Some(r) = self.active_mut() else {
            return false;
        };
        match focus {
            Focus::Timeline => {
                let (a, b) = r.timeline_range();
                let step = ((b - a) / 4).max(1);
                r.tl_anchor = if dir > 0 {
                    (r.tl_anchor.max(a + (b - a) / 2) + step).min(r.len())
                } else {
                    r.tl_anchor.min(a + (b - a) / 2).saturating_sub(step)
                };
            }
            _ => {
                let w = r.frame.map.bar_width.max(4);
                r.map_scroll_x = if dir > 0 {
                    r.map_scroll_x + w / 2
                } else {
                    r.map_scroll_x.saturating_sub(w / 2)
                };
            }
        }
        true
    }
}
