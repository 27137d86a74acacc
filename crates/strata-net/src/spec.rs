//! What a user writes: [`RemoteSpec`] and [`add_remote_worker`] (a node daemon on another
//! host), [`add_launched_workers`] (the other ranks of an `mpirun` / `srun` job started
//! through `strata-node launch`).

use crate::auth::{random_bytes, Secret};
use crate::client::{IntoLink, RemoteEndpoint};
use crate::error::NetError;
use crate::handshake::{expect, initiate, refuse, respond};
use crate::io::{connect, resolve, SyncConn};
use crate::memory::{RemoteLink, RemoteWorker};
use crate::node::{serve, NodeOptions};
use crate::wire::{self, ErrorCode, FrameType, Intro, NodeHello, Ready};
use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use strata_chip::ChipConfig;
use strata_dist::{DistConfig, DistWorker, Endpoint, NodeContext, RemoteChild, RemoteContext};

/// Environment a node daemon sets for the program it starts: the inherited descriptor of
/// the authenticated connection.
pub const ENV_NODE_FD: &str = "STRATA_NODE_FD";
/// … the worker id the process serves.
pub const ENV_NODE_WORKER: &str = "STRATA_NODE_WORKER";
/// … the session id (hex).
pub const ENV_NODE_SESSION: &str = "STRATA_NODE_SESSION";
/// Environment `strata-node launch` sets: this process's rank.
pub const ENV_LAUNCH_RANK: &str = "STRATA_LAUNCH_RANK";
/// … the number of ranks.
pub const ENV_LAUNCH_SIZE: &str = "STRATA_LAUNCH_SIZE";
/// … where rank 0 listens for the others (`host:port`).
pub const ENV_LAUNCH_ROOT: &str = "STRATA_LAUNCH_ROOT";
/// … the job's session secret (hex).
pub const ENV_LAUNCH_SECRET: &str = "STRATA_LAUNCH_SECRET";
/// … the transport of the job's sessions: `tcp` (the default) or `mpi`
/// (`strata-node launch --transport mpi`; needs strata-net's `mpi` feature).
pub const ENV_LAUNCH_TRANSPORT: &str = "STRATA_LAUNCH_TRANSPORT";
/// The secret file a root uses when its spec names none.
pub const ENV_SECRET_FILE: &str = "STRATA_SECRET_FILE";

/// Default bytes of a node's staging area.
pub const DEFAULT_STAGING_BYTES: u64 = 64 << 20;
/// Default silence after which a peer is declared gone.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);

/// Where a remote level-3 worker is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A `strata-node serve` daemon at `host:port`.
    Daemon(String),
    /// Rank `rank` of a launched job.
    Launched(u32),
}

/// A remote level-3 worker: where it is, its shape (chips, sub-workers), and the session's
/// budgets.
///
/// ```no_run
/// use strata_net::{add_remote_worker, RemoteSpec};
/// use strata_dist::{DistConfig, DistWorker};
/// let mut top = DistWorker::new(DistConfig::l4(0))?;
/// let w = add_remote_worker(
///     &mut top,
///     RemoteSpec::new("hostb:7070").chips(2).sub_workers(1).secret_file("/etc/strata/secret"),
/// )?;
/// # Ok::<(), strata_net::NetError>(())
/// ```
#[derive(Clone)]
pub struct RemoteSpec {
    target: Target,
    config: DistConfig,
    staging_bytes: u64,
    heartbeat_timeout: Duration,
    secret_file: Option<PathBuf>,
    secret: Option<Secret>,
    args: Option<Vec<String>>,
}

impl std::fmt::Debug for RemoteSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSpec")
            .field("target", &self.target)
            .field("chips", &self.config.chips.len())
            .field("sub_workers", &self.config.num_sub_workers)
            .finish()
    }
}

impl RemoteSpec {
    /// A worker served by the `strata-node serve` daemon at `addr` (`host:port`,
    /// `[v6]:port`); no chips, no sub-workers yet.
    pub fn new(addr: impl Into<String>) -> RemoteSpec {
        RemoteSpec {
            target: Target::Daemon(addr.into()),
            config: DistConfig::l3(Vec::new(), 0),
            staging_bytes: DEFAULT_STAGING_BYTES,
            heartbeat_timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            secret_file: None,
            secret: None,
            args: None,
        }
    }

