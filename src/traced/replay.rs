//! A traced program's requests, saved (`vramscope trace --save-requests
//! FILE`) and replayed on another GPU or under another allocator config
//! (`vramscope trace --from FILE --gpu … --conf …`) without running the
//! program again: the storages a program makes and frees do not depend on
//! the device, so the same requests go through another simulator.
//!
//! Where an answer the program read would have been different, the replay
//! says so: an OOM where the run had none (or none where it had one), or
//! another attention kernel, changes what the program does next, so the
//! replay stops there and names the request; a memory statistic the
//! program read differently is counted. Sizes vramscope itself chose for
//! the program (a cuDNN RNN's reserve) are resized to the new GPU's.
//!
//! The file: `VSREQS1\n`, a header frame (`{"requests": 1, "gpu", "conf",
//! "command"}`), then one frame per message, `[message, answer]` (the
//! answer `null` for messages that wait for none), framed as the live
//! stream is (4 bytes little-endian length + JSON).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{json, Value};

use super::error::TraceError;
use super::outcome::TraceOutcome;
use super::simulator::{SimOptions, Simulator};
use crate::device::{profile, GpuProfile};
use crate::job::{write_frame, FrameReader};
use crate::trace::snapshot::export_bytes;

/// The first bytes of a requests file.
pub const REQUESTS_MAGIC: &[u8; 8] = b"VSREQS1\n";

/// Where a replay came from and where it could not follow the program.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ReplayInfo {
    pub from: String,
    /// The GPU and allocator config the requests were traced on.
    pub recorded_gpu: String,
    pub recorded_conf: Option<String>,
    /// Messages replayed.
    pub requests: u64,
    /// Why the replay stopped before the recording's end: the program would
    /// have done something else from there.
    pub stopped: Option<String>,
    /// Answers to the program's own questions (`memory_allocated()`, …)
    /// that differ here; the replay follows what the program did with the
    /// recorded ones.
    pub answers_differ: u64,
    /// Caveats (the device the program saw).
    pub notes: Vec<String>,
}

/// Writes the program's messages and vramscope's answers as they happen.
pub struct RequestLog {
    w: BufWriter<File>,
}

impl RequestLog {
    pub fn create(
        path: &Path,
        gpu: &GpuProfile,
        conf: Option<&str>,
        command: &[String],
    ) -> Result<RequestLog, TraceError> {
        let io = |source| TraceError::Folder {
            path: path.to_path_buf(),
            source,
        };
        let mut w = BufWriter::new(File::create(path).map_err(io)?);
        w.write_all(REQUESTS_MAGIC).map_err(io)?;
        let header = json!({"requests": 1, "gpu": gpu.name, "conf": conf, "command": command});
        write_frame(&mut w, header.to_string().as_bytes()).map_err(io)?;
        Ok(RequestLog { w })
    }

    /// One message (its raw JSON) and the answer sent, if any.
    pub fn write(&mut self, message: &[u8], answer: Option<&Value>) -> Result<(), TraceError> {
        let answer = answer.map_or_else(|| "null".to_string(), Value::to_string);
        let mut body = Vec::with_capacity(message.len() + answer.len() + 3);
        body.push(b'[');
        body.extend_from_slice(message);
        body.push(b',');
        body.extend_from_slice(answer.as_bytes());
        body.push(b']');
        write_frame(&mut self.w, &body).map_err(TraceError::Sink)
    }

    pub fn finish(mut self) -> Result<(), TraceError> {
        self.w.flush().map_err(TraceError::Sink)
    }
}

/// What to replay on.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub from: PathBuf,
    /// None: the recorded GPU.
    pub gpu: Option<&'static GpuProfile>,
    pub conf: Option<String>,
    pub want_snapshot: bool,
}

/// How an answer compares with the recorded one.
enum Compared {
    Same,
    /// A statistic the program read: counted.
    Differs,
    /// The program would have taken another path: the replay stops.
    Stop(String),
}

fn kind_of(v: &Value) -> &str {
    v.get(0).and_then(Value::as_str).unwrap_or("")
}

