//! Real PyTorch snapshots as sources.

use std::path::PathBuf;

use super::helpers::*;
use crate::tui::import::snapshot_source;

fn real(name: &str) -> Option<PathBuf> {
    let p = PathBuf::from("/work/shared/snapshots/real").join(name);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("note: {} missing, test skipped", p.display());
        None
    }
}

#[test]
fn closed_trace_places_every_entry() {
    let Some(p) = real("adam-step_closed-trace_annotations.pickle") else {
        return;
    };
    let src = snapshot_source(&p, None).expect("imports");
    let mut app = app_with(vec![("adam".into(), src)], &opts());
    let r = &app.runs[0];
    assert_eq!(r.len(), 35);
    assert!(r.timeline.gaps().is_empty(), "{:?}", r.timeline.gaps());
    keys(&mut app, "Gj");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("large pool") && s.contains("small pool"), "{s}");
    assert!(s.contains("frames:"), "frames of the selected block\n{s}");
}

#[test]
fn expandable_trace_with_oom() {
    let Some(p) = real("code-location_expandable_3gpu_oom.pickle") else {
        return;
    };
    let src = snapshot_source(&p, Some(1)).expect("imports");
    let mut app = app_with(vec![("code-location".into(), src)], &opts());
    assert_eq!(app.runs[0].len(), 596);
    assert!(
        app.runs[0].timeline.gaps().is_empty(),
        "{:?}",
        &app.runs[0].timeline.gaps()[..1]
    );
    keys(&mut app, "x");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("L*"), "expandable rows\n{s}");
    assert!(s.contains("oom"), "{s}");
    // The OOM carries the free memory the driver reported, as recorded.
    let snap = crate::trace::snapshot::import_file(&p).expect("imports");
    let recorded: Vec<u64> = snap.device_traces[1]
        .iter()
        .filter_map(|e| snap.extra(e).device_free)
        .collect();
    let shown: Vec<u64> = app.runs[0]
        .timeline
        .events()
        .iter()
        .filter_map(|e| match e {
            crate::trace::Event::Alloc(a) if a.action == crate::alloc::Action::Oom => {
                Some(a.device_free)
            }
            _ => None,
        })
        .collect();
    assert!(!recorded.is_empty() && recorded.iter().all(|f| *f > 0));
    assert_eq!(shown, recorded);
}

#[test]
fn state_only_snapshot_shows_its_map() {
    let Some(p) = real("verl_private-pools_pending-free_state-only.pickle") else {
        return;
    };
    let src = snapshot_source(&p, None).expect("imports");
    let mut app = app_with(vec![("verl".into(), src)], &opts());
    assert_eq!(app.runs[0].len(), 0);
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("large pool"), "{s}");
    assert!(!app.runs[0].map.segments.is_empty());
}
