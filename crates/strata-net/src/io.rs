//! Frame I/O: blocking (the handshakes, which run before any thread may start — a node
//! forks its level-3 tree after its handshake) and async (the sessions, on the tokio
//! runtime of this crate), plus the runtime itself and bounded address resolution.

use crate::error::NetError;
use crate::wire::{self, FrameType, Header, HEADER_BYTES};
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The tokio runtime of the network node in this process: one worker thread
/// (`strata-net`), started on first use — after the engine forked its local children.
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
        self.seq += 1;
        let frame = wire::encode(kind, self.session, self.seq, body)?;
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

/// Reads one frame from an async reader (no deadline: session liveness is the
/// heartbeat's job), into `body` (reused).
///
/// # Errors
/// The socket failed or closed, or the frame is malformed.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    body: &mut Vec<u8>,
) -> Result<Header, NetError> {
    let mut raw = [0u8; HEADER_BYTES];
    r.read_exact(&mut raw)
        .await
        .map_err(|e| NetError::io("reading a frame header", e))?;
    let header = wire::decode_header(&raw)?;
    body.clear();
    body.resize(header.length as usize, 0);
    r.read_exact(body)
        .await
        .map_err(|e| NetError::io("reading a frame body", e))?;
    wire::check_body(&raw, &header, body)?;
    Ok(header)
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
