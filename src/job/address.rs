//! ADDRESS as PROTOCOL.md "Roles and transport" lists it: a unix socket
//! (`unix:/p`, `/p`, `./p`) or TCP (`HOST:PORT`, `tcp:HOST:PORT`), with
//! `{rank}` replaced per rank for multi-process jobs.

use std::fmt;
use std::path::PathBuf;

use super::error::LiveError;

/// Where a helper serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
}

/// The placeholder a multi-process job's address carries.
pub const RANK: &str = "{rank}";

impl Address {
    pub fn parse(text: &str) -> Result<Address, LiveError> {
        let bad = |why: &str| LiveError::Address(format!("address {text:?}: {why}"));
        let t = text.trim();
        if t.is_empty() {
            return Err(bad("empty"));
        }
        if let Some(path) = t.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(bad("no socket path after \"unix:\""));
            }
            return Ok(Address::Unix(PathBuf::from(path)));
        }
        if let Some(hp) = t.strip_prefix("tcp:") {
            return tcp(hp).ok_or_else(|| bad("expected tcp:HOST:PORT with PORT in 1..=65535"));
        }
        // A path names a socket; anything with a port after its last colon is TCP.
        if t.starts_with(['/', '.', '~']) || t.contains('/') || !t.contains(':') {
            return Ok(Address::Unix(PathBuf::from(t)));
        }
        tcp(t).ok_or_else(|| bad("expected HOST:PORT with PORT in 1..=65535, or a socket path"))
    }

    pub fn is_tcp(&self) -> bool {
        matches!(self, Address::Tcp { .. })
    }
}

fn tcp(hp: &str) -> Option<Address> {
    let (host, port) = hp.rsplit_once(':')?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| Address::Tcp {
        host: host.to_string(),
        port,
    })
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(p) => write!(f, "{}", p.display()),
            Address::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Address::Tcp { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// `pattern` once per rank with `{rank}` replaced; the pattern alone when it
/// has no `{rank}`.
pub fn expand_ranks(pattern: &str, ranks: &[u32]) -> Vec<String> {
    if !pattern.contains(RANK) {
        return vec![pattern.to_string()];
    }
    ranks
        .iter()
        .map(|r| pattern.replace(RANK, &r.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unix(p: &str) -> Address {
        Address::Unix(PathBuf::from(p))
    }

    fn tcp(h: &str, port: u16) -> Address {
        Address::Tcp {
            host: h.into(),
            port,
        }
    }

    #[test]
    fn every_written_form_of_protocol_md_parses() {
        let cases = [
            ("unix:/run/x.sock", unix("/run/x.sock")),
            ("/run/x.sock", unix("/run/x.sock")),
            ("./x.sock", unix("./x.sock")),
            ("x.sock", unix("x.sock")),
            ("127.0.0.1:7878", tcp("127.0.0.1", 7878)),
            ("localhost:7878", tcp("localhost", 7878)),
            ("tcp:127.0.0.1:7878", tcp("127.0.0.1", 7878)),
            ("10.1.2.3:9000", tcp("10.1.2.3", 9000)),
            ("[::1]:7878", tcp("::1", 7878)),
        ];
        for (text, want) in cases {
            assert_eq!(Address::parse(text).expect(text), want, "{text}");
        }
    }

    #[test]
    fn bad_addresses_say_why() {
        for text in ["", "host:99999", "host:0", "tcp:nohost", "unix:", "h:port"] {
            let err = Address::parse(text).expect_err(text).to_string();
            assert!(err.contains(&format!("{text:?}")), "{err}");
        }
    }

    #[test]
    fn rank_patterns_expand_per_rank() {
        assert_eq!(
            expand_ranks("/tmp/job-{rank}.sock", &[0, 1, 2]),
            ["/tmp/job-0.sock", "/tmp/job-1.sock", "/tmp/job-2.sock"]
        );
        assert_eq!(expand_ranks("127.0.0.1:7878", &[0, 1]), ["127.0.0.1:7878"]);
        assert_eq!(
            Address::parse("[::1]:7878").expect("v6").to_string(),
            "[::1]:7878"
        );
    }
}
