//! The TensorMap's span index: interval treaps over entries named by `u32` ids, which
//! find the entries whose extent meets a query's in O(log n + k).
//!
//! An entry's [`Extent`] is a byte span `[lo, hi)` and a range of innermost-axis
//! coordinates `[col_lo, col_hi)`; two extents *meet* when both ranges intersect. A tree
//! is keyed by `(lo, id)`, each subtree augmented with the largest `hi` and the hull of
//! the coordinate ranges in it, so a query descends only into subtrees that may hold a
//! match and, keys being ordered by start, never right of a node that starts at or after
//! the query's end.
//!
//! One [`Forest`] holds many trees (the map has up to two per buffer) in one slab indexed
//! by id, so an id is in at most one tree at a time; a [`Tree`] is a handle (its root)
//! kept by the caller. The slab grows to the largest id inserted and never shrinks: ids
//! are meant to be dense and reused (the map's node slab). Entries' links take one cache
//! line each and are apart from the caller's own records, so walks that never index never
//! touch them. Priorities are a bijective mix of the id, so no random state is kept and
//! every tree shape is reproducible.
//!
//! Queries report `(seq, id)` pairs, `seq` numbering insertions across the forest, so a
//! caller can put hits in insertion order. Removal leaves the hulls above the removed
//! entry as they were: still covering, merely loose until [`Forest::take`] and
//! [`Forest::rebuild`] rebuild the tree in linear time.

const NIL: u32 = u32::MAX;

/// What an entry covers, or what a query looks for: a byte span `[lo, hi)` and a range of
/// innermost-axis coordinates `[col_lo, col_hi)` ([`ALL_COLS`] when it has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Extent {
    pub(crate) lo: u64,
    pub(crate) hi: u64,
    pub(crate) col_lo: u32,
    pub(crate) col_hi: u32,
}

impl Extent {
    /// The extent of a span and a coordinate range.
    pub(crate) fn new((lo, hi): (u64, u64), (col_lo, col_hi): (u32, u32)) -> Extent {
        Extent {
            lo,
            hi,
            col_lo,
            col_hi,
        }
    }

    /// Whether both ranges of `self` intersect those of `other` (the test a query applies).
    pub(crate) fn meets(&self, other: &Extent) -> bool {
        self.lo < other.hi
            && self.hi > other.lo
            && self.col_lo < other.col_hi
            && self.col_hi > other.col_lo
    }
}

/// Every coordinate: the range of an extent that has none, which meets every range.
pub(crate) const ALL_COLS: (u32, u32) = (0, u32::MAX);

/// Innermost-axis coordinates `[lo, hi)` in the index's `u32` form: widened where they do
/// not fit (`u32::MAX` as an end stands for any larger end), so two ranges that intersect
/// still do.
pub(crate) fn cols((lo, hi): (u64, u64)) -> (u32, u32) {
    (
        lo.min(u32::MAX as u64 - 1) as u32,
        hi.min(u32::MAX as u64) as u32,
    )
}

/// One tree of a [`Forest`]: its root. Kept by the caller and passed back to every
/// operation on the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tree(u32);

impl Tree {
    /// The tree without entries.
    pub(crate) const EMPTY: Tree = Tree(NIL);
}

/// An entry's place in its tree; one cache line.
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
struct Links {
    /// Insertion number: queries report it with the id.
    seq: u64,
    /// The entry's extent.
    lo: u64,
    hi: u64,
    col_lo: u32,
    col_hi: u32,
    /// Hulls over the subtree: the largest `hi`, the smallest `col_lo`, the largest
    /// `col_hi`.
    max_hi: u64,
    min_col: u32,
    max_col: u32,
    left: u32,
    right: u32,
    /// In a tree.
    member: bool,
}

