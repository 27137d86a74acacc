//! Scoped rings: per scope depth (clamped at 3) a heap of byte offsets with FIFO
//! reclamation, an optional task window and an optional dependency pool.
//!
//! The ring owns no memory: it hands out offsets into a heap the caller maps (shared
//! memory at L3, device memory on a chip). Only the orchestrator allocates; reclamation is
//! observed lazily from slot states, so the scheduler never touches ring state except the
//! dependency-pool counters.

use crate::slot::TaskRef;
use std::collections::VecDeque;
use strata_sync::sync::{AtomicU64, Ordering};

/// Number of rings (scope depth ≥ 3 shares the last).
pub const RING_COUNT: usize = 4;

/// Heap allocations are aligned to (and sized in multiples of) this many bytes.
pub const HEAP_ALIGN: u64 = 1024;

/// The ring a scope depth uses: `clamp(depth, 0, 3)`.
///
/// ```
/// use strata_graph::ring_for_depth;
/// assert_eq!([0, 1, 2, 3, 4, 64].map(ring_for_depth), [0, 1, 2, 3, 3, 3]);
/// ```
pub fn ring_for_depth(depth: usize) -> usize {
    depth.min(RING_COUNT - 1)
}

/// Sizing of one ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingConfig {
    /// Heap bytes (0 disables the heap: only zero-byte slots).
    pub heap_bytes: u64,
    /// Maximum live task slots minus one (`None` = unbounded): at most `window − 1` tasks
    /// of this ring are live at once.
    pub task_window: Option<u64>,
    /// Maximum dependency edges held by live tasks of this ring (`None` = unbounded).
    pub dep_pool: Option<u64>,
}

impl Default for RingConfig {
    /// 1 GiB of heap, unbounded window and dependency pool (the host engine's defaults).
    fn default() -> Self {
        RingConfig {
            heap_bytes: 1 << 30,
            task_window: None,
            dep_pool: None,
        }
    }
}

/// A heap slab: ring index, byte offset inside that ring's heap, and aligned length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HeapSlab {
    /// Ring index.
    pub ring: usize,
    /// Offset in bytes from the ring's heap base (1024-aligned).
    pub offset: u64,
    /// Length in bytes (a multiple of 1024; 0 for a slot-only allocation).
    pub len: u64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct FifoEntry {
    pub(crate) task: TaskRef,
    heap_end: u64,
}

/// Orchestrator-owned state of one ring.
#[derive(Debug)]
pub(crate) struct Ring {
    pub(crate) cfg: RingConfig,
    top: u64,
    tail: u64,
    fifo: VecDeque<FifoEntry>,
    /// FIFO length at which [`Ring::advance_lazily`] next sweeps.
    advance_at: usize,
}

/// Why a reservation could not be made right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shortage {
    Window,
    Heap { free: u64 },
}

pub(crate) fn align_up(bytes: u64) -> Option<u64> {
    bytes
        .checked_add(HEAP_ALIGN - 1)
        .map(|b| b & !(HEAP_ALIGN - 1))
}

impl Ring {
    pub(crate) fn new(cfg: RingConfig) -> Self {
        Ring {
            cfg,
            top: 0,
            tail: 0,
            fifo: VecDeque::new(),
            advance_at: 64,
        }
    }

    /// Pops released entries off the front (`released` says whether a task was consumed).
    pub(crate) fn advance(&mut self, released: impl Fn(&TaskRef) -> bool) {
        while let Some(front) = self.fifo.front() {
            if !released(&front.task) {
                break;
            }
            self.tail = front.heap_end;
            self.fifo.pop_front();
        }
        if self.fifo.is_empty() {
            // Nothing live: rebase so the whole heap is one free run.
            self.top = 0;
            self.tail = 0;
        }
    }

    /// Like [`Ring::advance`], but only when the FIFO has grown since the last time (so
    /// the common submit pays a check of the front entry at most, and the FIFO of a ring
    /// that never runs short stays bounded by about twice its live entries).
    pub(crate) fn advance_lazily(&mut self, released: impl Fn(&TaskRef) -> bool) {
        if self.fifo.len() >= self.advance_at {
            self.advance(released);
            self.advance_at = 2 * self.fifo.len() + 64;
        } else if let Some(front) = self.fifo.front() {
            // Cheap: keep the heap tail moving when the oldest task is gone.
            if released(&front.task) {
                self.advance(released);
            }
        }
    }

    pub(crate) fn front(&self) -> Option<TaskRef> {
        self.fifo.front().map(|e| e.task)
    }

    pub(crate) fn live(&self) -> usize {
        self.fifo.len()
    }

    /// Up to `max` tasks of the FIFO, oldest first (for stall snapshots).
    pub(crate) fn holders(&self, max: usize) -> Vec<TaskRef> {
        self.fifo.iter().take(max).map(|e| e.task).collect()
    }

    /// Largest contiguous free run (for messages).
    fn free_bytes(&self) -> u64 {
        let size = self.cfg.heap_bytes;
        if self.fifo.is_empty() {
            size
        } else if self.top >= self.tail {
            (size - self.top).max(self.tail.saturating_sub(1))
        } else {
            (self.tail - self.top).saturating_sub(1)
        }
    }

