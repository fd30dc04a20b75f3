//! Decoding a frame straight into the message types, never through a
//! generic JSON tree: a 64 MiB frame of `[0,0,0,…]` cost about 1 GB as a
//! `serde_json::Value` (issue 40). Every collection is bounded as it is
//! read (PROTOCOL.md "Bounds a reader keeps"), unknown fields and unknown
//! message types are skipped without being kept, and strings are checked
//! against the 64 KiB bound before they are copied.
//!
//! A frame this path refuses is decoded again field by field (`fields.rs`)
//! for an error that names the field, when it is small enough that a tree
//! of it costs little; a larger one gets this path's error.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{
    DeviceStats, HelloDevice, LostMark, Message, OomMark, ServerHello, StateHeader, StateReason,
    StepMark, WireBlock, WireFrame, WireSegment, MAX_DEVICE, MAX_STACK_FRAMES, MAX_STRING,
    STACK_ID_LIMIT,
};
use crate::alloc::BlockState;
use crate::device::PciAddress;
use crate::trace::snapshot::PoolKind;

/// Keys in one `stats` message: `memory_stats()` has about 130.
pub const MAX_STATS_KEYS: usize = 1024;
/// Bytes of one stats key: `memory_stats()`'s longest is under 50.
pub const MAX_STATS_KEY: usize = 256;
/// Items of the hello's `argv`.
pub const MAX_ARGV: usize = 4096;
/// Entries of the hello's `allocator_settings`.
pub const MAX_SETTINGS: usize = 256;
/// Devices one hello lists (their numbers are 0..=255).
const MAX_DEVICES: usize = 256;

/// The message's type, read without keeping anything else of the frame.
pub(super) enum Tag {
    Missing,
    Str(String),
    /// `t` is not a string: what it is ("a number", "an array", …).
    Other(&'static str),
}

/// Read `t` alone.
pub(super) fn tag(bytes: &[u8]) -> Result<Tag, serde_json::Error> {
    #[derive(Deserialize)]
    struct OnlyT {
        t: Option<TagValue>,
    }
    let only: OnlyT = serde_json::from_slice(bytes)?;
    Ok(match only.t {
        None => Tag::Missing,
        Some(TagValue(Ok(s))) => Tag::Str(s),
        Some(TagValue(Err(kind))) => Tag::Other(kind),
    })
}

struct TagValue(Result<String, &'static str>);

impl<'de> Deserialize<'de> for TagValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TagValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("the message type")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<TagValue, E> {
                Ok(TagValue(if s.len() > MAX_STRING {
                    Err("a string over the 64 KiB bound")
                } else {
                    Ok(s.to_string())
                }))
            }
            fn visit_bool<E>(self, _: bool) -> Result<TagValue, E> {
                Ok(TagValue(Err("a boolean")))
            }
            fn visit_i64<E>(self, _: i64) -> Result<TagValue, E> {
                Ok(TagValue(Err("a number")))
            }
            fn visit_u64<E>(self, _: u64) -> Result<TagValue, E> {
                Ok(TagValue(Err("a number")))
            }
            fn visit_f64<E>(self, _: f64) -> Result<TagValue, E> {
                Ok(TagValue(Err("a number")))
            }
            fn visit_unit<E>(self) -> Result<TagValue, E> {
                Ok(TagValue(Err("null")))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<TagValue, A::Error> {
                while a.next_element::<IgnoredAny>()?.is_some() {}
                Ok(TagValue(Err("an array")))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<TagValue, A::Error> {
                while a.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(TagValue(Err("an object")))
            }
        }
        d.deserialize_any(V)
    }
}

/// A string within the 64 KiB bound, checked before it is copied.
struct Str(String);

impl<'de> Deserialize<'de> for Str {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Str;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Str, E> {
                if s.len() > MAX_STRING {
                    return Err(E::custom(format!(
                        "a string of {} bytes is over the 64 KiB bound",
                        s.len()
                    )));
                }
                Ok(Str(s.to_string()))
            }
        }
        d.deserialize_str(V)
    }
}

