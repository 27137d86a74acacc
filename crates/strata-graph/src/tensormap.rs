//! The TensorMap: per run and buffer key, the live writers and readers with their
//! footprints, from which submit infers read-after-write, write-after-write and
//! write-after-read edges.
//!
//! Owned by the orchestrator thread alone (no lock). Entries of consumed tasks are pruned
//! lazily: whenever a lookup meets one, when a consumed task's journal is replayed, and by
//! amortised compaction of long reader lists, so lookups stay proportional to the live
//! entries and wide fan-outs stay linear.

use crate::access::{Access, BufferKey, FxHashMap};
use crate::footprint::{Footprint, Overlap};
use crate::slot::TaskRef;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    fp: Footprint,
    task: TaskRef,
}

#[derive(Debug, Default)]
struct Entries {
    writers: Vec<Entry>,
    readers: Vec<Entry>,
    /// Retirements reported since the last compaction (a hint).
    retired: usize,
    /// Reader-list length at which the next compaction runs.
    compact_readers_at: usize,
}

impl Entries {
    fn is_empty(&self) -> bool {
        self.writers.is_empty() && self.readers.is_empty()
    }

    fn compact(&mut self, live: &impl Fn(&TaskRef) -> bool) {
        self.writers.retain(|e| live(&e.task));
        self.readers.retain(|e| live(&e.task));
        self.retired = 0;
        self.compact_readers_at = 2 * self.readers.len() + 16;
    }
}

/// Map key: run id and buffer key (runs never see each other's entries).
type MapKey = (u64, BufferKey);

#[derive(Debug, Default)]
pub(crate) struct TensorMap {
    map: FxHashMap<MapKey, Entries>,
    /// Runtime-allocated buffers: the task that allocated (and retains) them, or `None`
    /// once that task was consumed and the memory reclaimed (kept so a later use is
    /// reported instead of silently reading reclaimed memory).
    owned: FxHashMap<MapKey, Option<TaskRef>>,
}

impl TensorMap {
    /// Calls `found` for every live entry the access must wait for: writers overlapping a
    /// read; writers and readers overlapping a write. Prunes consumed entries it meets.
    pub(crate) fn collect(
        &mut self,
        run: u64,
        a: &Access,
        live: &impl Fn(&TaskRef) -> bool,
        mut found: impl FnMut(TaskRef),
    ) {
        if !a.tag.tracked() {
            return;
        }
        let Some(e) = self.map.get_mut(&(run, a.key)) else {
            return;
        };
        let mut scan = |list: &mut Vec<Entry>| {
            list.retain(|en| {
                if !live(&en.task) {
                    return false;
                }
                if a.footprint.overlap(&en.fp) != Overlap::None {
                    found(en.task);
                }
                true
            });
        };
        scan(&mut e.writers);
        if a.tag.writes() {
            scan(&mut e.readers);
        }
    }

    /// Records the access of `task`: a write supersedes the entries it covers and becomes
    /// a writer; a read becomes a reader. Returns whether an entry was added (to be
    /// journaled for erasure when `task` is consumed).
    pub(crate) fn record(
        &mut self,
        run: u64,
        a: &Access,
        task: TaskRef,
        live: &impl Fn(&TaskRef) -> bool,
    ) -> bool {
        if !a.tag.tracked() {
            return false;
        }
        let e = self.map.entry((run, a.key)).or_default();
        let entry = Entry {
            fp: a.footprint,
            task,
        };
        if a.tag.writes() {
            let covers = |en: &Entry| a.footprint.overlap(&en.fp) == Overlap::Covered;
            e.writers.retain(|en| !covers(en) && live(&en.task));
            e.readers.retain(|en| !covers(en) && live(&en.task));
            e.writers.push(entry);
        } else {
            if let Some(last) = e.readers.last() {
                if last.task == task && last.fp == a.footprint {
                    return false;
                }
            }
            e.readers.push(entry);
            if e.readers.len() >= e.compact_readers_at {
                e.compact(live);
            }
        }
        true
    }

    /// Notes that `task`, which recorded an entry under `(run, key)`, was consumed; the
    /// key's lists are compacted once enough of their entries are known to be stale.
    pub(crate) fn retire(&mut self, run: u64, key: BufferKey, live: &impl Fn(&TaskRef) -> bool) {
        let mk = (run, key);
        if let Some(e) = self.map.get_mut(&mk) {
            e.retired += 1;
            if 2 * e.retired >= e.writers.len() + e.readers.len() {
                e.compact(live);
                if e.is_empty() {
                    self.map.remove(&mk);
                }
            }
        }
    }