    /// Tries to place `aligned` bytes (already aligned, ≤ heap size); returns the offset.
    fn try_bump(&self, aligned: u64) -> Option<u64> {
        if aligned == 0 {
            return Some(self.top);
        }
        let size = self.cfg.heap_bytes;
        if self.fifo.is_empty() {
            return (aligned <= size).then_some(0);
        }
        if self.top >= self.tail {
            if self.top + aligned <= size {
                return Some(self.top);
            }
            // Wrap to 0 only if that leaves a gap before the tail (keeps full ≠ empty).
            if aligned < self.tail {
                return Some(0);
            }
            None
        } else if self.tail - self.top > aligned {
            Some(self.top)
        } else {
            None
        }
    }

    /// Checks whether a slot with `aligned` heap bytes fits now.
    pub(crate) fn check(&self, aligned: u64) -> Result<u64, Shortage> {
        if let Some(w) = self.cfg.task_window {
            if self.fifo.len() as u64 + 1 >= w {
                return Err(Shortage::Window);
            }
        }
        self.try_bump(aligned).ok_or(Shortage::Heap {
            free: self.free_bytes(),
        })
    }

    /// Commits a reservation found by [`Ring::check`].
    pub(crate) fn commit(&mut self, task: TaskRef, offset: u64, aligned: u64) {
        let end = offset + aligned;
        if self.fifo.is_empty() {
            self.tail = offset;
        }
        self.top = end;
        self.fifo.push_back(FifoEntry {
            task,
            heap_end: end,
        });
    }

    #[cfg(test)]
    pub(crate) fn cursors(&self) -> (u64, u64) {
        (self.top, self.tail)
    }
}

/// Dependency-pool usage of every ring (shared: the scheduler returns edges).
#[derive(Debug, Default)]
pub(crate) struct DepPools {
    used: [AtomicU64; RING_COUNT],
}

impl DepPools {
    pub(crate) fn used(&self, ring: usize) -> u64 {
        self.used[ring].load(Ordering::Acquire)
    }
    pub(crate) fn charge(&self, ring: usize, edges: u64) {
        self.used[ring].fetch_add(edges, Ordering::AcqRel);
    }
    pub(crate) fn refund(&self, ring: usize, edges: u64) {
        self.used[ring].fetch_sub(edges, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    //! Ports of the reference's ring cases (test_ring.cpp) at the level of this module;
    //! the blocking and deadlock cases run through the orchestrator (tests in lib).
    use super::*;

    fn t(i: u32) -> TaskRef {
        TaskRef {
            index: i,
            id: i as u64 + 1,
        }
    }

    fn heap(kib: u64) -> Ring {
        Ring::new(RingConfig {
            heap_bytes: kib * 1024,
            task_window: None,
            dep_pool: None,
        })
    }

    #[test]
    fn heap_slabs_are_aligned_and_distinct() {
        let mut r = heap(8);
        let a = align_up(100).unwrap();
        assert_eq!(a, 1024);
        let o1 = r.check(a).unwrap();
        r.commit(t(0), o1, a);
        let o2 = r.check(a).unwrap();
        r.commit(t(1), o2, a);
        assert_eq!((o1, o2), (0, 1024));
    }

    #[test]
    fn heap_reclamation_is_fifo_and_wraps_when_tail_leads_top() {
        let mut r = heap(4);
        for i in 0..4 {
            let o = r.check(1024).unwrap();
            r.commit(t(i), o, 1024);
        }
        assert!(r.check(1024).is_err(), "full");
        // Releasing slot 2 alone frees nothing (FIFO).
        r.advance(|x| x.index == 2);
        assert!(r.check(1024).is_err());
        // Releasing 0 and 1 frees the first two slabs; the next slab wraps to offset 0.
        r.advance(|x| x.index <= 2);
        assert_eq!(r.cursors(), (4096, 3072));
        assert_eq!(r.check(1024).unwrap(), 0);
    }

    #[test]
    fn one_slab_gap_keeps_full_distinguishable_from_empty() {
        let mut r = heap(2);
        for i in 0..2 {
            let o = r.check(1024).unwrap();
            r.commit(t(i), o, 1024);
        }
        r.advance(|x| x.index == 0);
        // tail = 1024, top = 2048: wrapping needs tail > request strictly.
        assert!(r.check(1024).is_err());
        r.advance(|_| true);
        assert_eq!(
            r.check(2048).unwrap(),
            0,
            "an empty ring rebases to offset 0"
        );
    }

    #[test]
    fn window_keeps_one_slot_free() {
        let mut r = Ring::new(RingConfig {
            heap_bytes: 0,
            task_window: Some(4),
            dep_pool: None,
        });
        for i in 0..3 {
            let o = r.check(0).unwrap();
            r.commit(t(i), o, 0);
        }
        assert_eq!(r.check(0), Err(Shortage::Window));
        r.advance(|x| x.index == 0);
        assert!(r.check(0).is_ok());
        assert_eq!(r.live(), 2);
    }

    #[test]
    fn inner_ring_reclaims_while_outer_holds() {
        let mut outer = heap(8);
        let o = outer.check(1024).unwrap();
        outer.commit(t(0), o, 1024);
        let mut inner = heap(8);
        for i in 0..8 {
            let o = inner.check(1024).unwrap();
            inner.commit(t(10 + i), o, 1024);
            inner.advance(|_| true);
        }
        assert_eq!(outer.cursors(), (1024, 0));
        let (top, tail) = inner.cursors();
        assert_eq!(top, tail);
    }
}
