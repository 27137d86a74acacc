//! Task slots: the per-task record shared by the orchestrator and scheduler threads, and the
//! arena that holds them.
//!
//! A slot's `word` packs the task id with its state, so every state transition is a CAS on
//! `(id, state)`: a stale reference to a recycled slot can never move the new task's state.
//! Reference counts and fan-in counts are packed atomics, so releasing a reference or
//! counting a completed producer takes no lock; the slot mutex guards only the consumer
//! list (against the completion snapshot), the producer list, the failure, the payload and
//! group bookkeeping.

use crate::error::Failure;
use std::fmt;
use std::sync::OnceLock;
use strata_sync::sync::{AtomicBool, AtomicU64, Mutex, Ordering};

/// The lifecycle state of a task slot.
///
/// ```text
/// FREE → BUILDING → PENDING → READY → RUNNING → COMPLETED ─┐
///            │          │        │                          ├→ CONSUMED
///            └──────────┴────────┴──────────→ FAILED ───────┘
/// ```
/// A slot is CONSUMED once it is terminal and every reference on it (its scope, each
/// consumer, itself) has been released; only then are its dependency entries and heap
/// bytes reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TaskState {
    /// Never used.
    Free = 0,
    /// Waiting for producers.
    Pending = 1,
    /// Every producer completed; waiting to be dispatched.
    Ready = 2,
    /// Dispatched.
    Running = 3,
    /// Finished successfully.
    Completed = 4,
    /// Failed, poisoned or cancelled.
    Failed = 5,
    /// Terminal and unreferenced; its resources are reclaimed.
    Consumed = 6,
    /// Being submitted.
    Building = 7,
}

impl TaskState {
    fn from_bits(b: u8) -> TaskState {
        match b {
            1 => TaskState::Pending,
            2 => TaskState::Ready,
            3 => TaskState::Running,
            4 => TaskState::Completed,
            5 => TaskState::Failed,
            6 => TaskState::Consumed,
            7 => TaskState::Building,
            _ => TaskState::Free,
        }
    }

    /// Whether the task finished (successfully or not).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Consumed
        )
    }
}

/// A task's id: unique for the life of its graph, monotonic in submit order, never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub u64);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task#{}", self.0)
    }
}

/// A reference to one task: its slot and its id. Slots are recycled; every use of a
/// `TaskRef` checks that the slot still holds the same task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TaskRef {
    pub(crate) index: u32,
    pub(crate) id: u64,
}

impl TaskRef {
    /// The task's id.
    pub fn id(&self) -> TaskId {
        TaskId(self.id)
    }

    /// The slot index (stable while the task is not consumed; recycled afterwards).
    pub fn slot_index(&self) -> u32 {
        self.index
    }
}

impl fmt::Display for TaskRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task#{}", self.id)
    }
}

/// State of one member of a group task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Not dispatched yet.
    NotDispatched,
    /// Dispatched.
    Running,
    /// Finished successfully.
    Succeeded,
    /// Failed.
    Failed,
    /// Never dispatched because another member failed first.
    Skipped,
}

impl MemberState {
    fn is_terminal(self) -> bool {
        matches!(
            self,
            MemberState::Succeeded | MemberState::Failed | MemberState::Skipped
        )
    }
}

#[derive(Debug, Default)]
pub(crate) struct GroupState {
    pub(crate) members: Vec<MemberState>,
    pub(crate) terminal: usize,
    pub(crate) first_failure: Option<(usize, Failure)>,
}

impl GroupState {
    pub(crate) fn reset(&mut self, size: usize) {
        self.members.clear();
        self.members.resize(size, MemberState::NotDispatched);
        self.terminal = 0;
        self.first_failure = None;
    }

    /// Marks every not-yet-dispatched member skipped.
    pub(crate) fn skip_undispatched(&mut self) {
        for m in &mut self.members {
            if *m == MemberState::NotDispatched {
                *m = MemberState::Skipped;
                self.terminal += 1;
            }
        }
    }

