//! [`OwnerFirst`]: a resource its owner thread uses whenever it has nothing else to do,
//! and a helper thread uses while the owner is busy.

use crate::sync::{fence, wait_timeout, AtomicBool, Condvar, Mutex, MutexGuard, Ordering};
use std::time::Duration;

/// A resource — a socket's reading side — used by its owner thread whenever the owner
/// has no work, and by a helper thread while the owner is busy.
///
/// The point is the wake-up. The owner runs the jobs the resource yields (the frames a
/// socket brings); if a separate reader waited on the resource and handed each job over,
/// every job would cost a second thread's wake-up. With `OwnerFirst` the owner itself
/// waits on the resource when it has nothing to do, so the event that brings a job wakes
/// the thread that runs it. The helper exists for the time the owner is busy: asked by
/// [`OwnerFirst::ask_helper`] (more is on its way, or a job runs long), it uses the
/// resource and hands the owner the jobs it yields through the caller's own channel.
///
/// The protocol's guarantee: **an owner waiting for a job is never left with nobody using
/// the resource.** The owner announces that it waits before it looks whether the helper
/// holds the resource ([`OwnerFirst::owner_turn`]); the helper, giving the resource back
/// ([`OwnerFirst::helper_release`]), looks whether the owner waits after it let go, and
/// if so must wake it (hand it a no-op job) so the owner takes the resource itself. One of
/// the two always sees the other (a store–fence–load pair on each side); a spurious no-op
/// job is the price of the race. The loom models in `loom_tests.rs` check it.
/// (The resource's lock is an atomic flag, not a mutex's `try_lock`: loom reports false
/// deadlocks on `try_lock` against a holder that blocks — tokio-rs/loom#376 — and the
/// helper does block while it holds the resource.)
///
/// ```
/// use strata_sync::{OwnerFirst, OwnerTurn};
/// let reader = OwnerFirst::new(vec![1, 2, 3]);
/// // The owner has nothing to do and the helper is not using the resource: it reads.
/// match reader.owner_turn() {
///     OwnerTurn::Use(mut frames) => assert_eq!(frames.pop(), Some(3)),
///     OwnerTurn::Wait => unreachable!("nobody else holds it"),
/// }
/// // The helper, asked while the owner is busy, takes it and gives it back.
/// reader.ask_helper();
/// assert!(reader.helper_wait_asked(std::time::Duration::from_millis(1)));
/// let held = reader.helper_take();
/// assert!(!reader.helper_release(held), "the owner does not wait");
/// ```
#[derive(Debug)]
pub struct OwnerFirst<R> {
    /// Locked only by the thread that set `held`: never contended.
    res: Mutex<R>,
    held: AtomicBool,
    /// The owner waits for a job (or is about to look whether it may use the resource).
    owner_waits: AtomicBool,
    helper: Mutex<HelperState>,
    /// The helper waits here: to be asked, or for the resource.
    wake: Condvar,
    closed: AtomicBool,
}

#[derive(Debug, Default)]
struct HelperState {
    /// The helper is asked to use the resource.
    asked: bool,
    /// The helper waits for the resource to be given back.
    wants: bool,
}

/// The resource, held ([`OwnerFirst::owner_turn`], [`OwnerFirst::helper_take`],
/// [`OwnerFirst::try_take`]); dropping it gives the resource back.
#[derive(Debug)]
pub struct Held<'a, R> {
    of: &'a OwnerFirst<R>,
    guard: Option<MutexGuard<'a, R>>,
}

impl<R> std::ops::Deref for Held<'_, R> {
    type Target = R;
    fn deref(&self) -> &R {
        self.guard
            .as_deref()
            .unwrap_or_else(|| unreachable!("held until dropped"))
    }
}

impl<R> std::ops::DerefMut for Held<'_, R> {
    fn deref_mut(&mut self) -> &mut R {
        self.guard
            .as_deref_mut()
            .unwrap_or_else(|| unreachable!("held until dropped"))
    }
}

impl<R> Drop for Held<'_, R> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let of = self.of;
        of.held.store(false, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        // The helper announces that it waits before it looks at `held` again: one of
        // the two sees the other.
        let mut h = of.helper.lock();
        if h.wants {
            h.wants = false;
            drop(h);
            of.wake.notify_all();
        }
    }
}