    /// A worker of a launched job ([`add_launched_workers`]: the ranks say where).
    pub fn launched() -> RemoteSpec {
        RemoteSpec::new(String::new())
    }

    /// `n` chips with the default configuration.
    pub fn chips(mut self, n: usize) -> Self {
        self.config.chips = vec![ChipConfig::default(); n];
        self
    }

    /// These chips.
    pub fn chip_configs(mut self, chips: Vec<ChipConfig>) -> Self {
        self.config.chips = chips;
        self
    }

    /// `n` host sub-workers.
    pub fn sub_workers(mut self, n: usize) -> Self {
        self.config.num_sub_workers = n;
        self
    }

    /// Changes the rest of the level-3 worker's configuration (timeouts, heap rings, …).
    pub fn configure(mut self, f: impl FnOnce(&mut DistConfig)) -> Self {
        f(&mut self.config);
        self
    }

    /// Bytes of the node's staging area, which holds the shipped tensors of the tasks in
    /// flight (default 64 MiB).
    pub fn staging_bytes(mut self, bytes: u64) -> Self {
        self.staging_bytes = bytes;
        self
    }

    /// How long either end waits without a frame before declaring the other gone
    /// (default 3 s; heartbeats go every 200 ms). A task's own deadline is separate
    /// (`CallConfig::timeout_ms`, `DistConfig::task_timeout`).
    pub fn heartbeat_timeout(mut self, t: Duration) -> Self {
        self.heartbeat_timeout = t;
        self
    }

    /// The file holding the secret shared with the node's daemon (mode 0600).
    pub fn secret_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.secret_file = Some(path.into());
        self
    }

    /// The shared secret itself.
    pub fn secret(mut self, secret: Secret) -> Self {
        self.secret = Some(secret);
        self
    }

    /// The arguments the node starts the program with (default: this process's own,
    /// so the node makes the same registrations).
    pub fn args(mut self, args: Vec<String>) -> Self {
        self.args = Some(args);
        self
    }

    /// The level-3 configuration the node builds its worker from (chips, sub-workers,
    /// timeouts, …).
    pub fn level3_config(&self) -> &DistConfig {
        &self.config
    }

    fn load_secret(&self) -> Result<Secret, NetError> {
        if let Some(s) = &self.secret {
            return Ok(s.clone());
        }
        let path = self
            .secret_file
            .clone()
            .or_else(|| std::env::var_os(ENV_SECRET_FILE).map(PathBuf::from))
            .ok_or_else(|| {
                NetError::Config(format!(
                    "no session secret: give RemoteSpec::secret_file(PATH) or set {ENV_SECRET_FILE}=PATH (the same secret as the node daemon's --secret-file)"
                ))
            })?;
        Secret::from_file(&path)
    }
}

/// Adds a remote level-3 worker as a next-level child of the level-4 worker `top`
/// (before `init`); returns its handle: its worker id ([`RemoteWorker::id`], same
/// counter as `add_worker`) and the device memory of its chips.
///
/// At `top.init()`, the root connects to the daemon, which starts this same program on
/// its host (same build-id, same arguments); that process makes the same registrations,
/// reaches the same `init`, and serves as this worker instead of returning.
///
/// # Errors
/// `top` is not a new level-4 worker; an invalid level-3 configuration.
pub fn add_remote_worker(top: &mut DistWorker, spec: RemoteSpec) -> Result<RemoteWorker, NetError> {
    let node = RemoteNode::new(spec);
    let link = node.link.clone();
    let id = top.add_remote_child(Box::new(node))?;
    Ok(RemoteWorker::new(id, link))
}

/// Adds one remote level-3 worker per other rank of a job launched with
/// `strata-node launch` (under `mpirun`, `srun`, …), each shaped like `spec` (its address
/// is ignored); returns their handles, for ranks 1, 2, … in order. Outside such a job
/// (or with one rank) adds none.
///
/// # Errors
/// As [`add_remote_worker`]; a malformed launch environment.
pub fn add_launched_workers(
    top: &mut DistWorker,
    spec: RemoteSpec,
) -> Result<Vec<RemoteWorker>, NetError> {
    let Some(size) = env_u32(ENV_LAUNCH_SIZE)? else {
        return Ok(Vec::new());
    };
    let mut ids = Vec::new();
    for rank in 1..size {
        let spec = RemoteSpec {
            target: Target::Launched(rank),
            ..spec.clone()
        };
        let node = RemoteNode::new(spec);
        let link = node.link.clone();
        ids.push(RemoteWorker::new(
            top.add_remote_child(Box::new(node))?,
            link,
        ));
    }
    Ok(ids)
}

