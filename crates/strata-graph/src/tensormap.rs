//! The TensorMap: per buffer key, the live writers and readers of the building run with
//! their footprints, from which submit infers read-after-write, write-after-write and
//! write-after-read edges.
//!
//! Owned by the orchestrator thread alone (no lock). Each key maps to a *head* holding two
//! intrusive lists (writers, readers) of nodes in one slab, so recording an access
//! allocates nothing in the steady state and a submit hashes each key once.
//!
//! Runs never see each other's entries: a node carries its run, and nodes of any other
//! run are dead to a lookup (only one run is built at a time, and a run's graph is closed
//! before the next begins). Heads are keyed by buffer alone so that a buffer used run
//! after run keeps its head.
//!
//! Entries of consumed tasks are retired through the task's journal of `(node, generation)`
//! pairs: the node is marked dead without touching the task's slot, and a head's lists are
//! compacted once half their nodes are dead; reader lists are also compacted when they
//! double. Lookups drop the dead nodes they meet. So lookups stay proportional to the live
//! entries and wide fan-outs stay linear.

use crate::access::{Access, BufferKey, FxHashMap};
use crate::footprint::{Footprint, Overlap};
use crate::slot::TaskRef;

const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Node {
    fp: Footprint,
    task: TaskRef,
    run: u64,
    head: u32,
    gen: u32,
    next: u32,
    dead: bool,
}

#[derive(Debug, Clone, Copy)]
struct List {
    first: u32,
    last: u32,
    len: u32,
}

impl List {
    const EMPTY: List = List {
        first: NIL,
        last: NIL,
        len: 0,
    };
}

/// A runtime-allocated buffer: its run and its allocator. The record outlives the
/// allocator (until the run is forgotten), so a use after the memory was reclaimed is
/// reported instead of silently reading reclaimed memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owned {
    run: u64,
    allocator: TaskRef,
}

#[derive(Debug)]
struct Head {
    key: BufferKey,
    in_use: bool,
    writers: List,
    readers: List,
    /// Nodes marked dead since the last compaction.
    dead: u32,
    /// Reader-list length at which the next compaction runs.
    compact_readers_at: u32,
    owned: Option<Owned>,
    /// The last run that looked this key up.
    last_run: u64,
    /// Empty since its last lookup.
    idle: bool,
    /// Present in `TensorMap::idle` (at most once).
    listed: bool,
}

/// A journal entry: a node this task recorded, and the node's generation then.
pub(crate) type JournalEntry = u64;

fn journal(node: u32, gen: u32) -> JournalEntry {
    ((gen as u64) << 32) | node as u64
}

#[derive(Debug, Default)]
pub(crate) struct TensorMap {
    map: FxHashMap<BufferKey, u32>,
    heads: Vec<Head>,
    free_heads: Vec<u32>,
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    /// Heads carrying an allocator record, per run (cleared when the run is forgotten).
    owned_heads: FxHashMap<u64, Vec<u32>>,
    /// Heads that became empty. A buffer used run after run keeps its head; heads left
    /// unused for two runs are freed by [`TensorMap::sweep`].
    idle: Vec<u32>,
}

impl TensorMap {
    /// The head of `key` as looked up by `run`, created if `create`.
    pub(crate) fn head(&mut self, key: BufferKey, run: u64, create: bool) -> Option<u32> {
        if let Some(&h) = self.map.get(&key) {
            let head = &mut self.heads[h as usize];
            // Write only on change: most lookups leave the line clean.
            if head.last_run != run {
                head.last_run = run;
            }
            if head.idle {
                head.idle = false;
            }
            return Some(h);
        }
        if !create {
            return None;
        }
        let head = Head {
            key,
            in_use: true,
            writers: List::EMPTY,
            readers: List::EMPTY,
            dead: 0,
            compact_readers_at: 16,
            owned: None,
            last_run: run,
            idle: false,
            listed: false,
        };
        let h = match self.free_heads.pop() {
            Some(h) => {
                self.heads[h as usize] = head;
                h
            }
            None => {
                self.heads.push(head);
                (self.heads.len() - 1) as u32
            }
        };
        self.map.insert(key, h);
        Some(h)
    }

