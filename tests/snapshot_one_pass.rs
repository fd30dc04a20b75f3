//! A file view made in one pass (its entries placed while the file is
//! still read) ends where the view made from the whole file does: the same
//! events, curve, misfits, map at every keyframe and at the end, the same
//! facts (device size, devices, OOMs, event count) and the same stacks and
//! times behind each event. Closed traces are placed once; open ones, and
//! files recorded under other block rules, start over from the rebuilt
//! start, before anything was shown where the first entries tell.

use std::path::Path;
use vramscope::alloc::AllocConfig;
use vramscope::alloc::Tag;
use vramscope::alloc::{Action, BlockState};
use vramscope::producers::{
    snapshot_source, snapshot_to_source, what_if_file_source, what_if_source, Opened, RecordedMsg,
    RunMsg, Source, SourceMsg,
};
use vramscope::trace::replay::entry_tag;
use vramscope::trace::snapshot::{
    export_bytes, import_bytes, import_file, synthetic_snapshot, AllocatorSettings, Snapshot,
    TraceEntry,
};
use vramscope::trace::{Event, Timeline};

mod common;

use common::{real_dir, temp_dir};

/// What a view received, kept as the UI keeps it.
struct View {
    timeline: Timeline,
    /// The last `Opened`, and whether any said the start was assumed.
    opened: Option<Opened>,
    assumed: bool,
    /// Events shown before a `Restarted`.
    shown_then_restarted: Vec<usize>,
    /// Events shown before a `KeepFirst`, and how many it kept.
    shown_then_kept: Vec<(usize, usize)>,
    finished: bool,
}

fn view(source: Source) -> View {
    let mut v = View {
        timeline: Timeline::new(),
        opened: None,
        assumed: false,
        shown_then_restarted: Vec::new(),
        shown_then_kept: Vec::new(),
        finished: false,
    };
    while let Some(msg) = source.recv() {
        match msg {
            SourceMsg::Recorded(RecordedMsg::Opened(o)) => {
                v.assumed |= o.assumed_empty_start;
                v.opened = Some(*o);
            }
            SourceMsg::Run(RunMsg::Start(map)) => {
                assert!(v.timeline.is_empty(), "a start after events");
                v.timeline = Timeline::starting_from(*map);
            }
            SourceMsg::Run(RunMsg::Part(mut part)) => {
                v.timeline.extend_part(&mut part);
                source.give_back(part);
            }
            SourceMsg::Run(RunMsg::Events(e)) => v.timeline.extend(e),
            SourceMsg::Run(RunMsg::Restarted) => {
                v.shown_then_restarted.push(v.timeline.len());
                v.timeline = Timeline::new();
            }
            SourceMsg::Run(RunMsg::KeepFirst(n)) => {
                v.shown_then_kept.push((v.timeline.len(), n));
                v.timeline.truncate(n);
            }
            SourceMsg::Run(RunMsg::Failed(why)) => panic!("{why}"),
            SourceMsg::Run(RunMsg::Finished) => v.finished = true,
            _ => {}
        }
    }
    v
}

/// The one-pass view of `path` equals the view planned from the whole
/// file, event for event.
fn same_as_whole(path: &Path, device: Option<usize>) -> View {
    let streamed = view(snapshot_source(path, device));
    let snap = import_file(path).expect("imports");
    let whole = view(snapshot_to_source(&snap, device).expect("opens"));
    same_views(streamed, whole)
}

/// The one-pass what-if view of `path` under `conf` equals the one
/// replayed from the whole file.
fn same_what_if_as_whole(path: &Path, conf: &str) -> View {
    let config = AllocConfig::parse(conf).expect("a config");
    let streamed = view(what_if_file_source(path, None, config.clone()));
    let snap = import_file(path).expect("imports");
    let whole = view(what_if_source(&snap, None, config).expect("opens"));
    same_views(streamed, whole)
}

