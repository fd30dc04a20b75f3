//! Connecting to a helper (PROTOCOL.md "Roles and transport", "Handshake").
//! A unix socket must be the user's own (its permissions are the lock, so a
//! socket or directory someone else owns is refused); TCP needs the token
//! the helper printed. A dead address fails at once, not after a wait.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::address::Address;
use super::error::{LiveError, NotOwner};
use super::frame::{write_value, FrameReader};
use super::message::{decode, Message, ServerHello, PROTOCOL};

/// Where `attach` looks for the token when `--token` is not given.
pub const TOKEN_ENV: &str = "VRAMSCOPE_TOKEN";
/// How long a TCP connect may take before the address counts as dead.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the whole handshake may take: from connecting until the
/// helper's hello has been read in full (a helper that sends it a byte a
/// second does not keep `attach` waiting).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a blocked read looks at the stop flag.
const POLL: Duration = Duration::from_millis(200);

/// A connection's writing and reading ends.
type Halves = (Box<dyn Write + Send>, Box<dyn Read + Send>);

/// An attached helper: its hello (frame 0), the frames after it, and the
/// way back to it for requests.
pub struct Connection {
    pub hello: ServerHello,
    pub frames: FrameReader<Box<dyn Read + Send>>,
    pub requests: Requester,
}

/// Writes the client's requests to the helper (PROTOCOL.md "What the client
/// sends"): shared by whatever may ask (the view's key).
#[derive(Clone)]
pub struct Requester(Arc<std::sync::Mutex<Box<dyn Write + Send>>>);

impl Requester {
    pub fn new(w: Box<dyn Write + Send>) -> Requester {
        Requester(Arc::new(std::sync::Mutex::new(w)))
    }

    /// Ask for a walk from the job's Python names to its tensors at its
    /// next step boundary (`find_holders`).
    pub fn find_holders(&self) -> std::io::Result<()> {
        let mut w = self
            .0
            .lock()
            .map_err(|_| std::io::Error::other("the request writer was poisoned"))?;
        write_value(&mut *w, &serde_json::json!({"t": "find_holders"}))?;
        w.flush()
    }
}

impl std::fmt::Debug for Requester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Requester")
    }
}

impl PartialEq for Requester {
    fn eq(&self, other: &Requester) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Requester {}

/// Refuse a socket or directory that another user owns: whoever owns it
/// could be anyone serving anything, and the stream carries this user's
/// code paths. A pure function of the two uids, so it can be tested.
pub fn check_owner(owner: u32, me: u32, what: &str) -> Result<(), NotOwner> {
    if owner == me {
        Ok(())
    } else {
        Err(NotOwner {
            what: what.to_string(),
            owner,
            me,
        })
    }
}

/// Connect to `addr`, say hello with `token`, and read the helper's hello.
/// `stop`: once set, reads end (Ctrl-C, or nobody reading any more).
pub fn connect(
    addr: &Address,
    token: Option<&str>,
    stop: Arc<AtomicBool>,
) -> Result<Connection, LiveError> {
    connect_within(addr, token, stop, HELLO_TIMEOUT)
}

/// [`connect`] with the handshake bounded by `limit` (tests).
pub fn connect_within(
    addr: &Address,
    token: Option<&str>,
    stop: Arc<AtomicBool>,
    limit: Duration,
) -> Result<Connection, LiveError> {
    let at = addr.to_string();
    let handshake = Handshake {
        deadline: Instant::now() + limit,
        done: Arc::new(AtomicBool::new(false)),
        limit,
    };
    let (mut w, r): Halves = match addr {
        Address::Unix(path) => unix(path, &at, &stop, &handshake)?,
        Address::Tcp { host, port } => {
            if token.is_none() {
                return Err(LiveError::NoToken { at });
            }
            tcp(host, *port, &at, &stop, &handshake)?
        }
    };
    let hello = serde_json::json!({
        "t": "hello",
        "protocol": PROTOCOL,
        "token": token,
        "client": concat!("vramscope ", env!("CARGO_PKG_VERSION")),
    });
    write_value(&mut w, &hello)
        .and_then(|()| w.flush())
        .map_err(|e| LiveError::Connect {
            at: at.clone(),
            why: format!("sending the hello: {e}"),
        })?;
    let mut frames = FrameReader::new(r, at.clone());
    let first = frames.next_frame()?;
    let Some((index, bytes)) = first else {
        return Err(LiveError::Connect {
            at,
            why: "the helper closed the connection before saying hello".into(),
        });
    };
    let decoded = decode(&at, index, bytes)?;
    handshake.done.store(true, Ordering::Relaxed);
    match decoded {
        Some(Message::Hello(h)) => Ok(Connection {
            hello: *h,
            frames,
            requests: Requester::new(w),
        }),
        Some(Message::Refused { reason }) => Err(LiveError::Refused { at, reason }),
        _ => Err(LiveError::protocol(
            &at,
            index,
            "?",
            "the first message is not the helper's hello".into(),
        )),
    }
}

#[cfg(unix)]
fn unix(
    path: &Path,
    at: &str,
    stop: &Arc<AtomicBool>,
    handshake: &Handshake,
) -> Result<Halves, LiveError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    use std::os::unix::net::UnixStream;

