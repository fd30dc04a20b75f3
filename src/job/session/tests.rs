use serde_json::{json, Value};

use super::*;
use crate::job::message::decode;
use crate::job::synth::hello;
use crate::leak::{analyze_snapshot_with, BoundarySource};

const BASE: u64 = 0x7f00_0000_0000;
const MIB: u64 = 1 << 20;

fn feed(s: &mut Session, msgs: &[Value]) -> Result<Vec<Applied>, LiveError> {
    msgs.iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let bytes = serde_json::to_vec(m).expect("json");
            match decode("test", i as u64, &bytes) {
                Ok(Some(msg)) => Some(s.apply(i as u64, msg)),
                Ok(None) => None,
                Err(e) => Some(Err(e)),
            }
        })
        .collect()
}

fn start(seq: u64) -> Vec<Value> {
    vec![
        hello(7, &[(0, 80 << 30)], ""),
        json!({"t":"state","seq":seq,"reason":"start","chunks":0}),
        json!({"t":"stack","id":1,"frames":[["/home/u/train.py",41,"train_step"],["/home/u/train.py",90,"<module>"]]}),
        json!({"t":"stack","id":2,"frames":[["/home/u/model.py",12,"forward"]]}),
    ]
}

fn e(action: &str, addr: u64, size: u64, stack: Option<u32>) -> Value {
    json!([action, 0, addr, size, 0, 1_000, stack])
}

/// One training step: a temporary of 8 MiB made and freed, and (when
/// `leak`) 2 MiB kept for good at the next free address.
fn step_entries(k: u64, leak: bool) -> Vec<Value> {
    let tmp = BASE + 512 * MIB;
    let mut v = vec![
        e("alloc", tmp, 8 * MIB, Some(2)),
        e("free_requested", tmp, 8 * MIB, Some(2)),
        e("free_completed", tmp, 8 * MIB, Some(2)),
    ];
    if leak {
        v.push(e("alloc", BASE + k * 2 * MIB, 2 * MIB, Some(1)));
    }
    v
}

/// A job of `steps` steps leaking 2 MiB per step when `leak`.
fn job(steps: u64, leak: bool) -> Vec<Value> {
    let mut msgs = start(0);
    msgs.push(json!({"t":"entries","first":0,"entries":[e("segment_alloc", BASE, 1 << 30, None)]}));
    let mut seq = 1;
    for k in 0..steps {
        let entries = step_entries(k, leak);
        let n = entries.len() as u64;
        msgs.push(json!({"t":"entries","first":seq,"entries":entries}));
        seq += n;
        msgs.push(json!({"t":"step","step":k,"seq":seq,"time_us":null,"source":"Optimizer.step"}));
    }
    msgs
}

#[test]
fn a_leak_of_2_mib_per_step_is_flagged_within_20_steps_and_a_clean_loop_is_not() {
    let msgs = job(20, true);
    let mut s = Session::new("test");
    let mut flagged_at = None;
    for (i, m) in msgs.iter().enumerate() {
        let bytes = serde_json::to_vec(m).expect("json");
        let msg = decode("test", i as u64, &bytes)
            .expect("decode")
            .expect("known");
        if s.apply(i as u64, msg).expect("apply") == Applied::Step && flagged_at.is_none() {
            let r = analyze_snapshot_with(s.snap(), 0, s.boundaries(0));
            let hit = r.findings.iter().find(|f| f.root.contains("train.py:41"));
            if let Some(f) = hit {
                assert_eq!(f.growth_per_iter, 2 * MIB as i64);
                flagged_at = Some(s.steps().len());
            }
        }
    }
    let at = flagged_at.expect("the leak is flagged");
    // Three iterations of growth need four boundaries before anything is claimed.
    assert!((4..=20).contains(&at), "flagged after {at} steps");
    let r = analyze_snapshot_with(s.snap(), 0, s.boundaries(0));
    // Live bytes at each of the 20 step boundaries grow by the leak.
    assert_eq!(r.live_at_boundary.len(), 20);
    let growth: Vec<i64> = r
        .live_at_boundary
        .windows(2)
        .map(|w| w[1] as i64 - w[0] as i64)
        .collect();
    assert!(growth.iter().all(|g| *g == 2 * MIB as i64), "{growth:?}");
    assert_eq!(
        r.boundary_source,
        BoundarySource::LiveSteps {
            source: "Optimizer.step".into()
        }
    );
    assert!(r.findings.iter().all(|f| !f.root.contains("model.py")));

    let mut clean = Session::new("test");
    feed(&mut clean, &job(20, false)).expect("clean job");
    let r = analyze_snapshot_with(clean.snap(), 0, clean.boundaries(0));
    assert!(r.findings.is_empty(), "{:?}", r.findings);
    assert_eq!(r.boundaries.len(), 20);
}