/// Where the program was when it sent `message`, from its stack id.
fn place(sim_stack: Option<String>, index: u64) -> String {
    match sim_stack {
        Some(at) => format!("request {index} ({at})"),
        None => format!("request {index}"),
    }
}

/// The stack id a message carries (`m`: 4th element; `op`, `before`,
/// `out`: 5th).
fn stack_id(message: &Value) -> Option<u32> {
    let i = match kind_of(message) {
        "m" | "ma" => 3,
        "op" | "oa" | "before" | "out" => 4,
        _ => return None,
    };
    message
        .get(i)
        .and_then(Value::as_u64)
        .and_then(|s| u32::try_from(s).ok())
}

fn compare(message: &Value, recorded: &Value, now: &Value) -> Compared {
    if recorded == now {
        return Compared::Same;
    }
    let (was, is) = (kind_of(recorded), kind_of(now));
    match kind_of(message) {
        "m" | "op" | "before" | "out" | "init" | "fraction" | "dump" if was != is => {
            let what = |k: &str| match k {
                "ok" => "went ahead".to_string(),
                "oom" => "ran out of memory".to_string(),
                other => format!("answered {other}"),
            };
            Compared::Stop(format!(
                "the recorded run {} where this one {}",
                what(was),
                what(is)
            ))
        }
        "sdpa" => Compared::Stop(format!(
            "PyTorch would take the {} attention kernel here, not the recorded {}",
            now.get(1).and_then(Value::as_str).unwrap_or("?"),
            recorded.get(1).and_then(Value::as_str).unwrap_or("?")
        )),
        "stats" | "mem_get_info" | "summary" | "get_fraction" => Compared::Differs,
        _ => Compared::Same,
    }
}