impl Default for Links {
    fn default() -> Self {
        Links {
            seq: 0,
            lo: 0,
            hi: 0,
            col_lo: 0,
            col_hi: 0,
            max_hi: 0,
            min_col: 0,
            max_col: 0,
            left: NIL,
            right: NIL,
            member: false,
        }
    }
}

impl Links {
    /// Whether the subtree below these hulls may hold an entry meeting `q`.
    fn may_hold(&self, q: &Extent) -> bool {
        self.max_hi > q.lo && self.min_col < q.col_hi && self.max_col > q.col_lo
    }

    fn extent(&self) -> Extent {
        Extent::new((self.lo, self.hi), (self.col_lo, self.col_hi))
    }
}

/// The treap priority of an id: a bijective mix of it (murmur3's finalizer).
fn prio(n: u32) -> u32 {
    let mut x = n;
    x = (x ^ (x >> 16)).wrapping_mul(0x85eb_ca6b);
    x = (x ^ (x >> 13)).wrapping_mul(0xc2b2_ae35);
    x ^ (x >> 16)
}

/// Interval treaps sharing one slab of entries; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Forest {
    /// Indexed by id; grown when an id first enters a tree.
    links: Vec<Links>,
    /// The insertion number of the next entry.
    seq: u64,
    /// Traversal scratch, reused so that operations allocate nothing in the steady state.
    stack: Vec<u32>,
    post: Vec<u32>,
    /// Entries visited by queries (diagnostics).
    probes: u64,
}

