//! The node's side of a session: a process of the user's program started to serve as
//! remote level-3 worker `k` (by the daemon, or by `strata-node launch`) reaches the
//! level-4 worker's `init`, which hands it here ([`strata_dist::RemoteChild::serve`]).
//!
//! Order (fork safety is the point): the handshake's last steps on a blocking socket,
//! the staging area leased, the level-3 worker `init`ed — it forks its chips and
//! sub-workers while this process still has one thread —, only then the session's
//! threads. The main thread runs the tasks one after the other (as a local level-3 child
//! serves its frames in turn) and, over TCP, reads the socket itself whenever it has no
//! job ([`ReadRole`]); a helper thread reads while a job runs long (liveness, the next
//! task's inputs, landed in the staging area while the previous task runs), the writer
//! thread streams outputs, the tokio runtime's thread sends heartbeats.

use crate::client::{IntoLink, Lane, Link, Out, Tx, CANCELLED, HEARTBEAT_INTERVAL};
use crate::error::NetError;
#[cfg(feature = "mpi")]
use crate::io::FrameConn;
use crate::io::{hostname, runtime};
use crate::tcp::{DataError, Incoming, Payload};
use crate::wire::{
    self, clip_message, Cancel, Control, ControlAnswer, Data, Done, ErrorBody, ErrorCode,
    FrameType, NodeHello, Ready, Segment, ShutdownAck, Task, MAX_TRACE_BYTES,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use strata_dist::{
    CopyDirection, DeviceTensor, DistError, DistWorker, HostOrchHandle, NodeContext,
};
use strata_host::SharedMemory;
use strata_mailbox::codes;
use strata_sync::{OwnerFirst, OwnerTurn};
use strata_types::wire::{decode_args, decode_config, CALL_CONFIG_WIRE_BYTES};
use strata_types::{
    ArgLimits, BufferDesc, BufferIdentity, BufferLocation, CallableId, DataType, IdentityMinter,
    TaskArgs, TensorArg, TensorView,
};

/// How a node serves: its staging area, liveness budget and startup deadline.
#[derive(Debug, Clone)]
pub(crate) struct NodeOptions {
    pub(crate) staging_bytes: u64,
    pub(crate) heartbeat_timeout: Duration,
    pub(crate) deadline: Instant,
    pub(crate) chips: u32,
    pub(crate) sub_workers: u32,
}

/// The staging area: one shared-memory region leased before the level-3 worker's `init`
/// (so its forked children map it), carved first-fit for each task's shipped tensors.
struct Staging {
    region: u64,
    free: Mutex<Vec<(u64, u64)>>,
}

/// Staging allocations are aligned to a cache line (and so to every element size).
const STAGING_ALIGN: u64 = 64;

impl Staging {
    fn alloc(&self, n: u64) -> Option<u64> {
        // Lengths come from the root's frames: no overflow whatever they say.
        let n = n.max(1).checked_next_multiple_of(STAGING_ALIGN)?;
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let i = free.iter().position(|&(_, len)| len >= n)?;
        let (at, len) = free[i];
        if len == n {
            free.remove(i);
        } else {
            free[i] = (at + n, len - n);
        }
        Some(at)
    }

    fn release(&self, at: u64, n: u64) {
        // Only lengths `alloc` accepted come here, so this does not overflow.
        let n = n.max(1).div_ceil(STAGING_ALIGN) * STAGING_ALIGN;
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let i = free.partition_point(|&(o, _)| o < at);
        free.insert(i, (at, n));
        // Coalesce with the neighbours.
        if i + 1 < free.len() && free[i].0 + free[i].1 == free[i + 1].0 {
            free[i].1 += free[i + 1].1;
            free.remove(i + 1);
        }
        if i > 0 && free[i - 1].0 + free[i - 1].1 == free[i].0 {
            free[i - 1].1 += free[i].1;
            free.remove(i);
        }
    }
}

/// What the reader hands the main thread.
enum Job {
    Task {
        seq: u64,
        task: Task,
        places: Vec<u64>,
        /// When its TASK frame arrived (ns, this host's `CLOCK_MONOTONIC`).
        received_ns: u64,
    },
    /// The task failed before it could run (e.g. it does not fit the staging area).
    Refused {
        seq: u64,
        why: String,
    },
    /// A device-memory request; a copy-to's bytes are at `place` in the staging area.
    Control {
        seq: u64,
        control: Control,
        place: Option<u64>,
    },
    Shutdown,
    Abort(String),
    /// A no-op: the helper gave the socket back while the main thread may have waited
    /// for a job; it takes another turn (and reads the socket itself).
    Reread,
}

/// A copy-to request whose bytes are still arriving.
struct ControlLanding {
    control: Control,
    /// Where its bytes land (`None`: they did not fit; they are swallowed and the request
    /// is refused).
    place: Option<u64>,
    /// Bytes that arrived so far (they come in order).
    have: u64,
    len: u64,
}

/// The chip tensors this session allocated for its root: handle → (chip, tensor). The
/// root names them by handle (in CONTROL frames, and as the device address of a task's
/// tensor argument); handles are never reused within a session.
#[derive(Default)]
struct DeviceTable {
    next: u64,
    live: HashMap<u64, (usize, DeviceTensor)>,
}

/// A task whose inputs are still arriving.
struct Landing {
    task: Task,
    places: Vec<u64>,
    remaining: u64,
    received_ns: u64,
}

struct NodeShared {
    session: u64,
    staging: Staging,
    shared: Arc<SharedMemory>,
    /// The writer's lanes (and direct writes).
    tx: Tx,
    jobs: std_mpsc::Sender<Job>,
    cancelled: Mutex<HashSet<u64>>,
    last_rx: AtomicU64,
    epoch: Instant,
    /// The session is over (the root is gone, silent, or the daemon drains): the main
    /// thread runs no further task.
    aborted: AtomicBool,
    /// The main thread left its loop (it closes the level-3 worker now).
    ending: AtomicBool,
    /// How long a task still running when the session ended may take to finish before
    /// the process ends itself (the heartbeat timeout).
    grace: Duration,
    /// Jobs handed to the main thread so far.
    handed: AtomicU64,
    /// Over TCP: who reads the socket ([`ReadRole`]).
    role: Option<ReadRole>,
}

impl NodeShared {
    /// Hands `job` to the main thread.
    fn hand(&self, job: Job) {
        self.handed.fetch_add(1, Ordering::SeqCst);
        let _ = self.jobs.send(job);
    }

    /// Ends the session: no further task runs. The task running now (if any) gets
    /// `grace` to finish, then the process ends at once — nobody waits for its result,
    /// and the daemon reaps the process group (its children also have the parent-death
    /// signal).
    fn abort(self: &Arc<Self>, why: String) {
        self.aborted.store(true, Ordering::Release);
        self.hand(Job::Abort(why));
        if let Some(role) = &self.role {
            role.stop_reading();
        }
        let ns = self.clone();
        runtime().spawn(async move {
            tokio::time::sleep(ns.grace).await;
            if !ns.ending.load(Ordering::Acquire) {
                eprintln!(
                    "strata-node: the session ended while a task ran, and it did not finish within {:?}; exiting",
                    ns.grace
                );
                // SAFETY: ends this process at once; nothing of it is needed any more.
                unsafe { libc::_exit(3) };
            }
        });
    }

    fn send(&self, lane: Lane, kind: FrameType, seq: u64, body: &impl serde::Serialize) {
        if let Ok(f) = wire::encode(kind, self.session, seq, body) {
            let _ = self.tx.send(lane, Out::Frame(f));
        }
    }
}

fn node_hello(node: &NodeContext, opts: &NodeOptions) -> NodeHello {
    NodeHello {
        worker_id: node.worker_id as u32,
        build_id: crate::identity::own_build_id().unwrap_or_default(),
        registry_digest: node.registry_digest,
        chips: opts.chips,
        sub_workers: opts.sub_workers,
        pid: std::process::id(),
        host: hostname(),
    }
}

/// Serves the session on `conn` (authenticated) as remote level-3 worker `node.worker_id`
/// with `worker`; returns the process's exit status (0 after an acknowledged shutdown).
pub(crate) fn serve<C: IntoLink>(
    mut conn: C,
    mut worker: DistWorker,
    node: NodeContext,
    opts: NodeOptions,
) -> i32 {
    let hello = node_hello(&node, &opts);
    if let Err(e) = conn.send(FrameType::NodeHello, &hello, opts.deadline) {
        eprintln!("strata-node: worker {}: {e}", node.worker_id);
        return 1;
    }
    // The staging area exists before the level-3 worker forks its children.
    let shared = SharedMemory::process().clone();
    let lease = match shared.lease_region(opts.staging_bytes as usize, "strata-net staging") {
        Ok(l) => l,
        Err(e) => {
            crate::handshake::refuse(
                &mut conn,
                ErrorCode::Startup,
                &format!("cannot create the staging area: {e}"),
                opts.deadline,
            );
            return 1;
        }
    };
    if let Err(e) = worker.init() {
        let msg = format!("the level-3 worker failed to start on {}: {e}", hostname());
        crate::handshake::refuse(&mut conn, ErrorCode::Startup, &msg, opts.deadline);
        return 1;
    }
    if let Err(e) = conn.send(
        FrameType::Ready,
        &Ready {
            staging_bytes: opts.staging_bytes,
        },
        opts.deadline,
    ) {
        eprintln!("strata-node: worker {}: {e}", node.worker_id);
        let _ = worker.close();
        return 1;
    }
    let session = conn.session();
    let status = run_session(
        conn.into_link(),
        session,
        &mut worker,
        &shared,
        lease.id(),
        opts,
    );
    drop(lease);
    status
}

/// Serves as remote level-3 worker `node.worker_id` over MPI: the same steps as
/// [`serve`], in the order MPI needs — the staging area and the level-3 worker's `init`
/// (its forks) first, while this process has one thread, and only then MPI (whose
/// library starts threads of its own), the handshake with rank 0, NODE_HELLO and READY.
/// A startup failure is still reported to the root (ERROR(Startup)).
#[cfg(feature = "mpi")]
pub(crate) fn serve_mpi(
    mut worker: DistWorker,
    node: NodeContext,
    opts: NodeOptions,
    secret: &crate::auth::Secret,
) -> i32 {
    let shared = SharedMemory::process().clone();
    let lease = shared.lease_region(opts.staging_bytes as usize, "strata-net staging");
    let started = match &lease {
        Ok(_) => worker
            .init()
            .map_err(|e| format!("the level-3 worker failed to start on {}: {e}", hostname())),
        Err(e) => Err(format!("cannot create the staging area: {e}")),
    };
    let conn = crate::mpi_link::MpiConn::to(0, crate::spec::fresh_session().unwrap_or(1)).and_then(
        |mut c| {
            crate::handshake::initiate(
                &mut c,
                secret,
                wire::Intro::Join {
                    worker_id: node.worker_id as u32,
                },
                opts.deadline,
            )?;
            Ok(c)
        },
    );
    let mut conn = match conn {
        Ok(c) => c,
        Err(e) => {
            eprintln!("strata-node: worker {} (MPI): {e}", node.worker_id);
            if started.is_ok() {
                let _ = worker.close();
            }
            return 2;
        }
    };
    let hello = node_hello(&node, &opts);
    let ended = |conn: &crate::mpi_link::MpiConn, worker: &mut DistWorker, status: i32| {
        conn.peer.flush(Instant::now() + Duration::from_secs(5));
        conn.peer.cut();
        let _ = worker.close();
        status
    };
    if let Err(e) = conn.send(FrameType::NodeHello, &hello, opts.deadline) {
        eprintln!("strata-node: worker {}: {e}", node.worker_id);
        return ended(&conn, &mut worker, 1);
    }
    let (lease, ()) = match (lease, started) {
        (Ok(l), Ok(())) => (l, ()),
        (_, Err(msg)) => {
            crate::handshake::refuse(&mut conn, ErrorCode::Startup, &msg, opts.deadline);
            return ended(&conn, &mut worker, 1);
        }
        (Err(e), Ok(())) => {
            let msg = format!("cannot create the staging area: {e}");
            crate::handshake::refuse(&mut conn, ErrorCode::Startup, &msg, opts.deadline);
            return ended(&conn, &mut worker, 1);
        }
    };
    if let Err(e) = conn.send(
        FrameType::Ready,
        &Ready {
            staging_bytes: opts.staging_bytes,
        },
        opts.deadline,
    ) {
        eprintln!("strata-node: worker {}: {e}", node.worker_id);
        return ended(&conn, &mut worker, 1);
    }
    let session = conn.session();
    let status = run_session(
        conn.into_link(),
        session,
        &mut worker,
        &shared,
        lease.id(),
        opts,
    );
    drop(lease);
    status
}

fn run_session(
    link: Link,
    session: u64,
    worker: &mut DistWorker,
    shared: &Arc<SharedMemory>,
    region: u64,
    opts: NodeOptions,
) -> i32 {
    let (jobs_tx, jobs_rx) = std_mpsc::channel();
    // The writer's error ends the session; it holds the session weakly (a strong
    // reference would keep the lanes open, and the writer waiting, for good).
    let died = Arc::new(std::sync::OnceLock::<std::sync::Weak<NodeShared>>::new());
    let (tx, tcp) = match link {
        Link::Tcp(stream) => {
            let on_error = {
                let died = died.clone();
                move |e: std::io::Error| {
                    if let Some(ns) = died.get().and_then(std::sync::Weak::upgrade) {
                        ns.abort(format!("sending to the root failed: {e}"));
                    }
                }
            };
            let Ok(sock) = stream.try_clone() else {
                return 1;
            };
            match crate::tcp::start(stream, shared.clone(), session, on_error) {
                Ok((tx, writer, rd)) => match ReadRole::new(rd) {
                    Ok(role) => (Tx::Tcp(tx), Some((writer, role, sock))),
                    Err(_) => return 1,
                },
                Err(_) => return 1,
            }
        }
        #[cfg(feature = "mpi")]
        Link::Mpi(peer) => (Tx::Mpi(peer), None),
    };
    let (writer, role, sock) = match tcp {
        Some((w, r, s)) => (Some(w), Some(r), Some(s)),
        None => (None, None, None),
    };
    let ns = Arc::new(NodeShared {
        session,
        staging: Staging {
            region,
            free: Mutex::new(vec![(0, opts.staging_bytes)]),
        },
        shared: shared.clone(),
        tx,
        jobs: jobs_tx,
        cancelled: Mutex::new(HashSet::new()),
        last_rx: AtomicU64::new(0),
        epoch: Instant::now(),
        aborted: AtomicBool::new(false),
        ending: AtomicBool::new(false),
        grace: opts.heartbeat_timeout,
        handed: AtomicU64::new(0),
        role,
    });
    let _ = died.set(Arc::downgrade(&ns));
    let rt = runtime();
    let (Some(writer), Some(sock)) = (writer, sock) else {
        #[cfg(feature = "mpi")]
        if let Tx::Mpi(peer) = &ns.tx {
            let peer = peer.clone();
            peer.attach(mpi_receiver(&ns), shared.clone(), session);
            rt.spawn(node_heartbeat(ns.clone(), opts.heartbeat_timeout));
            rt.spawn(node_signals(ns.clone()));
            let status = serve_jobs(worker, &ns, region, &jobs_rx);
            drop(ns);
            // Let the progress thread send what is queued (bounded), then end the link.
            peer.flush(Instant::now() + Duration::from_secs(5));
            peer.cut();
            return status;
        }
        return 1;
    };
    let helper_ns = ns.clone();
    if std::thread::Builder::new()
        .name("strata-net-rx".into())
        .spawn(move || read_helper(helper_ns))
        .is_err()
    {
        return 1;
    }
    rt.spawn(node_heartbeat(ns.clone(), opts.heartbeat_timeout));
    rt.spawn(node_signals(ns.clone()));
    let status = serve_jobs(worker, &ns, region, &jobs_rx);
    // Let the writer flush (bounded), then cut the connection. (The helper thread still
    // holds the session, so the lanes are closed here rather than by the last drop.)
    ns.tx.close();
    if let Some(role) = &ns.role {
        role.reader.close();
    }
    drop(ns);
    writer.wait(Duration::from_secs(5));
    let _ = sock.shutdown(std::net::Shutdown::Both);
    status
}

/// The main thread's loop: runs the jobs the reader hands over (tasks, device-memory
/// requests) in order until SHUTDOWN or the session's end, then closes the level-3
/// worker and, after a SHUTDOWN, acknowledges it. Returns the process's exit status.
fn serve_jobs(
    worker: &mut DistWorker,
    ns: &Arc<NodeShared>,
    region: u64,
    jobs_rx: &std_mpsc::Receiver<Job>,
) -> i32 {
    let minter = IdentityMinter::new();
    let mut table = DeviceTable::default();
    let acked = loop {
        let Some(job) = next_job(ns, jobs_rx) else {
            break false;
        };
        let _busy = ns.role.as_ref().map(|r| Busy::new(r, ns.epoch));
        match job {
            Job::Task { .. } | Job::Control { .. } if ns.aborted.load(Ordering::Acquire) => {
                // The session is over; the Abort behind this job ends the loop.
                continue;
            }
            Job::Task {
                seq,
                task,
                places,
                received_ns,
            } => {
                let cancelled = ns
                    .cancelled
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&seq);
                let run_start = strata_sync::mono_ns();
                let mut wait_for = Vec::new();
                let (failure, trace) = if cancelled {
                    (
                        Some((
                            CANCELLED,
                            "cancelled by the root before it started".to_owned(),
                        )),
                        None,
                    )
                } else {
                    let (r, trace) = run_task(worker, &ns.staging, &minter, &table, &task, &places);
                    let failure = r.err().map(|(message, stalled)| {
                        // What a stalled run waited for travels as data, as from a local
                        // level-3 child (dropped if it would not fit the bound).
                        if let Some(w) = stalled {
                            let bytes = w.encode();
                            if bytes.len() <= strata_types::WAIT_FOR_MAX_BYTES {
                                wait_for = bytes;
                            }
                        }
                        (codes::FAILED, clip_message(message))
                    });
                    (failure, trace)
                };
                let run_end = strata_sync::mono_ns();
                // Outputs first (the root writes them back as they arrive), then DONE,
                // then the staging bytes go back once the writer streamed them.
                let parts: Vec<(u32, u64, u64, u64)> = task
                    .segments
                    .iter()
                    .zip(&places)
                    .enumerate()
                    .filter(|(_, (s, _))| s.recv && s.len > 0 && failure.is_none())
                    .map(|(i, (s, &at))| (i as u32, region, at, s.len))
                    .collect();
                if !parts.is_empty() {
                    let _ = ns.tx.send(Lane::Main, Out::Bulk { owner: seq, parts });
                }
                let mut done = Done::new(failure);
                done.wait_for = wait_for;
                if let Some(mut trace) = trace {
                    // The node's own spans on its level-3 worker's track (the trace's first
                    // process): the task from its arrival, its inputs' arrival, its run.
                    let send = strata_sync::mono_ns();
                    let hid: String = task.callable[..8]
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect();
                    if let Some(p) = trace.processes.first_mut() {
                        let pid = std::process::id();
                        let span = |n: &str, a: u64, b: u64| {
                            strata_types::trace::Span::new(
                                pid,
                                NODE_TID,
                                seq,
                                &hid,
                                n,
                                a,
                                b.saturating_sub(a),
                            )
                        };
                        p.name_thread(NODE_TID, "node session (task in, run, done out)");
                        p.spans.push(span("node.task", received_ns, send));
                        p.spans
                            .push(span("node.task.stage_in", received_ns, run_start));
                        p.spans.push(span("node.task.run", run_start, run_end));
                    }
                    done.trace = trace.encode_bounded(MAX_TRACE_BYTES);
                    done.node_recv_ns = received_ns;
                    done.node_send_ns = strata_sync::mono_ns();
                }
                ns.send(Lane::Main, FrameType::Done, seq, &done);
                let ns2 = ns.clone();
                let segs = task.segments.clone();
                let _ = ns.tx.send(
                    Lane::Main,
                    Out::Then(Box::new(move || {
                        for (s, at) in segs.iter().zip(places) {
                            ns2.staging.release(at, s.len);
                        }
                    })),
                );
            }
            Job::Refused { seq, why } => {
                ns.send(
                    Lane::Main,
                    FrameType::Done,
                    seq,
                    &Done::new(Some((codes::FAILED, clip_message(why)))),
                );
            }
            Job::Control {
                seq,
                control,
                place,
            } => serve_control(worker, ns, &mut table, seq, control, place),
            Job::Shutdown => break true,
            // (`next_job` takes these itself.)
            Job::Reread => {}
            Job::Abort(why) => {
                eprintln!("strata-node: the session ends: {why}");
                break false;
            }
        }
    };
    ns.ending.store(true, Ordering::Release);
    // Close the level-3 worker: it shuts its children down and reaps them.
    let closed = worker.close();
    let reaped = !matches!(closed, Err(DistError::Host(_)));
    let report = closed.err().map(|e| e.to_string()).unwrap_or_default();
    if acked {
        ns.send(
            Lane::Main,
            FrameType::ShutdownAck,
            0,
            &ShutdownAck {
                reaped,
                report: clip_message(report),
            },
        );
    }
    if acked && reaped {
        0
    } else {
        1
    }
}

