//! The keys that move a selection: a block on the map, a line of the
//! by-line pane, a finding, the event log; page by segment; Enter to the
//! event that allocated the selected block.

use super::{App, Focus};
use crate::alloc::Action;
use crate::trace::Event;
use crate::tui::views::segment_map;

impl App {
    pub(super) fn select(&mut self, delta: isize) -> bool {
        let focus = self.focus;
        let Some(r) = self.active_mut() else {
            return false;
        };
        // Keys act on the state at the cursor, which may have moved since the last frame.
        r.sync_map();
        match focus {
            Focus::Map | Focus::Timeline | Focus::Stats if r.by_line.is_some() => {
                return r.move_site(delta);
            }
            Focus::Map | Focus::Timeline | Focus::Stats => {
                let spans = r.row_spans().to_vec();
                let order = segment_map::block_order(&r.map, &spans);
                if order.is_empty() {
                    return false;
                }
                let cur = r.sel_block.and_then(|a| order.iter().position(|b| *b == a));
                let next = match cur {
                    Some(i) => (i as isize + delta).clamp(0, order.len() as isize - 1) as usize,
                    None if delta > 0 => 0,
                    None => order.len() - 1,
                };
                r.sel_block = Some(order[next]);
            }
            Focus::Leaks => {
                if r.findings.is_empty() {
                    return false;
                }
                let n = r.findings.len() as isize;
                r.sel_finding = Some(match r.sel_finding {
                    Some(i) => (i as isize + delta).clamp(0, n - 1) as usize,
                    None => 0,
                });
                r.leak_scroll = 0;
            }
            Focus::Log => r.scroll_log(delta),
        }
        true
    }

    pub(super) fn page(&mut self, delta: isize) -> bool {
        let focus = self.focus;
        let Some(r) = self.active_mut() else {
            return false;
        };
        // Keys act on the state at the cursor, which may have moved since the last frame.
        r.sync_map();
        match focus {
            Focus::Log => r.scroll_log(delta * 10),
            // A finding's path and evidence can outgrow a small panel.
            Focus::Leaks => r.leak_scroll = r.leak_scroll.saturating_add_signed(delta as i16 * 5),
            _ if r.by_line.is_some() => {
                let page = r.frame.by_line.rows.len().max(1) as isize;
                return r.move_site(delta * page);
            }
            _ => {
                // Next/previous segment's first block.
                let order = segment_map::segment_order(r.row_spans());
                if order.is_empty() {
                    return false;
                }
                let cur = r
                    .sel_block
                    .and_then(|a| order.iter().position(|(s, size)| a >= *s && a < s + size));
                let next = match cur {
                    Some(i) => (i as isize + delta).clamp(0, order.len() as isize - 1) as usize,
                    None => 0,
                };
                let (s, size) = order[next];
                r.sel_block = r
                    .map
                    .blocks
                    .range(s..s + size)
                    .next()
                    .map(|(a, _)| *a)
                    .or(r.sel_block);
            }
        }
        true
    }

    /// Enter: on the map, jump to the event that allocated the selected block;
    /// on the leak panel, select (or deselect) the finding for highlighting.
    pub(super) fn enter(&mut self) -> bool {
        let focus = self.focus;
        if focus == Focus::Log {
            return self.show_event();
        }
        let Some(r) = self.active_mut() else {
            return false;
        };
        match focus {
            Focus::Leaks => {
                if r.findings.is_empty() {
                    return false;
                }
                r.sel_finding = match r.sel_finding {
                    Some(_) => None,
                    None => Some(0),
                };
                true
            }
            _ => {
                r.sync_map();
                let Some(addr) = r.sel_block else {
                    return false;
                };
                let upto = r.pos.min(r.len());
                let found = r.timeline.events().range(0..upto).rposition(
                    |e| matches!(e, Event::Alloc(a) if a.action == Action::Alloc && a.addr == addr),
                );
                match found {
                    Some(i) => {
                        self.playing = false;
                        self.set_active_pos(i + 1);
                        true
                    }
                    None => false,
                }
            }
        }
    }
}