impl Forest {
    /// Whether `id` is in a tree.
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.links.get(id as usize).is_some_and(|l| l.member)
    }

    /// Entries visited by queries so far (diagnostics).
    #[cfg(test)]
    pub(crate) fn probes(&self) -> u64 {
        self.probes
    }

    fn key_less(&self, a: u32, b: u32) -> bool {
        (self.links[a as usize].lo, a) < (self.links[b as usize].lo, b)
    }

    /// Recomputes the hulls of `x` from its own extent and its children's hulls.
    fn pull(&mut self, x: u32) {
        let mut l = self.links[x as usize];
        l.max_hi = l.hi;
        l.min_col = l.col_lo;
        l.max_col = l.col_hi;
        for c in [l.left, l.right] {
            if c != NIL {
                let c = &self.links[c as usize];
                l.max_hi = l.max_hi.max(c.max_hi);
                l.min_col = l.min_col.min(c.min_col);
                l.max_col = l.max_col.max(c.max_col);
            }
        }
        self.links[x as usize] = l;
    }

    /// Inserts `id`, which is in no tree, into `tree` with `extent`, numbering it as the
    /// latest insertion. Top-down: widens the hulls of the entries above its place, then
    /// splits the subtree at its place into its children.
    #[inline(never)]
    pub(crate) fn insert(&mut self, tree: &mut Tree, id: u32, extent: Extent) {
        debug_assert!(!self.contains(id), "id {id} already in a tree");
        if self.links.len() <= id as usize {
            self.links.resize(id as usize + 1, Links::default());
        }
        let me = &mut self.links[id as usize];
        me.seq = self.seq;
        self.seq += 1;
        me.lo = extent.lo;
        me.hi = extent.hi;
        me.col_lo = extent.col_lo;
        me.col_hi = extent.col_hi;
        me.member = true;
        let pn = prio(id);
        let (mut parent, mut left) = (NIL, false);
        let mut cur = tree.0;
        while cur != NIL && prio(cur) > pn {
            left = self.key_less(id, cur);
            let c = &mut self.links[cur as usize];
            c.max_hi = c.max_hi.max(extent.hi);
            c.min_col = c.min_col.min(extent.col_lo);
            c.max_col = c.max_col.max(extent.col_hi);
            parent = cur;
            cur = if left { c.left } else { c.right };
        }
        let (l, r) = self.split(cur, id);
        let m = &mut self.links[id as usize];
        m.left = l;
        m.right = r;
        self.pull(id);
        if parent == NIL {
            tree.0 = id;
            return;
        }
        let p = &mut self.links[parent as usize];
        if left {
            p.left = id;
        } else {
            p.right = id;
        }
    }

    /// Splits the subtree rooted at `t` into the keys below and above `id`'s.
    fn split(&mut self, t: u32, id: u32) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        if self.key_less(t, id) {
            let (a, b) = self.split(self.links[t as usize].right, id);
            self.links[t as usize].right = a;
            self.pull(t);
            (t, b)
        } else {
            let (a, b) = self.split(self.links[t as usize].left, id);
            self.links[t as usize].left = b;
            self.pull(t);
            (a, t)
        }
    }

    /// Joins two subtrees, every key of `a` below every key of `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if prio(a) > prio(b) {
            let r = self.merge(self.links[a as usize].right, b);
            self.links[a as usize].right = r;
            self.pull(a);
            a
        } else {
            let l = self.merge(a, self.links[b as usize].left);
            self.links[b as usize].left = l;
            self.pull(b);
            b
        }
    }

    /// Removes `id`, which is in `tree`, from it. The hulls above it are left as they
    /// are: still covering, merely loose until the tree is rebuilt.
    #[inline(never)]
    pub(crate) fn remove(&mut self, tree: &mut Tree, id: u32) {
        let (mut parent, mut left) = (NIL, false);
        let mut cur = tree.0;
        while cur != id {
            if cur == NIL {
                debug_assert!(false, "id {id} not in its tree");
                return;
            }
            left = self.key_less(id, cur);
            parent = cur;
            let c = &self.links[cur as usize];
            cur = if left { c.left } else { c.right };
        }
        let l = &mut self.links[id as usize];
        l.member = false;
        let (a, b) = (l.left, l.right);
        let m = self.merge(a, b);
        if parent == NIL {
            tree.0 = m;
            return;
        }
        let p = &mut self.links[parent as usize];
        if left {
            p.left = m;
        } else {
            p.right = m;
        }
    }

    /// Appends `(seq, id)` for every entry of `tree` whose extent meets `q`, in no
    /// particular order.
    pub(crate) fn query(&mut self, tree: Tree, q: &Extent, out: &mut Vec<(u64, u32)>) {
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        if tree.0 != NIL && self.links[tree.0 as usize].may_hold(q) {
            stack.push(tree.0);
        }
        let mut probes = 0;
        while let Some(x) = stack.pop() {
            probes += 1;
            let l = &self.links[x as usize];
            // Keys right of an entry start at or after its start.
            for (c, wanted) in [(l.left, true), (l.right, l.lo < q.hi)] {
                if wanted && c != NIL && self.links[c as usize].may_hold(q) {
                    stack.push(c);
                }
            }
            if l.extent().meets(q) {
                out.push((l.seq, x));
            }
        }
        self.probes += probes;
        self.stack = stack;
    }

    /// Takes `tree` apart: every entry leaves it (and the forest), and `out` gets their
    /// ids in key order, to be given back to [`Forest::rebuild`] (after dropping any).
    #[cold]
    #[inline(never)]
    pub(crate) fn take(&mut self, tree: &mut Tree, out: &mut Vec<u32>) {
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        let mut cur = std::mem::replace(tree, Tree::EMPTY).0;
        while cur != NIL || !stack.is_empty() {
            while cur != NIL {
                stack.push(cur);
                cur = self.links[cur as usize].left;
            }
            let x = stack.pop().unwrap_or(NIL);
            let l = &mut self.links[x as usize];
            l.member = false;
            out.push(x);
            cur = l.right;
        }
        self.stack = stack;
    }

    /// Empties `tree`: every entry leaves it.
    #[cold]
    #[inline(never)]
    pub(crate) fn clear(&mut self, tree: &mut Tree) {
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        let root = std::mem::replace(tree, Tree::EMPTY).0;
        if root != NIL {
            stack.push(root);
        }
        while let Some(x) = stack.pop() {
            let l = &mut self.links[x as usize];
            l.member = false;
            for c in [l.left, l.right] {
                if c != NIL {
                    stack.push(c);
                }
            }
        }
        self.stack = stack;
    }

    /// Makes `tree`, which is empty, of `ids`: entries that [`Forest::take`] took out,
    /// in the key order it gave them (any may have been dropped), which keep their
    /// extents and insertion numbers. Linear time: a Cartesian tree on the priorities,
    /// then the hulls bottom-up.
    #[cold]
    #[inline(never)]
    pub(crate) fn rebuild(&mut self, tree: &mut Tree, ids: &[u32]) {
        debug_assert!(*tree == Tree::EMPTY, "rebuild of a tree with entries");
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        for &x in ids {
            debug_assert!(!self.contains(x), "id {x} already in a tree");
            let mut last = NIL;
            while let Some(&top) = stack.last() {
                if prio(top) > prio(x) {
                    break;
                }
                last = top;
                stack.pop();
            }
            let l = &mut self.links[x as usize];
            l.left = last;
            l.right = NIL;
            l.member = true;
            if let Some(&top) = stack.last() {
                self.links[top as usize].right = x;
            }
            stack.push(x);
        }
        let root = stack.first().copied().unwrap_or(NIL);
        // Hulls, children before parents: a pre-order (node, right, left) reversed.
        stack.clear();
        let mut post = std::mem::take(&mut self.post);
        post.clear();
        if root != NIL {
            stack.push(root);
        }
        while let Some(x) = stack.pop() {
            post.push(x);
            let l = &self.links[x as usize];
            for c in [l.left, l.right] {
                if c != NIL {
                    stack.push(c);
                }
            }
        }
        for &x in post.iter().rev() {
            self.pull(x);
        }
        self.post = post;
        self.stack = stack;
        tree.0 = root;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Brute force: every entry of every tree with its extent and insertion number.
    #[derive(Default)]
    struct Model {
        entries: Vec<(usize, u32, Extent, u64)>,
        seq: u64,
    }

    impl Model {
        fn insert(&mut self, tree: usize, id: u32, e: Extent) {
            self.entries.push((tree, id, e, self.seq));
            self.seq += 1;
        }
        fn remove(&mut self, id: u32) {
            self.entries.retain(|&(_, i, _, _)| i != id);
        }
        fn tree_of(&self, id: u32) -> Option<usize> {
            self.entries
                .iter()
                .find(|&&(_, i, _, _)| i == id)
                .map(|&(t, _, _, _)| t)
        }
        fn query(&self, tree: usize, q: &Extent) -> Vec<(u64, u32)> {
            let mut v: Vec<_> = self
                .entries
                .iter()
                .filter(|(t, _, e, _)| *t == tree && e.meets(q))
                .map(|&(_, id, _, seq)| (seq, id))
                .collect();
            v.sort_unstable();
            v
        }
        fn ids(&self, tree: usize) -> Vec<u32> {
            let mut v: Vec<_> = self
                .entries
                .iter()
                .filter(|e| e.0 == tree)
                .map(|e| (e.2.lo, e.1))
                .collect();
            v.sort_unstable();
            v.into_iter().map(|(_, id)| id).collect()
        }
    }

    /// Small ranges, so that entries and queries meet often, duplicate starts are common,
    /// and some extents have no coordinates (they meet every range).
    fn extent(a: u64, b: u64, c: u64, d: u64) -> Extent {
        let lo = a % 64;
        let hi = lo + 1 + b % 16;
        let cols = if c % 5 == 0 {
            ALL_COLS
        } else {
            let cl = (c % 32) as u32;
            (cl, cl + 1 + (d % 8) as u32)
        };
        Extent::new((lo, hi), cols)
    }

    #[test]
    fn meets_needs_both_ranges_to_intersect() {
        let e = Extent::new((10, 20), (4, 8));
        assert!(e.meets(&Extent::new((19, 30), (7, 9))));
        assert!(!e.meets(&Extent::new((20, 30), (4, 8))), "touching spans");
        assert!(!e.meets(&Extent::new((0, 30), (8, 9))), "touching columns");
        assert!(e.meets(&Extent::new((0, 30), ALL_COLS)));
        assert_eq!(cols((5, u64::MAX)), (5, u32::MAX));
        assert_eq!(cols((u64::MAX - 1, u64::MAX)), (u32::MAX - 1, u32::MAX));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Random inserts, removes, queries, rebuilds and clears on three trees of one
        /// forest: every query returns exactly the entries a linear scan of the model
        /// finds (with their insertion numbers), and membership agrees.
        #[test]
        fn queries_match_a_linear_scan(
            ops in proptest::collection::vec(
                (0u8..10, 0u32..96, 0usize..3, 0u64..1024, 0u64..1024, 0u64..1024, 0u64..1024),
                1..400,
            )
        ) {
            let mut f = Forest::default();
            let mut trees = [Tree::EMPTY; 3];
            let mut model = Model::default();
            let mut order = vec![];
            for &(op, id, t, a, b, c, d) in &ops {
                match op {
                    0..=3 => match model.tree_of(id) {
                        None => {
                            let e = extent(a, b, c, d);
                            f.insert(&mut trees[t], id, e);
                            model.insert(t, id, e);
                        }
                        Some(in_tree) => {
                            f.remove(&mut trees[in_tree], id);
                            model.remove(id);
                        }
                    },
                    4..=7 => {
                        let q = extent(a, b, c, d);
                        let mut got = vec![];
                        f.query(trees[t], &q, &mut got);
                        got.sort_unstable();
                        prop_assert_eq!(got, model.query(t, &q));
                    }
                    // Compaction: take the tree apart, drop some entries, rebuild it.
                    8 => {
                        order.clear();
                        f.take(&mut trees[t], &mut order);
                        prop_assert_eq!(&order, &model.ids(t));
                        prop_assert!(order.iter().all(|&x| !f.contains(x)));
                        order.retain(|&x| (x as u64 + a) % 3 != 0);
                        for x in model.ids(t) {
                            if !order.contains(&x) {
                                model.remove(x);
                            }
                        }
                        f.rebuild(&mut trees[t], &order);
                    }
                    _ => {
                        f.clear(&mut trees[t]);
                        for x in model.ids(t) {
                            model.remove(x);
                        }
                        prop_assert_eq!(trees[t], Tree::EMPTY);
                    }
                }
                for x in 0..96 {
                    prop_assert_eq!(f.contains(x), model.tree_of(x).is_some());
                }
            }
            // A query of everything finds every entry.
            for (t, tree) in trees.iter().enumerate() {
                let mut got = vec![];
                f.query(*tree, &Extent::new((0, u64::MAX), ALL_COLS), &mut got);
                got.sort_unstable();
                prop_assert_eq!(got, model.query(t, &Extent::new((0, u64::MAX), ALL_COLS)));
            }
        }
    }

    #[test]
    fn queries_visit_only_subtrees_that_may_match() {
        // 4096 disjoint spans: a query of one visits O(log n) entries.
        let mut f = Forest::default();
        let mut t = Tree::EMPTY;
        for i in 0..4096u32 {
            let lo = i as u64 * 16;
            f.insert(&mut t, i, Extent::new((lo, lo + 16), ALL_COLS));
        }
        let mut got = vec![];
        for i in (0..4096u32).step_by(97) {
            let before = f.probes();
            got.clear();
            let lo = i as u64 * 16;
            f.query(t, &Extent::new((lo + 3, lo + 5), ALL_COLS), &mut got);
            assert_eq!(got, vec![(i as u64, i)]);
            assert!(f.probes() - before <= 48, "{} visited", f.probes() - before);
        }
    }
}
