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
use crate::sync::{fence, thread, Arc, AtomicBool, AtomicUsize, Mutex, MutexGuard, Ordering};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The dormant bit of `SeatWaker::drivers` (the rest counts the callers in the seat).
const DORMANT: usize = 1 << (usize::BITS - 1);

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
    /// Callers in the seat, the loop's thread, whether it was left dormant.
    waker: Arc<SeatWaker>,
    broken: AtomicBool,
    /// The panic message, written once before `broken` is set (under the state's lock).
    why: Mutex<Option<String>>,
}

/// The part of a [`DriverSeat`] a producer needs to wake the loop's thread after the last
/// caller left it dormant ([`DriverSeat::drive_quiet`]); shareable without the state.
#[derive(Debug)]
pub struct SeatWaker {
    /// The number of callers in (or entering) the seat — the loop's thread parks
    /// meanwhile — and the [`DORMANT`] bit: the last caller left the loop quiet and did
    /// not unpark the loop's thread, so whoever hands the loop work next must
    /// ([`SeatWaker::wake_dormant`]). One word, so that whoever clears the bit (a
    /// compare-exchange, which decides who unparks) has seen the departure that set it.
    drivers: AtomicUsize,
    /// The loop's own thread, unparked when the last caller leaves.
    loop_thread: Mutex<Option<thread::Thread>>,
}

impl<L> std::fmt::Debug for DriverSeat<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverSeat")
            .field(
                "drivers",
                &(self.waker.drivers.load(Ordering::Relaxed) & !DORMANT),
            )
            .field("broken", &self.broken.load(Ordering::Relaxed))
            .finish()
    }
}

impl<L> DriverSeat<L> {
    /// A seat for the loop state `state`.
    pub fn new(state: L) -> Self {
        DriverSeat {
            state: Mutex::new(Some(state)),
            waker: Arc::new(SeatWaker::new()),
            broken: AtomicBool::new(false),
            why: Mutex::new(None),
        }
    }

    /// Records the calling thread as the loop's own thread (a caller leaving the seat
    /// unparks it). Call it first thing on that thread.
    pub fn register_loop_thread(&self) {
        *self.waker.loop_thread.lock() = Some(thread::current());
    }

    /// Whether a caller is driving (or about to): the loop's thread should park.
    #[inline]
    pub fn is_driven(&self) -> bool {
        self.waker.drivers.load(Ordering::Acquire) & !DORMANT > 0
    }

    /// Parks the loop's thread for at most `slice` while a caller drives; `true` if it
    /// parked (the thread then re-checks everything).
    #[inline]
    pub fn park_while_driven(&self, slice: std::time::Duration) -> bool {
        // The dormant bit is left for a producer or a departing caller to clear: clearing
        // it here could erase a mark set for a park this thread is about to enter. A stale
        // bit costs one spurious unpark at most.
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
        done: impl FnMut() -> Option<R>,
        turn: impl FnMut(&mut L) -> Turn,
    ) -> Driven<R> {
        self.drive_quiet(done, turn, |_| false, || true)
    }

