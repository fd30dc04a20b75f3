//! The stack popup (`b`), the "by Python line" pane (`u`), event details
//! (Enter on the log) and messages in full (`e`), on real snapshots.

use std::collections::HashMap;

use super::helpers::*;
use crate::alloc::{format_size, Tag};
use crate::producers::snapshot::snapshot_source;
use crate::producers::StackOrigin;
use crate::real_snapshots::{real, real_dir};
use crate::trace::replay::tag_entry;
use crate::trace::snapshot::{import_file, FramesId, Snapshot};
use crate::tui::app::App;

fn open_real(name: &str) -> App {
    let src = snapshot_source(&real(name), None);
    app_finished(vec![(name.into(), src)], &opts())
}

/// `file:line in name` of every frame of `id`, read from the file itself.
fn locations(snap: &Snapshot, id: FramesId) -> Vec<String> {
    snap.frames
        .resolve(id)
        .map(|f| format!("{}:{} in {}", f.filename, f.line, f.name))
        .collect()
}

/// The device a source opens on: the first one the file holds.
fn first_device(snap: &Snapshot) -> usize {
    crate::producers::snapshot_devices(snap)
        .first()
        .copied()
        .unwrap_or(0)
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn every_live_block_at_the_end_has_the_stack_the_file_records() {
    let (mut checked, mut with_frames, mut untagged) = (0, 0, 0);
    let mut files = 0;
    let mut names: Vec<_> = std::fs::read_dir(real_dir())
        .expect("the real snapshots")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.ends_with(".pickle"))
        .collect();
    names.sort();
    for name in names {
        let snap = import_file(&real(&name)).expect("imports");
        let device = first_device(&snap);
        let mut app = open_real(&name);
        keys(&mut app, "G");
        let r = &mut app.runs[0];
        r.sync_map();
        let tags = r.tags.clone().expect("a snapshot source has tags");
        let finals: HashMap<u64, FramesId> = snap
            .segments
            .iter()
            .filter(|s| s.device == device as i64)
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state.is_active())
            .map(|b| (b.address, b.frames))
            .collect();
        files += 1;
        for (addr, b) in r.map.blocks.iter().filter(|(_, b)| b.state.is_active()) {
            // The view ends at the file's own final state.
            let id = finals
                .get(addr)
                .unwrap_or_else(|| panic!("{name}: live block {addr:#x} is not in the file"));
            let shown = tags
                .stack(b.tag, *addr)
                .expect("snapshot blocks have a stack lookup");
            let got: Vec<String> = shown
                .stack
                .map(|s| s.frames.iter().map(|f| f.location()).collect())
                .unwrap_or_default();
            assert_eq!(
                got,
                locations(&snap, *id),
                "{name}: block {addr:#x} (tag {:?}, origin {:?})",
                b.tag,
                shown.origin
            );
            checked += 1;
            with_frames += usize::from(!got.is_empty());
            untagged += usize::from(b.tag == Tag::NONE && !got.is_empty());
        }
    }
    assert_eq!(files, 12);
    assert!(checked > 5000, "{checked} blocks checked");
    // Most blocks have frames, and those from before a trace began too.
    assert!(with_frames > 3000, "{with_frames} with frames");
    assert!(untagged > 2000, "{untagged} untagged blocks with frames");
}

/// The largest live block at the end whose trace entry records a frame of
/// the user's own code, with that entry's stack as the file has it.
fn traced_block_with_user_frame(app: &mut App, snap: &Snapshot) -> (u64, FramesId) {
    let r = &mut app.runs[0];
    r.sync_map();
    let trace = &snap.device_traces[0];
    let (addr, id) = r
        .map
        .blocks
        .iter()
        .filter(|(_, b)| b.state.is_active())
        .filter_map(|(a, b)| Some((*a, b.size, trace.get(tag_entry(b.tag)?)?.frames)))
        .filter(|(_, _, id)| snap.frames.first_user_frame(*id).is_some())
        .max_by_key(|(a, size, _)| (*size, std::cmp::Reverse(*a)))
        .map(|(a, _, id)| (a, id))
        .expect("a traced block with a user frame");
    r.sel_block = Some(addr);
    (addr, id)
}

