//! Liveness checks run while waiting: is the peer process still there?

use crate::error::{ChildExit, MailboxError};
use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

/// A check run at least every [`crate::WaitOptions::park_slice`] (≤ 10 ms) while a
/// parent waits for its child. Returning an error ends the wait with that error.
///
/// Closures implement it:
///
/// ```
/// use strata_mailbox::{Liveness, MailboxError};
/// let mut polls = 0;
/// let mut check = || -> Result<(), MailboxError> {
///     polls += 1;
///     if polls > 3 { Err(MailboxError::PeerGone("remote node stopped answering".into())) } else { Ok(()) }
/// };
/// assert!(check.check().is_ok());
/// ```
pub trait Liveness {
    /// `Ok` while the peer is alive.
    ///
    /// # Errors
    /// Whatever error should end the wait (typically [`MailboxError::ChildExited`] or
    /// [`MailboxError::PeerGone`]).
    fn check(&mut self) -> Result<(), MailboxError>;
}

impl<F: FnMut() -> Result<(), MailboxError>> Liveness for F {
    fn check(&mut self) -> Result<(), MailboxError> {
        self()
    }
}

/// A liveness check that always passes (threads, tests, or a peer watched elsewhere).
#[derive(Debug, Clone, Copy, Default)]
pub struct AssumeAlive;

impl Liveness for AssumeAlive {
    fn check(&mut self) -> Result<(), MailboxError> {
        Ok(())
    }
}

/// Watches a forked child: through a pidfd (`pidfd_open` at [`ChildProcess::new`],
/// `waitid(P_PIDFD)`, `pidfd_send_signal`) where the kernel has them, else with
/// `waitpid(pid, WNOHANG)`.
///
/// When the child has exited the check **reaps it** and remembers how it ended
/// ([`ChildProcess::exit`]); every later check returns the same
/// [`MailboxError::ChildExited`] without waiting again.
///
/// A pid is only a number the kernel hands out again once its process was reaped, by
/// this watch or by anyone else in the process (a stray `waitpid(-1)`, `SIGCHLD`
/// ignored). The pidfd names the process itself: a wait or a signal through it never
/// reaches a later process that got the same pid ([`ChildProcess::kill`]).
#[derive(Debug, Clone)]
pub struct ChildProcess {
    pid: i32,
    exit: Option<ChildExit>,
    /// The child's pidfd (shared by clones), `None` on kernels without pidfds.
    pidfd: Option<Arc<OwnedFd>>,
}