/// This process's launch rank, if `strata-node launch` started it.
///
/// # Errors
/// A malformed value.
pub fn launch_rank() -> Result<Option<u32>, NetError> {
    env_u32(ENV_LAUNCH_RANK)
}

fn env_u32(name: &str) -> Result<Option<u32>, NetError> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| NetError::Config(format!("{name}={v:?} is not a number"))),
        Err(_) => Ok(None),
    }
}

/// The [`RemoteChild`] strata-net gives the engine.
struct RemoteNode {
    spec: RemoteSpec,
    /// Shared with the user's [`RemoteWorker`]: the session once connected.
    link: Arc<RemoteLink>,
}

impl RemoteNode {
    fn new(spec: RemoteSpec) -> RemoteNode {
        let mut node = RemoteNode {
            spec,
            link: RemoteLink::new(String::new(), 0),
        };
        node.link = RemoteLink::new(node.label(), node.spec.config.chips.len());
        node
    }

    fn options(&self, deadline: Instant) -> NodeOptions {
        NodeOptions {
            staging_bytes: self.spec.staging_bytes,
            heartbeat_timeout: self.spec.heartbeat_timeout,
            deadline,
            chips: self.spec.config.chips.len() as u32,
            sub_workers: self.spec.config.num_sub_workers as u32,
        }
    }

    /// The root's side after the handshake: the node's identity, then READY.
    fn attach<C: IntoLink>(
        &self,
        mut conn: C,
        ctx: &RemoteContext,
        label: String,
    ) -> Result<Box<dyn Endpoint>, NetError> {
        let body = expect(&mut conn, FrameType::NodeHello, "the node's NODE_HELLO (is the program on the node the same, started with the same arguments?)", ctx.deadline)?;
        let hello: NodeHello = wire::decode_body(FrameType::NodeHello, &body)?;
        let ours = crate::identity::own_build_id()?;
        let mismatch = if hello.build_id != ours {
            Some(format!(
                "the node runs a different build of the program (build-id {} on {}, {} here): deploy the same binary on both hosts",
                crate::auth::hex(&hello.build_id),
                hello.host,
                crate::auth::hex(&ours)
            ))
        } else if hello.registry_digest != ctx.registry_digest {
            Some(format!(
                "the program on {} registered different callables (registry digest {} there, {} here): both ends must make the same registrations, so start them with the same arguments",
                hello.host,
                crate::auth::hex(&hello.registry_digest[..8]),
                crate::auth::hex(&ctx.registry_digest[..8])
            ))
        } else if hello.worker_id as usize != ctx.worker_id
            || hello.chips as usize != self.spec.config.chips.len()
            || hello.sub_workers as usize != self.spec.config.num_sub_workers
        {
            Some(format!(
                "the node declared worker {} with {} chips and {} sub-workers; this root expects worker {} with {} and {}: start both with the same arguments",
                hello.worker_id, hello.chips, hello.sub_workers, ctx.worker_id,
                self.spec.config.chips.len(), self.spec.config.num_sub_workers
            ))
        } else {
            None
        };
        if let Some(m) = mismatch {
            refuse(&mut conn, ErrorCode::Program, &m, ctx.deadline);
            return Err(NetError::Program(m));
        }
        let body = expect(
            &mut conn,
            FrameType::Ready,
            "the node's READY (its level-3 worker's startup)",
            ctx.deadline,
        )?;
        let ready: Ready = wire::decode_body(FrameType::Ready, &body)?;
        let label = format!("{label} pid={} host={}", hello.pid, hello.host);
        let session = crate::io::FrameConn::session(&conn);
        let ep = RemoteEndpoint::start(
            conn.into_link(),
            session,
            label,
            ctx.doorbell.clone(),
            ctx.shared.clone(),
            self.spec.heartbeat_timeout,
            ready.staging_bytes,
        )?;
        self.link.connected(&ep.s);
        Ok(Box::new(ep))
    }
}