    /// [`DriverSeat::drive`], except that a caller whose work is done may leave the loop's
    /// thread parked instead of unparking it: when `done` answered and `quiet(state)`
    /// (asked while the caller still holds the state) says the loop has nothing to do
    /// until it is handed new work. A caller that drives again soon (a run after a run)
    /// then never wakes a thread only to have it park again — on a machine with no more
    /// CPUs than spinning threads that wake-up costs the round trip tens of µs whenever
    /// the kernel places the woken thread on the CPU of the party the caller waits for.
    ///
    /// The loop's thread, left parked ("dormant"), resumes when its park slice ends or
    /// when a producer that hands the loop work calls [`DriverSeat::wake_dormant`] after
    /// publishing it; `handed_over()` must then see that work (it is re-checked after the
    /// caller left, so a hand-over racing the departure is never lost).
    pub fn drive_quiet<R>(
        &self,
        mut done: impl FnMut() -> Option<R>,
        mut turn: impl FnMut(&mut L) -> Turn,
        quiet: impl FnOnce(&mut L) -> bool,
        handed_over: impl Fn() -> bool,
    ) -> Driven<R> {
        self.waker.drivers.fetch_add(1, Ordering::SeqCst);
        let mut leave = Leave {
            seat: self,
            quiet: None,
        };
        // The loop's thread may be finishing a pass: never block on it, it sees the
        // announcement and parks at its next iteration.
        let guard = loop {
            if let Some(r) = done() {
                // Done before this caller drove at all (e.g. a run with nothing to wait
                // for): if the loop is quiet, its thread stays parked as after a drive —
                // unparking it only to park again costs a wake-up per call.
                if let Some(mut g) = self.state.try_lock() {
                    if self.broken().is_none() {
                        if let Some(state) = g.as_mut() {
                            // `quiet` runs loop code: a panic in it breaks the loop, as in
                            // a drive.
                            match catch_unwind(AssertUnwindSafe(|| quiet(state))) {
                                Ok(true) => leave.quiet = Some(&handed_over),
                                Ok(false) => {}
                                Err(p) => return Driven::Broken(self.break_loop(&*p)),
                            }
                        }
                    }
                }
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
        let driven = catch_unwind(AssertUnwindSafe(|| {
            let driven = loop {
                if let Some(r) = done() {
                    break Driven::Done(r);
                }
                match turn(state) {
                    Turn::Again => {}
                    Turn::HandBack => break Driven::HandedBack,
                    Turn::Over => break Driven::Over,
                }
            };
            let quiet = matches!(driven, Driven::Done(_)) && quiet(state);
            (driven, quiet)
        }));
        match driven {
            Ok((d, quiet)) => {
                if quiet {
                    leave.quiet = Some(&handed_over);
                }
                d
            }
            Err(p) => Driven::Broken(self.break_loop(&*p)),
        }
    }

    /// Unparks the loop's thread if the last caller left it dormant (see
    /// [`SeatWaker::wake_dormant`]).
    #[inline]
    pub fn wake_dormant(&self) {
        self.waker.wake_dormant();
    }

    /// The waker, for producers that do not hold the seat.
    pub fn waker(&self) -> Arc<SeatWaker> {
        self.waker.clone()
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

impl SeatWaker {
    fn new() -> Self {
        SeatWaker {
            drivers: AtomicUsize::new(0),
            loop_thread: Mutex::new(None),
        }
    }

    /// Unparks the loop's thread if the last caller left it parked with nothing to do
    /// ([`DriverSeat::drive_quiet`]) and no caller drives now. A producer calls it after
    /// it published work for the loop (the `handed_over` of `drive_quiet` must see it).
    #[inline]
    pub fn wake_dormant(&self) {
        fence(Ordering::SeqCst);
        if self.drivers.load(Ordering::SeqCst) == DORMANT {
            self.wake_if_dormant();
        }
    }

    /// Clears the dormant bit if nobody drives, and then unparks the loop's thread. (With
    /// a driver in the seat the bit stays: that driver decides when it leaves.)
    #[cold]
    fn wake_if_dormant(&self) {
        if self
            .drivers
            .compare_exchange(DORMANT, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            self.unpark_loop_thread();
        }
    }

    fn unpark_loop_thread(&self) {
        if let Some(t) = self.loop_thread.lock().as_ref() {
            t.unpark();
        }
    }
}

/// Leaves the seat (also on unwind) and unparks the loop's thread — unless the caller
/// left the loop quiet (then the loop's thread stays parked, marked dormant, and the
/// hand-over check decides).
struct Leave<'a, 'h, L> {
    seat: &'a DriverSeat<L>,
    /// Set when the loop was left quiet: whether work was handed over since.
    quiet: Option<&'h dyn Fn() -> bool>,
}

impl<L> Drop for Leave<'_, '_, L> {
    fn drop(&mut self) {
        let waker = &self.seat.waker;
        let quiet = self.quiet;
        // The last caller out clears the dormant bit and unparks the loop's thread, or
        // (quiet) sets the bit and leaves it parked. One read-modify-write.
        let before = waker
            .drivers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| {
                let rest = (d & !DORMANT) - 1;
                Some(match (rest, quiet.is_some()) {
                    (0, true) => DORMANT,
                    (0, false) => 0,
                    _ => rest | (d & DORMANT),
                })
            })
            .unwrap_or_else(|d| d);
        if before & !DORMANT != 1 {
            return;
        }
        let Some(handed_over) = quiet else {
            waker.unpark_loop_thread();
            return;
        };
        // A producer that still saw this caller in the seat did not wake the loop's
        // thread: its work is visible here (both sides fence before they look).
        fence(Ordering::SeqCst);
        if handed_over() {
            waker.wake_if_dormant();
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

    #[test]
    fn a_quiet_leave_keeps_the_loop_thread_parked_until_a_hand_over_wakes_it() {
        let seat = Arc::new(DriverSeat::new(0u32));
        let handed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let parks = Arc::new(AtomicU32::new(0));
        let (s2, h2, p2) = (seat.clone(), handed.clone(), parks.clone());
        let t = std::thread::spawn(move || {
            s2.register_loop_thread();
            loop {
                // Parks for an hour while driven: only an unpark ends it.
                if s2.is_driven() {
                    p2.fetch_add(1, Ordering::SeqCst);
                }
                if s2.park_while_driven(std::time::Duration::from_secs(3600)) {
                    continue;
                }
                if h2.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::yield_now();
            }
        });
        // Drive until the loop's thread has parked, then leave quiet. Done only after a
        // turn: a run found done before the caller took the seat leaves it the plain way
        // (the quiet judgement needs the loop's state), which would unpark the thread.
        let turned = std::cell::Cell::new(false);
        let d = seat.drive_quiet(
            || (turned.get() && parks.load(Ordering::SeqCst) > 0).then_some(()),
            |_| {
                turned.set(true);
                std::thread::yield_now();
                Turn::Again
            },
            |_| true,
            || handed.load(Ordering::SeqCst),
        );
        assert_eq!(d, Driven::Done(()));
        assert_eq!(
            seat.waker.drivers.load(Ordering::SeqCst),
            DORMANT,
            "the quiet caller left the loop's thread dormant"
        );
        handed.store(true, Ordering::SeqCst);
        seat.wake_dormant();
        assert_eq!(seat.waker.drivers.load(Ordering::SeqCst), 0, "woken");
        t.join().unwrap();
    }
}