/// The outputs vramscope sized in a `before` answer (`{"sizes": {i: b}}`).
fn sizes_of(answer: &Value) -> Vec<(String, u64)> {
    answer
        .get(1)
        .and_then(|o| o.get("sizes"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// Replay the requests of `opts.from` through a fresh simulator writing
/// the live stream to `sink`: the outcome, and the snapshot if asked.
pub fn replay(
    opts: &ReplayOptions,
    sink: Box<dyn Write + Send>,
) -> Result<(TraceOutcome, Option<Vec<u8>>), TraceError> {
    let at = opts.from.display().to_string();
    let bad = |why: String| TraceError::Channel(format!("{at}: {why}"));
    let (file, _) = crate::files::open_regular(&opts.from).map_err(|e| bad(e.to_string()))?;
    let mut r = BufReader::new(file);
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic).map_err(|_| {
        bad("not a requests file (saved by `vramscope trace --save-requests`)".into())
    })?;
    if &magic != REQUESTS_MAGIC {
        return Err(bad(
            "not a requests file (saved by `vramscope trace --save-requests`)".into(),
        ));
    }
    let mut frames = FrameReader::new(r, at.clone());
    let header: Value = match frames.next_frame().map_err(|e| bad(e.to_string()))? {
        Some((_, b)) => serde_json::from_slice(b).map_err(|e| bad(format!("its header: {e}")))?,
        None => return Err(bad("it ends before its header".into())),
    };
    let recorded_gpu = header
        .get("gpu")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let recorded_conf = header.get("conf").and_then(Value::as_str).map(String::from);
    let command = super::message::strings(header.get("command"));
    let gpu = match opts.gpu {
        Some(g) => g,
        None => profile(&recorded_gpu).ok_or_else(|| {
            bad(format!(
                "it was traced on {recorded_gpu:?}, a GPU this vramscope does not know"
            ))
        })?,
    };
    let sim_opts = SimOptions {
        gpu,
        steps: None,
        conf: opts.conf.clone().or_else(|| recorded_conf.clone()),
        holders_budget_ms: super::simulator::HOLDERS_BUDGET_MS,
    };
    let mut sim = Simulator::new(sim_opts, sink, command);
    sim.replaying = true;
    let mut info = ReplayInfo {
        from: at.clone(),
        recorded_gpu: recorded_gpu.clone(),
        recorded_conf,
        ..ReplayInfo::default()
    };
    if gpu.name != recorded_gpu {
        info.notes.push(format!(
            "the program saw the {recorded_gpu}'s properties when it was traced; a program that \
             sizes its work by the GPU would size it for that one"
        ));
    }
    // Sizes vramscope chose that differ here: (recorded, now), for the
    // storages the program makes with them next.
    let mut resized: Vec<(u64, u64)> = Vec::new();
    while let Some((index, bytes)) = frames.next_frame().map_err(|e| bad(e.to_string()))? {
        let pair: Value =
            serde_json::from_slice(bytes).map_err(|e| bad(format!("frame {index}: {e}")))?;
        let (Some(message), Some(recorded)) = (pair.get(0), pair.get(1)) else {
            return Err(bad(format!("frame {index} is not [message, answer]")));
        };
        let mut message = message.clone();
        if matches!(kind_of(&message), "m" | "ma") {
            let n = message.get(2).and_then(Value::as_u64);
            if let Some(k) = resized.iter().position(|(old, _)| Some(*old) == n) {
                message[2] = json!(resized.remove(k).1);
            }
        }
        info.requests += 1;
        let ooms = sim.ooms();
        let now = sim.handle(index, &message)?;
        if matches!(kind_of(&message), "ma" | "oa") && sim.ooms() > ooms {
            // Sent without waiting where it fit; here it does not.
            let where_ = place(stack_id(&message).and_then(|s| sim.user_frame_of(s)), index);
            info.stopped = Some(format!(
                "at {where_}: the recorded run went ahead where this one ran out of memory, so the \
                 program would go on otherwise from here; run it under this GPU and config to see \
                 what follows"
            ));
            break;
        }
        let (Some(now), false) = (now, recorded.is_null()) else {
            continue;
        };
        if kind_of(&message) == "before" {
            let was = sizes_of(recorded);
            for (i, b) in sizes_of(&now) {
                if let Some((_, old)) = was.iter().find(|(j, _)| *j == i) {
                    if *old != b {
                        resized.push((*old, b));
                    }
                }
            }
        }
        match compare(&message, recorded, &now) {
            Compared::Same => {}
            Compared::Differs => info.answers_differ += 1,
            Compared::Stop(why) => {
                let stack = stack_id(&message);
                let where_ = place(stack.and_then(|s| sim.user_frame_of(s)), index);
                info.stopped = Some(format!(
                    "at {where_}: {why}, so the program would go on otherwise from here; \
                     run it under this GPU and config to see what follows"
                ));
                break;
            }
        }
    }
    let (mut outcome, snap) = sim.finish(Some(0))?;
    if info.stopped.is_some() {
        outcome.ended =
            Some("the replay stopped where the program would have gone another way".into());
    }
    outcome.replay = Some(info);
    let pickle = opts.want_snapshot.then(|| export_bytes(&snap));
    Ok((outcome, pickle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oom_where_the_run_went_ahead_stops_the_replay() {
        let m = json!(["m", 1, 1024, 0]);
        assert!(matches!(
            compare(&m, &json!(["ok"]), &json!(["oom", "CUDA out of memory."])),
            Compared::Stop(_)
        ));
        assert!(matches!(
            compare(&m, &json!(["ok"]), &json!(["ok"])),
            Compared::Same
        ));
        let s = json!(["stats"]);
        assert!(matches!(
            compare(&s, &json!(["ok", {"a": 1}]), &json!(["ok", {"a": 2}])),
            Compared::Differs
        ));
        let q = json!(["sdpa", {}]);
        assert!(matches!(
            compare(&q, &json!(["ok", "flash"]), &json!(["ok", "efficient"])),
            Compared::Stop(_)
        ));
    }

    #[test]
    fn a_before_answer_s_sizes_are_read() {
        let a = json!(["ok", {"sizes": {"3": 6177760}}]);
        assert_eq!(sizes_of(&a), vec![("3".to_string(), 6_177_760)]);
        assert!(sizes_of(&json!(["ok"])).is_empty());
    }
}
