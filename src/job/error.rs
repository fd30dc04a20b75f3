//! What can go wrong reading a live stream or a recording. Every error names
//! where: the address or file, and the frame (message) index in the stream.

/// An error reading a live job or a recording.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("{0}")]
    Address(String),
    /// Nothing listens at the address, or the socket file is missing.
    #[error("{at}: cannot connect: {why}")]
    Connect { at: String, why: String },
    /// A recording that cannot be opened as one.
    #[error("{at}: cannot open the recording: {why}")]
    Open { at: String, why: String },
    /// The helper said no.
    #[error("{at}: the helper refused the connection: {reason}")]
    Refused { at: String, reason: String },
    #[error("{at}: TCP needs a token: pass --token TOKEN or set VRAMSCOPE_TOKEN (the helper prints it to the job's log)")]
    NoToken { at: String },
    #[error("{at}: {why}")]
    NotMine { at: String, why: NotOwner },
    #[error("{at}: reading frame {index}: {source}")]
    Io {
        at: String,
        index: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("{at}: frame {index}: length {len} bytes is over the 64 MiB bound (4-byte little-endian length prefix)")]
    FrameTooLong { at: String, index: u64, len: u64 },
    #[error("{at}: frame {index}: the stream ends inside the frame ({got} of {want} bytes)")]
    Truncated {
        at: String,
        index: u64,
        got: u64,
        want: u64,
    },
    #[error("{at}: frame {index}: not a JSON object: {why} (line {line}, column {column})")]
    BadJson {
        at: String,
        index: u64,
        why: String,
        line: usize,
        column: usize,
    },
    /// A known message with a missing or mistyped field.
    #[error("{at}: message {index} (\"{kind}\"): field `{field}`: {problem}")]
    BadField {
        at: String,
        index: u64,
        kind: String,
        field: String,
        problem: String,
    },
    /// A bound of PROTOCOL.md "Bounds a reader keeps", or a broken rule of the log.
    #[error("{at}: message {index} (\"{kind}\"): {problem}")]
    Protocol {
        at: String,
        index: u64,
        kind: String,
        problem: String,
    },
    #[error("{at}: not a vramscope live recording (it does not start with \"VSLIVE1\\n\"){hint}")]
    NotARecording { at: String, hint: String },
}

impl LiveError {
    /// A field error for message `index` of kind `kind` at `at`.
    pub(crate) fn field(at: &str, index: u64, kind: &str, field: &str, problem: String) -> Self {
        LiveError::BadField {
            at: at.to_string(),
            index,
            kind: kind.to_string(),
            field: field.to_string(),
            problem,
        }
    }

    pub(crate) fn protocol(at: &str, index: u64, kind: &str, problem: String) -> Self {
        LiveError::Protocol {
            at: at.to_string(),
            index,
            kind: kind.to_string(),
            problem,
        }
    }
}

/// A socket or its directory that another user owns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} is owned by uid {owner}, not by you (uid {me}): refusing to attach to another user's socket")]
pub struct NotOwner {
    /// `the socket`, `its directory /run/…`.
    pub what: String,
    pub owner: u32,
    pub me: u32,
}
