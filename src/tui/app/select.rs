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

    /// `M`: the map scrolled to the segment of the latest allocator event
    /// at or before the cursor whose segment is still there (a narration
    /// is said with the event that makes it true, so this is the segment it
    /// is about; a freed segment is not on the map), its block selected
    /// where it is live; the status line says which event.
    pub(super) fn show_event_segment(&mut self) -> bool {
        let Some(r) = self.active_mut() else {
            return false;
        };
        r.sync_map();
        let spans = r.row_spans().to_vec();
        let row_of = |addr: u64| {
            spans.iter().position(|s| {
                matches!(s, segment_map::RowSpan::Segment { start, size, .. }
                    if addr >= *start && addr < start + size)
            })
        };
        let events = r.timeline.events();
        let found = (0..r.pos).rev().find_map(|i| match events.get(i) {
            Some(Event::Alloc(a)) if a.addr != 0 => row_of(a.addr).map(|row| (i, a, row)),
            _ => None,
        });
        let Some((i, a, row)) = found else {
            self.notice = Some(
                "no allocator event at or before the cursor touched a segment still on the map"
                    .into(),
            );
            return true;
        };
        r.map_scroll_y = row.saturating_sub(1);
        r.sel_block = r
            .map
            .blocks
            .range(..=a.addr)
            .next_back()
            .filter(|(start, b)| a.addr < *start + b.size)
            .map(|(start, _)| *start);
        let is_segment =
            |s: &&segment_map::RowSpan| matches!(s, segment_map::RowSpan::Segment { .. });
        let segments = spans.iter().filter(is_segment).count();
        let nth = spans[..=row].iter().filter(is_segment).count();
        self.focus = Focus::Map;
        self.notice = Some(format!(
            "map: segment {nth} of {segments}, of event {i}: {} {} at {:#x}",
            a.action.name(),
            crate::alloc::format_size(a.size.max(a.block_size)),
            a.addr
        ));
        true
    }
}