/// At most `N` items, refused as soon as one more comes.
struct Bounded<T, const N: usize>(Vec<T>);

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for Bounded<T, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T, const N: usize>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for V<T, N> {
            type Value = Bounded<T, N>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "an array of at most {N} items")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    if v.len() == N {
                        return Err(de::Error::custom(format!(
                            "more than {N} items, over the bound"
                        )));
                    }
                    v.push(x);
                }
                Ok(Bounded(v))
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }
}

/// A device number, 0..=255.
struct Dev(u8);

impl<'de> Deserialize<'de> for Dev {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        if n > MAX_DEVICE {
            return Err(de::Error::custom(format!("device {n} is outside 0..=255")));
        }
        Ok(Dev(n as u8))
    }
}

/// A stack id below 2^24, or null.
struct StackId(Option<u32>);

impl<'de> Deserialize<'de> for StackId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Option::<u64>::deserialize(d)? {
            Some(id) if id >= STACK_ID_LIMIT => Err(de::Error::custom(format!(
                "stack id {id} is not below 2^24"
            ))),
            id => Ok(StackId(id.map(|i| i as u32))),
        }
    }
}

/// `memory_stats()`: at most [`MAX_STATS_KEYS`] integer values.
struct StatsMap(Vec<(String, i64)>);

impl<'de> Deserialize<'de> for StatsMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StatsMap;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of integers")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<StatsMap, A::Error> {
                let mut v = Vec::new();
                while let Some((Str(k), n)) = a.next_entry::<Str, i64>()? {
                    if k.len() > MAX_STATS_KEY {
                        return Err(de::Error::custom(format!(
                            "a stats key of {} bytes, over the {MAX_STATS_KEY}-byte bound",
                            k.len()
                        )));
                    }
                    if v.len() == MAX_STATS_KEYS {
                        return Err(de::Error::custom(format!(
                            "more than {MAX_STATS_KEYS} stats keys, over the bound"
                        )));
                    }
                    v.push((k, n));
                }
                Ok(StatsMap(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// `allocator_settings`: strings, or another JSON value kept as its text.
struct Settings(Vec<(String, String)>);

impl<'de> Deserialize<'de> for Settings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Settings;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Settings, A::Error> {
                let mut v = Vec::new();
                while let Some((Str(k), raw)) = a.next_entry::<Str, &'de RawValue>()? {
                    if v.len() == MAX_SETTINGS {
                        return Err(de::Error::custom(format!(
                            "more than {MAX_SETTINGS} allocator settings, over the bound"
                        )));
                    }
                    let text = raw.get();
                    let value = match serde_json::from_str::<Str>(text) {
                        Ok(Str(s)) => s,
                        Err(_) if text.len() <= MAX_STRING => text.to_string(),
                        Err(_) => {
                            return Err(de::Error::custom(format!(
                            "allocator_settings.{k}: a value of {} bytes is over the 64 KiB bound",
                            text.len()
                        )))
                        }
                    };
                    v.push((k, value));
                }
                Ok(Settings(v))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Deserialize)]
struct HelloT {
    protocol: u64,
    pid: u64,
    rank: Option<u64>,
    world_size: Option<u64>,
    hostname: Option<Str>,
    argv: Option<Bounded<Str, MAX_ARGV>>,
    torch: Option<Str>,
    mode: Str,
    stacks: Option<bool>,
    devices: Bounded<DeviceT, MAX_DEVICES>,
    allocator_settings: Option<Settings>,
    started_us: Option<i64>,
    poll_interval_s: Option<f64>,
}

#[derive(Deserialize)]
struct DeviceT {
    device: Dev,
    name: Option<Str>,
    total_memory: Option<u64>,
    pci_bus_id: Option<Str>,
    uuid: Option<Str>,
}