    fn alloc_node(&mut self, fp: Footprint, task: TaskRef, run: u64, head: u32) -> (u32, u32) {
        match self.free_nodes.pop() {
            Some(n) => {
                let node = &mut self.nodes[n as usize];
                let gen = node.gen.wrapping_add(1);
                *node = Node {
                    fp,
                    task,
                    run,
                    head,
                    gen,
                    next: NIL,
                    dead: false,
                };
                (n, gen)
            }
            None => {
                self.nodes.push(Node {
                    fp,
                    task,
                    run,
                    head,
                    gen: 0,
                    next: NIL,
                    dead: false,
                });
                ((self.nodes.len() - 1) as u32, 0)
            }
        }
    }

    fn append(&mut self, list: List, n: u32) -> List {
        let mut l = list;
        if l.last == NIL {
            l.first = n;
        } else {
            self.nodes[l.last as usize].next = n;
        }
        l.last = n;
        l.len += 1;
        l
    }

    /// Walks `list`, unlinking and freeing every node for which `drop_node` says so (and
    /// counting how many of the dropped nodes were marked dead). Kept nodes are not written.
    fn filter(&mut self, list: List, mut drop_node: impl FnMut(&Node) -> bool) -> (List, u32) {
        let mut l = list;
        let mut prev = NIL;
        let mut n = l.first;
        let mut dead_dropped = 0;
        while n != NIL {
            let node = &self.nodes[n as usize];
            let next = node.next;
            if drop_node(node) {
                dead_dropped += node.dead as u32;
                if prev == NIL {
                    l.first = next;
                } else {
                    self.nodes[prev as usize].next = next;
                }
                if l.last == n {
                    l.last = prev;
                }
                l.len -= 1;
                // Drop any shared lattice now; bump the generation so journal entries of
                // the node's task no longer match it.
                let node = &mut self.nodes[n as usize];
                node.fp = Footprint::WHOLE;
                node.gen = node.gen.wrapping_add(1);
                self.free_nodes.push(n);
            } else {
                prev = n;
            }
            n = next;
        }
        (l, dead_dropped)
    }

    /// Filters both lists of `head` with `drop_node`.
    fn filter_head(&mut self, head: u32, both: bool, mut drop_node: impl FnMut(&Node) -> bool) {
        let h = &self.heads[head as usize];
        let (writers, readers) = (h.writers, h.readers);
        let (writers, d1) = self.filter(writers, &mut drop_node);
        let (readers, d2) = if both {
            self.filter(readers, &mut drop_node)
        } else {
            (readers, 0)
        };
        let h = &mut self.heads[head as usize];
        h.writers = writers;
        h.readers = readers;
        h.dead -= d1 + d2;
    }

    /// Calls `found` for every live entry of `run` the access must wait for: writers
    /// overlapping a read; writers and readers overlapping a write. Drops the nodes of
    /// other runs and the dead nodes it meets.
    pub(crate) fn collect(
        &mut self,
        head: u32,
        run: u64,
        a: &Access,
        live: &impl Fn(&TaskRef) -> bool,
        mut found: impl FnMut(TaskRef),
    ) {
        if !a.tag.tracked() {
            return;
        }
        self.filter_head(head, a.tag.writes(), |node| {
            if node.dead || node.run != run {
                return true;
            }
            if a.footprint.overlap(&node.fp) == Overlap::None {
                return false;
            }
            if live(&node.task) {
                found(node.task);
                false
            } else {
                true
            }
        });
    }

    /// Records the access of `task` in `run`: a write supersedes the entries it covers
    /// and becomes a writer; a read becomes a reader. Returns the journal entry of the
    /// node it added, if any.
    pub(crate) fn record(
        &mut self,
        head: u32,
        run: u64,
        a: &Access,
        task: TaskRef,
        live: &impl Fn(&TaskRef) -> bool,
    ) -> Option<JournalEntry> {
        if !a.tag.tracked() {
            return None;
        }
        if a.tag.writes() {
            self.filter_head(head, true, |n| {
                n.dead || n.run != run || a.footprint.overlap(&n.fp) == Overlap::Covered
            });
            let (n, gen) = self.alloc_node(a.footprint.clone(), task, run, head);
            let writers = self.heads[head as usize].writers;
            let writers = self.append(writers, n);
            self.heads[head as usize].writers = writers;
            Some(journal(n, gen))
        } else {
            let readers = self.heads[head as usize].readers;
            if readers.last != NIL {
                let last = &self.nodes[readers.last as usize];
                if last.task == task && last.fp == a.footprint {
                    return None;
                }
            }
            let (n, gen) = self.alloc_node(a.footprint.clone(), task, run, head);
            let readers = self.append(readers, n);
            self.heads[head as usize].readers = readers;
            if readers.len >= self.heads[head as usize].compact_readers_at {
                let (readers, dead) =
                    self.filter(readers, |n| n.dead || n.run != run || !live(&n.task));
                let h = &mut self.heads[head as usize];
                h.readers = readers;
                h.dead -= dead;
                h.compact_readers_at = 2 * readers.len + 16;
            }
            Some(journal(n, gen))
        }
    }