/// Runs one task: its tensors rewritten to name the staging area, its configuration
/// decoded, then the host orchestration as a run of the level-3 worker.
/// Why a task failed on the node: the message, and what its run waited for if it
/// stalled.
type TaskFailure = (String, Option<strata_types::WaitFor>);

fn run_task(
    worker: &mut DistWorker,
    staging: &Staging,
    minter: &IdentityMinter,
    table: &DeviceTable,
    task: &Task,
    places: &[u64],
) -> (Result<(), TaskFailure>, Option<strata_types::trace::Trace>) {
    let mut config_bytes = [0u8; CALL_CONFIG_WIRE_BYTES];
    if task.config.len() > CALL_CONFIG_WIRE_BYTES {
        return (
            Err((
                format!(
                    "the task's configuration has {} bytes (at most {CALL_CONFIG_WIRE_BYTES})",
                    task.config.len()
                ),
                None,
            )),
            None,
        );
    }
    config_bytes[..task.config.len()].copy_from_slice(&task.config);
    let prepared = (|| {
        let config =
            decode_config(&config_bytes).map_err(|e| format!("the task's configuration: {e}"))?;
        let args = decode_args(&task.args, ArgLimits::HOST)
            .map_err(|e| format!("the task's arguments: {e}"))?;
        let local = rewrite(&args, &task.segments, places, staging.region, minter, table)?;
        Ok::<_, String>((config, local))
    })();
    let (config, local) = match prepared {
        Ok(p) => p,
        Err(e) => return (Err((e, None)), None),
    };
    let handle = HostOrchHandle::from_id(CallableId(task.callable));
    let (r, trace) = worker.run_for_parent_traced(&handle, &local, &config);
    let r = r.map_err(|e| {
        let stalled = match &e {
            strata_dist::DistError::TaskFailed(f) => f.wait_for().map(|w| (**w).clone()),
            strata_dist::DistError::WaitTimeout { wait_for, .. } => {
                wait_for.as_ref().map(|w| (**w).clone())
            }
            _ => None,
        };
        (e.to_string(), stalled)
    });
    (r, trace)
}