    /// Records a member's outcome; returns false for an out-of-range index or a duplicate
    /// report (already terminal).
    pub(crate) fn record(&mut self, member: usize, outcome: &Result<(), Failure>) -> bool {
        let Some(m) = self.members.get_mut(member) else {
            return false;
        };
        if m.is_terminal() {
            return false;
        }
        match outcome {
            Ok(()) => *m = MemberState::Succeeded,
            Err(f) => {
                *m = MemberState::Failed;
                if self.first_failure.is_none() {
                    self.first_failure = Some((member, f.clone()));
                }
            }
        }
        self.terminal += 1;
        if outcome.is_err() {
            self.skip_undispatched();
        }
        true
    }

    pub(crate) fn all_terminal(&self) -> bool {
        self.terminal >= self.members.len()
    }
}

/// The parts of a slot guarded by its mutex.
#[derive(Debug)]
pub(crate) struct SlotInner<P> {
    /// Consumers to notify when this task completes (only while it has not completed).
    pub(crate) consumers: Vec<TaskRef>,
    /// Producers this task holds a reference on (deduplicated), released exactly once.
    pub(crate) producers: Vec<TaskRef>,
    pub(crate) failure: Option<Failure>,
    pub(crate) payload: Option<P>,
    /// Live producers counted at publication (`None` while building).
    pub(crate) fanin_count: Option<u32>,
    /// Live producers that completed so far.
    pub(crate) fanin_released: u32,
    /// Group bookkeeping (boxed: rare); absent or with no members for a single task.
    pub(crate) group: Option<Box<GroupState>>,
}

impl<P> SlotInner<P> {
    /// The group state of a group task (`None` for a single task).
    pub(crate) fn group_mut(&mut self) -> Option<&mut GroupState> {
        self.group.as_deref_mut().filter(|g| !g.members.is_empty())
    }

    /// Members of a group task (empty for a single task).
    pub(crate) fn members(&self) -> &[MemberState] {
        self.group.as_deref().map_or(&[], |g| &g.members)
    }

    /// Marks undispatched members of a group skipped (no-op for a single task).
    pub(crate) fn skip_undispatched(&mut self) {
        if let Some(g) = self.group_mut() {
            g.skip_undispatched();
        }
    }
}

// Bit layout of `refs`: released references in the low 32 bits, the number of references
// handed out (scope + consumers) in bits 32..62, and a sticky "consumed" bit.
pub(crate) const REFS_CONSUMED: u64 = 1 << 63;
pub(crate) const REFS_TOTAL_ONE: u64 = 1 << 32;
pub(crate) fn refs_released(v: u64) -> u64 {
    v & 0xffff_ffff
}
pub(crate) fn refs_total(v: u64) -> u64 {
    (v >> 32) & 0x7fff_ffff
}

/// One task slot.
pub(crate) struct Slot<P> {
    /// `(id << 8) | state`.
    word: AtomicU64,
    pub(crate) refs: AtomicU64,
    /// "Propagation debt": a failure claimed this slot while it was being built; whoever
    /// clears the flag performs the slot's reference releases.
    pub(crate) debt: AtomicBool,
    /// Caller-defined routing tag, immutable while the task is live.
    pub(crate) route: AtomicU64,
    /// `(run id << 1) | lease slot`.
    pub(crate) run: AtomicU64,
    /// `(ring << 32) | edges` charged to a ring's dependency pool.
    pub(crate) dep_charge: AtomicU64,
    pub(crate) inner: Mutex<SlotInner<P>>,
}

impl<P> fmt::Debug for Slot<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (id, st) = self.load();
        write!(f, "Slot(id {id}, {st:?})")
    }
}

impl<P> Slot<P> {
    fn new() -> Self {
        Slot {
            word: AtomicU64::new(0),
            refs: AtomicU64::new(0),
            debt: AtomicBool::new(false),
            route: AtomicU64::new(0),
            run: AtomicU64::new(0),
            dep_charge: AtomicU64::new(0),
            inner: Mutex::new(SlotInner {
                consumers: Vec::new(),
                producers: Vec::new(),
                failure: None,
                payload: None,
                fanin_count: None,
                fanin_released: 0,
                group: None,
            }),
        }
    }