fn same_views(streamed: View, whole: View) -> View {
    assert!(streamed.finished && whole.finished);
    let (s, w) = (&streamed.timeline, &whole.timeline);
    assert_eq!(s.len(), w.len(), "events");
    for i in 0..w.len() {
        assert_eq!(s.event(i), w.event(i), "event {i}");
        assert_eq!(s.sample(i), w.sample(i), "curve after event {i}");
    }
    assert_eq!(s.gaps(), w.gaps(), "entries the map could not place");
    assert!(s.head() == w.head(), "the map after the last event");
    let step = (w.len() / 40).max(1);
    for i in (0..w.len()).step_by(step) {
        assert!(s.state_at(Some(i)) == w.state_at(Some(i)), "map at {i}");
    }
    assert!(s.state_at(None) == w.state_at(None), "the start");
    let (so, wo) = (
        streamed.opened.as_ref().expect("opened"),
        whole.opened.as_ref().expect("opened"),
    );
    assert!(!so.assumed_empty_start, "the last word is the file's");
    assert_eq!(so.capacity, wo.capacity);
    assert_eq!(so.events, wo.events);
    assert_eq!(so.devices.devices, wo.devices.devices);
    assert_eq!(so.devices.current, wo.devices.current);
    assert_eq!(so.devices.with_oom, wo.devices.with_oom);
    assert_eq!(so.devices.under, wo.devices.under);
    let (st, wt) = (
        so.tags.clone().expect("tags"),
        wo.tags.clone().expect("tags"),
    );
    for i in (0..w.len()).step_by(step) {
        assert_eq!(
            st.event_entry(i),
            wt.event_entry(i),
            "entry behind event {i}"
        );
        let tag: Tag = match w.event(i) {
            Some(Event::Alloc(a)) => a.tag,
            _ => entry_tag(i),
        };
        assert_eq!(st.describe(tag), wt.describe(tag), "tag of event {i}");
        assert_eq!(st.entry_time(i), wt.entry_time(i), "time of entry {i}");
    }
    // Blocks older than the trace: their stacks from the final state.
    for (addr, b) in w.head().blocks.iter().take(200) {
        assert_eq!(
            st.stack(b.tag, *addr),
            wt.stack(b.tag, *addr),
            "stack at {addr:#x}"
        );
    }
    streamed
}

fn synthetic(bytes: u64, seed: u64) -> Snapshot {
    let mut out = Vec::new();
    synthetic_snapshot(&mut out, bytes, seed).expect("generates");
    import_bytes(&out).expect("imports")
}

fn write(dir: &Path, name: &str, snap: &Snapshot) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, export_bytes(snap)).expect("writes");
    path
}

#[test]
fn a_closed_trace_is_placed_once_as_it_is_read() {
    let dir = temp_dir("one-pass-closed");
    // More entries than the probation, so parts go out while it is read.
    let snap = synthetic(14_000_000, 3);
    assert!(snap.device_traces[0].len() > 140_000);
    let path = write(&dir, "closed.pickle", &snap);
    let v = same_as_whole(&path, None);
    assert!(v.assumed, "said the start was assumed while reading");
    assert!(v.shown_then_restarted.is_empty(), "placed once");
}

#[test]
fn an_open_trace_starts_over_from_its_rebuilt_start_before_anything_is_shown() {
    let dir = temp_dir("one-pass-open");
    let mut snap = synthetic(4_000_000, 4);
    // The recording began late: the first entries are gone, and the blocks
    // and segments they made are there before the trace.
    let trace = &mut snap.device_traces[0];
    let cut = trace.len() / 3;
    trace.drain(..cut);
    let path = write(&dir, "open.pickle", &snap);
    let v = same_as_whole(&path, None);
    assert!(
        v.timeline.state_at(None).reserved > 0,
        "the view starts from the rebuilt start"
    );
    assert_eq!(
        v.shown_then_restarted,
        Vec::<usize>::new(),
        "nothing shown first"
    );
}

#[test]
fn a_segment_older_than_the_trace_and_never_touched_is_found_at_the_end() {
    let dir = temp_dir("one-pass-untouched");
    let mut snap = synthetic(14_000_000, 5);
    // A segment that was there before the trace began and stayed idle: no
    // entry shows it, only the final state.
    let mut idle = snap.segments[0].clone();
    idle.address = snap
        .segments
        .iter()
        .map(|s| s.address + s.total_size)
        .max()
        .unwrap_or(0)
        + (1 << 30);
    for b in &mut idle.blocks {
        b.address = b.address - snap.segments[0].address + idle.address;
    }
    snap.segments.push(idle);
    let path = write(&dir, "idle-segment.pickle", &snap);
    let v = same_as_whole(&path, None);
    // Shown as if it began empty, then again from the true start.
    assert_eq!(v.shown_then_restarted.len(), 1);
    assert!(v.shown_then_restarted[0] > 0);
}

