//! A live job in the UI: a synthetic job leaking 2 MiB per step, through the
//! live producer, drawn on `TestBackend`. The by-line pane opens on what
//! grew since the last step.

use std::io::Cursor;
use std::sync::Arc;

use super::helpers::{app_finished, keys, opts, screen};
use crate::job::read_recording;
use crate::job::synth::training_job;
use crate::producers::job_source;

fn job_app(steps: u64, leak: u64) -> crate::tui::app::App {
    let bytes = training_job(steps, leak, 3).bytes;
    let frames = read_recording(
        Box::new(Cursor::new([&crate::job::MAGIC[..], &bytes].concat())),
        "job.vslive".into(),
    )
    .expect("a recording");
    let src = job_source(frames, None, None, Arc::default());
    app_finished(vec![("pid 7".into(), src)], &opts())
}

#[test]
fn the_default_view_shows_what_grew_since_the_last_step_and_which_line() {
    let mut app = job_app(12, 2 << 20);
    keys(&mut app, "G");
    let s = screen(&mut app, 140, 44);
    if std::env::var_os("SHOW_SCREEN").is_some() {
        eprintln!("{s}");
    }
    assert!(s.contains("Grown since step (event "), "{s}");
    // Since the step: this step's 2 MiB from train.py:41, nothing from
    // model.py (its temporaries were freed), nothing of earlier steps.
    assert!(s.contains("2.00 MiB"), "{s}");
    assert!(s.contains("train.py:41"), "{s}");
    assert!(!s.contains("model.py:12"), "{s}");
    assert!(s.contains("the job ended: the process is exiting"), "{s}");
    // The leak panel names the line too.
    assert!(!app.runs[0].findings.is_empty(), "{s}");
    assert!(app.runs[0]
        .findings
        .iter()
        .any(|f| f.root.contains("train.py:41")));

    // S: everything live, the earlier steps' 24 MiB included.
    keys(&mut app, "S");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains(" Live by Python line · 26.00 MiB"), "{s}");
}

/// A pane too narrow for the whole title keeps a whole short one, not the
/// long one cut mid-word; one block is "1 block".
#[test]
fn a_narrow_by_line_pane_keeps_a_whole_title() {
    let mut app = job_app(12, 2 << 20);
    keys(&mut app, "G");
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("2.00 MiB · 1 block · 1 line ─"), "{s}");
    let s = screen(&mut app, 72, 24);
    let title = s
        .lines()
        .find(|l| l.contains("by Python line"))
        .unwrap_or_else(|| panic!("no by-line pane:\n{s}"));
    assert!(
        title.contains("Grown since step by Python line · 2.00 MiB · 1 line ─"),
        "{title:?}"
    );
    assert!(!title.contains("(event"), "{title:?}");
}

#[test]
fn a_clean_job_grows_nothing_since_the_step() {
    let mut app = job_app(6, 0);
    keys(&mut app, "G");
    let s = screen(&mut app, 140, 44);
    assert!(
        s.contains("nothing born since the step began is live"),
        "{s}"
    );
    assert!(app.runs[0].findings.is_empty());
}

/// `attach --step-marker`: the leak panel's iterations come from the named
/// frame, not the job's own steps, and its evidence says which.
#[test]
fn a_step_marker_sets_the_live_leak_analysis_iterations() {
    use crate::producers::{job_source_with, JobOptions};
    let bytes = training_job(12, 2 << 20, 3).bytes;
    let frames = read_recording(
        Box::new(Cursor::new([&crate::job::MAGIC[..], &bytes].concat())),
        "job.vslive".into(),
    )
    .expect("a recording");
    let live = JobOptions {
        step_marker: Some("train_step".into()),
        ..JobOptions::default()
    };
    let src = job_source_with(frames, None, Arc::default(), live);
    let mut app = app_finished(vec![("pid 7".into(), src)], &opts());
    keys(&mut app, "G");
    let s = screen(&mut app, 140, 44);
    let f = &app.runs[0].findings;
    assert!(!f.is_empty(), "{s}");
    assert!(
        f.iter()
            .all(|f| f.evidence.contains("the step marker \"train_step\"")),
        "{:?}",
        f.iter().map(|f| &f.evidence).collect::<Vec<_>>()
    );
}

