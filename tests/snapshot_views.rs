//! A real snapshot opened in the views ends where the file says: at its last
//! event the map holds exactly the snapshot's final segments and blocks, on
//! every device, whether the trace covers the whole run or started late.

use vramscope::producers::{snapshot_to_source, RunMsg, SourceMsg};
use vramscope::trace::mirror::final_map;
use vramscope::trace::snapshot::import_file;
use vramscope::trace::{Event, MemoryMap};

mod common;

use common::real_dir;

/// The map a view of `device` shows at its last event, and how many events
/// did not fit the map as it stood. The producer places each event once and
/// sends the map it ends with; applying its events again to its start state
/// must give the same map, the same curve and the same misfits.
fn last_map(snap: &vramscope::trace::snapshot::Snapshot, device: usize) -> (MemoryMap, usize) {
    let source = snapshot_to_source(snap, Some(device)).expect("opens");
    let mut map = MemoryMap::default();
    let (mut misfits, mut gaps, mut head) = (0, 0, None);
    while let Some(msg) = source.recv() {
        match msg {
            SourceMsg::Run(RunMsg::Start(m)) => map = *m,
            SourceMsg::Run(RunMsg::Part(part)) => {
                for (e, sample) in part.events.iter().zip(&part.samples) {
                    if let Event::Alloc(a) = e {
                        misfits += usize::from(map.apply(a).is_err());
                    }
                    assert_eq!(
                        (sample.allocated, sample.reserved),
                        (map.allocated, map.reserved)
                    );
                }
                gaps += part.gaps.len();
                head = part.head.or(head);
            }
            SourceMsg::Run(RunMsg::Failed(why)) => panic!("{why}"),
            _ => {}
        }
    }
    assert_eq!(gaps, misfits, "the producer's misfits are the map's own");
    if let Some(head) = head {
        assert!(
            *head == map,
            "the producer's map differs from its events applied again"
        );
    }
    (map, misfits)
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn every_real_file_ends_at_its_recorded_state_on_every_device() {
    let mut files: Vec<_> = std::fs::read_dir(real_dir())
        .expect("the real snapshots")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    files.sort();
    assert!(files.len() >= 12);
    let mut wrong = Vec::new();
    for path in &files {
        let snap = import_file(path).expect("imports");
        let mut devices: Vec<usize> = snap
            .segments
            .iter()
            .map(|s| s.device as usize)
            .chain((0..snap.device_traces.len()).filter(|d| !snap.device_traces[*d].is_empty()))
            .collect();
        devices.sort_unstable();
        devices.dedup();
        for device in devices {
            let want = final_map(&snap, device);
            let (got, misfits) = last_map(&snap, device);
            let (w, g) = (want.stats(), got.stats());
            let name = path.file_name().unwrap().to_string_lossy();
            if (w.reserved, w.allocated, w.large_segments, w.small_segments)
                != (g.reserved, g.allocated, g.large_segments, g.small_segments)
                || want.blocks.len() != got.blocks.len()
                || misfits > 0
            {
                wrong.push(format!(
                    "{name} device {device}: file {} reserved, {} allocated, {}+{} segments, {} blocks; view {} reserved, {} allocated, {}+{} segments, {} blocks; {misfits} events that did not fit",
                    w.reserved, w.allocated, w.large_segments, w.small_segments, want.blocks.len(),
                    g.reserved, g.allocated, g.large_segments, g.small_segments, got.blocks.len()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