#[derive(Deserialize)]
struct Reason {
    reason: Str,
}

#[derive(Deserialize)]
struct StateT {
    seq: u64,
    reason: Str,
    chunks: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum SegmentType {
    Small,
    Large,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum StateT2 {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
}

#[derive(Deserialize)]
struct SegmentsT {
    segments: Vec<SegmentT>,
}

#[derive(Deserialize)]
struct SegmentT {
    device: Dev,
    address: u64,
    total_size: u64,
    stream: u64,
    segment_type: SegmentType,
    segment_pool_id: Option<(i64, i64)>,
    is_expandable: bool,
    blocks: Vec<BlockT>,
}

#[derive(Deserialize)]
struct BlockT {
    address: u64,
    size: u64,
    requested_size: Option<u64>,
    state: StateT2,
    #[serde(default)]
    stack: Option<StackId>,
}

#[derive(Deserialize)]
struct StackT {
    id: u64,
    frames: Bounded<(Str, i64, Str), MAX_STACK_FRAMES>,
}

#[derive(Deserialize)]
struct StepT {
    step: u64,
    seq: u64,
    time_us: Option<i64>,
    source: Str,
}

#[derive(Deserialize)]
struct StatsT {
    device: Dev,
    seq: u64,
    stats: StatsMap,
}

#[derive(Deserialize)]
struct OomT {
    device: Dev,
    seq: u64,
    message: Str,
    device_free: Option<u64>,
    device_total: Option<u64>,
    alloc_size: Option<u64>,
}

#[derive(Deserialize)]
struct OomMessageT {
    seq: u64,
    device: Option<Dev>,
    message: Str,
}

#[derive(Deserialize)]
struct LostT {
    seq: u64,
    count: Option<u64>,
    why: Option<Str>,
}

#[derive(Deserialize)]
struct ByeT {
    reason: Option<Str>,
}

/// Why the typed path refused a frame: serde's words, or a check made
/// after the fields were read (`field`, problem).
pub(super) enum Refusal {
    Json(serde_json::Error),
    Field(String, String),
    Bound(String),
}

impl From<serde_json::Error> for Refusal {
    fn from(e: serde_json::Error) -> Self {
        Refusal::Json(e)
    }
}

/// Message `kind` from `bytes`; `None` for a type this reader does not know.
pub(super) fn message(kind: &str, bytes: &[u8]) -> Result<Option<Message>, Refusal> {
    Ok(Some(match kind {
        "hello" => Message::Hello(Box::new(hello(from(bytes)?)?)),
        "refused" => Message::Refused {
            reason: from::<Reason>(bytes)?.reason.0,
        },
        "state" => {
            let s: StateT = from(bytes)?;
            Message::State(StateHeader {
                seq: s.seq,
                reason: StateReason::parse(&s.reason.0),
                chunks: s.chunks,
            })
        }
        "segments" => Message::Segments(
            from::<SegmentsT>(bytes)?
                .segments
                .into_iter()
                .map(segment)
                .collect(),
        ),
        "stack" => {
            let s: StackT = from(bytes)?;
            if s.id >= STACK_ID_LIMIT {
                return Err(Refusal::Bound(format!(
                    "`id`: stack id {} is not below 2^24",
                    s.id
                )));
            }
            Message::Stack {
                id: s.id as u32,
                frames: s
                    .frames
                    .0
                    .into_iter()
                    .map(|(file, line, name)| WireFrame {
                        filename: file.0,
                        line,
                        name: name.0,
                    })
                    .collect(),
            }
        }
        "entries" => from::<super::FastEntries>(bytes)?
            .into_message()
            .ok_or_else(|| {
                Refusal::Bound("an entry's device or stack id is out of bounds".into())
            })?,
        "step" => {
            let s: StepT = from(bytes)?;
            Message::Step(StepMark {
                step: s.step,
                seq: s.seq,
                time_us: s.time_us,
                source: s.source.0,
            })
        }
        "stats" => {
            let s: StatsT = from(bytes)?;
            Message::Stats(DeviceStats {
                device: s.device.0,
                seq: s.seq,
                stats: s.stats.0,
            })
        }
        "oom" => {
            let o: OomT = from(bytes)?;
            Message::Oom(OomMark {
                device: o.device.0,
                seq: o.seq,
                message: o.message.0,
                device_free: o.device_free,
                device_total: o.device_total,
                alloc_size: o.alloc_size,
                pytorch_message: None,
            })
        }
        "oom_message" => {
            let o: OomMessageT = from(bytes)?;
            Message::OomMessage {
                seq: o.seq,
                device: o.device.map(|d| d.0),
                message: o.message.0,
            }
        }
        "lost" => {
            let l: LostT = from(bytes)?;
            Message::Lost(LostMark {
                seq: l.seq,
                count: l.count,
                why: l
                    .why
                    .map_or_else(|| "the helper did not say why".into(), |w| w.0),
            })
        }
        "bye" => Message::Bye {
            reason: from::<ByeT>(bytes)?.reason.map(|r| r.0),
        },
        _ => return Ok(None),
    }))
}

fn from<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(bytes)
}

fn hello(h: HelloT) -> Result<ServerHello, Refusal> {
    if h.protocol != super::PROTOCOL {
        return Err(Refusal::Bound(format!(
            "protocol {} is not supported; this vramscope speaks {}",
            h.protocol,
            super::PROTOCOL
        )));
    }
    let mut devices = Vec::with_capacity(h.devices.0.len());
    for (i, d) in h.devices.0.into_iter().enumerate() {
        let pci_bus_id = match d.pci_bus_id {
            None => None,
            Some(Str(text)) => Some(PciAddress::parse(&text).ok_or_else(|| {
                Refusal::Field(
                    format!("devices[{i}].pci_bus_id"),
                    format!("{text:?} is not a PCI bus id (DOMAIN:BUS:DEVICE.FUNCTION in hex)"),
                )
            })?),
        };
        devices.push(HelloDevice {
            device: d.device.0,
            name: d.name.map(|s| s.0),
            total_memory: d.total_memory,
            pci_bus_id,
            uuid: d.uuid.map(|s| s.0),
        });
    }
    Ok(ServerHello {
        protocol: h.protocol,
        pid: h.pid,
        rank: h.rank,
        world_size: h.world_size,
        hostname: h.hostname.map(|s| s.0),
        argv: h
            .argv
            .map_or_else(Vec::new, |a| a.0.into_iter().map(|s| s.0).collect()),
        torch: h.torch.map(|s| s.0),
        mode: h.mode.0,
        stacks: h.stacks.unwrap_or(false),
        devices,
        allocator_settings: h.allocator_settings.map_or_else(Vec::new, |s| s.0),
        started_us: h.started_us,
        poll_interval_s: h.poll_interval_s,
    })
}

fn segment(s: SegmentT) -> WireSegment {
    WireSegment {
        device: s.device.0,
        address: s.address,
        total_size: s.total_size,
        stream: s.stream,
        segment_type: match s.segment_type {
            SegmentType::Small => PoolKind::Small,
            SegmentType::Large => PoolKind::Large,
        },
        pool_id: s.segment_pool_id.unwrap_or((0, 0)),
        is_expandable: s.is_expandable,
        blocks: s
            .blocks
            .into_iter()
            .map(|b| WireBlock {
                address: b.address,
                size: b.size,
                requested_size: b.requested_size.unwrap_or(b.size),
                state: match b.state {
                    StateT2::ActiveAllocated => BlockState::ActiveAllocated,
                    StateT2::ActivePendingFree => BlockState::ActivePendingFree,
                    StateT2::Inactive => BlockState::Inactive,
                },
                stack: b.stack.and_then(|s| s.0),
            })
            .collect(),
    }
}
