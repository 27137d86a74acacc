//! The node daemon (`strata-node serve`): accepts sessions from roots, authenticates
//! them, and starts the requested program — found among its `--program`s by ELF
//! build-id — in a new process group with the authenticated connection as descriptor 3;
//! that process serves the session (see the crate docs). The daemon reaps it, and on
//! SIGTERM (or SIGINT) stops accepting, asks every session's process group to end
//! (SIGTERM: a node tells its root why, closes its level-3 worker and exits), and kills
//! what is left after the drain bound.

use crate::auth::{hex, Secret};
use crate::error::NetError;
use crate::handshake::{refuse, respond};
use crate::identity::build_id_of;
use crate::io::{resolve, SyncConn};
use crate::spec::{ENV_NODE_FD, ENV_NODE_SESSION, ENV_NODE_WORKER};
use crate::wire::{ErrorCode, Intro};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How a daemon serves.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// `host:port` to listen on (`0.0.0.0:7070`, `[::]:7070`, `127.0.0.1:0`, …).
    pub listen: String,
    /// The secret roots must prove.
    pub secret: Secret,
    /// The executables sessions may start (by their build-ids).
    pub programs: Vec<PathBuf>,
    /// How long a connection may take to authenticate (a silent client is dropped then).
    pub handshake_timeout: Duration,
    /// How long SIGTERM waits for sessions to end before killing them.
    pub drain_timeout: Duration,
    /// Sessions served at once (more are refused).
    pub max_sessions: usize,
}

/// The daemon's state shared by its tasks.
struct Daemon {
    config: DaemonConfig,
    programs: HashMap<Vec<u8>, PathBuf>,
    /// Live sessions: process group id → description.
    sessions: Mutex<HashMap<i32, String>>,
    draining: std::sync::atomic::AtomicBool,
}

/// Runs the daemon until SIGTERM or SIGINT, then drains. `ready` receives the bound
/// address once it listens (for tests and scripts that bind port 0).
///
/// # Errors
/// A program that cannot be read, an address that cannot be bound.
pub fn run(config: DaemonConfig, ready: impl FnOnce(std::net::SocketAddr)) -> Result<(), NetError> {
    let mut programs = HashMap::new();
    for p in &config.programs {
        let id = build_id_of(p)?;
        eprintln!(
            "strata-node: program {} (build-id {})",
            p.display(),
            hex(&id)
        );
        programs.insert(id, p.clone());
    }
    let addrs = resolve(&config.listen, Duration::from_secs(10))?;
    let std_listener = std::net::TcpListener::bind(&addrs[..])
        .map_err(|e| NetError::io(format!("listening on {}", config.listen), e))?;
    let local = std_listener
        .local_addr()
        .map_err(|e| NetError::io("local address", e))?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| NetError::io("listener", e))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("strata-node")
        .enable_all()
        .build()
        .map_err(|e| NetError::io("starting the runtime", e))?;
    let d = Arc::new(Daemon {
        config,
        programs,
        sessions: Mutex::new(HashMap::new()),
        draining: std::sync::atomic::AtomicBool::new(false),
    });
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(std_listener)
            .map_err(|e| NetError::io("listener", e))?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| NetError::io("SIGTERM handler", e))?;
        let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(|e| NetError::io("SIGINT handler", e))?;
        eprintln!("strata-node: listening on {local}");
        ready(local);
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = int.recv() => break,
                a = listener.accept() => {
                    let Ok((stream, peer)) = a else { continue };
                    let d = d.clone();
                    tokio::task::spawn_blocking(move || d.session(stream, peer));
                }
            }
        }
        drop(listener);
        d.drain().await;
        Ok(())
    })
}

impl Daemon {
    /// One connection: the handshake under its deadline, then the program started for it
    /// and reaped (this blocking thread waits for it).
    fn session(&self, stream: tokio::net::TcpStream, peer: std::net::SocketAddr) {
        let Ok(stream) = stream.into_std() else {
            return;
        };
        let _ = stream.set_nonblocking(false);
        let mut conn = SyncConn::new(stream, 0);
        let deadline = Instant::now() + self.config.handshake_timeout;
        let intro = match respond(&mut conn, &self.config.secret, deadline) {
            Ok(i) => i,
            Err(e) => {
                eprintln!("strata-node: {peer}: refused: {e}");
                return;
            }
        };
        let Intro::Open {
            worker_id,
            build_id,
            args,
        } = intro
        else {
            refuse(
                &mut conn,
                ErrorCode::Protocol,
                "a node daemon opens sessions; JOIN is for launched jobs",
                deadline,
            );
            return;
        };
        if self.draining.load(std::sync::atomic::Ordering::Acquire) {
            refuse(
                &mut conn,
                ErrorCode::Draining,
                "this node daemon is shutting down",
                deadline,
            );
            return;
        }
        let Some(program) = self.programs.get(&build_id) else {
            let msg = format!(
                "no program with build-id {} on this node; start `strata-node serve` with `--program /path/to/it` (the same binary as the root's; this daemon has {})",
                hex(&build_id),
                if self.programs.is_empty() { "none".to_owned() } else {
                    self.config.programs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
                }
            );
            eprintln!("strata-node: {peer}: {msg}");
            refuse(&mut conn, ErrorCode::Program, &msg, deadline);
            return;
        };
        if self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
            >= self.config.max_sessions
        {
            refuse(&mut conn, ErrorCode::Other, "this node daemon serves its maximum number of sessions; try later or raise --max-sessions", deadline);
            return;
        }
        let fd = conn.stream.as_raw_fd();
        let mut cmd = std::process::Command::new(program);
        cmd.args(&args)
            .env(ENV_NODE_FD, "3")
            .env(ENV_NODE_WORKER, worker_id.to_string())
            .env(ENV_NODE_SESSION, format!("{:x}", conn.session))
            .stdin(std::process::Stdio::null())
            .process_group(0);
        // SAFETY: the closure runs in the forked child before exec and only calls
        // async-signal-safe functions (dup2, fcntl) on descriptors it owns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let flags = libc::fcntl(3, libc::F_GETFD);
                if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                refuse(
                    &mut conn,
                    ErrorCode::Startup,
                    &format!("cannot start {}: {e}", program.display()),
                    deadline,
                );
                return;
            }
        };
        // The child has its own copy of the connection now.
        drop(conn);
        let pid = child.id() as i32;
        let what = format!(
            "worker {worker_id} for {peer} ({}, pid {pid})",
            program.display()
        );
        eprintln!("strata-node: session started: {what}");
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, what.clone());
        let status = child.wait();
        // Whatever it left behind in its group goes with it.
        // SAFETY: kill(2) on the group this daemon created for the session.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pid);
        eprintln!("strata-node: session ended: {what}: {status:?}");
    }

    /// SIGTERM to every session's group, then SIGKILL after the drain bound.
    async fn drain(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Release);
        let groups: Vec<i32> = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect();
        eprintln!(
            "strata-node: draining {} session(s) (bound {:?})",
            groups.len(),
            self.config.drain_timeout
        );
        for g in &groups {
            // SAFETY: kill(2) on a process group this daemon created.
            unsafe { libc::kill(-*g, libc::SIGTERM) };
        }
        let until = Instant::now() + self.config.drain_timeout;
        while Instant::now() < until
            && !self
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left: Vec<i32> = self
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect();
        for g in &left {
            // SAFETY: as above.
            unsafe { libc::kill(-*g, libc::SIGKILL) };
        }
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until
            && !self
                .sessions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        eprintln!("strata-node: drained");
    }
}