#[test]
fn the_current_map_becomes_the_snapshots_segments_with_stacks() {
    let mut s = Session::new("test");
    feed(&mut s, &job(3, true)).expect("job");
    let snap = s.snapshot();
    assert_eq!(snap.segments.len(), 1);
    let seg = &snap.segments[0];
    assert_eq!(seg.total_size, 1 << 30);
    assert_eq!(seg.allocated_size, 6 * MIB);
    let live: Vec<_> = seg.blocks.iter().filter(|b| b.state.is_active()).collect();
    assert_eq!(live.len(), 3);
    for b in live {
        assert_eq!(
            snap.user_site(b.frames).as_deref(),
            Some("/home/u/train.py:41 in train_step")
        );
    }
}

#[test]
fn a_gap_in_seq_is_an_error_naming_the_message_and_field() {
    let mut msgs = start(0);
    msgs.push(json!({"t":"entries","first":5,"entries":[e("segment_alloc", BASE, 1 << 30, None)]}));
    let err = feed(&mut Session::new("sock"), &msgs).expect_err("gap");
    let text = err.to_string();
    assert!(
        text.contains("message 4") && text.contains("`first`"),
        "{text}"
    );
    assert!(text.contains("5, where the next entry is seq 0"), "{text}");
}

#[test]
fn an_unknown_stack_id_is_an_error_naming_the_entry() {
    let mut msgs = start(0);
    msgs.push(json!({"t":"entries","first":0,"entries":[
        e("segment_alloc", BASE, 1 << 30, None), e("alloc", BASE, 512, Some(99))]}));
    let err = feed(&mut Session::new("sock"), &msgs).expect_err("unknown stack");
    let text = err.to_string();
    assert!(
        text.contains("entries[1][6]") && text.contains("stack 99"),
        "{text}"
    );
}

#[test]
fn entries_before_a_state_and_a_stack_defined_twice_are_errors() {
    let msgs = vec![
        hello(1, &[(0, 0)], ""),
        json!({"t":"entries","first":0,"entries":[]}),
    ];
    let err = feed(&mut Session::new("s"), &msgs).expect_err("no state");
    assert!(err.to_string().contains("before any state"), "{err}");
    let mut msgs = start(0);
    msgs.push(json!({"t":"stack","id":1,"frames":[]}));
    let err = feed(&mut Session::new("s"), &msgs).expect_err("twice");
    assert!(
        err.to_string().contains("stack 1 is defined twice"),
        "{err}"
    );
}

fn state(seq: u64, reason: &str, blocks: Value) -> Vec<Value> {
    vec![
        json!({"t":"state","seq":seq,"reason":reason,"chunks":1}),
        json!({"t":"segments","segments":[{"device":0,"address":BASE,"total_size":1u64<<30,
            "stream":0,"segment_type":"large","segment_pool_id":[0,0],"is_expandable":false,
            "blocks":blocks}]}),
    ]
}

#[test]
fn a_resync_that_matches_is_a_checkpoint_and_one_that_differs_starts_over() {
    let mut msgs = start(0);
    msgs.push(json!({"t":"entries","first":0,"entries":[
        e("segment_alloc", BASE, 1 << 30, None), e("alloc", BASE, 2 * MIB, Some(1))]}));
    let same = json!([
        {"address":BASE,"size":2*MIB,"requested_size":2*MIB,"state":"active_allocated","stack":1},
        {"address":BASE+2*MIB,"size":(1u64<<30)-2*MIB,"requested_size":0,"state":"inactive","stack":null}]);
    msgs.extend(state(2, "resync", same));
    let mut s = Session::new("s");
    let applied = feed(&mut s, &msgs).expect("resync");
    assert_eq!(applied.last(), Some(&Applied::Checkpoint));
    assert_eq!(s.trace(0).len(), 2, "a checkpoint keeps the history");

    let differs = json!([{"address":BASE,"size":1u64<<30,"requested_size":0,"state":"inactive","stack":null}]);
    let applied = feed(&mut s, &state(2, "rebase", differs)).expect("rebase");
    let Some(Applied::Started { why: Some(why) }) = applied.last() else {
        panic!("{applied:?}");
    };
    assert!(why.contains("rebase state at seq 2 differs"), "{why}");
    assert!(s.trace(0).is_empty());
    assert_eq!(s.map(0).map(|m| m.allocated), Some(0));
}

