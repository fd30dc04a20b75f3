//! Real snapshots (shared/snapshots/real, see SOURCES.md). Assertions are
//! about the data's real properties, checked beforehand with Python's pickle.

use crate::leak::{analyze_snapshot, BoundarySource, FindingKind};
use crate::real_snapshots::real;
use crate::trace::snapshot::{import_file, Snapshot};

fn load(name: &str) -> Snapshot {
    match import_file(&real(name)) {
        Ok(s) => s,
        Err(e) => panic!("{name}: {e}"),
    }
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn eor_nn_ten_training_steps_have_a_flat_survivor_set() {
    // 9 `snapshot` markers, one between consecutive forward/backward/step
    // cycles; at every marker the same 9 allocations (39,976,976 B) are live.
    let snap = load("eor-nn_snapshot-actions.pickle");
    let r = analyze_snapshot(&snap, 0, None);
    assert_eq!(r.boundary_source, BoundarySource::SnapshotMarker);
    assert_eq!(r.boundaries.len(), 9);
    assert!(
        r.live_at_boundary.iter().all(|b| *b == 39_976_976),
        "{:?}",
        r.live_at_boundary
    );
    assert!(r.backward_seen);
    assert!(r.survivors.is_empty());
    assert!(r.findings.is_empty());
    assert!(r.conclusion.contains("no call site"), "{}", r.conclusion);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn code_location_forward_layers_accumulate_survivors_but_no_leak_is_claimed() {
    // One Qwen3 forward with grad: every decoder layer leaves its saved
    // activations behind. With the attention output projection (line 267 of
    // modeling_qwen3.py, once per layer) as the marker, allocations from
    // apply_rotary_pos_emb and the k projection grow by 12,320,768 B per layer.
    let snap = load("code-location_expandable_3gpu_oom.pickle");
    let r = analyze_snapshot(&snap, 0, Some("modeling_qwen3.py:267"));
    assert!(matches!(r.boundary_source, BoundarySource::StepMarker(_)));
    assert!(r.boundaries.len() >= 20, "{}", r.boundaries.len());
    assert!(!r.backward_seen, "only a forward runs between the markers");
    assert!(!r.findings.is_empty());
    assert!(r
        .findings
        .iter()
        .all(|f| f.kind == FindingKind::SurvivingAllocations));
    let rotary = r
        .survivors
        .iter()
        .find(|g| g.site.contains("apply_rotary_pos_emb"))
        .expect("rotary survivors");
    assert_eq!(rotary.growth_per_iter, 12_320_768);
    assert!(rotary.confidence > 0.5);
    assert!(!rotary.addresses.is_empty());
    // Truthful about what it is and is not.
    assert!(r.conclusion.contains("cannot show which variable"));
    assert!(
        r.conclusion.contains("single forward pass"),
        "{}",
        r.conclusion
    );
    assert!(r
        .findings
        .iter()
        .all(|f| f.severity == crate::leak::Severity::Info));
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn code_location_without_a_marker_claims_nothing() {
    // One zero_grad annotation and no optimizer step: too few boundaries.
    let snap = load("code-location_expandable_3gpu_oom.pickle");
    let r = analyze_snapshot(&snap, 0, None);
    assert!(r.findings.is_empty(), "{:?}", r.findings);
    assert!(r.boundaries.len() < 4);
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn single_step_traces_claim_nothing() {
    // magma: one forward + backward; adam: one step; no repeated iterations.
    for name in [
        "cs336-magma_windows_user-metadata.pickle",
        "adam-step_closed-trace_annotations.pickle",
        "sqattn_segment-churn.pickle",
    ] {
        let snap = load(name);
        let r = analyze_snapshot(&snap, 0, None);
        assert!(r.findings.is_empty(), "{name}: {:?}", r.findings);
        assert!(!r.conclusion.is_empty());
    }
}

#[test]
#[ignore = "needs the real-snapshot corpus ../shared/snapshots/real"]
fn state_only_snapshots_say_nothing_can_be_concluded() {
    let snap = load("text-to-sql_expandable_2gpu_state-only.pickle");
    let r = analyze_snapshot(&snap, 0, None);
    assert!(r.findings.is_empty());
    assert!(r.conclusion.contains("state-only"), "{}", r.conclusion);
}
