//! A gate for a waiter that sleeps somewhere a ring cannot reach (in `poll` on a socket,
//! say) and must still not miss a ring: ringers kick it (write an eventfd the waiter also
//! polls) — but only while someone is in the gate, so a ring costs one more load, not a
//! system call, when nobody is.

use crate::sync::{AtomicU32, Ordering};
use std::os::fd::AsRawFd;

/// Counts the waiters in the gate; the store-buffering hand-shake between a ringer and a
/// waiter.
///
/// A ringer publishes its event (a store the waiter re-checks), then asks
/// [`KickGate::should_kick`]; a waiter [`KickGate::enter`]s, then re-checks the event
/// before it sleeps. Both go through read-modify-writes of the one counter, so they are
/// ordered in its modification order: if the ringer's comes second it reads the waiter
/// in the gate and kicks; if first, the waiter's acquires it and the event published
/// before it is visible to the waiter's re-check, which then does not sleep. (Two plain
/// loads behind fences would do on paper, but store buffering is exactly where a model
/// checker — and a reviewer — is least sure; the RMW costs a ring a few ns.)
/// Model-checked (`loom_kick_gate_a_waiter_that_sleeps_is_kicked`).
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use strata_sync::KickGate;
/// let (gate, event) = (KickGate::new(), AtomicBool::new(false));
/// // A waiter enters, re-checks, and would sleep (nothing happened yet) ...
/// let inside = gate.enter();
/// assert!(!event.load(Ordering::SeqCst));
/// // ... so a ringer that publishes now must kick it.
/// event.store(true, Ordering::SeqCst);
/// assert!(gate.should_kick());
/// drop(inside);
/// assert!(!gate.should_kick());
/// ```
#[derive(Debug, Default)]
pub struct KickGate {
    inside: AtomicU32,
}

/// A waiter's stay in the gate; leaving is dropping it.
#[derive(Debug)]
#[must_use = "the waiter leaves the gate when this is dropped"]
pub struct Inside<'a>(&'a KickGate);

impl KickGate {
    /// An empty gate.
    pub fn new() -> KickGate {
        KickGate {
            inside: AtomicU32::new(0),
        }
    }

    /// A waiter enters; it re-checks for events after this, before it sleeps.
    pub fn enter(&self) -> Inside<'_> {
        self.inside.fetch_add(1, Ordering::AcqRel);
        Inside(self)
    }

    /// After publishing an event: whether a waiter may be in the gate and must be kicked.
    #[inline]
    pub fn should_kick(&self) -> bool {
        self.inside.fetch_add(0, Ordering::AcqRel) != 0
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A non-blocking, close-on-exec eventfd: the descriptor a [`KickGate`] waiter polls
/// beside what it waits for, and ringers [`EventFd::signal`].
///
/// ```
/// use std::os::fd::AsRawFd;
/// let e = strata_sync::EventFd::new()?;
/// e.signal();
/// let mut p = libc::pollfd { fd: e.as_raw_fd(), events: libc::POLLIN, revents: 0 };
/// // SAFETY: one valid pollfd.
/// assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 1);
/// e.drain();
/// // SAFETY: as above.
/// assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct EventFd(std::os::fd::OwnedFd);

impl EventFd {
    /// A fresh eventfd, not readable.
    ///
    /// # Errors
    /// The kernel refused one (descriptor limit).
    pub fn new() -> std::io::Result<EventFd> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscall.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        Ok(EventFd(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes it readable (until drained).
    pub fn signal(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to the eventfd this owns; a full counter
        // (EAGAIN) is readable already, so nothing is lost.
        unsafe { libc::write(self.as_raw_fd(), (&raw const one).cast(), 8) };
    }

    /// Makes it not readable (non-blocking: nothing to do if it was not signalled).
    pub fn drain(&self) {
        let mut n = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from the eventfd this owns.
        unsafe { libc::read(self.as_raw_fd(), (&raw mut n).cast(), 8) };
    }
}

impl std::os::fd::AsRawFd for EventFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}