    /// Retires a journal entry of a consumed task: marks its node dead if it still holds
    /// that entry, compacts the head once half its nodes are dead, and frees a head left
    /// empty.
    pub(crate) fn retire(&mut self, entry: JournalEntry) {
        let (n, gen) = (entry as u32, (entry >> 32) as u32);
        let Some(node) = self.nodes.get_mut(n as usize) else {
            return;
        };
        if node.gen != gen || node.dead {
            return;
        }
        node.dead = true;
        let head = node.head;
        let h = &mut self.heads[head as usize];
        h.dead += 1;
        if 2 * h.dead < h.writers.len + h.readers.len {
            return;
        }
        self.filter_head(head, true, |n| n.dead);
        let h = &mut self.heads[head as usize];
        h.compact_readers_at = 2 * h.readers.len + 16;
        self.note_if_idle(head);
    }

    fn is_empty(h: &Head) -> bool {
        h.in_use && h.writers.len == 0 && h.readers.len == 0 && h.owned.is_none()
    }

    fn note_if_idle(&mut self, head: u32) {
        let h = &mut self.heads[head as usize];
        if Self::is_empty(h) {
            h.idle = true;
            if !h.listed {
                h.listed = true;
                self.idle.push(head);
            }
        }
    }

    /// Frees heads that are empty and were not looked up by the current or the previous
    /// run; call it when a run begins.
    pub(crate) fn sweep(&mut self, current_run: u64) {
        if self.idle.len() < 1024 {
            return;
        }
        let mut idle = std::mem::take(&mut self.idle);
        idle.retain(|&head| {
            let h = &mut self.heads[head as usize];
            if !h.idle || !Self::is_empty(h) {
                h.listed = false;
                return false;
            }
            if h.last_run + 1 >= current_run {
                return true;
            }
            h.idle = false;
            h.listed = false;
            h.in_use = false;
            self.map.remove(&h.key);
            self.free_heads.push(head);
            false
        });
        self.idle = idle;
    }

    /// Registers `task` of `run` as the allocator of runtime-owned buffer `head`, with a
    /// whole-buffer writer entry so any later access of the buffer depends on it. Returns
    /// the journal entry of that writer.
    pub(crate) fn register_owned(&mut self, head: u32, run: u64, task: TaskRef) -> JournalEntry {
        self.filter_head(head, true, |n| n.dead || n.run != run);
        let (n, gen) = self.alloc_node(Footprint::WHOLE, task, run, head);
        let writers = self.heads[head as usize].writers;
        let writers = self.append(writers, n);
        let h = &mut self.heads[head as usize];
        h.writers = writers;
        if h.owned.is_none() {
            self.owned_heads.entry(run).or_default().push(head);
        }
        self.heads[head as usize].owned = Some(Owned {
            run,
            allocator: task,
        });
        journal(n, gen)
    }

    /// The allocator of runtime-owned buffer `head` in `run` (which may since have been
    /// consumed: check its liveness), or `None` for any other buffer.
    pub(crate) fn owner(&self, head: u32, run: u64) -> Option<TaskRef> {
        match self.heads[head as usize].owned {
            Some(o) if o.run == run => Some(o.allocator),
            _ => None,
        }
    }

    /// Forgets the allocator records of a run whose tasks are all consumed.
    pub(crate) fn forget_run(&mut self, run: u64) {
        for head in self.owned_heads.remove(&run).unwrap_or_default() {
            let h = &mut self.heads[head as usize];
            if h.owned.is_some_and(|o| o.run == run) {
                h.owned = None;
                self.note_if_idle(head);
            }
        }
    }