    let dead = |why: String| LiveError::Connect {
        at: at.to_string(),
        why,
    };
    // The socket where it really is: a link to another user's directory is
    // that directory's socket, checked (and connected to) as such.
    let path = &std::fs::canonicalize(path).map_err(|e| dead(format!("no socket there ({e})")))?;
    let meta = std::fs::metadata(path).map_err(|e| dead(format!("no socket there ({e})")))?;
    if !meta.file_type().is_socket() {
        return Err(dead("not a unix socket".into()));
    }
    let me = my_uid();
    let not_mine = |why| LiveError::NotMine {
        at: at.to_string(),
        why,
    };
    check_owner(meta.uid(), me, "the socket").map_err(not_mine)?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Ok(d) = std::fs::metadata(dir) {
        // A shared directory such as /tmp (sticky, world-writable) is
        // fine: the socket's own owner was checked above.
        let sticky = d.mode() & 0o1000 != 0;
        if !sticky {
            check_owner(d.uid(), me, &format!("its directory {}", dir.display()))
                .map_err(not_mine)?;
        }
    }
    let stream =
        UnixStream::connect(path).map_err(|e| dead(format!("nothing is listening ({e})")))?;
    let _ = stream.set_read_timeout(Some(POLL));
    let _ = stream.set_write_timeout(Some(handshake.limit));
    let reader = stream.try_clone().map_err(|e| dead(e.to_string()))?;
    Ok((
        Box::new(stream),
        Box::new(Stoppable::new(reader, stop.clone(), handshake.clone())),
    ))
}

#[cfg(not(unix))]
fn unix(_: &Path, at: &str, _: &Arc<AtomicBool>, _: &Handshake) -> Result<Halves, LiveError> {
    Err(LiveError::Connect {
        at: at.to_string(),
        why: "unix sockets need a unix system; use HOST:PORT".into(),
    })
}

#[cfg(unix)]
fn my_uid() -> u32 {
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

fn tcp(
    host: &str,
    port: u16,
    at: &str,
    stop: &Arc<AtomicBool>,
    handshake: &Handshake,
) -> Result<Halves, LiveError> {
    let dead = |why: String| LiveError::Connect {
        at: at.to_string(),
        why,
    };
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| dead(format!("cannot resolve {host}: {e}")))?
        .collect();
    let mut last = format!("{host} resolves to no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                let _ = stream.set_read_timeout(Some(POLL));
                let _ = stream.set_write_timeout(Some(handshake.limit));
                let reader = stream.try_clone().map_err(|e| dead(e.to_string()))?;
                return Ok((
                    Box::new(stream),
                    Box::new(Stoppable::new(reader, stop.clone(), handshake.clone())),
                ));
            }
            Err(e) => last = format!("nothing is listening at {a} ({e})"),
        }
    }
    Err(dead(last))
}

/// The handshake's one deadline, and whether it is over (the helper's
/// hello read): until then every read checks the deadline.
#[derive(Clone)]
struct Handshake {
    deadline: Instant,
    done: Arc<AtomicBool>,
    limit: Duration,
}

/// A socket read with a timeout that retries until data comes, the peer
/// closes, or `stop` is set (then it reads as the end of the stream). The
/// whole handshake must be over by its deadline, however the bytes trickle.
struct Stoppable<R> {
    inner: R,
    stop: Arc<AtomicBool>,
    handshake: Handshake,
}

impl<R> Stoppable<R> {
    fn new(inner: R, stop: Arc<AtomicBool>, handshake: Handshake) -> Self {
        Stoppable {
            inner,
            stop,
            handshake,
        }
    }

    fn past_deadline(&self) -> bool {
        !self.handshake.done.load(Ordering::Relaxed) && Instant::now() >= self.handshake.deadline
    }
}

impl<R: Read> Read for Stoppable<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(0);
            }
            if self.past_deadline() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the helper did not complete the handshake within {} s",
                        self.handshake.limit.as_secs_f64()
                    ),
                ));
            }
            match self.inner.read(buf) {
                Ok(n) => return Ok(n),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_my_own_socket_is_accepted() {
        assert!(check_owner(1000, 1000, "the socket").is_ok());
        let err = check_owner(0, 1000, "the socket").expect_err("root's");
        assert_eq!((err.owner, err.me), (0, 1000));
        let said = err.to_string();
        assert!(
            said.contains("uid 0") && said.contains("uid 1000"),
            "{said}"
        );
    }

    #[test]
    fn tcp_without_a_token_fails_before_connecting() {
        // Port 9 of a TEST-NET address: were it tried, it would time out.
        let addr = Address::parse("192.0.2.1:9").expect("addr");
        let t = std::time::Instant::now();
        let err = connect(&addr, None, Arc::default())
            .err()
            .expect("no token");
        assert!(matches!(err, LiveError::NoToken { .. }), "{err}");
        assert!(t.elapsed() < Duration::from_millis(500));
    }

    #[test]
    fn a_missing_socket_fails_at_once() {
        let addr = Address::parse("/nonexistent/vramscope-test.sock").expect("addr");
        let err = connect(&addr, None, Arc::default()).err().expect("dead");
        assert!(err.to_string().contains("no socket there"), "{err}");
    }
}
