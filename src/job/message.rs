//! The messages of PROTOCOL.md as typed values. A frame's JSON is decoded
//! here; a message type this reader does not know is skipped (`None`), and a
//! known one with a missing or mistyped field is an error naming the
//! message's index and the field (`segments[2].blocks[0].size`). The bounds
//! of "Bounds a reader keeps" that one message can break are checked here;
//! those across messages (stacks defined) in the session.

use serde::Deserialize;
use serde_json::Value;

use super::error::LiveError;
use crate::alloc::{Action, BlockState};
use crate::trace::snapshot::PoolKind;

/// The protocol version this reader speaks.
pub const PROTOCOL: u64 = 1;
/// PROTOCOL.md bounds.
pub const MAX_STRING: usize = 64 << 10;
pub const MAX_STACK_FRAMES: usize = 1024;
pub const STACK_ID_LIMIT: u64 = 1 << 24;
pub const MAX_DEVICE: u64 = 255;
pub use typed::MAX_STATS_KEYS;

/// One decoded message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Hello(Box<ServerHello>),
    Refused {
        reason: String,
    },
    State(StateHeader),
    Segments(Vec<WireSegment>),
    Stack {
        id: u32,
        frames: Vec<WireFrame>,
    },
    Entries {
        first: u64,
        entries: Vec<WireEntry>,
    },
    Step(StepMark),
    Stats(DeviceStats),
    Oom(OomMark),
    /// PyTorch's own message for the latest OOM (`oom_message`).
    OomMessage {
        seq: u64,
        device: Option<u8>,
        message: String,
    },
    Lost(LostMark),
    /// What the helper found holding the job's tensors (`holders`).
    Holders(Box<crate::job::holders::HoldersReport>),
    Bye {
        reason: Option<String>,
    },
}

/// The server hello: who the job is.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ServerHello {
    pub protocol: u64,
    pub pid: u64,
    pub rank: Option<u64>,
    pub world_size: Option<u64>,
    pub hostname: Option<String>,
    pub argv: Vec<String>,
    pub torch: Option<String>,
    /// `agent` or `poll`.
    pub mode: String,
    pub stacks: bool,
    pub devices: Vec<HelloDevice>,
    pub allocator_settings: Vec<(String, String)>,
    pub started_us: Option<i64>,
    pub poll_interval_s: Option<f64>,
}