#[test]
fn a_block_older_than_the_trace_freed_late_is_found_by_reading_again() {
    let dir = temp_dir("one-pass-late-free");
    let mut snap = synthetic(14_000_000, 8);
    // A segment from before the trace, idle until, long after the first
    // entries, a block it held from before is freed.
    let mut idle = snap
        .segments
        .iter()
        .find(|s| s.total_size >= 4 << 20)
        .expect("a large segment")
        .clone();
    idle.address = snap
        .segments
        .iter()
        .map(|s| s.address + s.total_size)
        .max()
        .unwrap_or(0)
        + (1 << 30);
    idle.blocks.truncate(1);
    idle.blocks[0].address = idle.address;
    idle.blocks[0].size = idle.total_size;
    idle.blocks[0].requested_size = 0;
    idle.blocks[0].state = BlockState::Inactive;
    let freed = idle.address + (2 << 20);
    snap.segments.push(idle);
    let trace = &mut snap.device_traces[0];
    let last = *trace.last().expect("entries");
    for action in [Action::FreeRequested, Action::FreeCompleted] {
        trace.push(
            TraceEntry::new(action, freed, 1 << 20, 0, last.frames).with_time_us(last.time_us()),
        );
    }
    let path = write(&dir, "late-free.pickle", &snap);
    let v = same_as_whole(&path, None);
    assert_eq!(
        v.shown_then_restarted.len(),
        1,
        "shown as if it began empty, then again"
    );
    assert!(
        v.timeline.state_at(None).blocks.contains_key(&freed),
        "the block freed late is there from the start"
    );
}

#[test]
fn a_trace_recorded_under_other_block_rules_is_placed_under_them() {
    let dir = temp_dir("one-pass-rules");
    let mut snap = synthetic(4_000_000, 6);
    snap.allocator_settings = Some(AllocatorSettings {
        conf: "max_split_size_mb:64".into(),
        max_split_size: 64 << 20,
        garbage_collection_threshold: 0.0,
        expandable_segments: false,
        roundup_power2_divisions: Vec::new(),
        other: Vec::new(),
    });
    let path = write(&dir, "rules.pickle", &snap);
    same_as_whole(&path, None);
}

#[test]
fn a_what_if_of_a_closed_trace_is_replayed_as_it_is_read() {
    let dir = temp_dir("one-pass-what-if");
    let snap = synthetic(14_000_000, 9);
    let path = write(&dir, "closed.pickle", &snap);
    // Configs whose replay stays within what the recorded run reserved
    // (the device a what-if replays on): replayed once, as it is read.
    for conf in ["max_split_size_mb:4096", "garbage_collection_threshold:0.8"] {
        let v = same_what_if_as_whole(&path, conf);
        assert!(
            v.assumed,
            "{conf}: said the start was assumed while reading"
        );
        assert!(v.shown_then_restarted.is_empty(), "{conf}: replayed once");
    }
    // One that needs more (the requests that do not fit change what the
    // allocator does from the first one on): the events before it stay,
    // the rest is replayed again on that device.
    let v = same_what_if_as_whole(&path, "max_split_size_mb:64");
    assert!(v.shown_then_restarted.is_empty(), "not started over");
    let [(shown, kept)] = v.shown_then_kept[..] else {
        panic!("one cut: {:?}", v.shown_then_kept);
    };
    assert!(0 < kept && kept < shown, "kept {kept} of {shown}");
    assert!(kept < v.timeline.len());
    // Expandable segments reserve by the device size: from the whole file.
    let v = same_what_if_as_whole(&path, "expandable_segments:True");
    assert!(!v.assumed);
}

#[test]
fn a_what_if_of_an_open_trace_is_replayed_from_its_rebuilt_start() {
    let dir = temp_dir("one-pass-what-if-open");
    let mut snap = synthetic(4_000_000, 10);
    let trace = &mut snap.device_traces[0];
    let cut = trace.len() / 3;
    trace.drain(..cut);
    let path = write(&dir, "open.pickle", &snap);
    let v = same_what_if_as_whole(&path, "max_split_size_mb:64");
    assert!(v.timeline.state_at(None).reserved > 0);
    assert!(v.shown_then_restarted.is_empty(), "nothing shown first");
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn every_real_file_is_the_same_read_in_one_pass_on_every_device() {
    let mut files: Vec<_> = std::fs::read_dir(real_dir())
        .expect("the real snapshots")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    files.sort();
    assert!(files.len() >= 12);
    for path in &files {
        let snap = import_file(path).expect("imports");
        let mut devices = vramscope::producers::snapshot_devices(&snap);
        devices.push(0);
        devices.sort_unstable();
        devices.dedup();
        for device in devices {
            if vramscope::producers::snapshot_devices(&snap).contains(&device)
                || snap.segments.is_empty()
            {
                eprintln!("{} device {device}", path.display());
                same_as_whole(path, Some(device));
            }
        }
        same_as_whole(path, None);
        if !snap.device_traces.iter().all(Vec::is_empty) {
            same_what_if_as_whole(path, "max_split_size_mb:64");
        }
    }
}
