//! The caller-runs driver seat: the state of a scheduler loop, stepped by the loop's own
//! thread — or, while a caller waits for its work, by that caller.
//!
//! A waiting caller [`DriverSeat::drive`]s: it announces itself (`drivers += 1`), takes
//! the state's lock and runs the loop's passes on its own thread until its work is done or
//! the loop goes quiet; the loop's thread sees the announcement and parks
//! ([`DriverSeat::park_while_driven`]) until the last caller leaves the seat, which
//! unparks it. A hand-off then involves two parties (the caller and the worker it waits
//! for) instead of three, which matters when there are no more CPUs than spinning threads.
//!
//! A pass that panics — on the loop's thread ([`DriverSeat::pass`]) or on a caller's —
//! is caught where it ran, and the panic message is recorded *before* the state's lock is
//! released: the loop is broken. Every later pass, drive and [`DriverSeat::broken`] then
//! reports [`Broken`] naming that message, and nobody steps the half-updated state again
//! (the lock is never "recovered" to keep stepping). The state can still be taken out to
//! be torn down ([`DriverSeat::take`]). See `docs/sync.md` for the protocol and
//! `loom_tests.rs` for its model.

use crate::panic_message;
use crate::sync::{thread, AtomicBool, AtomicUsize, Mutex, MutexGuard, Ordering};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The loop is broken: a pass panicked. Carries the panic message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the scheduler loop is broken: a pass panicked: {message}")]
pub struct Broken {
    /// The panic's message.
    pub message: String,
}

/// What a caller's turn at the loop decided (see [`DriverSeat::drive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Run another pass.
    Again,
    /// The loop made no progress for the caller's budget (or its deadline passed): leave
    /// the seat and let the loop's thread go on.
    HandBack,
    /// The loop is over (it stopped): nothing more will happen.
    Over,
}

/// How [`DriverSeat::drive`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Driven<R> {
    /// `done` returned this.
    Done(R),
    /// A turn handed the loop back: block (or wait) for the rest.
    HandedBack,
    /// The loop is over (or its state was taken out): nothing will finish.
    Over,
    /// A pass panicked (now or before): the loop is broken.
    Broken(Broken),
}

/// The state of a loop and the seat from which it is driven. See the module docs.
pub struct DriverSeat<L> {
    state: Mutex<Option<L>>,
    /// Callers in (or entering) the seat: the loop's thread parks meanwhile.
    drivers: AtomicUsize,
    broken: AtomicBool,
    /// The panic message, written once before `broken` is set (under the state's lock).
    why: Mutex<Option<String>>,
    /// The loop's own thread, unparked when the last caller leaves.
    loop_thread: Mutex<Option<thread::Thread>>,
}

impl<L> std::fmt::Debug for DriverSeat<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverSeat")
            .field("drivers", &self.drivers.load(Ordering::Relaxed))
            .field("broken", &self.broken.load(Ordering::Relaxed))
            .finish()
    }
}

impl<L> DriverSeat<L> {
    /// A seat for the loop state `state`.
    pub fn new(state: L) -> Self {
        DriverSeat {
            state: Mutex::new(Some(state)),
            drivers: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
            why: Mutex::new(None),
            loop_thread: Mutex::new(None),
        }
    }

    /// Records the calling thread as the loop's own thread (a caller leaving the seat
    /// unparks it). Call it first thing on that thread.
    pub fn register_loop_thread(&self) {
        *self.loop_thread.lock() = Some(thread::current());
    }

    /// Whether a caller is driving (or about to): the loop's thread should park.
    #[inline]
    pub fn is_driven(&self) -> bool {
        self.drivers.load(Ordering::Acquire) > 0
    }

    /// Parks the loop's thread for at most `slice` while a caller drives; `true` if it
    /// parked (the thread then re-checks everything).
    #[inline]
    pub fn park_while_driven(&self, slice: std::time::Duration) -> bool {
        if !self.is_driven() {
            return false;
        }
        thread::park_timeout(slice);
        true
    }

    /// Why the loop is broken, if it is.
    #[inline]
    pub fn broken(&self) -> Option<Broken> {
        if !self.broken.load(Ordering::Acquire) {
            return None;
        }
        Some(self.recorded())
    }