    fn list_tasks(
        &self,
        list: List,
        run: Option<u64>,
        live: &impl Fn(&TaskRef) -> bool,
    ) -> Vec<TaskRef> {
        let mut v = vec![];
        let mut n = list.first;
        while n != NIL {
            let node = &self.nodes[n as usize];
            if !node.dead && run.is_none_or(|r| node.run == r) && live(&node.task) {
                v.push(node.task);
            }
            n = node.next;
        }
        v
    }

    /// Live entries across all keys and runs (diagnostics and tests).
    pub(crate) fn live_entries(&self, live: &impl Fn(&TaskRef) -> bool) -> usize {
        self.heads
            .iter()
            .filter(|h| h.in_use)
            .map(|h| {
                self.list_tasks(h.writers, None, live).len()
                    + self.list_tasks(h.readers, None, live).len()
            })
            .sum()
    }

    /// Live writers of `key` in `run`, in insertion order (tests and diagnostics).
    pub(crate) fn writers(
        &self,
        run: u64,
        key: &BufferKey,
        live: &impl Fn(&TaskRef) -> bool,
    ) -> Vec<TaskRef> {
        match self.map.get(key) {
            Some(&h) => self.list_tasks(self.heads[h as usize].writers, Some(run), live),
            None => vec![],
        }
    }

    /// Heads listed as idle (tests).
    #[cfg(test)]
    pub(crate) fn idle_listed(&self) -> usize {
        self.idle.len()
    }

    /// Number of keys with a head.
    #[cfg(test)]
    pub(crate) fn key_count(&self) -> usize {
        self.map.len()
    }

    /// Length of the reader list of `key` including dead entries (tests).
    #[cfg(test)]
    pub(crate) fn reader_list_len(&self, key: &BufferKey) -> usize {
        self.map
            .get(key)
            .map_or(0, |&h| self.heads[h as usize].readers.len as usize)
    }
}

#[cfg(test)]
mod tests {
    //! Ports of the reference's TensorMap cases (test_tensormap.cpp). The reference
    //! tracks writers only; here every case is checked for writers (the reference's
    //! semantics) plus the reader tracking strata adds.
    use super::*;
    use crate::access::KeySpace;
    use std::cell::RefCell;
    use std::collections::{HashMap, HashSet};
    use strata_types::{ArgTag, DataType, IdentityMinter, TensorView};

    const RUN1: u64 = 1;
    const RUN2: u64 = 2;

    /// A map plus the bookkeeping the orchestrator does around it: liveness of tasks and
    /// each task's journal.
    struct Fixture {
        minter: IdentityMinter,
        dead: RefCell<HashSet<u32>>,
        journal: RefCell<HashMap<u32, Vec<JournalEntry>>>,
        m: RefCell<TensorMap>,
    }

    fn t(i: u32) -> TaskRef {
        TaskRef {
            index: i,
            id: i as u64 + 100,
        }
    }

    impl Fixture {
        fn new() -> Self {
            Fixture {
                minter: IdentityMinter::new(),
                dead: Default::default(),
                journal: Default::default(),
                m: Default::default(),
            }
        }
        fn key(&self) -> BufferKey {
            BufferKey::new(self.minter.mint(), KeySpace::Host)
        }
        /// Consumes task `i`: it is no longer live and its journal is retired.
        fn kill(&self, i: u32) {
            self.dead.borrow_mut().insert(i);
            for e in self.journal.borrow_mut().remove(&i).unwrap_or_default() {
                self.m.borrow_mut().retire(e);
            }
        }
        fn access(&self, run: u64, key: BufferKey, fp: Footprint, tag: ArgTag, task: u32) {
            let dead = self.dead.borrow();
            let live = |t: &TaskRef| !dead.contains(&t.index);
            let mut m = self.m.borrow_mut();
            let h = m.head(key, run, true).unwrap();
            if let Some(e) = m.record(h, run, &Access::new(key, fp, tag), t(task), &live) {
                self.journal.borrow_mut().entry(task).or_default().push(e);
            }
        }
        fn write(&self, run: u64, key: BufferKey, fp: Footprint, task: u32) {
            self.access(run, key, fp, ArgTag::OutputExisting, task)
        }
        fn deps(&self, run: u64, key: BufferKey, fp: Footprint, tag: ArgTag) -> Vec<u32> {
            let dead = self.dead.borrow();
            let live = |t: &TaskRef| !dead.contains(&t.index);
            let mut m = self.m.borrow_mut();
            let mut v = vec![];
            if let Some(h) = m.head(key, run, false) {
                m.collect(h, run, &Access::new(key, fp, tag), &live, |x| {
                    v.push(x.index)
                });
            }
            v
        }
        fn reads(&self, run: u64, key: BufferKey, fp: Footprint) -> Vec<u32> {
            self.deps(run, key, fp, ArgTag::Input)
        }
        fn writes(&self, run: u64, key: BufferKey, fp: Footprint) -> Vec<u32> {
            self.deps(run, key, fp, ArgTag::OutputExisting)
        }
        fn live_entries(&self, _run: u64) -> usize {
            let dead = self.dead.borrow();
            self.m
                .borrow()
                .live_entries(&|t: &TaskRef| !dead.contains(&t.index))
        }
    }