impl ChildProcess {
    /// Watches the child with this pid. Call it right after `fork`, before anything
    /// could reap the child: the pidfd is opened here.
    pub fn new(pid: i32) -> ChildProcess {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1;
        // no memory is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        let pidfd = (fd >= 0).then(|| {
            // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
            Arc::new(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
        });
        ChildProcess {
            pid,
            exit: None,
            pidfd,
        }
    }

    /// The child's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// How the child ended, once a check found it gone (it has then been reaped, unless
    /// [`ChildExit::NotWaitable`]).
    pub fn exit(&self) -> Option<ChildExit> {
        self.exit
    }

    /// Whether waits and signals go through a pidfd (immune to pid reuse).
    pub fn has_pidfd(&self) -> bool {
        self.pidfd.is_some()
    }

    /// Sends `signal` to the child if it may still run: never once it was reaped or found
    /// not waitable (someone else reaped it: its pid may belong to another process by
    /// now), and through the pidfd when there is one, so a process that reused the pid is
    /// never hit. Whether the signal was sent.
    pub fn kill(&self, signal: i32) -> bool {
        if self.exit.is_some() {
            return false;
        }
        match &self.pidfd {
            // SAFETY: pidfd_send_signal takes a live descriptor we own, a signal number, a
            // null siginfo (the kernel fills a default one) and flags 0.
            Some(fd) => unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    signal,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                ) == 0
            },
            // Without pidfds (kernels before 5.3) the pid is the only handle; it has not
            // been reaped by this watch, which is all that can be checked.
            // SAFETY: kill takes a pid and a signal number; no memory is passed.
            None => unsafe { libc::kill(self.pid, signal) == 0 },
        }
    }

    /// Polls the child once without blocking: `None` while it runs.
    ///
    /// # Errors
    /// [`MailboxError::Os`] if the wait fails with anything but `ECHILD`/`EINTR`.
    pub fn try_wait(&mut self) -> Result<Option<ChildExit>, MailboxError> {
        if self.exit.is_some() {
            return Ok(self.exit);
        }
        let exit = match &self.pidfd {
            Some(fd) => Self::wait_pidfd(fd)?,
            None => Self::wait_pid(self.pid)?,
        };
        self.exit = exit;
        Ok(exit)
    }

    fn wait_pid(pid: i32) -> Result<Option<ChildExit>, MailboxError> {
        Ok(
            match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => Some(ChildExit::Exited(code)),
                Ok(WaitStatus::Signaled(_, sig, core_dumped)) => Some(ChildExit::Signaled {
                    signal: sig as i32,
                    core_dumped,
                }),
                Ok(_) => None,
                Err(Errno::EINTR) => None,
                Err(Errno::ECHILD) => Some(ChildExit::NotWaitable),
                Err(e) => {
                    return Err(MailboxError::Os {
                        op: "waitpid",
                        source: std::io::Error::from(e),
                    })
                }
            },
        )
    }

    fn wait_pidfd(fd: &OwnedFd) -> Result<Option<ChildExit>, MailboxError> {
        // SAFETY: an all-zero siginfo_t is a valid value (plain integers and unions).
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, writable siginfo_t; the descriptor is live and ours.
        let r = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                fd.as_raw_fd() as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG,
            )
        };
        if r != 0 {
            return match Errno::last() {
                Errno::EINTR => Ok(None),
                // Reaped by someone else.
                Errno::ECHILD => Ok(Some(ChildExit::NotWaitable)),
                e => Err(MailboxError::Os {
                    op: "waitid(P_PIDFD)",
                    source: std::io::Error::from(e),
                }),
            };
        }
        // SAFETY: waitid filled `info` for a child event (or left it zeroed: still
        // running, si_pid 0); the accessors read the fields of that union variant.
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if pid == 0 {
            return Ok(None);
        }
        Ok(Some(match info.si_code {
            libc::CLD_EXITED => ChildExit::Exited(status),
            code => ChildExit::Signaled {
                signal: status,
                core_dumped: code == libc::CLD_DUMPED,
            },
        }))
    }
}

impl Liveness for ChildProcess {
    fn check(&mut self) -> Result<(), MailboxError> {
        match self.try_wait()? {
            None => Ok(()),
            Some(exit) => Err(MailboxError::ChildExited {
                pid: self.pid,
                exit,
            }),
        }
    }
}

/// The child's view of its parent: alive while `getppid()` still returns the pid the
/// child was started under. When the parent dies the child is re-parented (to init or a
/// subreaper), so the pid changes.
///
/// A child that runs as a thread of its parent (a threads-only execution mode) is given
/// its own process's pid; the watch then always reports the parent alive.
#[derive(Debug, Clone, Copy)]
pub struct ParentWatch {
    parent: u32,
}

impl ParentWatch {
    /// Watches the current parent (`getppid()` now). Prefer
    /// [`ParentWatch::with_parent`] with the pid the parent recorded before forking:
    /// a parent that died between `fork` and this call would go unnoticed.
    pub fn current() -> ParentWatch {
        ParentWatch::with_parent(nix::unistd::getppid().as_raw() as u32)
    }

    /// Watches the given parent pid.
    pub fn with_parent(pid: u32) -> ParentWatch {
        ParentWatch { parent: pid }
    }

    /// The watched pid.
    pub fn parent(&self) -> u32 {
        self.parent
    }

    /// Whether the parent is still alive (`getppid()` unchanged).
    pub fn is_alive(&self) -> bool {
        self.parent == std::process::id() || nix::unistd::getppid().as_raw() as u32 == self.parent
    }
}