    fn recorded(&self) -> Broken {
        Broken {
            message: self
                .why
                .lock()
                .clone()
                .unwrap_or_else(|| "(no message recorded)".to_owned()),
        }
    }

    /// Marks the loop broken with `payload`'s message. Called with the state's lock held,
    /// so nobody can take the lock between the panic and the mark.
    #[cold]
    fn break_loop(&self, payload: &(dyn std::any::Any + Send)) -> Broken {
        let message = panic_message(payload);
        {
            let mut why = self.why.lock();
            if why.is_none() {
                *why = Some(message);
            }
        }
        self.broken.store(true, Ordering::Release);
        self.recorded()
    }

    /// Refuses the locked state of a broken loop.
    fn acquire<'a>(
        &self,
        guard: MutexGuard<'a, Option<L>>,
    ) -> Result<MutexGuard<'a, Option<L>>, Broken> {
        // Checked under the lock: a pass that panicked set it before releasing the lock.
        if let Some(b) = self.broken() {
            return Err(b);
        }
        Ok(guard)
    }

    /// One pass on the loop's own thread: locks the state (waiting for a caller's pass to
    /// end) and runs `pass` on it, catching a panic (which breaks the loop). `Ok(None)`
    /// once the state was taken out.
    pub fn pass<R>(&self, pass: impl FnOnce(&mut L) -> R) -> Result<Option<R>, Broken> {
        let mut seated = self.acquire(self.state.lock())?;
        let Some(state) = seated.as_mut() else {
            return Ok(None);
        };
        match catch_unwind(AssertUnwindSafe(|| pass(state))) {
            Ok(r) => Ok(Some(r)),
            Err(p) => Err(self.break_loop(&*p)),
        }
    }

    /// Drives the loop on the calling thread until `done()` returns a value.
    ///
    /// The caller takes the seat (the loop's thread parks), waits for a pass of the loop's
    /// thread that may be running (checking `done` meanwhile: that pass may finish the
    /// work), then holds the state's lock and alternates `done()` with `turn(state)` — one
    /// pass plus whatever the caller does when the pass found nothing (spin, wait on a
    /// bell) — until `done` answers, a turn hands back or ends the loop, or a pass panics
    /// (caught here: the loop is broken for everyone, and this returns
    /// [`Driven::Broken`]). Leaving the seat (also on unwind) unparks the loop's thread.
    pub fn drive<R>(
        &self,
        mut done: impl FnMut() -> Option<R>,
        mut turn: impl FnMut(&mut L) -> Turn,
    ) -> Driven<R> {
        self.drivers.fetch_add(1, Ordering::AcqRel);
        let _leave = Leave(self);
        // The loop's thread may be finishing a pass: never block on it, it sees the
        // announcement and parks at its next iteration.
        let guard = loop {
            if let Some(r) = done() {
                return Driven::Done(r);
            }
            if let Some(g) = self.state.try_lock() {
                break g;
            }
            if let Some(b) = self.broken() {
                return Driven::Broken(b);
            }
            crate::sync::spin_hint();
        };
        let mut seated = match self.acquire(guard) {
            Ok(s) => s,
            Err(b) => return Driven::Broken(b),
        };
        let Some(state) = seated.as_mut() else {
            return Driven::Over;
        };
        // One catch for the whole drive (no cost per pass); the lock stays held until the
        // panic is recorded.
        let driven = catch_unwind(AssertUnwindSafe(|| loop {
            if let Some(r) = done() {
                return Driven::Done(r);
            }
            match turn(state) {
                Turn::Again => {}
                Turn::HandBack => return Driven::HandedBack,
                Turn::Over => return Driven::Over,
            }
        }));
        match driven {
            Ok(d) => d,
            Err(p) => Driven::Broken(self.break_loop(&*p)),
        }
    }

    /// Runs `f` on the state outside the loop (e.g. to take a report), unless the loop is
    /// broken. `Ok(None)` once the state was taken out.
    pub fn with<R>(&self, f: impl FnOnce(&mut L) -> R) -> Result<Option<R>, Broken> {
        let mut seated = self.acquire(self.state.lock())?;
        Ok(seated.as_mut().map(f))
    }

    /// Takes the state out to tear it down (shut its resources down): allowed even when
    /// the loop is broken, because the taker never steps it again. Later passes and drives
    /// see [`Driven::Over`] / `Ok(None)`.
    pub fn take(&self) -> Option<L> {
        self.state.lock().take()
    }
}