    fn br(b: u64, e: u64) -> Footprint {
        Footprint::of_view(
            &TensorView::contiguous(DataType::U8, &[4096])
                .unwrap()
                .slice(0, b, e)
                .unwrap(),
        )
    }

    fn tile(r0: u64, rows: u64, c0: u64, cols: u64) -> Footprint {
        Footprint::of_view(
            &TensorView::contiguous(DataType::U8, &[16, 16])
                .unwrap()
                .window(&[r0, c0], &[rows, cols])
                .unwrap(),
        )
    }

    #[test]
    fn lookup_on_empty_map_finds_nothing() {
        let f = Fixture::new();
        assert!(f.reads(RUN1, f.key(), Footprint::WHOLE).is_empty());
    }

    #[test]
    fn insert_lookup_and_overwrite() {
        let f = Fixture::new();
        let (k, other) = (f.key(), f.key());
        f.write(RUN1, k, Footprint::WHOLE, 5);
        assert_eq!(f.reads(RUN1, k, Footprint::WHOLE), vec![5]);
        assert!(f.reads(RUN1, other, Footprint::WHOLE).is_empty());
        f.write(RUN1, k, Footprint::WHOLE, 7);
        assert_eq!(f.live_entries(RUN1), 1);
        assert_eq!(f.reads(RUN1, k, Footprint::WHOLE), vec![7]);
    }