    /// Registers `task` as the allocator of runtime-owned buffer `key`, inserting a
    /// whole-buffer writer entry so any later access of the buffer depends on it.
    pub(crate) fn register_owned(&mut self, run: u64, key: BufferKey, task: TaskRef) {
        self.owned.insert((run, key), Some(task));
        let e = self.map.entry((run, key)).or_default();
        e.writers.push(Entry {
            fp: Footprint::WHOLE,
            task,
        });
    }

    /// For a runtime-owned buffer: `Some(Some(allocator))` while live, `Some(None)` once
    /// reclaimed; `None` for any other buffer.
    pub(crate) fn owner(&self, run: u64, key: &BufferKey) -> Option<Option<TaskRef>> {
        self.owned.get(&(run, *key)).copied()
    }

    /// Marks runtime-owned buffer `key` reclaimed if its allocator is still `task`.
    pub(crate) fn reclaim_owned(&mut self, run: u64, key: BufferKey, task: TaskRef) {
        if let Some(o) = self.owned.get_mut(&(run, key)) {
            if *o == Some(task) {
                *o = None;
            }
        }
    }

    /// Drops every entry of `run` (once it has retired).
    pub(crate) fn clear_run(&mut self, run: u64) {
        self.map.retain(|k, _| k.0 != run);
        self.owned.retain(|k, _| k.0 != run);
    }

    /// Live entries across all keys (diagnostics and tests).
    pub(crate) fn live_entries(&self, live: &impl Fn(&TaskRef) -> bool) -> usize {
        self.map
            .values()
            .map(|e| {
                e.writers.iter().filter(|x| live(&x.task)).count()
                    + e.readers.iter().filter(|x| live(&x.task)).count()
            })
            .sum()
    }