#[test]
fn lost_entries_start_over_from_the_state_that_follows() {
    let mut msgs = start(0);
    msgs.push(json!({"t":"entries","first":0,"entries":[e("segment_alloc", BASE, 1 << 30, None)]}));
    msgs.push(json!({"t":"lost","seq":1,"count":1532,"why":"the native ring overflowed"}));
    let blocks = json!([{"address":BASE,"size":1u64<<30,"requested_size":0,"state":"inactive","stack":null}]);
    msgs.extend(state(1533, "lost", blocks));
    msgs.push(json!({"t":"entries","first":1533,"entries":[e("alloc", BASE, 512, Some(2))]}));
    let mut s = Session::new("s");
    let applied = feed(&mut s, &msgs).expect("lost");
    let why = applied.iter().find_map(|a| match a {
        Applied::Started { why: Some(w) } => Some(w.clone()),
        _ => None,
    });
    let why = why.expect("started over");
    assert!(why.contains("lost 1532 entries from seq 1"), "{why}");
    assert_eq!(s.trace(0).len(), 1);
    let facts = s.facts();
    assert_eq!(facts.lost.len(), 1);
    assert_eq!(facts.started_over, vec![why]);
}

#[test]
fn past_the_cap_the_history_is_dropped_and_the_map_kept() {
    let mut s = Session::with_cap("s", 10);
    feed(&mut s, &job(5, true)).expect("job");
    assert!(s.trace(0).len() <= 10);
    let snap = s.snapshot();
    let allocated: u64 = snap.segments.iter().map(|g| g.allocated_size).sum();
    assert_eq!(allocated, 10 * MIB, "the map survives the drop");
    assert!(s
        .facts()
        .started_over
        .iter()
        .any(|w| w.contains("over the 10 kept (attach --keep-entries)")));
}

#[test]
fn bye_ends_the_session_with_its_reason() {
    let mut msgs = start(0);
    msgs.push(json!({"t":"bye","reason":"the process is exiting"}));
    msgs.push(json!({"t":"some_future_message","x":1}));
    let mut s = Session::new("s");
    feed(&mut s, &msgs).expect("bye");
    assert_eq!(s.ended(), Some("the process is exiting"));
}

#[test]
fn pytorch_s_oom_message_joins_the_oom_the_observer_sent() {
    let mut s = Session::new("test");
    let mut msgs = job(1, false);
    msgs.push(json!({"t":"entries","first":4,"entries":[e("oom", 3 << 30, 40 << 30, None)]}));
    msgs.push(json!({"t":"oom","device":0,"seq":5,"message":"observer: tried 40 GiB","device_free":3221225472u64,"device_total":null,"alloc_size":42949672960u64}));
    msgs.push(json!({"t":"oom_message","seq":5,"device":0,"message":"CUDA out of memory. Tried to allocate 40.00 GiB. GPU 0 has a total capacity of 80.00 GiB"}));
    let applied = feed(&mut s, &msgs).expect("applies");
    assert!(
        matches!(applied.last(), Some(Applied::OomMessage)),
        "{applied:?}"
    );
    let ooms = s.ooms().to_vec();
    assert_eq!(ooms.len(), 1);
    assert_eq!(ooms[0].message, "observer: tried 40 GiB");
    assert_eq!(
        ooms[0].pytorch_message.as_deref(),
        Some("CUDA out of memory. Tried to allocate 40.00 GiB. GPU 0 has a total capacity of 80.00 GiB")
    );
    let facts = serde_json::to_value(s.facts()).expect("json");
    assert_eq!(
        facts["ooms"][0]["pytorch_message"],
        ooms[0].pytorch_message.as_deref().unwrap_or_default()
    );

    // Without the observer's record, the message alone stands for the OOM.
    let mut alone = Session::new("test");
    let mut msgs = job(1, false);
    msgs.push(json!({"t":"oom_message","seq":4,"device":null,"message":"CUDA out of memory."}));
    feed(&mut alone, &msgs).expect("applies");
    assert_eq!(alone.ooms().len(), 1);
    assert_eq!(
        alone.ooms()[0].pytorch_message.as_deref(),
        Some("CUDA out of memory.")
    );
}

