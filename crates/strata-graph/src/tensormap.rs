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
//!
//! # The span index
//!
//! A short list is walked. A list of at least [`INDEX_AT`] nodes that a walk found mostly
//! apart from the access walking it (at most a quarter of the nodes' byte spans meet the
//! access's) gets an index, so that an access examines only the entries it can overlap,
//! however many disjoint slices or tiles of the buffer the list holds. The index is an
//! interval treap of the list's live nodes (one tree of the map's [`Forest`], see
//! [`crate::interval`]) whose [`Extent`]s are:
//!
//! - the node's byte span;
//! - and, for the head's *grid* (the lattice of the first regular multi-axis entry
//!   indexed: element size, rank, strides), the node's coordinate range on the innermost
//!   axis. Spans alone do not separate the tiles of a row-major matrix (the spans of all
//!   tiles of one row band intersect: they interleave row by row); two views on one grid
//!   that overlap intersect on every axis, so an access on the grid also skips subtrees
//!   and nodes on the grid whose columns miss its own. Nodes off the grid match every
//!   column range.
//!
//! The footprint test still decides among the candidates (the index only narrows the
//! scan, it changes no edge), which are taken in insertion order. A node an indexed lookup
//! finds stale (dead, of another run, of a consumed task), and an entry a write covers,
//! leaves the index and stays in its list as a dead node until the head is compacted (once
//! half its nodes are dead), which rebuilds the index from the survivors. An access whose
//! candidates are at least half the list walks it instead. A compaction that leaves at
//! most [`UNINDEX_AT`] nodes drops the index.

use crate::access::{Access, BufferKey, FxHashMap, KeyMap, LocalKey};
use crate::footprint::{Footprint, Lattice, Overlap};
use crate::free_list::FreeList;
use crate::interval::{cols, Extent, Forest, Tree, ALL_COLS};
use crate::slot::TaskRef;
use std::sync::Arc;

const NIL: u32 = u32::MAX;

/// Length at which a list whose walks mostly miss gets a span index.
const INDEX_AT: u32 = 32;
/// Listed idle heads per run between two sweeps when the list does not grow.
const SWEEP_HEADS_PER_RUN: u64 = 64;
/// Length at or below which compaction drops a list's span index.
const UNINDEX_AT: u32 = 8;

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

/// Which list of a head: the writers or the readers of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Writers = 0,
    Readers = 1,
}

impl Side {
    /// Both lists, writers first (the order lookups take them in).
    const BOTH: [Side; 2] = [Side::Writers, Side::Readers];

    fn other(self) -> Side {
        match self {
            Side::Writers => Side::Readers,
            Side::Readers => Side::Writers,
        }
    }
}

/// The span indexes of a head's lists, while at least one of them has one.
#[derive(Debug)]
struct Index {
    /// Which lists have an index (by [`Side`]): each of their live nodes is in it.
    on: [bool; 2],
    /// The trees (by [`Side`]).
    tree: [Tree; 2],
    /// The grid whose innermost coordinates the indexes carry.
    grid: Option<Arc<Lattice>>,
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
    /// Dead nodes still in the lists.
    dead: u32,
    /// Reader-list length at which the next compaction runs.
    compact_readers_at: u32,
    owned: Option<Owned>,
    /// The last run that looked this key up.
    last_run: u64,
    /// Present in `TensorMap::idle` (at most once).
    listed: bool,
    /// Its span indexes in `TensorMap::indexes` (`NIL`: none).
    index: u32,
}

impl Head {
    fn list(&self, side: Side) -> List {
        match side {
            Side::Writers => self.writers,
            Side::Readers => self.readers,
        }
    }

    fn list_mut(&mut self, side: Side) -> &mut List {
        match side {
            Side::Writers => &mut self.writers,
            Side::Readers => &mut self.readers,
        }
    }
}

/// A journal entry: a node this task recorded, and the node's generation then.
pub(crate) type JournalEntry = u64;

fn journal(node: u32, gen: u32) -> JournalEntry {
    ((gen as u64) << 32) | node as u64
}

