//! A running PyTorch job (issue 29, `attach`): its allocator trace, as
//! `python/vramscope_live` serves it (`python/PROTOCOL.md`), or a
//! recording of one.
//!
//! - `address`: ADDRESS parsing and `{rank}` expansion;
//! - `frame`: the length-prefixed JSON framing, bounded before allocating;
//! - `message`: the typed messages, with errors naming message and field;
//! - `connect`: the unix socket (owner checked) or TCP (token) handshake;
//! - `recording`: `VSLIVE1\n` files; `synth`: recordings made from snapshots
//!   and synthetic jobs (tests, benches, `tests/fixtures/live/`);
//! - `session`: the job as received, as a [`crate::trace::snapshot::Snapshot`]
//!   the reports and the leak analysis read unchanged (`facts`: what only a
//!   live job tells, which `report::job` adds for `attach --json`;
//!   `map_diff`: a job's state against the mirrored map);
//! - `nvml_match`: the job's devices against NVML's reading of its process;
//! - `creep`: the job's own memory at each step over the whole attach.
//!
//! The producer that feeds the views is `crate::producers::job`.

pub mod address;
pub mod connect;
pub mod creep;
mod error;
pub mod facts;
pub mod frame;
pub mod holders;
mod map_diff;
pub mod message;
pub mod nvml_match;
pub mod recording;
pub mod session;
pub mod synth;

pub use address::{expand_ranks, Address};
pub use connect::{check_owner, connect, Connection, Requester, TOKEN_ENV};
pub use error::{LiveError, NotOwner};
pub use facts::{DeviceGrowth, LiveFacts};
pub use frame::{write_frame, write_value, FrameReader, MAX_FRAME};
pub use message::{decode, Message, ServerHello};
pub use recording::{open_recording, read_recording, MAGIC};
pub use session::{Applied, Session, ENTRY_CAP};