pub(crate) fn fresh_session() -> Result<u64, NetError> {
    Ok(u64::from_le_bytes(random_bytes::<8>()?).max(1))
}

impl RemoteChild for RemoteNode {
    fn label(&self) -> String {
        match &self.spec.target {
            Target::Daemon(a) => format!("remote_worker level=3 at {a}"),
            Target::Launched(r) => format!("remote_worker level=3 rank={r}"),
        }
    }

    fn node_config(&self) -> DistConfig {
        self.spec.config.clone()
    }

    fn serves_here(&self, worker_id: usize) -> bool {
        match self.spec.target {
            Target::Daemon(_) => {
                std::env::var(ENV_NODE_WORKER)
                    .ok()
                    .and_then(|v| v.parse::<usize>().ok())
                    == Some(worker_id)
                    && std::env::var_os(ENV_NODE_FD).is_some()
            }
            Target::Launched(rank) => matches!(launch_rank(), Ok(Some(r)) if r == rank),
        }
    }

    fn serve(self: Box<Self>, worker: DistWorker, node: NodeContext) -> i32 {
        let deadline = Instant::now()
            + worker
                .config()
                .startup_timeout
                .min(Duration::from_secs(3600));
        if let Target::Launched(_) = &self.spec.target {
            match launch_transport() {
                Ok(Transport::Tcp) => {}
                Ok(Transport::Mpi) => return self.serve_mpi(worker, node, deadline),
                Err(e) => {
                    eprintln!("strata-net: cannot serve worker {}: {e}", node.worker_id);
                    return 2;
                }
            }
        }
        let conn = match &self.spec.target {
            Target::Daemon(_) => node_conn_from_daemon(),
            Target::Launched(_) => node_conn_to_root(node.worker_id, deadline),
        };
        match conn {
            Ok(conn) => serve(conn, worker, node, self.options(deadline)),
            Err(e) => {
                eprintln!("strata-net: cannot serve worker {}: {e}", node.worker_id);
                2
            }
        }
    }

    fn connect(self: Box<Self>, ctx: RemoteContext) -> Result<Box<dyn Endpoint>, String> {
        let label = self.label();
        let r = match &self.spec.target {
            Target::Daemon(addr) => self.connect_daemon(addr, &ctx, label.clone()),
            Target::Launched(rank) => self.accept_launched(*rank, &ctx, label.clone()),
        };
        r.map_err(|e| e.to_string())
    }
}

impl RemoteNode {
    fn connect_daemon(
        &self,
        addr: &str,
        ctx: &RemoteContext,
        label: String,
    ) -> Result<Box<dyn Endpoint>, NetError> {
        let secret = self.spec.load_secret()?;
        let budget = ctx
            .deadline
            .saturating_duration_since(Instant::now())
            .min(Duration::from_secs(10));
        let addrs = resolve(addr, budget)?;
        let stream = connect(&addrs, ctx.deadline)?;
        let mut conn = SyncConn::new(stream, fresh_session()?);
        let args = self
            .spec
            .args
            .clone()
            .unwrap_or_else(|| std::env::args().skip(1).collect());
        let intro = Intro::Open {
            worker_id: ctx.worker_id as u32,
            build_id: crate::identity::own_build_id()?,
            args,
        };
        initiate(&mut conn, &secret, intro, ctx.deadline)?;
        self.attach(conn, ctx, label)
    }

    fn accept_launched(
        &self,
        rank: u32,
        ctx: &RemoteContext,
        label: String,
    ) -> Result<Box<dyn Endpoint>, NetError> {
        if launch_transport()? == Transport::Mpi {
            return self.accept_mpi(rank, ctx, label);
        }
        let conn = LaunchHub::take(ctx.worker_id, ctx.deadline)
            .map_err(|e| NetError::Config(format!("rank {rank}: {e}")))?;
        self.attach(conn, ctx, label)
    }
}

/// How the sessions of a launched job travel ([`ENV_LAUNCH_TRANSPORT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    Tcp,
    Mpi,
}

