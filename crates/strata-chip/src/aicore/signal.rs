//! Where a kernel blocked in a signal wait says what it waits on ([`SignalNote`]), so a
//! stall snapshot can show the cell, the condition and the value instead of only "the
//! kernel made no progress". One slot per core, written only by that core's kernel, read
//! by the scheduler when it gives up on a run: plain relaxed stores, no lock, and nothing
//! at all for a wait whose condition already holds.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

/// The comparisons a note can name, by index.
const CMP_SYMBOLS: [&str; 6] = ["==", "!=", ">=", ">", "<=", "<"];

const IDLE: u32 = 0;
const WAITING: u32 = 1;
const GAVE_UP: u32 = 2;

/// A core's signal-wait slot.
#[derive(Debug, Default)]
pub(crate) struct SignalSlot {
    /// The dispatch (its sequence number on the core) whose kernel wrote the note: a note
    /// left by an earlier kernel is never attributed to a later one.
    seq: AtomicU64,
    state: AtomicU32,
    rank: AtomicU32,
    cell: AtomicU64,
    cmp: AtomicU32,
    expected: AtomicI32,
    value: AtomicI32,
}

/// What a slot held for one dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SignalNoteView {
    pub(crate) rank: u32,
    pub(crate) cell: u64,
    pub(crate) cmp: &'static str,
    pub(crate) expected: i32,
    pub(crate) value: i32,
    pub(crate) gave_up: bool,
}

impl SignalSlot {
    /// The note of dispatch `seq`, if its kernel is waiting (or gave up waiting).
    pub(crate) fn read(&self, seq: u64) -> Option<SignalNoteView> {
        let state = self.state.load(Ordering::Acquire);
        if state == IDLE || self.seq.load(Ordering::Relaxed) != seq {
            return None;
        }
        Some(SignalNoteView {
            rank: self.rank.load(Ordering::Relaxed),
            cell: self.cell.load(Ordering::Relaxed),
            cmp: CMP_SYMBOLS
                .get(self.cmp.load(Ordering::Relaxed) as usize)
                .copied()
                .unwrap_or("?"),
            expected: self.expected.load(Ordering::Relaxed),
            value: self.value.load(Ordering::Relaxed),
            gave_up: state == GAVE_UP,
        })
    }
}

/// A kernel's handle on its core's signal-wait slot ([`crate::KernelCtx::signal_note`]):
/// a signal wait (strata-comm's `Window::wait`) calls [`SignalNote::waiting`] before it
/// blocks, [`SignalNote::seen`] as it re-reads the cell, and [`SignalNote::done`] or
/// [`SignalNote::gave_up`] when it returns. If the run stalls, the chip's error carries
/// the note ([`strata_types::SignalWait`]).
#[derive(Debug, Clone, Copy)]
pub struct SignalNote<'a> {
    slot: &'a SignalSlot,
    seq: u64,
}

impl<'a> SignalNote<'a> {
    pub(crate) fn new(slot: &'a SignalSlot, seq: u64) -> Self {
        SignalNote { slot, seq }
    }

    /// The kernel is about to block until cell `cell` (flat element index) of world rank
    /// `rank`'s signal tensor satisfies `value <cmp> expected` (`cmp` one of `"=="`,
    /// `"!="`, `">="`, `">"`, `"<="`, `"<"`); `value` is what it read.
    pub fn waiting(&self, rank: u32, cell: u64, cmp: &str, expected: i32, value: i32) {
        let s = self.slot;
        let cmp = CMP_SYMBOLS
            .iter()
            .position(|&c| c == cmp)
            .unwrap_or(CMP_SYMBOLS.len());
        s.state.store(IDLE, Ordering::Relaxed);
        s.seq.store(self.seq, Ordering::Relaxed);
        s.rank.store(rank, Ordering::Relaxed);
        s.cell.store(cell, Ordering::Relaxed);
        s.cmp.store(cmp as u32, Ordering::Relaxed);
        s.expected.store(expected, Ordering::Relaxed);
        s.value.store(value, Ordering::Relaxed);
        s.state.store(WAITING, Ordering::Release);
    }

    /// The cell's value, read again while waiting.
    #[inline]
    pub fn seen(&self, value: i32) {
        self.slot.value.store(value, Ordering::Relaxed);
    }

    /// The wait ended (its condition held).
    #[inline]
    pub fn done(&self) {
        self.slot.state.store(IDLE, Ordering::Relaxed);
    }

    /// The wait gave up at its own deadline, last seeing `value`: the note stays, so the
    /// failure of the kernel shows what it waited for.
    pub fn gave_up(&self, value: i32) {
        self.slot.value.store(value, Ordering::Relaxed);
        self.slot.state.store(GAVE_UP, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_read_only_for_its_own_dispatch_and_while_set() {
        let slot = SignalSlot::default();
        assert_eq!(slot.read(1), None);
        let n = SignalNote::new(&slot, 7);
        n.waiting(2, 5, ">=", 1, 0);
        let v = slot.read(7).unwrap();
        assert_eq!(
            (v.rank, v.cell, v.cmp, v.expected, v.value),
            (2, 5, ">=", 1, 0)
        );
        assert!(!v.gave_up);
        assert_eq!(slot.read(8), None);
        n.seen(-3);
        assert_eq!(slot.read(7).unwrap().value, -3);
        n.gave_up(-4);
        let v = slot.read(7).unwrap();
        assert!(v.gave_up && v.value == -4);
        n.done();
        assert_eq!(slot.read(7), None);
        SignalNote::new(&slot, 9).waiting(0, 0, "~", 0, 0);
        assert_eq!(slot.read(9).unwrap().cmp, "?");
    }
}