/// What the owner does when it has no job ([`OwnerFirst::owner_turn`]).
#[derive(Debug)]
pub enum OwnerTurn<'a, R> {
    /// Use the resource itself (one step: e.g. read one frame), then look for a job again.
    /// Look for a job once more *before* blocking on the resource: the helper may have
    /// handed one just before it let go (and blocking on the resource while that job
    /// waits can stall both: the peer may send nothing until the job is done).
    Use(Held<'a, R>),
    /// The helper holds the resource: wait for the job it hands over, then call
    /// [`OwnerFirst::owner_woken`]. The job may be a no-op wake-up (see the type's docs):
    /// then take another turn.
    Wait,
}

impl<R> OwnerFirst<R> {
    /// Wraps the resource; nobody uses it yet.
    pub fn new(res: R) -> Self {
        OwnerFirst {
            res: Mutex::new(res),
            held: AtomicBool::new(false),
            owner_waits: AtomicBool::new(false),
            helper: Mutex::new(HelperState::default()),
            wake: Condvar::new(),
            closed: AtomicBool::new(false),
        }
    }

    fn try_hold(&self) -> Option<Held<'_, R>> {
        self.held
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()
            .map(|_| Held {
                of: self,
                guard: Some(self.res.lock()),
            })
    }

    /// The owner has no job: use the resource, or wait for the helper's job.
    pub fn owner_turn(&self) -> OwnerTurn<'_, R> {
        self.owner_waits.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        match self.try_hold() {
            Some(h) => {
                self.owner_waits.store(false, Ordering::SeqCst);
                OwnerTurn::Use(h)
            }
            None => OwnerTurn::Wait,
        }
    }

    /// The owner got a job after [`OwnerTurn::Wait`].
    pub fn owner_woken(&self) {
        self.owner_waits.store(false, Ordering::SeqCst);
    }

    /// Whether the owner waits for a job now: a helper that just handed it one may give
    /// the resource back.
    pub fn owner_waits(&self) -> bool {
        self.owner_waits.load(Ordering::SeqCst)
    }

    /// The resource, if nobody uses it (e.g. to look whether more is on its way).
    pub fn try_take(&self) -> Option<Held<'_, R>> {
        self.try_hold()
    }

    /// Asks the helper to use the resource (the owner is busy and more is on its way).
    pub fn ask_helper(&self) {
        self.helper.lock().asked = true;
        self.wake.notify_all();
    }

    /// The helper waits until it is asked (`true`, and the request is taken) or the
    /// resource is closed (`false`); it looks at least every `slice`.
    pub fn helper_wait_asked(&self, slice: Duration) -> bool {
        let mut h = self.helper.lock();
        loop {
            if self.closed.load(Ordering::Acquire) {
                return false;
            }
            if h.asked {
                h.asked = false;
                return true;
            }
            h = wait_timeout(&self.wake, h, slice);
        }
    }

    /// The helper takes the resource, waiting while the owner uses it.
    pub fn helper_take(&self) -> Held<'_, R> {
        loop {
            if let Some(held) = self.try_hold() {
                return held;
            }
            let mut h = self.helper.lock();
            h.wants = true;
            fence(Ordering::SeqCst);
            if let Some(held) = self.try_hold() {
                h.wants = false;
                return held;
            }
            while h.wants {
                h = wait_timeout(&self.wake, h, Duration::from_millis(50));
                if !self.held.load(Ordering::SeqCst) {
                    break;
                }
            }
        }
    }

    /// The helper gives the resource back. `true`: the owner may be waiting for a job
    /// while nobody uses the resource — hand it a no-op job so it takes another turn.
    #[must_use = "an owner left waiting must be woken"]
    pub fn helper_release(&self, held: Held<'_, R>) -> bool {
        drop(held);
        fence(Ordering::SeqCst);
        self.owner_waits.load(Ordering::SeqCst)
    }

    /// Ends the helper's waits ([`OwnerFirst::helper_wait_asked`] returns `false`).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _guard = self.helper.lock();
        self.wake.notify_all();
    }
}