/// The thread id of the node's own spans (`node.task*`) on its track.
const NODE_TID: u64 = 1 << 41;

/// The task's arguments over the staging area: tensors of one root buffer (one segment
/// each, in order of first appearance — the order the root planned them in) become views
/// of one node buffer holding the segment's bytes, under one fresh identity.
fn rewrite(
    args: &TaskArgs,
    segments: &[Segment],
    places: &[u64],
    region: u64,
    minter: &IdentityMinter,
    table: &DeviceTable,
) -> Result<TaskArgs, String> {
    let mut local = TaskArgs::with_limits(args.limits());
    let mut by_buffer: HashMap<BufferIdentity, (usize, BufferIdentity)> = HashMap::new();
    for (i, t) in args.tensors().iter().enumerate() {
        let (their_region, base) = match t.buffer.location() {
            BufferLocation::HostShared { region, offset } => (region, offset),
            // A tensor this session allocated on one of its chips: its address is the
            // handle the root was given.
            BufferLocation::Device { addr, .. } => {
                let (_, ct) = table.live.get(&addr).ok_or_else(|| {
                    format!("tensor argument {i} names device allocation {addr}, which is not live on this node (freed)")
                })?;
                if t.buffer.nbytes() != ct.arg(t.tag).buffer.nbytes() {
                    return Err(format!(
                        "tensor argument {i} names device allocation {addr} with {} bytes; it has {}",
                        t.buffer.nbytes(),
                        ct.arg(t.tag).buffer.nbytes()
                    ));
                }
                let arg = ct
                    .arg_view(t.view, t.tag)
                    .map_err(|e| format!("tensor argument {i}: {e}"))?;
                local.push_tensor(arg).map_err(|e| e.to_string())?;
                continue;
            }
            BufferLocation::HostLocal { .. } => {
                return Err(format!(
                    "tensor argument {i} does not name the root's shared memory"
                ))
            }
        };
        let next = by_buffer.len();
        let (k, id) = *by_buffer
            .entry(t.buffer.identity())
            .or_insert_with(|| (next, minter.mint()));
        let seg = segments
            .get(k)
            .ok_or_else(|| format!("tensor argument {i} has no segment"))?;
        // Every figure comes from the root's frame: checked arithmetic throughout.
        let outside = || {
            format!("tensor argument {i} lies outside its segment (region {their_region}, offset {base})")
        };
        let (lo, hi) = t.view.byte_span();
        let (lo, hi) = (
            base.checked_add(lo).ok_or_else(outside)?,
            base.checked_add(hi).ok_or_else(outside)?,
        );
        let end = seg.start.checked_add(seg.len).ok_or_else(outside)?;
        if seg.region != their_region || lo < seg.start || hi > end {
            return Err(outside());
        }
        let offset = base
            .checked_add(t.view.byte_offset())
            .and_then(|o| o.checked_sub(seg.start))
            .ok_or_else(outside)?;
        let view = TensorView::new(t.view.dtype(), t.view.shape(), t.view.strides(), offset)
            .map_err(|e| format!("tensor argument {i}: {e}"))?;
        // SAFETY: `[places[k], places[k] + seg.len)` of the staging region was allocated
        // to this task alone (first-fit, released only after the task's outputs were
        // sent), every descriptor of these bytes in the task carries `id` (one per root
        // buffer), and the bytes stay allocated until the run ends.
        let buffer = unsafe {
            BufferDesc::from_parts(
                id,
                seg.len,
                BufferLocation::HostShared {
                    region,
                    offset: places[k],
                },
            )
        };
        local
            .push_tensor(TensorArg {
                buffer,
                view,
                tag: t.tag,
            })
            .map_err(|e| e.to_string())?;
    }
    for &s in args.scalars() {
        local.push_scalar_bits(s).map_err(|e| e.to_string())?;
    }
    Ok(local)
}