impl ServerHello {
    /// `PYTORCH_CUDA_ALLOC_CONF` of the job, when it said.
    pub fn alloc_conf(&self) -> Option<&str> {
        self.allocator_settings
            .iter()
            .find(|(k, _)| k == "PYTORCH_CUDA_ALLOC_CONF")
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HelloDevice {
    pub device: u8,
    pub name: Option<String>,
    pub total_memory: Option<u64>,
    /// Where the device sits on the PCI bus, as torch tells it: how NVML's
    /// reading of it is found (an ordinal differs under `CUDA_VISIBLE_DEVICES`).
    pub pci_bus_id: Option<crate::device::PciAddress>,
    /// The device's UUID (`GPU-…`), as NVML writes it.
    pub uuid: Option<String>,
}

/// Why a `state` was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateReason {
    Start,
    Rebase,
    Lost,
    Oom,
    Resync,
    /// A reason newer than this reader: treated as a checkpoint.
    Other(String),
}

impl StateReason {
    fn parse(s: &str) -> StateReason {
        match s {
            "start" => StateReason::Start,
            "rebase" => StateReason::Rebase,
            "lost" => StateReason::Lost,
            "oom" => StateReason::Oom,
            "resync" => StateReason::Resync,
            other => StateReason::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            StateReason::Start => "start",
            StateReason::Rebase => "rebase",
            StateReason::Lost => "lost",
            StateReason::Oom => "oom",
            StateReason::Resync => "resync",
            StateReason::Other(s) => s,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateHeader {
    pub seq: u64,
    pub reason: StateReason,
    pub chunks: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireSegment {
    pub device: u8,
    pub address: u64,
    pub total_size: u64,
    pub stream: u64,
    pub segment_type: PoolKind,
    pub pool_id: (i64, i64),
    pub is_expandable: bool,
    pub blocks: Vec<WireBlock>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireBlock {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
    pub stack: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireFrame {
    pub filename: String,
    pub line: i64,
    pub name: String,
}

/// One trace entry: `[action, device, addr, size, stream, time_us, stack]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireEntry {
    pub action: Action,
    /// PyTorch's spelling when `action` is [`Action::Other`].
    pub other: Option<String>,
    pub device: u8,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub time_us: Option<i64>,
    pub stack: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StepMark {
    pub step: u64,
    pub seq: u64,
    pub time_us: Option<i64>,
    pub source: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceStats {
    pub device: u8,
    pub seq: u64,
    pub stats: Vec<(String, i64)>,
}

impl DeviceStats {
    pub fn get(&self, key: &str) -> Option<i64> {
        self.stats.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OomMark {
    pub device: u8,
    pub seq: u64,
    pub message: String,
    pub device_free: Option<u64>,
    pub device_total: Option<u64>,
    pub alloc_size: Option<u64>,
    /// What PyTorch raised, when the job sent it (`oom_message`).
    pub pytorch_message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LostMark {
    pub seq: u64,
    pub count: Option<u64>,
    pub why: String,
}

/// Frames up to this size that the typed path refuses are decoded again
/// field by field, for an error naming the field: a tree of 1 MiB of JSON
/// costs tens of MB at most.
const CAREFUL_MAX: usize = 1 << 20;

/// Decode frame `index` read from `at`; `None` for a type this reader does
/// not know. The frame is read straight into the message types
/// (`typed.rs`), never into a generic JSON tree a hostile frame could blow up.
pub fn decode(at: &str, index: u64, bytes: &[u8]) -> Result<Option<Message>, LiveError> {
    // Entries are nearly all of a stream's bytes: read them first.
    if let Ok(fast) = serde_json::from_slice::<FastEntries>(bytes) {
        if fast.t == "entries" {
            if let Some(m) = fast.into_message() {
                return Ok(Some(m));
            }
        }
    }
    let bad_json = |why: String, line: usize, column: usize| LiveError::BadJson {
        at: at.to_string(),
        index,
        why,
        line,
        column,
    };
    if let Some(what) = not_an_object(bytes) {
        return Err(bad_json(format!("{what}, not an object"), 1, 1));
    }
    let kind = match typed::tag(bytes) {
        Ok(typed::Tag::Str(kind)) => kind,
        Ok(typed::Tag::Missing) => {
            return Err(LiveError::field(at, index, "?", "t", "missing".into()))
        }
        Ok(typed::Tag::Other(what)) => {
            return Err(LiveError::field(
                at,
                index,
                "?",
                "t",
                format!("expected a string, found {what}"),
            ))
        }
        Err(e) => return Err(bad_json(e.to_string(), e.line(), e.column())),
    };
    // A holders report (PROTOCOL.md) is small and bounded: it is read field by
    // field, and a frame too large for that is refused.
    if kind == "holders" {
        if bytes.len() > CAREFUL_MAX {
            return Err(LiveError::protocol(
                at,
                index,
                &kind,
                format!(
                    "{} bytes, over the 1 MiB a holders report may take",
                    bytes.len()
                ),
            ));
        }
        return match serde_json::from_slice::<Value>(bytes) {
            Ok(Value::Object(obj)) => Fields {
                at,
                index,
                kind: &kind,
            }
            .message(&obj),
            Ok(_) => Err(bad_json("not an object".into(), 1, 1)),
            Err(e) => Err(bad_json(e.to_string(), e.line(), e.column())),
        };
    }
    match typed::message(&kind, bytes) {
        Ok(m) => Ok(m),
        Err(refusal) => {
            if bytes.len() <= CAREFUL_MAX {
                careful(at, index, &kind, bytes)?;
            }
            Err(match refusal {
                typed::Refusal::Json(e) => LiveError::protocol(at, index, &kind, e.to_string()),
                typed::Refusal::Field(field, problem) => {
                    LiveError::field(at, index, &kind, &field, problem)
                }
                typed::Refusal::Bound(problem) => LiveError::protocol(at, index, &kind, problem),
            })
        }
    }
}

/// What a frame is when it is JSON but no object (from its first byte).
fn not_an_object(bytes: &[u8]) -> Option<&'static str> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace())?;
    Some(match first {
        b'{' => return None,
        b'[' => "an array",
        b'"' => "a string",
        b't' | b'f' => "a boolean",
        b'n' => "null",
        b'-' | b'0'..=b'9' => "a number",
        _ => return None,
    })
}

/// The field-by-field decoding of a small frame the typed path refused:
/// its error names the field.
fn careful(at: &str, index: u64, kind: &str, bytes: &[u8]) -> Result<(), LiveError> {
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(bytes) else {
        return Ok(());
    };
    Fields { at, index, kind }.message(&obj).map(|_| ())
}

#[derive(Deserialize)]
struct FastEntries {
    t: String,
    first: u64,
    entries: Vec<RawEntry>,
}

/// `[action, device, addr, size, stream, time_us, stack]` as it comes.
type RawEntry = (String, u64, u64, u64, u64, Option<i64>, Option<u64>);

impl FastEntries {
    /// `None` when a value is out of bounds: the slow path says which.
    fn into_message(self) -> Option<Message> {
        let mut entries = Vec::with_capacity(self.entries.len());
        for (action, device, addr, size, stream, time_us, stack) in self.entries {
            if device > MAX_DEVICE || stack.is_some_and(|s| s >= STACK_ID_LIMIT) {
                return None;
            }
            if action.len() > MAX_STRING {
                return None;
            }
            let parsed = Action::parse(&action);
            entries.push(WireEntry {
                action: parsed,
                other: (parsed == Action::Other).then_some(action),
                device: device as u8,
                addr,
                size,
                stream,
                time_us,
                stack: stack.map(|s| s as u32),
            });
        }
        Some(Message::Entries {
            first: self.first,
            entries,
        })
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

mod fields;
mod typed;

use fields::Fields;

#[cfg(test)]
mod tests;
