//! Frame I/O of the handshakes (blocking, with deadlines: they run before any thread may
//! start — a node forks its level-3 tree after its handshake), this crate's tokio runtime
//! (the daemon's accept loop, the sessions' heartbeats and timers, SIGTERM), and bounded
//! address resolution. A session's own socket I/O is `tcp.rs`'s, on plain threads.

use crate::error::NetError;
use crate::wire::{self, FrameType, Header, HEADER_BYTES};
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The tokio runtime of the network node in this process: one worker thread
/// (`strata-net`) for heartbeats, timers and signals, started on first use — after the
/// engine forked its local children.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("strata-net")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start the strata-net runtime thread: {e}"))
    })
}

/// A frame read whole: its header and body bytes.
#[derive(Debug)]
pub struct RawFrame {
    /// The decoded header.
    pub header: Header,
    /// The body (checksum verified).
    pub body: Vec<u8>,
}

/// A blocking frame connection: what the handshake and the start-up frames of a session
/// (NODE_HELLO, READY) run over, whatever the transport — a TCP socket ([`SyncConn`]) or
/// MPI messages to one rank (`mpi_link::MpiConn`, feature `mpi`).
pub trait FrameConn {
    /// The session id stamped on frames sent.
    fn session(&self) -> u64;
    /// Adopts the initiator's session id (the responder learns it from HELLO).
    fn set_session(&mut self, session: u64);
    /// The next sequence number for a frame sent.
    fn next_seq(&mut self) -> u64;
    /// Sends one encoded frame of type `kind` by `deadline`.
    ///
    /// # Errors
    /// The transport failed or the deadline passed.
    fn send_frame(
        &mut self,
        kind: FrameType,
        frame: Vec<u8>,
        deadline: Instant,
    ) -> Result<(), NetError>;
    /// Receives one frame by `deadline`.
    ///
    /// # Errors
    /// The transport failed or closed, the deadline passed, or the frame is malformed.
    fn recv(&mut self, what: &str, deadline: Instant) -> Result<RawFrame, NetError>;

    /// Encodes and sends one frame, by `deadline`.
    ///
    /// # Errors
    /// As [`FrameConn::send_frame`]; the body does not encode.
    fn send<T: Serialize>(
        &mut self,
        kind: FrameType,
        body: &T,
        deadline: Instant,
    ) -> Result<(), NetError>
    where
        Self: Sized,
    {
        let seq = self.next_seq();
        let frame = wire::encode(kind, self.session(), seq, body)?;
        self.send_frame(kind, frame, deadline)
    }
}

impl FrameConn for SyncConn {
    fn session(&self) -> u64 {
        self.session
    }

    fn set_session(&mut self, session: u64) {
        self.session = session;
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn send_frame(
        &mut self,
        kind: FrameType,
        frame: Vec<u8>,
        deadline: Instant,
    ) -> Result<(), NetError> {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        self.stream
            .set_write_timeout(Some(left))
            .map_err(|e| NetError::io("setting a write timeout", e))?;
        self.stream
            .write_all(&frame)
            .map_err(|e| NetError::io(format!("sending {kind:?}"), e))
    }

    fn recv(&mut self, what: &str, deadline: Instant) -> Result<RawFrame, NetError> {
        SyncConn::recv(self, what, deadline)
    }
}

/// A blocking connection used for the handshakes: every read and write has a deadline.
#[derive(Debug)]
pub struct SyncConn {
    /// The socket.
    pub stream: TcpStream,
    /// The session id stamped on frames sent.
    pub session: u64,
    seq: u64,
}

impl SyncConn {
    /// Wraps a connected socket (Nagle off: the protocol's frames are small requests).
    pub fn new(stream: TcpStream, session: u64) -> SyncConn {
        let _ = stream.set_nodelay(true);
        SyncConn {
            stream,
            session,
            seq: 0,
        }
    }

    /// Sends one frame, by `deadline`.
    ///
    /// # Errors
    /// The socket failed or the deadline passed.
    pub fn send<T: Serialize>(
        &mut self,
        kind: FrameType,
        body: &T,
        deadline: Instant,
    ) -> Result<(), NetError> {
        FrameConn::send(self, kind, body, deadline)
    }

    /// Receives one frame by `deadline`.
    ///
    /// # Errors
    /// The socket failed or closed, the deadline passed, or the frame is malformed.
    pub fn recv(&mut self, what: &str, deadline: Instant) -> Result<RawFrame, NetError> {
        let mut raw = [0u8; HEADER_BYTES];
        self.read_exact_by(&mut raw, what, deadline)?;
        let header = wire::decode_header(&raw)?;
        let mut body = vec![0u8; header.length as usize];
        self.read_exact_by(&mut body, what, deadline)?;
        wire::check_body(&raw, &header, &body)?;
        Ok(RawFrame { header, body })
    }

