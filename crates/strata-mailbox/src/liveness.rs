//! Liveness checks run while waiting: is the peer process still there?

use crate::error::{ChildExit, MailboxError};
use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

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

/// Watches a forked child with `waitpid(pid, WNOHANG)`.
///
/// When the child has exited the check **reaps it** and remembers how it ended
/// ([`ChildProcess::exit`]); every later check returns the same
/// [`MailboxError::ChildExited`] without calling `waitpid` again.
#[derive(Debug, Clone)]
pub struct ChildProcess {
    pid: i32,
    exit: Option<ChildExit>,
}

impl ChildProcess {
    /// Watches the child with this pid.
    pub fn new(pid: i32) -> ChildProcess {
        ChildProcess { pid, exit: None }
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

    /// Polls the child once without blocking: `None` while it runs.
    ///
    /// # Errors
    /// [`MailboxError::Os`] if `waitpid` fails with anything but `ECHILD`/`EINTR`.
    pub fn try_wait(&mut self) -> Result<Option<ChildExit>, MailboxError> {
        if self.exit.is_some() {
            return Ok(self.exit);
        }
        let exit = match waitpid(Pid::from_raw(self.pid), Some(WaitPidFlag::WNOHANG)) {
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
        };
        self.exit = exit;
        Ok(exit)
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