/// The launched job's transport.
///
/// # Errors
/// An unknown name, or `mpi` in a build without the `mpi` feature.
fn launch_transport() -> Result<Transport, NetError> {
    match std::env::var(ENV_LAUNCH_TRANSPORT).as_deref() {
        Err(_) | Ok("" | "tcp") => Ok(Transport::Tcp),
        Ok("mpi") if cfg!(feature = "mpi") => Ok(Transport::Mpi),
        Ok("mpi") => Err(NetError::Config(format!(
            "{ENV_LAUNCH_TRANSPORT}=mpi, but this program was built without strata-net's `mpi` feature: build it with `--features strata-net/mpi`, or launch with `--transport tcp`"
        ))),
        Ok(other) => Err(NetError::Config(format!(
            "{ENV_LAUNCH_TRANSPORT}={other:?} is not a transport (tcp or mpi)"
        ))),
    }
}

#[cfg(feature = "mpi")]
impl RemoteNode {
    /// Rank 0's side of an MPI session: the handshake with rank `rank` over MPI (it
    /// initiates, as a TCP rank dials), then the same NODE_HELLO / READY checks.
    fn accept_mpi(
        &self,
        rank: u32,
        ctx: &RemoteContext,
        label: String,
    ) -> Result<Box<dyn Endpoint>, NetError> {
        let hub = crate::mpi_link::Hub::get()?;
        check_mpi_world(hub)?;
        let secret = Secret::from_hex(&std::env::var(ENV_LAUNCH_SECRET).unwrap_or_default())?;
        let mut conn = crate::mpi_link::MpiConn::to(rank, 0)?;
        match respond(&mut conn, &secret, ctx.deadline)? {
            Intro::Join { worker_id } if worker_id as usize == ctx.worker_id => {}
            Intro::Join { worker_id } => {
                let m = format!(
                    "MPI rank {rank} serves worker {worker_id}; this root expects worker {} there: start every rank with the same program and arguments",
                    ctx.worker_id
                );
                refuse(&mut conn, ErrorCode::Program, &m, ctx.deadline);
                return Err(NetError::Program(m));
            }
            Intro::Open { .. } => {
                let m = "this is a launched job's root, not a node daemon";
                refuse(&mut conn, ErrorCode::Protocol, m, ctx.deadline);
                return Err(NetError::Protocol(m.into()));
            }
        }
        self.attach(conn, ctx, label)
    }

    /// A launched rank's side over MPI ([`crate::node::serve_mpi`]).
    fn serve_mpi(self: Box<Self>, worker: DistWorker, node: NodeContext, deadline: Instant) -> i32 {
        let secret = match Secret::from_hex(&std::env::var(ENV_LAUNCH_SECRET).unwrap_or_default()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("strata-net: cannot serve worker {}: {e}", node.worker_id);
                return 2;
            }
        };
        crate::node::serve_mpi(worker, node, self.options(deadline), &secret)
    }
}

#[cfg(not(feature = "mpi"))]
impl RemoteNode {
    fn accept_mpi(
        &self,
        _: u32,
        _: &RemoteContext,
        _: String,
    ) -> Result<Box<dyn Endpoint>, NetError> {
        launch_transport().and(Err(NetError::Config(
            "no MPI transport in this build".into(),
        )))
    }

    fn serve_mpi(self: Box<Self>, _: DistWorker, node: NodeContext, _: Instant) -> i32 {
        eprintln!(
            "strata-net: cannot serve worker {}: no MPI transport in this build",
            node.worker_id
        );
        2
    }
}

/// MPI's world is the launcher's: the same number of ranks, this process rank 0's.
#[cfg(feature = "mpi")]
fn check_mpi_world(hub: &crate::mpi_link::Hub) -> Result<(), NetError> {
    let size = env_u32(ENV_LAUNCH_SIZE)?;
    let rank = launch_rank()?;
    if size != Some(hub.size) || rank != Some(hub.rank) {
        return Err(NetError::Config(format!(
            "MPI says rank {} of {}, the launcher rank {rank:?} of {size:?}: start the job as `mpirun -n N strata-node launch --transport mpi -- PROGRAM`",
            hub.rank, hub.size
        )));
    }
    Ok(())
}