    fn read_exact_by(
        &mut self,
        mut buf: &mut [u8],
        what: &str,
        deadline: Instant,
    ) -> Result<(), NetError> {
        let start = Instant::now();
        while !buf.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NetError::Timeout {
                    what: what.to_owned(),
                    after: deadline.saturating_duration_since(start),
                });
            }
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| NetError::io("setting a read timeout", e))?;
            match self.stream.read(buf) {
                Ok(0) => {
                    return Err(NetError::io(
                        what.to_owned(),
                        std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "the peer closed the connection",
                        ),
                    ))
                }
                Ok(n) => buf = &mut buf[n..],
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NetError::io(what.to_owned(), e)),
            }
        }
        Ok(())
    }
}

/// Resolves `addr` (`host:port`, `[v6]:port`, or a numeric address) within `budget`: a
/// numeric address at once; a host name on a helper thread, so a slow resolver cannot hold
/// the caller past its bound (the thread is left to finish alone if it does).
///
/// # Errors
/// Not `host:port`, no address found, or the resolver did not answer within `budget`.
pub fn resolve(addr: &str, budget: Duration) -> Result<Vec<SocketAddr>, NetError> {
    if let Ok(a) = addr.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    if addr
        .rsplit_once(':')
        .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
    {
        return Err(NetError::Config(format!(
            "address {addr:?} is not HOST:PORT (IPv6: [ADDR]:PORT)"
        )));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = addr.to_owned();
    std::thread::Builder::new()
        .name("strata-resolve".into())
        .spawn(move || {
            let _ = tx.send(owned.to_socket_addrs().map(|i| i.collect::<Vec<_>>()));
        })
        .map_err(|e| NetError::io("starting a resolver thread", e))?;
    match rx.recv_timeout(budget) {
        Ok(Ok(v)) if !v.is_empty() => Ok(v),
        Ok(Ok(_)) => Err(NetError::Config(format!("{addr}: the name has no address"))),
        Ok(Err(e)) => Err(NetError::io(format!("resolving {addr}"), e)),
        Err(_) => Err(NetError::Timeout {
            what: format!("resolving {addr} (check the name, /etc/hosts and DNS)"),
            after: budget,
        }),
    }
}

/// Connects to the first of `addrs` that answers, each attempt bounded by what is left
/// of `deadline`.
///
/// # Errors
/// None answered (the last error, naming the address).
pub fn connect(addrs: &[SocketAddr], deadline: Instant) -> Result<TcpStream, NetError> {
    let mut last = None;
    for a in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(a, left) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(NetError::io(format!("connecting to {a}"), e)),
        }
    }
    Err(last.unwrap_or_else(|| NetError::Timeout {
        what: format!("connecting to {addrs:?}"),
        after: Duration::ZERO,
    }))
}

/// The host name of this machine (for messages).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_addresses_resolve_at_once_v4_and_v6() {
        let v4 = resolve("127.0.0.1:7070", Duration::ZERO).unwrap();
        assert_eq!(v4, vec!["127.0.0.1:7070".parse::<SocketAddr>().unwrap()]);
        let v6 = resolve("[::1]:7070", Duration::ZERO).unwrap();
        assert!(v6[0].is_ipv6() && v6[0].ip().is_loopback() && v6[0].port() == 7070);
    }

    #[test]
    fn localhost_resolves_to_loopback_within_the_bound() {
        let t = Instant::now();
        let v = resolve("localhost:7070", Duration::from_secs(10)).unwrap();
        assert!(t.elapsed() < Duration::from_secs(10));
        assert!(!v.is_empty());
        assert!(
            v.iter().all(|a| a.ip().is_loopback() && a.port() == 7070),
            "{v:?}"
        );
    }

    #[test]
    fn malformed_addresses_are_refused_with_the_expected_form() {
        for bad in [
            "localhost",
            "localhost:",
            ":7070",
            "host:notaport",
            "::1:7070x",
        ] {
            let e = resolve(bad, Duration::from_secs(1)).unwrap_err();
            assert!(
                matches!(e, NetError::Config(_)) && e.to_string().contains("HOST:PORT"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_name_that_does_not_resolve_is_an_error_within_the_bound() {
        // `.invalid` never resolves (RFC 6761); without a reachable resolver the lookup
        // may hang, and the bound cuts it.
        let budget = Duration::from_secs(2);
        let t = Instant::now();
        let e = resolve("strata-no-such-host.invalid:7070", budget).unwrap_err();
        assert!(
            t.elapsed() < budget + Duration::from_secs(1),
            "{:?}",
            t.elapsed()
        );
        assert!(
            matches!(
                e,
                NetError::Io { .. } | NetError::Timeout { .. } | NetError::Config(_)
            ),
            "{e}"
        );
        assert!(e.to_string().contains("strata-no-such-host.invalid"), "{e}");
    }

    #[test]
    fn connect_tries_every_address_in_turn() {
        // Nothing listens on the first (a port just released); the second answers.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = closed.local_addr().unwrap();
        drop(closed);
        let live = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ok = live.local_addr().unwrap();
        let s = connect(&[dead, ok], Instant::now() + Duration::from_secs(10)).unwrap();
        assert_eq!(s.peer_addr().unwrap(), ok);
        let e = connect(&[dead], Instant::now() + Duration::from_secs(10)).unwrap_err();
        assert!(e.to_string().contains(&dead.to_string()), "{e}");
    }
}