/// The node's receiver over MPI, run by the progress thread: what [`node_reader`] does for
/// a socket (it holds the session weakly: the session holds the peer, which holds it).
#[cfg(feature = "mpi")]
fn mpi_receiver(ns: &Arc<NodeShared>) -> crate::mpi_link::Handler {
    use crate::mpi_link::{decode_message, Incoming};
    let weak = Arc::downgrade(ns);
    let mut landing: HashMap<u64, Landing> = HashMap::new();
    let mut ctl_landing: HashMap<u64, ControlLanding> = HashMap::new();
    Box::new(move |inc| {
        let Some(ns) = weak.upgrade() else {
            return;
        };
        let protocol_error = |why: String| {
            ns.send(
                Lane::Prio,
                FrameType::Error,
                0,
                &ErrorBody {
                    code: ErrorCode::Protocol,
                    message: clip_message(why.clone()),
                },
            );
            ns.abort(why);
        };
        match inc {
            Incoming::Frame(buf, tag) => match decode_message(buf, tag) {
                Ok((h, body)) => {
                    ns.last_rx
                        .store(ns.epoch.elapsed().as_millis() as u64, Ordering::Release);
                    if let Err(why) = node_frame(&ns, &mut landing, &mut ctl_landing, &h, body) {
                        protocol_error(why);
                    }
                }
                Err(e) => protocol_error(format!("the root sent a bad frame: {e}")),
            },
            Incoming::Data(h, head, p) => {
                ns.last_rx
                    .store(ns.epoch.elapsed().as_millis() as u64, Ordering::Release);
                let landed = check_session(&ns, &h)
                    .map_err(DataError::Protocol)
                    .and_then(|()| {
                        node_data(&ns, &mut landing, &mut ctl_landing, head, Payload::Mpi(p))
                    });
                match landed {
                    Ok(()) => {}
                    Err(DataError::Link(e)) => {
                        ns.abort(format!("MPI failed on the link to the root: {e}"))
                    }
                    Err(DataError::Protocol(why)) => protocol_error(why),
                }
            }
            Incoming::Closed => ns.abort("the root ended the session".into()),
            Incoming::Broken(why) => ns.abort(format!("MPI failed on the link to the root: {why}")),
        }
    })
}