/// A job whose stream ends right at a step's end (the helper's recording of
/// the peak-inside-step capture: its last Optimizer.step after its last
/// entry): the pane shows what the step that just ended left alive, not an
/// empty step after it.
#[test]
fn at_a_step_s_end_the_pane_shows_the_step_that_just_ended() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/live/peak-inside-step.vslive");
    let frames = crate::job::open_recording(&path).expect("the fixture");
    let src = job_source(frames, None, None, Arc::default());
    let mut app = app_finished(vec![("job".into(), src)], &opts());
    keys(&mut app, "G");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("Grown since step (event "), "{s}");
    assert!(!s.contains("nothing born since the step began"), "{s}");
    // the capture's training loop: the optimizer's state made in the last step
    assert!(s.contains("_seed_train.py:62 in train"), "{s}");
}

/// A job whose first steps end before its first entry: the steps' markers
/// were the timeline's only events, with no keyframe before them, and
/// drawing the view panicked (issue 40).
#[test]
fn a_step_before_the_first_entry_is_drawn_and_stepped_through() {
    let bytes = include_bytes!("../../../tests/fixtures/hostile/step-before-entries.vslive");
    let frames = read_recording(Box::new(Cursor::new(bytes.to_vec())), "step.vslive".into())
        .expect("a recording");
    let src = job_source(frames, None, None, Arc::default());
    let mut app = app_finished(vec![("pid 7".into(), src)], &opts());
    for k in ["g", "l", "l", "G", "h"] {
        keys(&mut app, k);
        let s = screen(&mut app, 120, 40);
        assert!(s.contains("the job ended: done"), "{k}: {s}");
    }
    // The job's start state (one 4 KiB block) stands before and after the markers.
    let tl = &app.runs[0].timeline;
    assert_eq!(tl.len(), 4, "two steps, two markers each");
    assert_eq!(tl.state_at(Some(0)).allocated, 4096);
    assert_eq!(tl.peak_until(1).allocated, 4096);
}

/// A recording of a traced job whose loop keeps every step's loss in
/// `self.history` (python/tests/make_holders_recording.py, six steps): the
/// helper's walks name the list, and the leak panel shows its chain first.
#[test]
fn the_helper_s_holders_are_findings_in_the_leak_panel() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/live/history-leak.vslive");
    let frames = crate::job::open_recording(&path).expect("the fixture");
    let src = job_source(frames, None, None, Arc::default());
    let mut app = app_finished(vec![("job".into(), src)], &opts());
    keys(&mut app, "G");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("self.history"), "{s}");
    let f = &app.runs[0].findings[0];
    assert_eq!(f.root, "self.history");
    assert_eq!(f.kind, crate::leak::FindingKind::GrowingHolder);
    // The program's sixth loss keeps x and relu's result, 512 KiB each.
    assert!(
        f.path[0].ends_with(
            "self.history (list, 6 items) → [5]: 0-dim tensor float32, grad_fn=SumBackward0, \
             its graph keeps 1024.00 KiB of saved tensors"
        ),
        "{:?}",
        f.path
    );
    assert!(f.fix.contains("self.history.append(x.item())"), "{}", f.fix);
    // H on a recording asks nothing, and says why.
    keys(&mut app, "H");
    assert!(app.runs[0]
        .note
        .as_deref()
        .is_some_and(|n| n.contains("not a running job")));
}