/// Leaves the seat (also on unwind) and unparks the loop's thread.
struct Leave<'a, L>(&'a DriverSeat<L>);

impl<L> Drop for Leave<'_, L> {
    fn drop(&mut self) {
        if self.0.drivers.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(t) = self.0.loop_thread.lock().as_ref() {
                t.unpark();
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    #[test]
    fn a_caller_drives_until_done() {
        let seat = DriverSeat::new(0u32);
        let seen = std::cell::Cell::new(0);
        let d = seat.drive(
            || (seen.get() >= 3).then_some(seen.get()),
            |n| {
                *n += 1;
                seen.set(*n);
                Turn::Again
            },
        );
        assert_eq!(d, Driven::Done(3));
        assert_eq!(seat.with(|n| *n), Ok(Some(3)));
    }

    #[test]
    fn a_panic_in_a_callers_pass_breaks_the_loop_for_everyone() {
        let seat = DriverSeat::new(0u32);
        let d: Driven<()> = seat.drive(|| None, |_| panic!("pass exploded"));
        let Driven::Broken(b) = d else {
            panic!("expected a broken loop, got {d:?}")
        };
        assert_eq!(b.message, "pass exploded");
        assert_eq!(seat.pass(|n| *n += 1), Err(b.clone()));
        assert_eq!(seat.with(|n| *n), Err(b.clone()));
        assert_eq!(
            seat.drive(|| None::<()>, |_| Turn::Again),
            Driven::Broken(b)
        );
        assert_eq!(seat.take(), Some(0), "the state can still be torn down");
    }

    #[test]
    fn a_panic_on_the_loop_thread_breaks_the_loop() {
        let seat = Arc::new(DriverSeat::new(0u32));
        let s2 = seat.clone();
        let r = std::thread::spawn(move || s2.pass(|_| -> () { panic!("thread pass {}", 7) }))
            .join()
            .unwrap();
        assert_eq!(r.unwrap_err().message, "thread pass 7");
        let d = seat.drive(|| None::<()>, |_| Turn::Again);
        assert!(matches!(d, Driven::Broken(b) if b.message == "thread pass 7"));
    }

    #[test]
    fn handing_back_and_taking_out() {
        let seat = DriverSeat::new(5u32);
        assert_eq!(
            seat.drive(|| None::<()>, |_| Turn::HandBack),
            Driven::HandedBack
        );
        assert_eq!(seat.drive(|| None::<()>, |_| Turn::Over), Driven::Over);
        assert_eq!(seat.take(), Some(5));
        assert_eq!(seat.drive(|| None::<()>, |_| Turn::Again), Driven::Over);
        assert_eq!(seat.pass(|n| *n), Ok(None));
    }

    #[test]
    fn the_loop_thread_parks_while_driven_and_is_unparked_after() {
        let seat = Arc::new(DriverSeat::new(0u32));
        let passes = Arc::new(AtomicU32::new(0));
        let (s2, p2) = (seat.clone(), passes.clone());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let st2 = stop.clone();
        let t = std::thread::spawn(move || {
            s2.register_loop_thread();
            while !st2.load(Ordering::Relaxed) {
                if s2.park_while_driven(std::time::Duration::from_millis(1)) {
                    continue;
                }
                s2.pass(|n| *n += 1).unwrap();
                p2.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
        });
        let turns = std::cell::Cell::new(0);
        let d = seat.drive(
            || (turns.get() == 100).then_some(()),
            |_| {
                turns.set(turns.get() + 1);
                Turn::Again
            },
        );
        assert_eq!(d, Driven::Done(()));
        stop.store(true, Ordering::Relaxed);
        t.join().unwrap();
    }
}