    #[test]
    fn many_keys_and_namespaces_are_distinct() {
        let f = Fixture::new();
        let keys: Vec<_> = (0..100).map(|_| f.key()).collect();
        for (i, k) in keys.iter().enumerate() {
            f.write(RUN1, *k, Footprint::WHOLE, i as u32);
        }
        assert_eq!(f.live_entries(RUN1), 100);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(f.reads(RUN1, *k, Footprint::WHOLE), vec![i as u32]);
        }
        // Same identity in two device spaces and on the host are distinct keys.
        let id = f.minter.mint();
        let c0 = BufferKey::new(id, KeySpace::Device(0));
        let c1 = BufferKey::new(id, KeySpace::Device(1));
        let h = BufferKey::new(id, KeySpace::Host);
        f.write(RUN1, c0, Footprint::WHOLE, 110);
        f.write(RUN1, c1, Footprint::WHOLE, 120);
        f.write(RUN1, h, Footprint::WHOLE, 130);
        assert_eq!(f.reads(RUN1, c0, Footprint::WHOLE), vec![110]);
        assert_eq!(f.reads(RUN1, c1, Footprint::WHOLE), vec![120]);
        assert_eq!(f.reads(RUN1, h, Footprint::WHOLE), vec![130]);
    }

    #[test]
    fn runs_never_see_each_others_entries() {
        let f = Fixture::new();
        let k = f.key();
        f.write(RUN1, k, Footprint::WHOLE, 5);
        assert!(f.reads(RUN2, k, Footprint::WHOLE).is_empty());
        f.write(RUN2, k, Footprint::WHOLE, 9);
        assert_eq!(f.reads(RUN2, k, Footprint::WHOLE), vec![9]);
        assert_eq!(
            f.live_entries(RUN1),
            1,
            "run 2's write dropped run 1's entry"
        );
    }

    #[test]
    fn erase_keeps_newer_same_run_producer_and_frees_empty_keys() {
        let f = Fixture::new();
        let k = f.key();
        f.write(RUN1, k, br(0, 64), 3);
        f.write(RUN1, k, br(0, 128), 7); // covers 3
        f.kill(3);
        assert_eq!(f.reads(RUN1, k, Footprint::WHOLE), vec![7]);
        f.kill(7);
        // The empty key stays for a run in case it is used again, then is swept.
        assert_eq!(f.m.borrow().key_count(), 1);
        let filler: Vec<_> = (0..2000).map(|_| f.key()).collect();
        for (i, k) in filler.iter().enumerate() {
            f.write(RUN1, *k, Footprint::WHOLE, 1000 + i as u32);
            f.kill(1000 + i as u32);
        }
        f.m.borrow_mut().sweep(RUN1 + 1);
        assert_eq!(
            f.m.borrow().key_count(),
            2001,
            "used by the previous run: kept"
        );
        f.m.borrow_mut().sweep(RUN1 + 2);
        assert_eq!(f.m.borrow().key_count(), 0, "unused for two runs: freed");
        assert_eq!(f.m.borrow().idle_listed(), 0);
    }

    #[test]
    fn a_key_emptied_run_after_run_is_listed_idle_once() {
        let f = Fixture::new();
        let k = f.key();
        for run in 1..=50u64 {
            f.write(run, k, Footprint::WHOLE, run as u32);
            f.kill(run as u32);
        }
        assert_eq!(f.m.borrow().idle_listed(), 1);
    }

    #[test]
    fn ranges_under_one_key() {
        let f = Fixture::new();
        let k = f.key();
        f.write(RUN1, k, br(0, 64), 1);
        f.write(RUN1, k, br(64, 128), 2);
        assert_eq!(f.live_entries(RUN1), 2);
        assert_eq!(f.reads(RUN1, k, br(0, 64)), vec![1]);
        assert_eq!(f.reads(RUN1, k, br(64, 128)), vec![2]);
        assert_eq!(f.reads(RUN1, k, Footprint::WHOLE), vec![1, 2]);
        assert_eq!(f.reads(RUN1, k, br(32, 96)), vec![1, 2]);
        assert_eq!(f.reads(RUN1, k, br(8, 16)), vec![1]);
        assert!(
            f.reads(RUN1, k, br(128, 256)).is_empty(),
            "touching ranges do not overlap"
        );
        // A covering write supersedes both.
        f.write(RUN1, k, br(0, 128), 3);
        assert_eq!(f.reads(RUN1, k, Footprint::WHOLE), vec![3]);
    }

    #[test]
    fn partially_covered_producer_survives_for_its_own_bytes() {
        let f = Fixture::new();
        let k = f.key();
        f.write(RUN1, k, br(0, 128), 1);
        f.write(RUN1, k, br(0, 64), 2);
        assert_eq!(f.live_entries(RUN1), 2);
        assert_eq!(f.reads(RUN1, k, br(64, 128)), vec![1]);
        assert_eq!(f.reads(RUN1, k, br(0, 64)), vec![1, 2]);
    }

    #[test]
    fn erase_drops_every_range_a_task_still_owns() {
        let f = Fixture::new();
        let k = f.key();
        f.write(RUN1, k, br(0, 32), 1);
        f.write(RUN1, k, br(64, 96), 1);
        f.write(RUN1, k, br(128, 160), 2);
        f.kill(1);
        assert_eq!(f.live_entries(RUN1), 1);
        assert_eq!(f.reads(RUN1, k, Footprint::WHOLE), vec![2]);
    }

    #[test]
    fn whole_backing_write_supersedes_every_range() {
        let f = Fixture::new();
        let k = f.key();
        f.write(RUN1, k, br(0, 8), 1);
        f.write(RUN1, k, Footprint::WHOLE, 2);
        assert_eq!(f.live_entries(RUN1), 1);
        assert_eq!(f.reads(RUN1, k, br(0, 8)), vec![2]);
    }

    #[test]
    fn tiles() {
        let f = Fixture::new();
        let k = f.key();
        f.write(RUN1, k, tile(0, 8, 0, 8), 0);
        f.write(RUN1, k, tile(0, 8, 8, 8), 1);
        f.write(RUN1, k, tile(8, 8, 0, 8), 2);
        f.write(RUN1, k, tile(8, 8, 8, 8), 3);
        assert_eq!(f.live_entries(RUN1), 4);
        for (i, (r, c)) in [(0, 0), (0, 8), (8, 0), (8, 8)].into_iter().enumerate() {
            assert_eq!(f.reads(RUN1, k, tile(r, 8, c, 8)), vec![i as u32]);
        }
        assert_eq!(f.reads(RUN1, k, tile(4, 8, 4, 8)), vec![0, 1, 2, 3]);
        // Column blocks with interleaved bounding ranges are independent.
        let kc = f.key();
        f.write(RUN1, kc, tile(0, 16, 0, 4), 4);
        assert!(f.reads(RUN1, kc, tile(0, 16, 8, 4)).is_empty());
        // A tile write supersedes only the tiles it contains.
        let k2 = f.key();
        f.write(RUN1, k2, tile(0, 4, 0, 4), 1);
        f.write(RUN1, k2, tile(0, 4, 8, 4), 2);
        f.write(RUN1, k2, tile(0, 8, 0, 8), 3);
        assert_eq!(f.reads(RUN1, k2, tile(0, 4, 0, 4)), vec![3]);
        assert_eq!(f.reads(RUN1, k2, tile(0, 4, 8, 4)), vec![2]);
    }

    #[test]
    fn writers_wait_for_earlier_readers_until_covered() {
        let f = Fixture::new();
        let k = f.key();
        f.write(RUN1, k, br(0, 128), 1);
        // Two readers of disjoint halves.
        f.access(RUN1, k, br(0, 64), ArgTag::Input, 2);
        f.access(RUN1, k, br(64, 128), ArgTag::Input, 3);
        // A reader does not wait for readers.
        assert_eq!(f.reads(RUN1, k, br(0, 128)), vec![1]);
        // A writer of the first half waits for the writer and that half's reader (WAR).
        assert_eq!(f.writes(RUN1, k, br(0, 64)), vec![1, 2]);
        f.write(RUN1, k, br(0, 64), 4);
        // The covered reader is gone; the other half's reader stays.
        assert_eq!(f.writes(RUN1, k, br(0, 128)), vec![1, 4, 3]);
        // NO_DEP neither looks up nor records.
        assert!(f.deps(RUN1, k, br(0, 128), ArgTag::NoDep).is_empty());
        let mut m = f.m.borrow_mut();
        let h = m.head(k, RUN1, false).unwrap();
        assert!(m
            .record(
                h,
                RUN1,
                &Access::new(k, br(0, 128), ArgTag::NoDep),
                t(9),
                &|_| true
            )
            .is_none());
    }

    #[test]
    fn wide_fan_out_readers_are_compacted() {
        let f = Fixture::new();
        let k = f.key();
        for i in 0..10_000u32 {
            f.access(RUN1, k, Footprint::WHOLE, ArgTag::Input, i);
            f.kill(i);
        }
        assert!(f.m.borrow().reader_list_len(&k) < 64);
        // Readers whose journals are never replayed are still compacted when the list
        // doubles.
        let k2 = f.key();
        for i in 10_000..20_000u32 {
            f.access(RUN1, k2, Footprint::WHOLE, ArgTag::Input, i);
            f.dead.borrow_mut().insert(i);
        }
        assert!(f.m.borrow().reader_list_len(&k2) < 64);
    }

    #[test]
    fn stale_journal_entries_never_touch_a_reused_node() {
        let f = Fixture::new();
        let k = f.key();
        f.write(RUN1, k, Footprint::WHOLE, 1);
        f.write(RUN1, k, Footprint::WHOLE, 2); // frees task 1's node; 2 may reuse it
        f.write(RUN1, k, Footprint::WHOLE, 3); // task 3 reuses the freed node
        f.kill(1); // task 1's journal entry is stale
        assert_eq!(f.reads(RUN1, k, Footprint::WHOLE), vec![3]);
    }

    #[test]
    fn owned_buffers_record_their_allocator_until_forgotten() {
        let f = Fixture::new();
        let k = f.key();
        let mut m = f.m.borrow_mut();
        let h = m.head(k, RUN1, true).unwrap();
        m.register_owned(h, RUN1, t(5));
        assert_eq!(m.owner(h, RUN1), Some(t(5)));
        assert_eq!(m.owner(h, RUN2), None);
        m.forget_run(RUN1);
        assert_eq!(m.owner(h, RUN1), None);
    }
}