/// The authenticated connection a daemon handed this process (descriptor in
/// [`ENV_NODE_FD`]).
fn node_conn_from_daemon() -> Result<SyncConn, NetError> {
    let fd: i32 = std::env::var(ENV_NODE_FD)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| NetError::Config(format!("{ENV_NODE_FD} is not a descriptor number")))?;
    let session = std::env::var(ENV_NODE_SESSION)
        .ok()
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .ok_or_else(|| NetError::Config(format!("{ENV_NODE_SESSION} is not a hex session id")))?;
    // SAFETY: the daemon put the connection's socket at this descriptor (dup2 before
    // exec) and nothing else in this process owns it.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    Ok(SyncConn::new(stream, session))
}

/// A launched node (rank > 0) dials rank 0, retrying until it listens, and proves the
/// job's secret.
fn node_conn_to_root(worker_id: usize, deadline: Instant) -> Result<SyncConn, NetError> {
    let root = std::env::var(ENV_LAUNCH_ROOT)
        .map_err(|_| NetError::Config(format!("{ENV_LAUNCH_ROOT} is not set")))?;
    let secret = Secret::from_hex(&std::env::var(ENV_LAUNCH_SECRET).unwrap_or_default())?;
    let addrs = resolve(&root, Duration::from_secs(10))?;
    let stream = loop {
        match connect(&addrs, deadline) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => return Err(e),
            // Rank 0 may not listen yet.
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let mut conn = SyncConn::new(stream, fresh_session()?);
    initiate(
        &mut conn,
        &secret,
        Intro::Join {
            worker_id: worker_id as u32,
        },
        deadline,
    )?;
    Ok(conn)
}

/// Rank 0's listener for the launched ranks: bound once per process at the launch
/// address's port; each accepted, authenticated connection waits here for the
/// `connect` of the worker it names.
struct LaunchHub {
    listener: TcpListener,
    secret: Secret,
    joined: HashMap<usize, SyncConn>,
}

impl LaunchHub {
    fn get() -> Result<&'static Mutex<LaunchHub>, NetError> {
        static HUB: OnceLock<Result<Mutex<LaunchHub>, String>> = OnceLock::new();
        HUB.get_or_init(|| {
            let root = std::env::var(ENV_LAUNCH_ROOT).map_err(|_| format!("{ENV_LAUNCH_ROOT} is not set: start the job with `strata-node launch -- PROGRAM`"))?;
            let port = root.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).ok_or_else(|| format!("{ENV_LAUNCH_ROOT}={root:?} has no port"))?;
            let secret = Secret::from_hex(&std::env::var(ENV_LAUNCH_SECRET).unwrap_or_default()).map_err(|e| e.to_string())?;
            let listener = TcpListener::bind(("::", port))
                .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
                .map_err(|e| format!("cannot listen on port {port} for the launched ranks: {e} (another job on this host? pass `strata-node launch --port`)"))?;
            listener.set_nonblocking(true).map_err(|e| e.to_string())?;
            Ok(Mutex::new(LaunchHub { listener, secret, joined: HashMap::new() }))
        })
        .as_ref()
        .map_err(|e| NetError::Config(e.clone()))
    }

    /// The connection of worker `worker_id`, accepting (and authenticating) arrivals
    /// until it is among them or `deadline` passes.
    fn take(worker_id: usize, deadline: Instant) -> Result<SyncConn, NetError> {
        let hub = Self::get()?;
        loop {
            {
                let mut h = hub.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(c) = h.joined.remove(&worker_id) {
                    return Ok(c);
                }
                match h.listener.accept() {
                    Ok((stream, _)) => {
                        let _ = stream.set_nonblocking(false);
                        let mut conn = SyncConn::new(stream, 0);
                        let shake = Instant::now() + Duration::from_secs(5);
                        match respond(&mut conn, &h.secret, shake.min(deadline)) {
                            Ok(Intro::Join { worker_id: w }) => {
                                h.joined.insert(w as usize, conn);
                            }
                            Ok(Intro::Open { .. }) => {
                                refuse(
                                    &mut conn,
                                    ErrorCode::Protocol,
                                    "this is a launched job's root, not a node daemon",
                                    shake,
                                );
                            }
                            Err(e) => {
                                eprintln!("strata-net: a launched rank failed the handshake: {e}")
                            }
                        }
                        continue;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(NetError::io("accepting a launched rank", e)),
                }
            }
            if Instant::now() >= deadline {
                return Err(NetError::Timeout {
                    what: format!("worker {worker_id}'s rank to join (did every rank start, with the same program?)"),
                    after: Duration::ZERO,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