/// A segment made after the start (a private pool's, say, under a CUDA
/// graph) takes its pool from the next state that matches the map.
#[test]
fn a_checkpoint_tells_the_pool_of_a_segment_made_since_the_start() {
    let mut msgs = start(0);
    msgs.push(json!({"t":"entries","first":0,"entries":[
        e("segment_alloc", BASE, 1 << 30, None), e("alloc", BASE, 2 * MIB, Some(1))]}));
    let mut s = Session::new("s");
    feed(&mut s, &msgs).expect("entries");
    assert_eq!(
        s.snapshot().segments[0].pool_id,
        (0, 0),
        "unknown until a state says"
    );
    let blocks = json!([
        {"address":BASE,"size":2*MIB,"requested_size":2*MIB,"state":"active_allocated","stack":1},
        {"address":BASE+2*MIB,"size":(1u64<<30)-2*MIB,"requested_size":0,"state":"inactive","stack":null}]);
    let mut resync = state(2, "resync", blocks);
    resync[1]["segments"][0]["segment_pool_id"] = json!([1, 3]);
    let applied = feed(&mut s, &resync).expect("resync");
    assert_eq!(applied.last(), Some(&Applied::Checkpoint));
    assert_eq!(s.snapshot().segments[0].pool_id, (1, 3));
}

/// A stream that defines ever more distinct frames, or ever longer stacks,
/// is stopped at the stack table's bounds with an error naming the message.
#[test]
fn the_stack_table_has_bounds_a_stream_cannot_pass() {
    let bounds = StackBounds {
        text: 1_000,
        frames: 50,
    };
    let stack = |id: u32, frames: Vec<Value>| json!({"t":"stack","id":id,"frames":frames});
    // Distinct names: 40 bytes of text each, so the 26th frame passes 1,000.
    let mut s = Session::new("s").with_stack_bounds(bounds);
    let mut msgs = vec![hello(7, &[(0, 80 << 30)], "")];
    for i in 0..30u32 {
        msgs.push(stack(
            i,
            vec![json!([
                format!("/very/long/file/name/{i:08}.py"),
                1,
                format!("f{i:09}")
            ])],
        ));
    }
    let e = feed(&mut s, &msgs).expect_err("over the text bound");
    assert!(
        e.to_string()
            .contains("distinct frames' names take more than"),
        "{e}"
    );
    // The same frame again and again costs no text, but frames over stacks count.
    let mut s = Session::new("s").with_stack_bounds(bounds);
    let mut msgs = vec![hello(7, &[(0, 80 << 30)], "")];
    for i in 0..6u32 {
        msgs.push(stack(i, vec![json!(["train.py", 1, "step"]); 10]));
    }
    let e = feed(&mut s, &msgs).expect_err("over the frames bound");
    assert!(
        e.to_string()
            .contains("more than 50 frames over its stacks"),
        "{e}"
    );
    // Under both, all is well.
    let mut s = Session::new("s").with_stack_bounds(bounds);
    feed(&mut s, &msgs[..5]).expect("under the bounds");
}

/// A stream that starts over without end keeps the first reasons and says
/// there were more, rather than a list that grows for ever.
#[test]
fn endless_start_overs_keep_a_bounded_list_of_reasons() {
    let mut s = Session::new("s");
    let mut msgs = start(0);
    for k in 0..150u64 {
        msgs.push(json!({"t":"lost","seq":0,"count":1,"why":format!("test {k}")}));
        msgs.push(json!({"t":"state","seq":0,"reason":"lost","chunks":0}));
    }
    feed(&mut s, &msgs).expect("applies");
    let overs = s.facts().started_over;
    assert_eq!(overs.len(), 101);
    assert!(overs[0].contains("lost"), "{}", overs[0]);
    assert_eq!(overs[100], "… and more start-overs after these");
}