/// Who reads a TCP session's socket. A frame's wake-up is the largest part of a remote
/// round trip, so the thread that acts on a task should be the one the frame wakes: the
/// main thread reads the socket itself whenever it has no job (a TASK it reads, it runs
/// at once — no hand-off between a reader and the main thread). While a job runs, a
/// helper thread ([`read_helper`]) reads only when asked: when more is on its way as the
/// job starts (the next task, a copy's next bytes: the transfer then overlaps the job), or
/// when the job runs past a heartbeat tick (liveness, cancellations). Strata-sync's
/// [`OwnerFirst`] is the protocol (loom-checked): a main thread that waits for a job is
/// never left with nobody reading.
struct ReadRole {
    reader: OwnerFirst<NodeRx>,
    /// A clone of the socket, to end a blocked read ([`ReadRole::stop_reading`]).
    sock: std::net::TcpStream,
    /// When the main thread's current job started (ms since the session's epoch, + 1;
    /// 0: no job).
    busy_since: AtomicU64,
}

impl ReadRole {
    fn new(sock: std::net::TcpStream) -> std::io::Result<ReadRole> {
        Ok(ReadRole {
            reader: OwnerFirst::new(NodeRx {
                sock: crate::tcp::FrameReader::new(sock.try_clone()?),
                body: Vec::new(),
                landing: HashMap::new(),
                ctl_landing: HashMap::new(),
                ended: false,
            }),
            sock,
            busy_since: AtomicU64::new(0),
        })
    }

    /// Ends reading: a thread blocked in the socket's read returns (end of stream).
    fn stop_reading(&self) {
        let _ = self.sock.shutdown(std::net::Shutdown::Read);
        self.reader.ask_helper();
    }

