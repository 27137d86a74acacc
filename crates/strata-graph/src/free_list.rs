//! A LIFO list of free indices into a growing table (task slots, TensorMap nodes) that
//! keeps reuse cache-friendly.
//!
//! Within a run, LIFO reuse hands out the index freed last, whose memory is still in
//! cache. Across runs the order in which a large run frees its entries (completion order,
//! compaction order) scatters the list, and the next run then writes entries all over a
//! table of megabytes: one cache miss per allocation. [`FreeList::tidy`], called between
//! runs, sorts the list so that allocations walk the table in ascending order (which the
//! hardware prefetcher follows), but only once at least half the list arrived scattered
//! since the last sort, so the sorting costs O(log n) per freed index, a run of a few
//! tasks pays nothing, and a list freed in order keeps its LIFO order.

/// Free indices; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct FreeList {
    free: Vec<u32>,
    /// Indices pushed since the list was last sorted far from the one pushed before them
    /// (a scattered push), and the last one pushed.
    scattered_since_sort: usize,
    last_pushed: u32,
}

/// A push further than this from the previous one is scattered (about a cache line of
/// the tables these lists index, in either direction).
const NEAR: u32 = 4;

/// Lists shorter than this are never sorted: they fit in cache anyway.
const TIDY_MIN: usize = 1024;

impl FreeList {
    pub(crate) fn push(&mut self, index: u32) {
        self.free.push(index);
        if index.abs_diff(self.last_pushed) > NEAR {
            self.scattered_since_sort += 1;
        }
        self.last_pushed = index;
    }

    pub(crate) fn pop(&mut self) -> Option<u32> {
        self.free.pop()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.free.is_empty()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.free.len()
    }

    /// Sorts the list (the lowest index is popped first) if it is long and at least half
    /// of it arrived scattered since the last sort. A list freed in a sequential order
    /// (a chain, a fan) is left as it is: LIFO then reuses the entries freed last, which
    /// are still in cache.
    pub(crate) fn tidy(&mut self) {
        let n = self.free.len();
        if n >= TIDY_MIN && 2 * self.scattered_since_sort >= n {
            self.free.sort_unstable_by(|a, b| b.cmp(a));
            self.scattered_since_sort = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_lifo_until_tidied_then_ascending() {
        let mut f = FreeList::default();
        let scrambled: Vec<u32> = (0..4096u32)
            .map(|i| i.wrapping_mul(2654435761) % 4096)
            .collect();
        for &i in &scrambled {
            f.push(i);
        }
        assert_eq!(f.pop(), scrambled.last().copied(), "LIFO before tidy");
        f.tidy();
        let popped: Vec<u32> = std::iter::from_fn(|| f.pop()).take(5).collect();
        let mut expect: Vec<u32> = scrambled[..scrambled.len() - 1].to_vec();
        expect.sort_unstable();
        assert_eq!(popped, expect[..5]);
    }

    #[test]
    fn short_sequential_or_barely_changed_lists_are_left_alone() {
        let mut f = FreeList::default();
        for i in [5u32, 1, 9] {
            f.push(i);
        }
        f.tidy();
        assert_eq!(f.pop(), Some(9), "short list: unsorted");

        let mut f = FreeList::default();
        for i in 0..4096u32 {
            f.push(i);
        }
        f.tidy();
        assert_eq!(f.pop(), Some(4095), "freed in order: LIFO kept");

        let mut f = FreeList::default();
        for i in 0..4096u32 {
            f.push(i.wrapping_mul(2654435761) % 4096);
        }
        f.tidy(); // scrambled: sorted, pops 0 first
        assert_eq!(f.pop(), Some(0));
        for i in [7000u32, 6000] {
            f.push(i);
        }
        f.tidy(); // 2 of 4097 scattered since: not sorted again
        assert_eq!(f.pop(), Some(6000));
        assert_eq!(f.len(), 4096);
    }
}