    /// Live writers of `(run, key)` in insertion order (tests and diagnostics).
    pub(crate) fn writers(
        &self,
        run: u64,
        key: &BufferKey,
        live: &impl Fn(&TaskRef) -> bool,
    ) -> Vec<TaskRef> {
        self.map
            .get(&(run, *key))
            .map(|e| {
                e.writers
                    .iter()
                    .filter(|x| live(&x.task))
                    .map(|x| x.task)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Number of keys (including keys whose entries are all stale but not yet pruned).
    #[cfg(test)]
    pub(crate) fn key_count(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    //! Ports of the reference's TensorMap cases (test_tensormap.cpp). The reference
    //! tracks writers only; here every case is checked for writers (the reference's
    //! semantics) plus the reader tracking strata adds.
    use super::*;
    use crate::access::KeySpace;
    use strata_types::{ArgTag, DataType, IdentityMinter, TensorView};

    const RUN1: u64 = 1;
    const RUN2: u64 = 2;

    struct Fixture {
        minter: IdentityMinter,
        dead: std::cell::RefCell<std::collections::HashSet<u32>>,
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
            }
        }
        fn key(&self) -> BufferKey {
            BufferKey::new(self.minter.mint(), KeySpace::Host)
        }
        fn live(&self) -> impl Fn(&TaskRef) -> bool + '_ {
            |t| !self.dead.borrow().contains(&t.index)
        }
        fn kill(&self, i: u32) {
            self.dead.borrow_mut().insert(i);
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

    fn write(m: &mut TensorMap, f: &Fixture, run: u64, key: BufferKey, fp: Footprint, task: u32) {
        m.record(
            run,
            &Access::new(key, fp, ArgTag::OutputExisting),
            t(task),
            &f.live(),
        );
    }

    fn read_deps(
        m: &mut TensorMap,
        f: &Fixture,
        run: u64,
        key: BufferKey,
        fp: Footprint,
    ) -> Vec<u32> {
        let mut v = vec![];
        m.collect(run, &Access::new(key, fp, ArgTag::Input), &f.live(), |x| {
            v.push(x.index)
        });
        v
    }

    fn write_deps(
        m: &mut TensorMap,
        f: &Fixture,
        run: u64,
        key: BufferKey,
        fp: Footprint,
    ) -> Vec<u32> {
        let mut v = vec![];
        m.collect(
            run,
            &Access::new(key, fp, ArgTag::OutputExisting),
            &f.live(),
            |x| v.push(x.index),
        );
        v
    }

    #[test]
    fn lookup_on_empty_map_finds_nothing() {
        let f = Fixture::new();
        let mut m = TensorMap::default();
        assert!(read_deps(&mut m, &f, RUN1, f.key(), Footprint::WHOLE).is_empty());
    }

    #[test]
    fn insert_lookup_and_overwrite() {
        let f = Fixture::new();
        let mut m = TensorMap::default();
        let (k, other) = (f.key(), f.key());
        write(&mut m, &f, RUN1, k, Footprint::WHOLE, 5);
        assert_eq!(read_deps(&mut m, &f, RUN1, k, Footprint::WHOLE), vec![5]);
        assert!(read_deps(&mut m, &f, RUN1, other, Footprint::WHOLE).is_empty());
        write(&mut m, &f, RUN1, k, Footprint::WHOLE, 7);
        assert_eq!(m.live_entries(&f.live()), 1);
        assert_eq!(read_deps(&mut m, &f, RUN1, k, Footprint::WHOLE), vec![7]);
    }

    #[test]
    fn many_keys_and_namespaces_are_distinct() {
        let f = Fixture::new();
        let mut m = TensorMap::default();
        let keys: Vec<_> = (0..100).map(|_| f.key()).collect();
        for (i, k) in keys.iter().enumerate() {
            write(&mut m, &f, RUN1, *k, Footprint::WHOLE, i as u32);
        }
        assert_eq!(m.live_entries(&f.live()), 100);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(
                read_deps(&mut m, &f, RUN1, *k, Footprint::WHOLE),
                vec![i as u32]
            );
        }
        // Same identity in two device spaces, host vs device, and two runs.
        let id = f.minter.mint();
        let c0 = BufferKey::new(id, KeySpace::Device(0));
        let c1 = BufferKey::new(id, KeySpace::Device(1));
        let h = BufferKey::new(id, KeySpace::Host);
        write(&mut m, &f, RUN1, c0, Footprint::WHOLE, 10);
        write(&mut m, &f, RUN1, c1, Footprint::WHOLE, 20);
        write(&mut m, &f, RUN1, h, Footprint::WHOLE, 30);
        write(&mut m, &f, RUN2, h, Footprint::WHOLE, 40);
        assert_eq!(read_deps(&mut m, &f, RUN1, c0, Footprint::WHOLE), vec![10]);
        assert_eq!(read_deps(&mut m, &f, RUN1, c1, Footprint::WHOLE), vec![20]);
        assert_eq!(read_deps(&mut m, &f, RUN1, h, Footprint::WHOLE), vec![30]);
        assert_eq!(read_deps(&mut m, &f, RUN2, h, Footprint::WHOLE), vec![40]);
        m.clear_run(RUN1);
        assert_eq!(read_deps(&mut m, &f, RUN2, h, Footprint::WHOLE), vec![40]);
        assert!(read_deps(&mut m, &f, RUN1, h, Footprint::WHOLE).is_empty());
    }

    #[test]
    fn erase_keeps_newer_same_run_producer() {
        let f = Fixture::new();
        let mut m = TensorMap::default();
        let k = f.key();
        write(&mut m, &f, RUN1, k, br(0, 64), 3);
        write(&mut m, &f, RUN1, k, br(0, 128), 7); // covers 3
        f.kill(3);
        m.retire(RUN1, k, &f.live());
        assert_eq!(read_deps(&mut m, &f, RUN1, k, Footprint::WHOLE), vec![7]);
        f.kill(7);
        m.retire(RUN1, k, &f.live());
        assert_eq!(m.key_count(), 0, "a key with only stale entries is dropped");
    }

    #[test]
    fn ranges_under_one_key() {
        let f = Fixture::new();
        let mut m = TensorMap::default();
        let k = f.key();
        write(&mut m, &f, RUN1, k, br(0, 64), 1);
        write(&mut m, &f, RUN1, k, br(64, 128), 2);
        assert_eq!(m.live_entries(&f.live()), 2);
        assert_eq!(read_deps(&mut m, &f, RUN1, k, br(0, 64)), vec![1]);
        assert_eq!(read_deps(&mut m, &f, RUN1, k, br(64, 128)), vec![2]);
        assert_eq!(read_deps(&mut m, &f, RUN1, k, Footprint::WHOLE), vec![1, 2]);
        assert_eq!(read_deps(&mut m, &f, RUN1, k, br(32, 96)), vec![1, 2]);
        assert_eq!(read_deps(&mut m, &f, RUN1, k, br(8, 16)), vec![1]);
        // A covering write supersedes both.
        write(&mut m, &f, RUN1, k, br(0, 128), 3);
        assert_eq!(read_deps(&mut m, &f, RUN1, k, Footprint::WHOLE), vec![3]);
    }

    #[test]
    fn partially_covered_producer_survives_for_its_own_bytes() {
        let f = Fixture::new();
        let mut m = TensorMap::default();
        let k = f.key();
        write(&mut m, &f, RUN1, k, br(0, 128), 1);
        write(&mut m, &f, RUN1, k, br(0, 64), 2);
        assert_eq!(m.live_entries(&f.live()), 2);
        assert_eq!(read_deps(&mut m, &f, RUN1, k, br(64, 128)), vec![1]);
        assert_eq!(read_deps(&mut m, &f, RUN1, k, br(0, 64)), vec![1, 2]);
    }

    #[test]
    fn whole_backing_write_supersedes_every_range() {
        let f = Fixture::new();
        let mut m = TensorMap::default();
        let k = f.key();
        write(&mut m, &f, RUN1, k, br(0, 8), 1);
        write(&mut m, &f, RUN1, k, Footprint::WHOLE, 2);
        assert_eq!(m.live_entries(&f.live()), 1);
        assert_eq!(read_deps(&mut m, &f, RUN1, k, br(0, 8)), vec![2]);
    }

    #[test]
    fn tiles() {
        let f = Fixture::new();
        let mut m = TensorMap::default();
        let k = f.key();
        write(&mut m, &f, RUN1, k, tile(0, 8, 0, 8), 0);
        write(&mut m, &f, RUN1, k, tile(0, 8, 8, 8), 1);
        write(&mut m, &f, RUN1, k, tile(8, 8, 0, 8), 2);
        write(&mut m, &f, RUN1, k, tile(8, 8, 8, 8), 3);
        assert_eq!(m.live_entries(&f.live()), 4);
        for (i, (r, c)) in [(0, 0), (0, 8), (8, 0), (8, 8)].into_iter().enumerate() {
            assert_eq!(
                read_deps(&mut m, &f, RUN1, k, tile(r, 8, c, 8)),
                vec![i as u32]
            );
        }
        assert_eq!(
            read_deps(&mut m, &f, RUN1, k, tile(4, 8, 4, 8)),
            vec![0, 1, 2, 3]
        );
        // A tile write supersedes only the tiles it contains.
        let k2 = f.key();
        write(&mut m, &f, RUN1, k2, tile(0, 4, 0, 4), 1);
        write(&mut m, &f, RUN1, k2, tile(0, 4, 8, 4), 2);
        write(&mut m, &f, RUN1, k2, tile(0, 8, 0, 8), 3);
        assert_eq!(read_deps(&mut m, &f, RUN1, k2, tile(0, 4, 0, 4)), vec![3]);
        assert_eq!(read_deps(&mut m, &f, RUN1, k2, tile(0, 4, 8, 4)), vec![2]);
    }

    #[test]
    fn writers_wait_for_earlier_readers_until_covered() {
        let f = Fixture::new();
        let mut m = TensorMap::default();
        let k = f.key();
        write(&mut m, &f, RUN1, k, br(0, 128), 1);
        // Two readers of disjoint halves.
        m.record(
            RUN1,
            &Access::new(k, br(0, 64), ArgTag::Input),
            t(2),
            &f.live(),
        );
        m.record(
            RUN1,
            &Access::new(k, br(64, 128), ArgTag::Input),
            t(3),
            &f.live(),
        );
        // A reader does not wait for readers.
        assert_eq!(read_deps(&mut m, &f, RUN1, k, br(0, 128)), vec![1]);
        // A writer of the first half waits for the writer and that half's reader (WAR).
        assert_eq!(write_deps(&mut m, &f, RUN1, k, br(0, 64)), vec![1, 2]);
        write(&mut m, &f, RUN1, k, br(0, 64), 4);
        // The covered reader is gone; the other half's reader stays.
        assert_eq!(write_deps(&mut m, &f, RUN1, k, br(0, 128)), vec![1, 4, 3]);
        // NO_DEP neither looks up nor records.
        let mut v = vec![];
        m.collect(
            RUN1,
            &Access::new(k, br(0, 128), ArgTag::NoDep),
            &f.live(),
            |x| v.push(x),
        );
        assert!(v.is_empty());
        assert!(!m.record(
            RUN1,
            &Access::new(k, br(0, 128), ArgTag::NoDep),
            t(9),
            &f.live()
        ));
    }

    #[test]
    fn wide_fan_out_readers_are_compacted_as_they_retire() {
        let f = Fixture::new();
        let mut m = TensorMap::default();
        let k = f.key();
        for i in 0..10_000u32 {
            m.record(
                RUN1,
                &Access::new(k, Footprint::WHOLE, ArgTag::Input),
                t(i),
                &f.live(),
            );
            f.kill(i);
            m.retire(RUN1, k, &f.live());
        }
        assert!(m.map.get(&(RUN1, k)).is_none_or(|e| e.readers.len() < 64));
    }
}