    /// `(id, state)` with Acquire ordering.
    pub(crate) fn load(&self) -> (u64, TaskState) {
        let w = self.word.load(Ordering::Acquire);
        (w >> 8, TaskState::from_bits(w as u8))
    }

    /// The state if the slot still holds task `id`, else `None` (the task was consumed and
    /// the slot recycled).
    pub(crate) fn state_of(&self, id: u64) -> Option<TaskState> {
        let (cur, st) = self.load();
        (cur == id).then_some(st)
    }

    /// Whether the slot still holds task `id` and it is not consumed.
    pub(crate) fn is_live(&self, id: u64) -> bool {
        matches!(self.state_of(id), Some(s) if s != TaskState::Consumed)
    }

    /// CAS `(id, from)` → `(id, to)`.
    pub(crate) fn transition(&self, id: u64, from: TaskState, to: TaskState) -> bool {
        self.word
            .compare_exchange(
                (id << 8) | from as u64,
                (id << 8) | to as u64,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// Unconditional store of `(id, state)` (used only by the owner of the transition).
    pub(crate) fn store(&self, id: u64, state: TaskState) {
        self.word.store((id << 8) | state as u64, Ordering::Release);
    }

    /// Claims a not-yet-running task as failed: CAS from BUILDING, PENDING or READY to
    /// FAILED. Returns the prior state on success. Only the winner may write the failure.
    pub(crate) fn claim_failure(&self, id: u64) -> Option<TaskState> {
        loop {
            let w = self.word.load(Ordering::Acquire);
            if w >> 8 != id {
                return None;
            }
            let st = TaskState::from_bits(w as u8);
            if !matches!(
                st,
                TaskState::Building | TaskState::Pending | TaskState::Ready
            ) {
                return None;
            }
            if self
                .word
                .compare_exchange(
                    w,
                    (id << 8) | TaskState::Failed as u64,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                return Some(st);
            }
        }
    }

    /// Adds one handed-out reference unless the slot is already consumed.
    pub(crate) fn add_ref(&self) -> bool {
        let mut cur = self.refs.load(Ordering::Acquire);
        loop {
            if cur & REFS_CONSUMED != 0 {
                return false;
            }
            match self.refs.compare_exchange_weak(
                cur,
                cur + REFS_TOTAL_ONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
    }

    /// Releases one reference. Returns true for exactly one caller: the one whose release
    /// makes every handed-out reference plus the self-release come back (then the slot
    /// must be consumed by that caller).
    pub(crate) fn release_ref(&self) -> bool {
        let mut cur = self.refs.load(Ordering::Acquire);
        loop {
            debug_assert!(cur & REFS_CONSUMED == 0, "release after consumption");
            let mut next = cur + 1;
            let done = refs_released(next) > refs_total(next);
            if done {
                next |= REFS_CONSUMED;
            }
            match self
                .refs
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return done,
                Err(v) => cur = v,
            }
        }
    }

    /// Resets the slot for a new task (orchestrator only, on a consumed or never-used slot).
    ///
    /// The new id is stored while the mutex is held, so anyone who checks a slot's identity
    /// under its mutex sees either the old, consumed task or the new one.
    pub(crate) fn reset(&self, id: u64, run_word: u64, route: u64, group_size: usize) {
        let mut inner = self.inner.lock();
        inner.consumers.clear();
        inner.producers.clear();
        inner.failure = None;
        inner.payload = None;
        inner.fanin_count = None;
        inner.fanin_released = 0;
        if group_size > 1 {
            inner
                .group
                .get_or_insert_with(Default::default)
                .reset(group_size);
        } else if let Some(g) = inner.group.as_mut() {
            g.reset(0);
        }
        self.refs.store(0, Ordering::Relaxed);
        self.debt.store(false, Ordering::Relaxed);
        self.route.store(route, Ordering::Relaxed);
        self.run.store(run_word, Ordering::Relaxed);
        self.dep_charge.store(0, Ordering::Relaxed);
        self.store(id, TaskState::Building);
        drop(inner);
    }
}

/// Chunk `k` of the arena holds `BASE_CHUNK << k` slots, so `CHUNKS` chunks address every
/// `u32` index and a small graph allocates only its first chunk.
#[cfg(not(loom))]
const BASE_CHUNK: usize = 256;
#[cfg(loom)]
const BASE_CHUNK: usize = 4;
const CHUNKS: usize = (u32::BITS - BASE_CHUNK.trailing_zeros() + 1) as usize;

fn locate(index: u32) -> (usize, usize) {
    let i = index as usize;
    let k = (usize::BITS - 1 - (i / BASE_CHUNK + 1).leading_zeros()) as usize;
    let base = BASE_CHUNK * ((1usize << k) - 1);
    (k, i - base)
}

/// A growable arena of slots whose addresses never move. Only the orchestrator grows it;
/// any thread may read a slot whose index it was handed.
pub(crate) struct SlotArena<P> {
    chunks: [OnceLock<Box<[Slot<P>]>>; CHUNKS],
}

impl<P> SlotArena<P> {
    pub(crate) fn new() -> Self {
        SlotArena {
            chunks: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// The slot at `index`.
    ///
    /// # Panics
    /// If `index` was never created (an internal invariant: indices come only from
    /// [`SlotArena::ensure`]).
    pub(crate) fn get(&self, index: u32) -> &Slot<P> {
        let (k, off) = locate(index);
        &self.chunks[k].get().expect("slot index was created")[off]
    }

    /// Makes sure slot `index` exists.
    pub(crate) fn ensure(&self, index: u32) {
        let (k, _) = locate(index);
        self.chunks[k].get_or_init(|| (0..(BASE_CHUNK << k)).map(|_| Slot::new()).collect());
    }

    /// Visits every slot that exists, with its index.
    pub(crate) fn for_each(&self, created: u32, mut f: impl FnMut(u32, &Slot<P>)) {
        for i in 0..created {
            f(i, self.get(i));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_is_contiguous() {
        let mut expect = (0usize, 0usize);
        for i in 0..(BASE_CHUNK * 40) as u32 {
            let got = locate(i);
            assert_eq!(got, expect, "index {i}");
            expect.1 += 1;
            if expect.1 == BASE_CHUNK << expect.0 {
                expect = (expect.0 + 1, 0);
            }
        }
        // The largest u32 index is addressable.
        assert!(locate(u32::MAX).0 < CHUNKS);
    }

    #[test]
    fn refcount_consumes_exactly_once_at_the_threshold() {
        let s: Slot<()> = Slot::new();
        s.reset(1, 0, 0, 1);
        assert!(s.add_ref()); // scope
        assert!(s.add_ref()); // consumer
        assert!(!s.release_ref()); // self
        assert!(!s.release_ref()); // scope
        assert!(s.release_ref()); // consumer: 3 released > 2 handed out
        assert!(!s.add_ref(), "no reference can be taken after consumption");
    }

    #[test]
    fn stale_ids_cannot_transition_a_recycled_slot() {
        let s: Slot<()> = Slot::new();
        s.reset(7, 0, 0, 1);
        assert!(s.transition(7, TaskState::Building, TaskState::Ready));
        s.reset(9, 0, 0, 1);
        s.store(9, TaskState::Ready);
        assert!(!s.transition(7, TaskState::Ready, TaskState::Running));
        assert_eq!(s.claim_failure(7), None);
        assert_eq!(s.state_of(9), Some(TaskState::Ready));
        assert_eq!(s.claim_failure(9), Some(TaskState::Ready));
        assert_eq!(s.claim_failure(9), None, "a failure claim is won once");
    }
}