#[test]
fn stats_read_at_an_oom_are_no_step_and_leave_the_per_step_trend_alone() {
    let stats = |seq: u64, allocated: u64| {
        json!({"t":"stats","device":0,"seq":seq,"stats":{
            "allocated_bytes.all.current": allocated, "reserved_bytes.all.current": 1u64 << 30}})
    };
    let mut msgs = Vec::new();
    for m in job(6, true) {
        let step = (m["t"] == "step").then(|| (m["step"].as_u64(), m["seq"].as_u64()));
        msgs.push(m);
        if let Some((Some(k), Some(seq))) = step {
            msgs.push(stats(seq, 100 * MIB + k * 2 * MIB));
        }
    }
    // The loop then hoards memory to an OOM: the helper sends the OOM and
    // the stats read at that moment, mid-step.
    msgs.push(json!({"t":"oom","device":0,"seq":30,"message":"observer","device_free":0,"device_total":null,"alloc_size":MIB}));
    msgs.push(stats(30, 989 * MIB));
    let mut s = Session::new("test");
    feed(&mut s, &msgs).expect("apply");
    let t = s.step_trends();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].allocated_per_step, Some(2 * MIB as i64));
    assert_eq!(t[0].allocated_last, 110 * MIB);
    assert_eq!(t[0].readings, 6);
}

/// A flood of `step` messages grew `attach` by 310 MB/s: only entries
/// made the view start over. Steps are bounded too, and a long source is cut.
#[test]
fn a_flood_of_steps_starts_over_and_keeps_each_source_short() {
    let mut s = Session::new("job");
    feed(&mut s, &start(0)).expect("start");
    let long = "record_function:".to_string() + &"x".repeat(4 << 10);
    let mut started = 0;
    for k in 0..(MAX_STEPS_KEPT as u64 * 2 + 10) {
        let step = StepMark {
            step: k,
            seq: 0,
            time_us: None,
            source: long.clone(),
        };
        if let Applied::Started { why } = s.apply(k, Message::Step(step)).expect("a step") {
            assert!(why.is_some_and(|w| w.contains("steps, over the 100000 kept")));
            started += 1;
        }
        assert!(s.steps().len() <= MAX_STEPS_KEPT);
    }
    assert_eq!(started, 2);
    assert!(s
        .steps()
        .iter()
        .all(|st| st.source.capacity() <= MAX_STEP_SOURCE + 3));
    assert!(s.steps()[0].source.ends_with("xx…"));
    // `--keep-entries` lowers the bound with the entries'.
    let mut s = Session::with_cap("job", 50);
    feed(&mut s, &start(0)).expect("start");
    let steps: Vec<Value> = (0..60)
        .map(|k| json!({"t":"step","step":k,"seq":0,"source":"mark_step"}))
        .collect();
    let applied = feed(&mut s, &steps).expect("steps");
    assert!(applied.iter().any(|a| matches!(a, Applied::Started { .. })));
    assert!(s.steps().len() <= 50);
}

/// A state whose chunks never end (`chunks` of 2^63, then segments without
/// end) is refused once it holds more blocks than the bound.
#[test]
fn a_state_that_never_ends_is_refused_at_the_bound() {
    let mut s = Session::with_cap("job", 10);
    let mut msgs = start(0);
    msgs.push(json!({"t":"state","seq":0,"reason":"rebase","chunks":1u64 << 63}));
    feed(&mut s, &msgs).expect("start");
    let blocks: Vec<Value> = (0..1000u64)
        .map(|b| json!({"address": BASE + b * 512, "size": 512, "state": "inactive"}))
        .collect();
    let chunk = json!({"t":"segments","segments":[{"device":0,"address":BASE,"total_size":1u64 << 30,
        "stream":0,"segment_type":"large","is_expandable":false,"blocks":blocks}]});
    let bytes = serde_json::to_vec(&chunk).expect("json");
    let mut refused = None;
    for i in 0..100 {
        let msg = decode("job", i, &bytes).expect("decodes").expect("known");
        if let Err(e) = s.apply(i, msg) {
            refused = Some((i, e.to_string()));
            break;
        }
    }
    let (at, err) = refused.expect("refused before 100 chunks");
    assert_eq!(at, 65, "65 chunks of 1,001 pass 65,536");
    assert!(err.contains("more than 65,536 blocks (the bound)"), "{err}");
}

/// The OOM's answer replays the snapshot under its own settings: a job's
/// `PYTORCH_CUDA_ALLOC_CONF` reaches the snapshot the session builds.
#[test]
fn the_job_s_allocator_settings_reach_its_snapshot() {
    let mut s = Session::new("s");
    feed(
        &mut s,
        &[hello(7, &[(0, 80 << 30)], "expandable_segments:True")],
    )
    .expect("hello");
    let settings = s.snapshot().allocator_settings.as_ref().expect("settings");
    assert!(settings.expandable_segments);
    assert_eq!(settings.conf, "expandable_segments:True");
    assert!(crate::trace::replay::from_snapshot::config(s.snapshot()).expandable_segments);
}