    /// Whether more of the root's frames are on their way and nobody reads them: bytes of
    /// a task or copy still arriving, bytes read ahead, or bytes waiting in the socket
    /// (not asked of the kernel when the last `recv` emptied the socket a moment ago:
    /// what arrives later is read by the main thread after its job, or by the helper
    /// once the job runs past a heartbeat tick). `false` while the helper reads already.
    fn more_coming(&self) -> bool {
        let Some(rx) = self.reader.try_take() else {
            return false;
        };
        if rx.ended {
            return false;
        }
        if !rx.landing.is_empty() || !rx.ctl_landing.is_empty() || rx.sock.buffered() {
            return true;
        }
        if rx.sock.drained() {
            return false;
        }
        let mut byte = 0u8;
        // SAFETY: a one-byte peek into a valid local buffer on the open socket.
        let n = unsafe {
            libc::recv(
                std::os::fd::AsRawFd::as_raw_fd(rx.sock.socket()),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n > 0
    }
}

/// The socket's reading side and the frames half-landed (their inputs still arriving).
struct NodeRx {
    sock: crate::tcp::FrameReader,
    body: Vec<u8>,
    landing: HashMap<u64, Landing>,
    ctl_landing: HashMap<u64, ControlLanding>,
    /// The stream ended or broke (the session was aborted): nothing more to read.
    ended: bool,
}

impl NodeRx {
    /// The stream broke or brought a malformed frame (`e`): reading ends and the session
    /// is aborted (a malformed frame is answered with an ERROR first).
    fn broke(&mut self, ns: &Arc<NodeShared>, e: NetError) {
        self.ended = true;
        let why = match e {
            NetError::Wire(w) => {
                let msg = format!("the root sent a bad frame: {w}");
                ns.send(
                    Lane::Prio,
                    FrameType::Error,
                    0,
                    &ErrorBody {
                        code: ErrorCode::Protocol,
                        message: msg.clone(),
                    },
                );
                msg
            }
            other => format!("the connection to the root ended ({other})"),
        };
        // (Reading ends after an abort too: that abort said why.)
        if !ns.aborted.load(Ordering::Acquire) {
            ns.abort(why);
        }
    }

    /// Reads one frame from the root and acts on it (blocking); a broken stream or a
    /// bad frame aborts the session.
    fn read_one(&mut self, ns: &Arc<NodeShared>) {
        if self.ended {
            return;
        }
        let next = match crate::tcp::read_next(&mut self.sock, &mut self.body) {
            Ok(n) => n,
            Err(e) => return self.broke(ns, e),
        };
        ns.last_rx
            .store(ns.epoch.elapsed().as_millis() as u64, Ordering::Release);
        let handled = match next {
            Incoming::Whole(h) => {
                node_frame(ns, &mut self.landing, &mut self.ctl_landing, &h, &self.body)
            }
            Incoming::Data(h, head, p) => match check_session(ns, &h) {
                Err(why) => Err(why),
                Ok(()) => match node_data(
                    ns,
                    &mut self.landing,
                    &mut self.ctl_landing,
                    head,
                    Payload::Socket(p),
                ) {
                    Ok(()) => Ok(()),
                    Err(DataError::Link(e)) => return self.broke(ns, e),
                    Err(DataError::Protocol(why)) => Err(why),
                },
            },
        };
        if let Err(why) = handled {
            self.ended = true;
            ns.send(
                Lane::Prio,
                FrameType::Error,
                0,
                &ErrorBody {
                    code: ErrorCode::Protocol,
                    message: clip_message(why.clone()),
                },
            );
            ns.abort(why);
        }
    }
}

/// The main thread's next job: one already handed over, else one it reads from the socket
/// itself, else (the helper holds the socket, or reading ended) one handed over later.
/// `None` once every sender is gone.
fn next_job(ns: &Arc<NodeShared>, jobs_rx: &std_mpsc::Receiver<Job>) -> Option<Job> {
    let Some(role) = &ns.role else {
        return jobs_rx.recv().ok();
    };
    let waited = |j: Result<Job, std_mpsc::RecvError>| {
        role.reader.owner_woken();
        j.ok()
    };
    loop {
        let job = match jobs_rx.try_recv() {
            Ok(j) => j,
            Err(std_mpsc::TryRecvError::Disconnected) => return None,
            Err(std_mpsc::TryRecvError::Empty) => match role.reader.owner_turn() {
                // A job the helper handed just before it let go comes first.
                OwnerTurn::Use(mut rx) => match jobs_rx.try_recv() {
                    Ok(j) => j,
                    Err(std_mpsc::TryRecvError::Disconnected) => return None,
                    Err(std_mpsc::TryRecvError::Empty) if !rx.ended => {
                        rx.read_one(ns);
                        continue;
                    }
                    // Reading ended: the abort's job is on its way.
                    Err(std_mpsc::TryRecvError::Empty) => {
                        drop(rx);
                        jobs_rx.recv().ok()?
                    }
                },
                OwnerTurn::Wait => waited(jobs_rx.recv())?,
            },
        };
        if matches!(job, Job::Reread) {
            continue;
        }
        // More is on its way (the next task's or copy's bytes, the next task): the helper
        // reads it while this job runs, so the transfer overlaps the job.
        if role.more_coming() {
            role.reader.ask_helper();
        }
        return Some(job);
    }
}

/// Marks the main thread busy with a job while it lives (the heartbeat asks the helper to
/// read once a job has run past a tick).
struct Busy<'a>(&'a ReadRole);

impl<'a> Busy<'a> {
    fn new(role: &'a ReadRole, epoch: Instant) -> Busy<'a> {
        role.busy_since
            .store(epoch.elapsed().as_millis() as u64 + 1, Ordering::Release);
        Busy(role)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.busy_since.store(0, Ordering::Release);
    }
}

/// The helper reader of a TCP session: parked until asked, then reads the socket until it
/// has handed the main thread a job while the main thread waited for one (or reading
/// ended); then the main thread reads again.
fn read_helper(ns: Arc<NodeShared>) {
    let Some(role) = &ns.role else {
        return;
    };
    while role.reader.helper_wait_asked(HEARTBEAT_INTERVAL) {
        let mut rx = role.reader.helper_take();
        while !rx.ended && !ns.ending.load(Ordering::Acquire) {
            let before = ns.handed.load(Ordering::SeqCst);
            rx.read_one(&ns);
            if ns.handed.load(Ordering::SeqCst) != before && role.reader.owner_waits() {
                break;
            }
        }
        if role.reader.helper_release(rx) {
            ns.hand(Job::Reread);
        }
    }
}

/// Lands a DATA frame's payload in the staging area — read from the socket straight to
/// its place — for the task or copy-to request it belongs to; a copy-to that did not fit
/// has its bytes swallowed. Hands the job over once all its bytes are in.
fn node_data(
    ns: &Arc<NodeShared>,
    landing: &mut HashMap<u64, Landing>,
    ctl_landing: &mut HashMap<u64, ControlLanding>,
    d: wire::DataHead,
    payload: Payload<'_, '_>,
) -> Result<(), DataError> {
    let n = payload.len() as u64;
    if let Some(c) = ctl_landing.get_mut(&d.owner) {
        if d.segment != 0 || d.offset != c.have || c.have + n > c.len {
            return Err(format!(
                "data for control request {} outside its bytes (offset {}, {n} bytes, {} expected)",
                d.owner, d.offset, c.len
            )
            .into());
        }
        land_in_staging(ns, c.place.map(|at| at + c.have), payload)?;
        c.have += n;
        if c.have == c.len {
            if let Some(c) = ctl_landing.remove(&d.owner) {
                ns.hand(Job::Control {
                    seq: d.owner,
                    control: c.control,
                    place: c.place,
                });
            }
        }
        return Ok(());
    }
    let l = landing
        .get_mut(&d.owner)
        .ok_or_else(|| format!("data for task {} which is not arriving", d.owner))?;
    if n > l.remaining {
        return Err(format!("more data for task {} than its segments hold", d.owner).into());
    }
    match (
        l.task.segments.get(d.segment as usize),
        l.places.get(d.segment as usize),
    ) {
        (Some(s), Some(&at)) => {
            if !s.send || d.offset.checked_add(n).is_none_or(|e| e > s.len) {
                return Err(format!(
                    "data outside the inputs of task {} (segment {}, offset {})",
                    d.owner, d.segment, d.offset
                )
                .into());
            }
            land_in_staging(ns, Some(at + d.offset), payload)?;
        }
        // A refused task's inputs: swallowed.
        _ => land_in_staging(ns, None, payload)?,
    }
    l.remaining -= n;
    if l.remaining == 0 {
        if let Some(l) = landing.remove(&d.owner) {
            if !l.places.is_empty() {
                ns.hand(Job::Task {
                    seq: d.owner,
                    task: l.task,
                    places: l.places,
                    received_ns: l.received_ns,
                });
            }
        }
    }
    Ok(())
}

/// Lands `payload` at staging offset `at` — inside the allocation of the task or request
/// it belongs to, which nothing reads before that job runs — or swallows it (`None`: its
/// job was refused, or did not fit).
fn land_in_staging(
    ns: &NodeShared,
    at: Option<u64>,
    payload: Payload<'_, '_>,
) -> Result<(), DataError> {
    let Some(at) = at else {
        return payload.bytes(&mut Vec::new()).map(drop);
    };
    let n = payload.len();
    let dst = ns
        .shared
        .ptr(ns.staging.region, at, n as u64)
        .map_err(|e| e.to_string())?;
    // SAFETY: `ptr` checked `[at, at + n)` lies in the staging region; the caller's
    // allocation covers it and nothing reads it before its job runs.
    payload.land(unsafe { std::slice::from_raw_parts_mut(dst, n) })
}

/// A frame of another session on this one ends it.
fn check_session(ns: &NodeShared, h: &wire::Header) -> Result<(), String> {
    if h.session != ns.session {
        return Err(format!(
            "a frame of session {:#x} on session {:#x}",
            h.session, ns.session
        ));
    }
    Ok(())
}

fn node_frame(
    ns: &Arc<NodeShared>,
    landing: &mut HashMap<u64, Landing>,
    ctl_landing: &mut HashMap<u64, ControlLanding>,
    h: &wire::Header,
    body: &[u8],
) -> Result<(), String> {
    check_session(ns, h)?;
    match h.kind {
        FrameType::Heartbeat => Ok(()),
        FrameType::Task => {
            let received_ns = strata_sync::mono_ns();
            let task: Task = wire::decode_body(h.kind, body).map_err(|e| e.to_string())?;
            let mut places = Vec::with_capacity(task.segments.len());
            let mut failed = None;
            for s in &task.segments {
                match ns.staging.alloc(s.len) {
                    Some(at) => places.push(at),
                    None => {
                        failed = Some(format!(
                            "the task's tensors ({} bytes in all) do not fit the node's free staging area; raise RemoteSpec::staging_bytes",
                            task.segments.iter().fold(0u64, |t, s| t.saturating_add(s.len))
                        ));
                        break;
                    }
                }
            }
            // (Saturating: lengths come from the root; a sum past u64 means inputs that never
            // finish arriving, and the session ends on the first byte too many.)
            let remaining: u64 = task
                .segments
                .iter()
                .filter(|s| s.send)
                .fold(0u64, |t, s| t.saturating_add(s.len));
            if let Some(why) = failed {
                for (s, at) in task.segments.iter().zip(&places) {
                    ns.staging.release(*at, s.len);
                }
                // Its inputs still come: swallow them (a landing with nowhere to land).
                if remaining > 0 {
                    landing.insert(
                        h.sequence,
                        Landing {
                            task: Task {
                                segments: Vec::new(),
                                ..task
                            },
                            places: Vec::new(),
                            remaining,
                            received_ns,
                        },
                    );
                }
                ns.hand(Job::Refused {
                    seq: h.sequence,
                    why,
                });
                return Ok(());
            }
            if remaining == 0 {
                ns.hand(Job::Task {
                    seq: h.sequence,
                    task,
                    places,
                    received_ns,
                });
            } else {
                landing.insert(
                    h.sequence,
                    Landing {
                        task,
                        places,
                        remaining,
                        received_ns,
                    },
                );
            }
            Ok(())
        }
        FrameType::Data => {
            let d: Data<'_> = wire::decode_body(h.kind, body).map_err(|e| e.to_string())?;
            let head = wire::DataHead {
                owner: d.owner,
                segment: d.segment,
                offset: d.offset,
            };
            node_data(ns, landing, ctl_landing, head, Payload::Bytes(d.bytes))
                .map_err(|e| e.to_string())
        }
        FrameType::Cancel => {
            let c: Cancel = wire::decode_body(h.kind, body).map_err(|e| e.to_string())?;
            ns.cancelled
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(c.task);
            Ok(())
        }
        FrameType::Control => {
            let control: Control = wire::decode_body(h.kind, body).map_err(|e| e.to_string())?;
            match control {
                Control::CopyTo { len, .. } if len > 0 => {
                    // Its bytes follow: land them in the staging area, then the main
                    // thread has the chip copy them in place. Bytes that do not fit are
                    // swallowed and the request refused (place `None`).
                    let place = ns.staging.alloc(len);
                    ctl_landing.insert(
                        h.sequence,
                        ControlLanding {
                            control,
                            place,
                            have: 0,
                            len,
                        },
                    );
                }
                control => {
                    ns.hand(Job::Control {
                        seq: h.sequence,
                        control,
                        place: None,
                    });
                }
            }
            Ok(())
        }
        FrameType::Shutdown => {
            ns.hand(Job::Shutdown);
            Ok(())
        }
        FrameType::Error => {
            let e: ErrorBody = wire::decode_body(h.kind, body).map_err(|e| e.to_string())?;
            ns.abort(format!("the root ended the session: {}", e.message));
            Ok(())
        }
        other => Err(format!("an unexpected {other:?} frame from the root")),
    }
}

/// Heartbeats to the root, and the root's liveness: no frame for the timeout (a
/// partition, a stopped root) ends the session.
async fn node_heartbeat(ns: Arc<NodeShared>, timeout: Duration) {
    let mut tick = tokio::time::interval(HEARTBEAT_INTERVAL);
    loop {
        tick.tick().await;
        ns.send(Lane::Prio, FrameType::Heartbeat, 0, &());
        if let Some(role) = &ns.role {
            let since = role.busy_since.load(Ordering::Acquire);
            let now = ns.epoch.elapsed().as_millis() as u64 + 1;
            if since != 0 && now.saturating_sub(since) >= HEARTBEAT_INTERVAL.as_millis() as u64 / 2
            {
                role.reader.ask_helper();
            }
        }
        let last = ns.last_rx.load(Ordering::Acquire);
        let silent =
            Duration::from_millis((ns.epoch.elapsed().as_millis() as u64).saturating_sub(last));
        // (Once the main thread closes the level-3 worker after SHUTDOWN, nobody reads:
        // the root waits for the acknowledgement, and silence means nothing.)
        if silent > timeout && !ns.ending.load(Ordering::Acquire) {
            ns.abort(format!(
                "no frame from the root for {silent:?} (heartbeat timeout)"
            ));
            return;
        }
    }
}

/// SIGTERM (the daemon drains): tell the root why, then end the session.
async fn node_signals(ns: Arc<NodeShared>) {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return;
    };
    if term.recv().await.is_some() {
        ns.send(
            Lane::Prio,
            FrameType::Error,
            0,
            &ErrorBody {
                code: ErrorCode::Draining,
                message: format!(
                    "the node daemon on {} is shutting down (SIGTERM)",
                    hostname()
                ),
            },
        );
        ns.abort("SIGTERM".into());
    }
}

/// Serves one device-memory request on the main thread (the level-3 worker runs no task
/// meanwhile: requests and tasks are served in the order they came) and queues the reply
/// on the ordered lane; a copy-from's bytes go before it.
fn serve_control(
    worker: &mut DistWorker,
    ns: &Arc<NodeShared>,
    table: &mut DeviceTable,
    seq: u64,
    control: Control,
    place: Option<u64>,
) {
    let region = ns.staging.region;
    let lookup = |table: &DeviceTable, id: u64| {
        table.live.get(&id).map(|(_, t)| *t).ok_or_else(|| {
            format!("device allocation {id} is not live on this node (freed, or never allocated in this session)")
        })
    };
    let result: Result<u64, String> = match control {
        Control::Alloc { chip, bytes } => worker
            .alloc_child_tensor(chip as usize, &[bytes], DataType::U8)
            .map(|t| {
                table.next += 1;
                table.live.insert(table.next, (chip as usize, t));
                table.next
            })
            .map_err(|e| format!("allocating {bytes} bytes on chip {chip}: {e}")),
        Control::Free { id } => match table.live.remove(&id) {
            Some((chip, t)) => worker
                .free(t)
                .map(|()| 0)
                .map_err(|e| format!("freeing device allocation {id} on chip {chip}: {e}")),
            None => lookup(table, id).map(|_| 0),
        },
        Control::CopyTo { id, offset, len } => {
            let r = if len > 0 && place.is_none() {
                Err(format!(
                    "a copy of {len} bytes does not fit the node's free staging area; raise RemoteSpec::staging_bytes"
                ))
            } else {
                lookup(table, id).and_then(|t| {
                    worker
                        .copy_range(&t, offset, region, place.unwrap_or(0), len, CopyDirection::ToDevice)
                        .map(|()| 0)
                        .map_err(|e| format!("copying {len} bytes to device allocation {id} at offset {offset}: {e}"))
                })
            };
            if let Some(at) = place {
                ns.staging.release(at, len);
            }
            r
        }
        Control::CopyFrom { id, offset, len } => {
            match lookup(table, id).and_then(|t| {
                let at = if len == 0 {
                    None
                } else {
                    Some(ns.staging.alloc(len).ok_or_else(|| {
                        format!("a copy of {len} bytes does not fit the node's free staging area; raise RemoteSpec::staging_bytes")
                    })?)
                };
                let copied = worker
                    .copy_range(&t, offset, region, at.unwrap_or(0), len, CopyDirection::FromDevice)
                    .map_err(|e| format!("copying {len} bytes from device allocation {id} at offset {offset}: {e}"));
                if let Err(e) = copied {
                    if let Some(at) = at {
                        ns.staging.release(at, len);
                    }
                    return Err(e);
                }
                Ok(at)
            }) {
                Ok(Some(at)) => {
                    // The bytes, the reply, then the staging bytes go back once streamed.
                    let _ = ns.tx.send(Lane::Main, Out::Bulk {
                        owner: seq,
                        parts: vec![(0, region, at, len)],
                    });
                    ns.send(Lane::Main, FrameType::ControlReply, seq, &ControlAnswer { result: Ok(0) });
                    let ns2 = ns.clone();
                    let _ = ns.tx.send(Lane::Main, Out::Then(Box::new(move || {
                        ns2.staging.release(at, len);
                    })));
                    return;
                }
                Ok(None) => Ok(0),
                Err(e) => Err(e),
            }
        }
        Control::Committed { chip } => worker
            .committed_device_memory(chip as usize)
            .map_err(|e| format!("chip {chip}: {e}")),
        Control::FreeBytes { chip } => worker
            .device_memory_info(chip as usize)
            .map(|(free, _)| free)
            .map_err(|e| format!("chip {chip}: {e}")),
        Control::Capacity { chip } => worker
            .device_memory_info(chip as usize)
            .map(|(_, total)| total)
            .map_err(|e| format!("chip {chip}: {e}")),
    };
    let result = result.map_err(clip_message);
    ns.send(
        Lane::Main,
        FrameType::ControlReply,
        seq,
        &ControlAnswer { result },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_allocates_first_fit_and_coalesces() {
        let s = Staging {
            region: 0,
            free: Mutex::new(vec![(0, 1024)]),
        };
        let a = s.alloc(100).unwrap();
        let b = s.alloc(100).unwrap();
        let c = s.alloc(100).unwrap();
        assert_eq!((a, b, c), (0, 128, 256));
        assert!(s.alloc(1024).is_none());
        s.release(b, 100);
        s.release(a, 100);
        s.release(c, 100);
        assert_eq!(*s.free.lock().unwrap(), vec![(0, 1024)]);
        assert_eq!(s.alloc(1024), Some(0));
    }

    #[test]
    fn staging_refuses_lengths_that_overflow() {
        let s = Staging {
            region: 0,
            free: Mutex::new(vec![(0, 1024)]),
        };
        assert_eq!(s.alloc(u64::MAX), None);
        assert_eq!(s.alloc(u64::MAX - 3), None);
        assert_eq!(s.alloc(1), Some(0));
    }
}