#[derive(Debug, Default)]
pub(crate) struct TensorMap {
    map: KeyMap<u32>,
    heads: Vec<Head>,
    free_heads: Vec<u32>,
    nodes: Vec<Node>,
    /// The span indexes' trees, over node ids.
    forest: Forest,
    /// Span indexes of heads, and the free ones.
    indexes: Vec<Index>,
    free_indexes: Vec<u32>,
    free_nodes: FreeList,
    /// Heads carrying an allocator record, per run (cleared when the run is forgotten).
    owned_heads: FxHashMap<u64, Vec<u32>>,
    /// Heads that may be empty (they became empty, or were created). A buffer used run
    /// after run keeps its head; empty heads left unused for two runs are freed by a later
    /// [`TensorMap::sweep`].
    idle: Vec<u32>,
    /// `idle.len()` after the last sweep, and runs begun since.
    idle_after_sweep: usize,
    runs_since_sweep: u64,
    /// Scratch of indexed lookups and compactions: `(seq, node)` candidates, and nodes in
    /// key order.
    cands: Vec<(u64, u32)>,
    order: Vec<u32>,
    /// Entries examined by lookups and records (walked, or candidates of an index).
    visits: u64,
}

impl TensorMap {
    /// The head of `key` as looked up by `run`, created if `create`.
    pub(crate) fn head(&mut self, key: BufferKey, run: u64, create: bool) -> Option<u32> {
        if let Some(&h) = self.map.get(&LocalKey(key)) {
            let head = &mut self.heads[h as usize];
            // Write only on change: most lookups leave the line clean.
            if head.last_run != run {
                head.last_run = run;
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
            // Listed from the start: a lookup that records nothing (a wait for a buffer,
            // a read-back) leaves the head empty, and only a sweep frees it.
            listed: true,
            index: NIL,
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
        self.map.insert(LocalKey(key), h);
        self.idle.push(h);
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

    fn link(&mut self, list: List, n: u32) -> List {
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

    /// Appends node `n` to list `side` of `head` (and to its index, if any).
    #[inline(always)]
    fn append(&mut self, head: u32, side: Side, n: u32) {
        let h = &self.heads[head as usize];
        let index = h.index;
        let l = self.link(h.list(side), n);
        *self.heads[head as usize].list_mut(side) = l;
        if index != NIL && self.indexes[index as usize].on[side as usize] {
            self.index_insert(head, side, n);
        }
    }

    /// Inserts node `n` into the index of list `side` of `head` (which has one).
    #[inline(never)]
    fn index_insert(&mut self, head: u32, side: Side, n: u32) {
        let extent = self.extent_of(head, &self.nodes[n as usize].fp);
        let i = self.heads[head as usize].index as usize;
        self.forest
            .insert(&mut self.indexes[i].tree[side as usize], n, extent);
    }

    // ----- the span index -----------------------------------------------------------------

    /// Whether list `side` of `head` has a span index.
    fn is_indexed(&self, head: u32, side: Side) -> bool {
        let i = self.heads[head as usize].index;
        i != NIL && self.indexes[i as usize].on[side as usize]
    }

    /// The tree of the span index of list `side` of `head` (which has an index).
    fn tree(&self, head: u32, side: Side) -> Tree {
        self.indexes[self.heads[head as usize].index as usize].tree[side as usize]
    }

    fn set_tree(&mut self, head: u32, side: Side, tree: Tree) {
        let i = self.heads[head as usize].index;
        self.indexes[i as usize].tree[side as usize] = tree;
    }

    /// The extent of `fp` in the indexes of `head`: its span, and its innermost-axis
    /// coordinates if it is on their grid.
    fn extent_of(&self, head: u32, fp: &Footprint) -> Extent {
        let i = self.heads[head as usize].index;
        let grid = if i == NIL {
            None
        } else {
            self.indexes[i as usize].grid.as_ref()
        };
        let cols = match (fp.lattice(), grid) {
            (Some(l), Some(g)) if l.same_grid(g) => cols(l.inner()),
            _ => ALL_COLS,
        };
        Extent::new(fp.span(), cols)
    }

    /// Gives list `side` of `head` a span index of its live nodes (choosing the head's
    /// grid if it has none). Nodes enter in list order, so the index's insertion order is
    /// the list's.
    #[cold]
    #[inline(never)]
    fn index(&mut self, head: u32, side: Side) {
        let first = self.heads[head as usize].list(side).first;
        if self.heads[head as usize].index == NIL {
            let index = Index {
                on: [false; 2],
                tree: [Tree::EMPTY; 2],
                grid: None,
            };
            let i = match self.free_indexes.pop() {
                Some(i) => {
                    self.indexes[i as usize] = index;
                    i
                }
                None => {
                    self.indexes.push(index);
                    (self.indexes.len() - 1) as u32
                }
            };
            self.heads[head as usize].index = i;
        }
        let i = self.heads[head as usize].index as usize;
        if self.indexes[i].grid.is_none() {
            let mut n = first;
            while n != NIL {
                let node = &self.nodes[n as usize];
                if let Some(g) = node.fp.lattice().filter(|_| !node.dead) {
                    self.indexes[i].grid = Some(g.clone());
                    break;
                }
                n = node.next;
            }
        }
        self.indexes[i].on[side as usize] = true;
        let mut tree = Tree::EMPTY;
        let mut n = first;
        while n != NIL {
            let node = &self.nodes[n as usize];
            if !node.dead {
                let extent = self.extent_of(head, &node.fp);
                self.forest.insert(&mut tree, n, extent);
            }
            n = self.nodes[n as usize].next;
        }
        self.set_tree(head, side, tree);
    }

    /// Drops the span index of list `side` of `head` (and the head's indexes, grid
    /// included, once neither list has one).
    #[cold]
    #[inline(never)]
    fn unindex(&mut self, head: u32, side: Side) {
        let i = self.heads[head as usize].index;
        let index = &mut self.indexes[i as usize];
        index.on[side as usize] = false;
        self.forest.clear(&mut index.tree[side as usize]);
        if !index.on[side.other() as usize] {
            index.grid = None;
            self.free_indexes.push(i);
            self.heads[head as usize].index = NIL;
        }
    }

    /// The candidates of access `a` in indexed list `side` of `head`: the nodes whose
    /// spans (and, on the head's grid, innermost coordinates) meet the access's, in
    /// insertion order if `ordered`. `None` when they are at least half the list: walking
    /// it is then as cheap.
    fn candidates(
        &mut self,
        head: u32,
        side: Side,
        a: &Access,
        ordered: bool,
    ) -> Option<Vec<(u64, u32)>> {
        let q = self.extent_of(head, &a.footprint);
        if (q.lo, q.hi) == (0, u64::MAX) {
            return None;
        }
        let len = self.heads[head as usize].list(side).len;
        let mut cands = std::mem::take(&mut self.cands);
        cands.clear();
        self.forest.query(self.tree(head, side), &q, &mut cands);
        if 2 * cands.len() >= len as usize {
            self.cands = cands;
            return None;
        }
        self.visits += cands.len() as u64;
        if ordered && cands.len() > 1 {
            cands.sort_unstable();
        }
        Some(cands)
    }

    /// Takes node `n` of list `side` of `head` out of the index and marks it dead; it
    /// stays in the list until compaction.
    #[inline(never)]
    fn bury(&mut self, head: u32, side: Side, n: u32) {
        if self.forest.contains(n) {
            let i = self.heads[head as usize].index as usize;
            self.forest
                .remove(&mut self.indexes[i].tree[side as usize], n);
        }
        let node = &mut self.nodes[n as usize];
        if !node.dead {
            node.dead = true;
            self.heads[head as usize].dead += 1;
        }
    }
    // ----- lists --------------------------------------------------------------------------

    /// Walks `list`, unlinking and freeing every node for which `drop_node` says so (and
    /// taking it out of `tree`, the list's index, if it is in it); returns the list, the
    /// tree and how many of the dropped nodes were marked dead. Kept nodes are not
    /// written.
    #[inline(always)]
    fn filter_list(
        &mut self,
        list: List,
        mut tree: Tree,
        mut drop_node: impl FnMut(&Node) -> bool,
    ) -> (List, Tree, u32) {
        let mut l = list;
        let mut prev = NIL;
        let mut n = l.first;
        let mut dead_dropped = 0;
        while n != NIL {
            let node = &self.nodes[n as usize];
            let next = node.next;
            if drop_node(node) {
                dead_dropped += node.dead as u32;
                if tree != Tree::EMPTY && self.forest.contains(n) {
                    self.forest.remove(&mut tree, n);
                }
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
        (l, tree, dead_dropped)
    }

    /// Filters both lists (or only the writers) of `head`, which has no index, with
    /// `drop_node`.
    fn filter_head_plain(
        &mut self,
        head: u32,
        both: bool,
        mut drop_node: impl FnMut(&Node) -> bool,
    ) {
        let h = &self.heads[head as usize];
        let (writers, readers) = (h.writers, h.readers);
        let (writers, _, d1) = self.filter_list(writers, Tree::EMPTY, &mut drop_node);
        let (readers, _, d2) = if both {
            self.filter_list(readers, Tree::EMPTY, &mut drop_node)
        } else {
            (readers, Tree::EMPTY, 0)
        };
        let h = &mut self.heads[head as usize];
        h.writers = writers;
        h.readers = readers;
        h.dead -= d1 + d2;
    }

    /// Whether `head` takes the plain path: no index, and lists too short to get one.
    fn plain(&self, head: u32) -> bool {
        let h = &self.heads[head as usize];
        h.index == NIL && h.writers.len < INDEX_AT && h.readers.len < INDEX_AT
    }

    /// Walks list `side` of `head`, unlinking and freeing every node for which
    /// `drop_node` says so (and its index entry). Kept nodes are not written. Drops the
    /// index of a list left short.
    fn filter(&mut self, head: u32, side: Side, drop_node: impl FnMut(&Node) -> bool) {
        let indexed = self.is_indexed(head, side);
        let tree = if indexed {
            self.tree(head, side)
        } else {
            Tree::EMPTY
        };
        let l = self.heads[head as usize].list(side);
        let (l, tree, dead) = self.filter_list(l, tree, drop_node);
        let h = &mut self.heads[head as usize];
        *h.list_mut(side) = l;
        h.dead -= dead;
        if indexed {
            self.set_tree(head, side, tree);
            if l.len <= UNINDEX_AT {
                self.unindex(head, side);
            }
        }
    }

    /// Filters both lists of `head` with `drop_node`.
    fn filter_head(&mut self, head: u32, mut drop_node: impl FnMut(&Node) -> bool) {
        self.filter(head, Side::Writers, &mut drop_node);
        self.filter(head, Side::Readers, &mut drop_node);
    }

    /// Walks list `side` of `head` for access `a`, dropping what `drop_node` says. A
    /// long unindexed list whose nodes' spans mostly miss the access's gets an index.
    fn walk(
        &mut self,
        head: u32,
        side: Side,
        a: &Access,
        mut drop_node: impl FnMut(&Node) -> bool,
    ) {
        let l = self.heads[head as usize].list(side);
        if l.len < INDEX_AT {
            // A short list (most are): no index to consider.
            self.visits += l.len as u64;
            self.filter(head, side, drop_node);
            return;
        }
        let measure = !self.is_indexed(head, side);
        let (lo, hi) = a.footprint.span();
        let (mut walked, mut hits) = (0u32, 0u32);
        self.filter(head, side, |n| {
            walked += 1;
            if measure {
                let (s, e) = n.fp.span();
                hits += (s < hi && e > lo) as u32;
            }
            drop_node(n)
        });
        self.visits += walked as u64;
        if measure && 4 * hits <= walked && self.heads[head as usize].list(side).len >= INDEX_AT {
            self.index(head, side);
        }
    }

    /// Frees the dead nodes of `head`. An index loses half its nodes or more here, so it
    /// is taken apart and rebuilt from the survivors rather than pruned node by node.
    fn compact(&mut self, head: u32) {
        if self.heads[head as usize].index == NIL {
            self.filter_head_plain(head, true, |n| n.dead);
        } else {
            self.compact_indexed(head);
        }
        let h = &mut self.heads[head as usize];
        h.compact_readers_at = 2 * h.readers.len + 16;
    }

    #[cold]
    #[inline(never)]
    fn compact_indexed(&mut self, head: u32) {
        for side in Side::BOTH {
            if self.is_indexed(head, side) {
                // The survivors in key order, before the dead nodes are freed.
                let mut order = std::mem::take(&mut self.order);
                order.clear();
                let i = self.heads[head as usize].index as usize;
                self.forest
                    .take(&mut self.indexes[i].tree[side as usize], &mut order);
                order.retain(|&n| !self.nodes[n as usize].dead);
                self.filter(head, side, |n| n.dead);
                if self.is_indexed(head, side) {
                    let i = self.heads[head as usize].index as usize;
                    self.forest
                        .rebuild(&mut self.indexes[i].tree[side as usize], &order);
                }
                self.order = order;
            } else {
                self.filter(head, side, |n| n.dead);
            }
        }
    }

    /// Compacts `head` if half its nodes are dead.
    fn compact_if_half_dead(&mut self, head: u32) {
        let h = &self.heads[head as usize];
        if h.dead > 0 && 2 * h.dead >= h.writers.len + h.readers.len {
            self.compact(head);
        }
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
        if self.plain(head) {
            let h = &self.heads[head as usize];
            self.visits += (h.writers.len + a.tag.writes() as u32 * h.readers.len) as u64;
            self.filter_head_plain(head, a.tag.writes(), |node| {
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
            return;
        }
        self.collect_list(head, Side::Writers, run, a, live, &mut found);
        if a.tag.writes() {
            self.collect_list(head, Side::Readers, run, a, live, &mut found);
        }
    }

    fn collect_list(
        &mut self,
        head: u32,
        side: Side,
        run: u64,
        a: &Access,
        live: &impl Fn(&TaskRef) -> bool,
        found: &mut impl FnMut(TaskRef),
    ) {
        if self.is_indexed(head, side) {
            if let Some(cands) = self.candidates(head, side, a, true) {
                let mut buried = false;
                for &(_, n) in &cands {
                    let node = &self.nodes[n as usize];
                    if !node.dead && node.run == run {
                        if a.footprint.overlap(&node.fp) == Overlap::None {
                            continue;
                        }
                        if live(&node.task) {
                            found(node.task);
                            continue;
                        }
                    }
                    self.bury(head, side, n);
                    buried = true;
                }
                self.cands = cands;
                if buried {
                    self.compact_if_half_dead(head);
                }
                return;
            }
        }
        self.walk(head, side, a, |node| {
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

    /// Entries examined by lookups and records so far: walked, or candidates of a span
    /// index (diagnostics).
    pub(crate) fn visits(&self) -> u64 {
        self.visits
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
            let supersedes =
                |n: &Node| n.dead || n.run != run || a.footprint.overlap(&n.fp) == Overlap::Covered;
            let mut buried = false;
            if self.plain(head) {
                let h = &self.heads[head as usize];
                self.visits += (h.writers.len + h.readers.len) as u64;
                self.filter_head_plain(head, true, supersedes);
            } else {
                self.supersede(head, a, supersedes, &mut buried);
            }
            if buried {
                self.compact_if_half_dead(head);
            }
            let (n, gen) = self.alloc_node(a.footprint.clone(), task, run, head);
            self.append(head, Side::Writers, n);
            Some(journal(n, gen))
        } else {
            self.record_read(head, run, a, task, live)
        }
    }

    /// Drops the entries of a head that may be indexed that a write supersedes.
    fn supersede(
        &mut self,
        head: u32,
        a: &Access,
        supersedes: impl Fn(&Node) -> bool + Copy,
        buried: &mut bool,
    ) {
        for side in Side::BOTH {
            if self.is_indexed(head, side) {
                if let Some(cands) = self.candidates(head, side, a, false) {
                    for &(_, n) in &cands {
                        if supersedes(&self.nodes[n as usize]) {
                            self.bury(head, side, n);
                            *buried = true;
                        }
                    }
                    self.cands = cands;
                    continue;
                }
            }
            self.walk(head, side, a, supersedes);
        }
    }

    /// Records a read of `task`: a reader entry (unless it repeats the task's last one).
    fn record_read(
        &mut self,
        head: u32,
        run: u64,
        a: &Access,
        task: TaskRef,
        live: &impl Fn(&TaskRef) -> bool,
    ) -> Option<JournalEntry> {
        let readers = self.heads[head as usize].readers;
        if readers.last != NIL {
            let last = &self.nodes[readers.last as usize];
            if !last.dead && last.task == task && last.fp == a.footprint {
                return None;
            }
        }
        let (n, gen) = self.alloc_node(a.footprint.clone(), task, run, head);
        self.append(head, Side::Readers, n);
        let h = &self.heads[head as usize];
        if h.readers.len >= h.compact_readers_at {
            self.filter(head, Side::Readers, |n| {
                n.dead || n.run != run || !live(&n.task)
            });
            let h = &mut self.heads[head as usize];
            h.compact_readers_at = 2 * h.readers.len + 16;
        }
        Some(journal(n, gen))
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
        self.compact(head);
        self.note_if_idle(head);
    }

    fn is_empty(h: &Head) -> bool {
        h.in_use && h.writers.len == 0 && h.readers.len == 0 && h.owned.is_none()
    }

    fn note_if_idle(&mut self, head: u32) {
        let h = &mut self.heads[head as usize];
        if Self::is_empty(h) && !h.listed {
            h.listed = true;
            self.idle.push(head);
        }
    }

    /// Frees heads that are empty and were not looked up by the current or the previous
    /// run; call it when a run begins.
    ///
    /// A pass visits every listed head, and a workload that uses the same many buffers run
    /// after run keeps them all listed, so passes are spaced out: one runs when the list
    /// has doubled since the last pass (new buffers keep coming) or after one run per
    /// [`SWEEP_HEADS_PER_RUN`] listed heads (so an unused head is freed eventually); either
    /// way a run pays for a bounded number of visits.
    pub(crate) fn sweep(&mut self, current_run: u64) {
        self.free_nodes.tidy();
        self.runs_since_sweep += 1;
        let n = self.idle.len();
        if n < 1024
            || (n < 2 * self.idle_after_sweep
                && self.runs_since_sweep * SWEEP_HEADS_PER_RUN < n as u64)
        {
            return;
        }
        self.runs_since_sweep = 0;
        let mut idle = std::mem::take(&mut self.idle);
        idle.retain(|&head| {
            let h = &mut self.heads[head as usize];
            if !Self::is_empty(h) {
                // Listed again when it next becomes empty.
                h.listed = false;
                return false;
            }
            if h.last_run + 1 >= current_run {
                return true;
            }
            h.listed = false;
            h.in_use = false;
            self.map.remove(&LocalKey(h.key));
            self.free_heads.push(head);
            false
        });
        self.idle_after_sweep = idle.len();
        self.idle = idle;
    }

    /// Registers `task` of `run` as the allocator of runtime-owned buffer `head`, with a
    /// whole-buffer writer entry so any later access of the buffer depends on it. Returns
    /// the journal entry of that writer.
    pub(crate) fn register_owned(&mut self, head: u32, run: u64, task: TaskRef) -> JournalEntry {
        self.filter_head(head, |n| n.dead || n.run != run);
        let (n, gen) = self.alloc_node(Footprint::WHOLE, task, run, head);
        self.append(head, Side::Writers, n);
        let h = &mut self.heads[head as usize];
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
        match self.map.get(&LocalKey(*key)) {
            Some(&h) => self.list_tasks(self.heads[h as usize].writers, Some(run), live),
            None => vec![],
        }
    }

    /// Live readers of `key` in `run`, in insertion order (tests).
    #[cfg(test)]
    pub(crate) fn readers(
        &self,
        run: u64,
        key: &BufferKey,
        live: &impl Fn(&TaskRef) -> bool,
    ) -> Vec<TaskRef> {
        match self.map.get(&LocalKey(*key)) {
            Some(&h) => self.list_tasks(self.heads[h as usize].readers, Some(run), live),
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

    /// Index nodes traversed by lookups so far (tests).
    #[cfg(test)]
    pub(crate) fn probes(&self) -> u64 {
        self.forest.probes()
    }

    /// Whether the writer and the reader list of `key` have a span index (tests).
    #[cfg(test)]
    pub(crate) fn indexed(&self, key: &BufferKey) -> (bool, bool) {
        self.map.get(&LocalKey(*key)).map_or((false, false), |&h| {
            (
                self.is_indexed(h, Side::Writers),
                self.is_indexed(h, Side::Readers),
            )
        })
    }

    /// Length of the reader list of `key` including dead entries (tests).
    #[cfg(test)]
    pub(crate) fn reader_list_len(&self, key: &BufferKey) -> usize {
        self.map
            .get(&LocalKey(*key))
            .map_or(0, |&h| self.heads[h as usize].readers.len as usize)
    }
}

#[cfg(test)]
mod tests;