/// Rows of the drawn popup in reverse video (the highlighted frame).
fn highlighted_rows(buf: &ratatui::buffer::Buffer, area: ratatui::layout::Rect) -> Vec<String> {
    use ratatui::style::Modifier;
    (area.y..area.y + area.height)
        .filter(|&y| {
            (area.x + 1..area.x + area.width - 1)
                .any(|x| buf[(x, y)].modifier.contains(Modifier::REVERSED))
        })
        .map(|y| {
            (area.x + 1..area.x + area.width - 1)
                .map(|x| buf[(x, y)].symbol())
                .collect::<String>()
        })
        .collect()
}

const KK: &str = "cs336-kk_2.7b-forward_segment-free.pickle";
const FLEXGEN: &str = "flexgen_legacy-history-blocks.pickle";
const EOR: &str = "eor-nn_snapshot-actions.pickle";

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn the_stack_popup_highlights_the_first_user_frame_of_the_file() {
    let snap = import_file(&real(KK)).expect("imports");
    let mut app = open_real(KK);
    keys(&mut app, "G");
    let (_, id) = traced_block_with_user_frame(&mut app, &snap);
    let user = snap.frames.first_user_frame(id).expect("a user frame");
    let want = format!("{}:{} in {}", user.filename, user.line, user.name);
    let at = snap
        .frames
        .resolve(id)
        .position(|f| f == user)
        .expect("in its stack");
    keys(&mut app, "b");
    let mut t = terminal(200, 60);
    let buf = draw(&mut app, &mut t);
    let area = app.popup.as_ref().expect("the popup is open").frame.area;
    let rows = highlighted_rows(&buf, area);
    assert_eq!(rows.len(), 1, "one highlighted row: {rows:?}");
    assert!(
        rows[0].contains(&format!("#{at}  {want}")),
        "{:?} is not #{at} {want}",
        rows[0]
    );
    let s = text(&buf);
    assert!(s.contains(&format!("your code: {want}")), "{s}");
    assert!(
        s.contains(&format!(
            "{} frames, innermost first",
            snap.frames.stack(id).len()
        )),
        "{s}"
    );
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn folding_hides_the_frames_before_the_users_and_says_how_many() {
    let snap = import_file(&real(KK)).expect("imports");
    let mut app = open_real(KK);
    keys(&mut app, "G");
    let (_, id) = traced_block_with_user_frame(&mut app, &snap);
    let frames: Vec<_> = snap.frames.resolve(id).collect();
    // The run of C++/PyTorch frames under the user's first line.
    let hidden = frames.iter().take_while(|f| !f.is_user_code()).count();
    assert!(hidden >= 2, "{hidden} frames before the user's");
    keys(&mut app, "b");
    let frame_rows = |app: &mut App| -> Vec<String> {
        let _ = screen(app, 200, 60);
        app.popup
            .as_ref()
            .expect("open")
            .lines()
            .into_iter()
            .map(|l| l.text)
            .filter(|t| {
                t.trim_start_matches(['▶', ' ']).starts_with('#') || t.contains(" frames  (#")
            })
            .collect()
    };
    let folded = frame_rows(&mut app);
    assert!(
        folded[0].contains(&format!("… {hidden} C++"))
            && folded[0].contains(&format!("(#0–#{}", hidden - 1)),
        "{:?}",
        folded[0]
    );
    assert!(
        folded[1].contains(&format!("#{hidden}  ")),
        "{:?}",
        folded[1]
    );
    assert!(!folded.iter().any(|r| r.contains("#0  ")), "{folded:?}");
    app.handle_key(code(crossterm::event::KeyCode::Enter));
    let unfolded = frame_rows(&mut app);
    assert_eq!(unfolded.len(), frames.len(), "every frame, one row each");
    assert!(unfolded[0].contains("#0  "), "{:?}", unfolded[0]);
    let shown_before = folded.iter().filter(|r| !r.contains(" frames  (#")).count();
    let said: usize = folded
        .iter()
        .filter_map(|r| {
            r.split("… ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .sum();
    assert_eq!(
        shown_before + said,
        unfolded.len(),
        "folded rows say what they hide"
    );
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn blocks_from_before_the_trace_show_what_the_file_knows() {
    // flexgen's trace is one free_completed: every other block predates it.
    let snap = import_file(&real(FLEXGEN)).expect("imports");
    let mut app = open_real(FLEXGEN);
    let freed = snap.device_traces[0][0].addr;
    // Before the free: the freed block is live, and no record keeps its stack.
    let r = &mut app.runs[0];
    r.sync_map();
    assert!(r
        .map
        .blocks
        .get(&freed)
        .is_some_and(|b| b.state.is_active() && b.tag == Tag::NONE));
    r.sel_block = Some(freed);
    keys(&mut app, "b");
    let s = screen(&mut app, 200, 60);
    assert!(
        s.contains("allocated before the trace began and freed within it")
            && s.contains("no stack recorded"),
        "{s}"
    );
    app.handle_key(code(crossterm::event::KeyCode::Esc));
    // At the end: a survivor shows the frames of its final-state block (a
    // legacy block's history).
    keys(&mut app, "G");
    let r = &mut app.runs[0];
    r.sync_map();
    let (addr, b) = r
        .map
        .blocks
        .iter()
        .filter(|(_, b)| b.state.is_active())
        .max_by_key(|(a, b)| (b.size, std::cmp::Reverse(**a)))
        .map(|(a, b)| (*a, *b))
        .expect("live blocks");
    assert_eq!(b.tag, Tag::NONE);
    let block = snap
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .find(|x| x.address == addr)
        .expect("in the file");
    let user = snap
        .frames
        .first_user_frame(block.frames)
        .expect("python frames");
    r.sel_block = Some(addr);
    let bs = r
        .tags
        .as_ref()
        .and_then(|t| t.stack(b.tag, addr))
        .expect("a lookup");
    assert_eq!(bs.origin, StackOrigin::FinalState);
    keys(&mut app, "b");
    let mut t = terminal(200, 60);
    let buf = draw(&mut app, &mut t);
    let s = text(&buf);
    assert!(
        s.contains("allocated before the trace began and still live at its end"),
        "{s}"
    );
    let rows = highlighted_rows(&buf, app.popup.as_ref().expect("open").frame.area);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(
        rows[0].contains(&format!("{}:{} in {}", user.filename, user.line, user.name)),
        "{rows:?}"
    );
}

#[test]
fn a_simulated_block_says_what_the_engine_knows_and_no_stack() {
    let mut app = leaky_app();
    keys(&mut app, "G");
    let r = &mut app.runs[0];
    r.sync_map();
    let addr = r
        .map
        .blocks
        .iter()
        .find(|(_, b)| b.state.is_active() && b.tag != Tag::NONE)
        .map(|(a, _)| *a)
        .expect("a live block");
    r.sel_block = Some(addr);
    keys(&mut app, "b");
    let s = screen(&mut app, 80, 24);
    let p = app.popup.as_ref().expect("open");
    assert!(p.stack.is_none());
    assert!(
        s.contains("no stack recorded: a simulated run has no Python stack"),
        "{s}"
    );
    assert!(s.contains("op ") && s.contains("holds "), "{s}");
    assert!(!s.contains("#0 "), "no frame is made up\n{s}");
}

/// Live bytes per first user frame of the file's own final blocks.
fn final_sites(snap: &Snapshot, device: i64) -> HashMap<String, (u64, Vec<u64>)> {
    let mut sites: HashMap<String, (u64, Vec<u64>)> = HashMap::new();
    for b in snap
        .segments
        .iter()
        .filter(|s| s.device == device)
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state.is_active())
    {
        let site = snap.frames.first_user_frame(b.frames).map_or_else(
            || "(no stack recorded)".to_string(),
            |f| format!("{}:{} in {}", f.filename, f.line, f.name),
        );
        let e = sites.entry(site).or_default();
        e.0 += b.size;
        e.1.push(b.address);
    }
    sites
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn by_python_line_lists_live_bytes_per_first_user_frame() {
    for name in [FLEXGEN, KK] {
        let snap = import_file(&real(name)).expect("imports");
        let sites = final_sites(&snap, 0);
        let (top_site, (top_bytes, mut top_blocks)) = sites
            .iter()
            .max_by_key(|(s, (b, _))| (*b, std::cmp::Reverse((*s).clone())))
            .map(|(s, v)| (s.clone(), v.clone()))
            .expect("live blocks");
        let mut app = open_real(name);
        keys(&mut app, "Gu");
        let s = screen(&mut app, 200, 60);
        let pane = &app.runs[0].frame.by_line;
        assert!(pane.rows[0].selected, "{s}");
        assert_eq!(pane.rows[0].site, top_site, "{name}\n{s}");
        assert_eq!(pane.rows[0].bytes, format_size(top_bytes), "{name}");
        assert!(s.contains(&top_site), "{s}");
        assert_eq!(pane.rows[0].blocks, top_blocks.len().to_string(), "{name}");
        // Every line, not only the top one.
        let groups = app.runs[0].site_groups();
        assert_eq!(groups.len(), sites.len(), "{name}");
        for g in groups.iter() {
            assert_eq!(sites[&*g.site].0, g.bytes, "{name}: {}", g.site);
        }
        // The selected line's blocks are the ones highlighted on the map.
        top_blocks.sort_unstable();
        assert_eq!(app.runs[0].highlighted(), top_blocks, "{name}");
        assert!(s.contains("▚selected line"), "{s}");
    }
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn a_selected_line_marks_its_allocations_on_the_timeline() {
    let snap = import_file(&real(KK)).expect("imports");
    let trace = &snap.device_traces[0];
    // The entries that allocated from each line, read from the file.
    let allocs_of = |site: &str| -> Vec<usize> {
        trace
            .iter()
            .enumerate()
            .filter(|(_, e)| e.action == crate::alloc::Action::Alloc)
            .filter(|(_, e)| {
                snap.frames
                    .first_user_frame(e.frames)
                    .is_some_and(|f| format!("{}:{} in {}", f.filename, f.line, f.name) == site)
            })
            .map(|(i, _)| i)
            .collect()
    };
    let mut app = open_real(KK);
    keys(&mut app, "Gu");
    let groups = app.runs[0].site_groups();
    // The biggest line some trace entry allocated for (not only blocks
    // from before the trace).
    let (index, entries) = groups
        .iter()
        .enumerate()
        .map(|(i, g)| (i, allocs_of(&g.site)))
        .find(|(_, e)| !e.is_empty())
        .expect("a line allocated in the trace");
    assert!(app.runs[0].select_site(index));
    let _ = screen(&mut app, 200, 60);
    let r = &app.runs[0];
    // Mirrored one for one (kk's trace holds allocator entries only).
    assert_eq!(r.len(), trace.len());
    let t = &r.frame.timeline;
    let w = usize::from(t.inner.width);
    let mut want: Vec<usize> = entries
        .iter()
        .map(|i| (i - t.from) * w / (t.to - t.from))
        .collect();
    want.dedup();
    let got: Vec<usize> = t
        .site_marks
        .iter()
        .enumerate()
        .filter(|(_, m)| **m)
        .map(|(c, _)| c)
        .collect();
    assert_eq!(got, want);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn enter_on_the_log_shows_the_events_trace_entry_and_time() {
    use crossterm::event::KeyCode;
    let snap = import_file(&real(EOR)).expect("imports");
    let trace = &snap.device_traces[0];
    let mut app = open_real(EOR);
    keys(&mut app, "G");
    app.handle_key(code(KeyCode::BackTab));
    keys(&mut app, "kkk");
    let len = app.runs[0].len();
    let index = len - 4;
    assert_eq!(app.runs[0].log_selected(), Some(index));
    let s = screen(&mut app, 200, 60);
    assert!(
        s.contains(&format!("›{index:>8} ")),
        "the selected line is marked\n{s}"
    );
    app.handle_key(code(KeyCode::Enter));
    // The file's own entry behind that event: snapshot markers make none.
    let entry = trace
        .iter()
        .enumerate()
        .filter(|(_, e)| e.action.is_allocator())
        .nth(index)
        .map(|(i, _)| i)
        .expect("an entry");
    assert!(
        entry > index,
        "markers before it: the mapping is not the identity"
    );
    let e = &trace[entry];
    let time = crate::units::format_epoch_us(e.time_us().expect("eor-nn has times"));
    let s = screen(&mut app, 200, 60);
    assert!(s.contains(&format!(" Event {index} of {len} ")), "{s}");
    assert!(
        s.contains(&format!("action       {}", e.action.name())),
        "{s}"
    );
    assert!(s.contains(&format!("trace entry  {entry}")), "{s}");
    assert!(s.contains(&format!("time         {time}")), "{s}");
    assert!(s.contains(&format!("stream       {}", e.stream)), "{s}");
    let n = snap.frames.stack(e.frames).len();
    assert!(n > 0);
    assert!(s.contains(&format!("the entry's stack, {n} frames")), "{s}");
    app.handle_key(code(KeyCode::Esc));
    assert!(app.popup.is_none());
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn an_oom_entry_opens_with_the_free_memory_it_recorded() {
    let name = "code-location_expandable_3gpu_oom.pickle";
    let snap = import_file(&real(name)).expect("imports");
    let recorded = snap.device_traces[1]
        .iter()
        .find_map(|e| snap.extra(e).device_free)
        .expect("an oom");
    let src = snapshot_source(&real(name), Some(1));
    let mut app = app_finished(vec![(name.into(), src)], &opts());
    // `e` at an OOM entry, which has no message of its own: its details.
    keys(&mut app, "xe");
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("action       oom"), "{s}");
    assert!(
        s.contains(&format!("device free  {}", format_size(recorded))),
        "{s}"
    );
}

#[test]
fn the_oom_message_opens_in_full() {
    use crate::trace::{Event, Marker};
    let mut app = leaky_app();
    keys(&mut app, "G");
    let msg = app.runs[0]
        .timeline
        .events()
        .iter()
        .find_map(|e| match e {
            Event::Marker(Marker::Error(t)) => Some(t.to_string()),
            _ => None,
        })
        .expect("the tour ends in an OOM");
    // PyTorch's message, then the detector's answer at the OOM.
    let (message, answer) = msg
        .split_once("\n\n")
        .expect("the message, then the answer");
    assert!(message.ends_with("cuda-alloc-conf)"), "{msg}");
    assert!(answer.starts_with("at the OOM:"), "{answer}");
    assert!(answer.contains("expandable_segments:True:"), "{answer}");
    let tail = msg.split_whitespace().last().expect("words");
    // The callout cuts it at 80×24.
    let before = screen(&mut app, 80, 24);
    assert!(
        before.contains("torch.OutOfMemoryError") && !before.contains(tail),
        "{before}"
    );
    keys(&mut app, "e");
    let p = app.popup.as_ref().expect("open");
    let all: String = p
        .lines()
        .iter()
        .map(|l| l.text.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(all.contains(&msg), "every word of the message\n{all}");
    // Scrolled to its end, the last words are on screen.
    keys(&mut app, "G");
    let s = screen(&mut app, 80, 24);
    let joined: String = s
        .lines()
        .map(|l| l.trim_matches(|c| c == '│' || c == ' '))
        .collect();
    assert!(joined.contains(tail) || s.contains(tail), "{s}");
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn help_scrolls_to_every_key_at_80x24() {
    use crate::tui::input::KEYS;
    let mut app = open_real(FLEXGEN);
    keys(&mut app, "?");
    let mut seen = String::new();
    // Descriptions wrap at 80 columns: more lines than keys to scroll through.
    for _ in 0..KEYS.len() * 2 {
        seen.push_str(&screen(&mut app, 80, 24));
        keys(&mut app, "j");
    }
    for (k, d) in KEYS {
        assert!(seen.contains(k), "help at 80×24 never shows {k}");
        let start: String = d.chars().take(20).collect();
        assert!(seen.contains(&start), "help at 80×24 never shows {start}");
    }
    assert!(seen.contains("j/k PgDn/PgUp g/G scroll"));
}

/// Screens pinned from a real file: flexgen's largest live block (from
/// before its trace, frames from its final state), its by-line pane, and an
/// event of eor-nn in detail.
#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn screens_at_80x24_and_200x60() {
    use crossterm::event::KeyCode;
    for (w, h) in [(80, 24), (200, 60)] {
        let mut app = open_real(FLEXGEN);
        keys(&mut app, "G");
        let r = &mut app.runs[0];
        r.sync_map();
        r.sel_block = r
            .map
            .blocks
            .iter()
            .filter(|(_, b)| b.state.is_active())
            .max_by_key(|(a, b)| (b.size, std::cmp::Reverse(**a)))
            .map(|(a, _)| *a);
        keys(&mut app, "b");
        insta::assert_snapshot!(format!("stack_popup_{w}x{h}"), screen(&mut app, w, h));
        app.handle_key(code(KeyCode::Esc));
        keys(&mut app, "uj");
        insta::assert_snapshot!(format!("by_line_{w}x{h}"), screen(&mut app, w, h));

        let mut app = open_real(EOR);
        keys(&mut app, "G");
        app.handle_key(code(KeyCode::BackTab));
        keys(&mut app, "kkk");
        app.handle_key(code(KeyCode::Enter));
        insta::assert_snapshot!(format!("event_details_{w}x{h}"), screen(&mut app, w, h));
    }
}