/// A traced run of python/gpu/holders_job.py (`vramscope trace --record`:
/// tests/fixtures/trace/holders-job.vslive): the trace's walks are findings
/// in the leak panel as a live job's are, with the growth of one score and
/// its graph per step.
#[test]
fn a_traced_program_s_holders_are_findings_in_the_leak_panel() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/trace/holders-job.vslive");
    let frames = crate::job::open_recording(&path).expect("the fixture");
    let src = job_source(frames, None, None, Arc::default());
    let mut app = app_finished(vec![("trace".into(), src)], &opts());
    keys(&mut app, "G");
    let s = screen(&mut app, 140, 44);
    assert!(s.contains("self.val_history"), "{s}");
    let f = &app.runs[0].findings[0];
    assert_eq!(f.root, "self.val_history");
    assert_eq!(f.kind, crate::leak::FindingKind::GrowingHolder);
    // A score (4 B) and what its graph saves: the input and the ReLU's
    // result (512 × 1024 fp32 each), the last Linear's output (512 × 10).
    let per_step = 4 + 2 * 512 * 1024 * 4 + 512 * 10 * 4;
    assert_eq!(f.growth_per_iter, per_step);
    assert!(
        f.path[0].contains("self.val_history (list, 9 items)"),
        "{:?}",
        f.path
    );
}

/// A job that runs out of memory (the H100's capture of store-outputs-bug,
/// streamed, with the helper's `oom` message after its last entry): the
/// view's note gives the answer at it beside PyTorch's first line.
#[test]
fn a_live_oom_is_answered_in_the_note() {
    use crate::job::{write_value, FrameReader};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pytorch/captured/store_outputs_bug.pickle");
    let snap = crate::trace::snapshot::import_file(&path).expect("the capture");
    let bytes = crate::job::synth::recording_of(&snap);
    // Every frame again, the `oom` message before the last (bye).
    let mut frames = FrameReader::new(&bytes[crate::job::MAGIC.len()..], "rec".to_string());
    let mut all = Vec::new();
    while let Ok(Some((_, f))) = frames.next_frame() {
        all.push(f.to_vec());
    }
    let mut out = crate::job::MAGIC.to_vec();
    let last = all.len() - 1;
    for (i, f) in all.iter().enumerate() {
        if i == last {
            let oom = serde_json::json!({"t": "oom", "device": 0, "seq": 0,
                "message": "out of memory on device 0", "alloc_size": 33554432});
            write_value(&mut out, &oom).expect("writes");
        }
        crate::job::write_frame(&mut out, f).expect("writes");
    }
    let frames = read_recording(Box::new(Cursor::new(out)), "oom.vslive".into()).expect("reads");
    let src = job_source(frames, None, None, Arc::default());
    let mut notes = Vec::new();
    while let Some(m) = src.recv() {
        match m {
            crate::producers::SourceMsg::Job(crate::producers::JobMsg::Note(n)) => notes.push(n),
            crate::producers::SourceMsg::Run(crate::producers::RunMsg::Finished) => break,
            _ => {}
        }
    }
    let oom = notes
        .iter()
        .find(|n| n.starts_with("OOM on device 0"))
        .unwrap_or_else(|| panic!("{notes:?}"));
    // The capture's answer: its logits list's line holds the most, and
    // neither setting would have let the 32 MiB request fit.
    assert!(
        oom.contains("at the OOM: ")
            && oom.contains("_mnist_mlp.py:25 in forward holds 416.00 MiB"),
        "{oom}"
    );
    assert!(
        oom.contains("empty_cache() no · expandable_segments no"),
        "{oom}"
    );
}

/// A real job's OOM (tests/fixtures/live/leak-oom-h100-agent.vslive: eight
/// steps keeping 2 MiB each at line 83, then 64 MiB requests to an OOM under
/// a 1 GiB fraction): the leak panel answers it as `attach --json` does,
/// with what grew between the job's own steps.
#[test]
fn a_live_job_s_oom_is_answered_in_the_leak_panel() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/live/leak-oom-h100-agent.vslive");
    let frames = crate::job::open_recording(&path).expect("the fixture");
    let src = job_source(frames, None, None, Arc::default());
    let app = app_finished(vec![("job".into(), src)], &opts());
    let a = app.runs[0].oom_answer.as_ref().expect("an answer");
    assert_eq!(a.requested, 64 << 20);
    assert_eq!(a.grew.since_iteration, Some(1), "{:?}", a.grew);
    assert!(
        a.grew
            .by
            .iter()
            .any(|(site, _, _)| site.contains("live_oom_check.py:83")),
        "{:?}",
        a.grew
    );
}
