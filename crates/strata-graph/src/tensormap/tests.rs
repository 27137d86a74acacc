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
    // The list did not grow since that pass, so the next one comes after one run per
    // SWEEP_HEADS_PER_RUN listed heads.
    let wait = 2001u64.div_ceil(SWEEP_HEADS_PER_RUN);
    for run in RUN1 + 2..RUN1 + 1 + wait {
        f.m.borrow_mut().sweep(run);
        assert_eq!(f.m.borrow().key_count(), 2001, "run {run}: no pass yet");
    }
    f.m.borrow_mut().sweep(RUN1 + 1 + wait);
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
fn heads_whose_last_use_records_nothing_are_freed_too() {
    let f = Fixture::new();
    // Buffers written and emptied in one run, then only looked up in the next (a wait
    // for their data, a read-back): the lookup records nothing.
    let used: Vec<_> = (0..1500).map(|_| f.key()).collect();
    for (i, k) in used.iter().enumerate() {
        f.write(RUN1, *k, Footprint::WHOLE, i as u32);
        f.kill(i as u32);
    }
    f.m.borrow_mut().sweep(RUN1 + 1);
    for k in &used {
        f.m.borrow_mut().head(*k, RUN1 + 1, false);
    }
    // Buffers only ever looked up: their heads are created empty.
    for _ in 0..1500 {
        let k = f.key();
        f.m.borrow_mut().head(k, RUN1 + 1, true);
    }
    assert_eq!(f.m.borrow().key_count(), 3000);
    let bound = 2 + 3000u64.div_ceil(SWEEP_HEADS_PER_RUN);
    for run in RUN1 + 2..RUN1 + 2 + bound {
        f.m.borrow_mut().sweep(run);
    }
    assert_eq!(f.m.borrow().key_count(), 0, "every unused empty head freed");
    assert_eq!(f.m.borrow().idle_listed(), 0);
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

/// The counters of lookups: entries examined, index nodes traversed.
fn counters(f: &Fixture) -> (u64, u64) {
    let m = f.m.borrow();
    (m.visits(), m.probes())
}

#[test]
fn indexed_lookups_examine_only_overlapping_entries() {
    let f = Fixture::new();
    // 4096 disjoint 16-byte slices of one buffer.
    let k = f.key();
    let slice = |i: u64, n: u64| Footprint::bytes(i * 16, (i + n) * 16).unwrap();
    for i in 0..4096u32 {
        f.write(RUN1, k, slice(i as u64, 1), i);
    }
    assert_eq!(f.m.borrow().indexed(&k), (true, false));
    let (v0, p0) = counters(&f);
    let lookups = (0..4096u32).step_by(97).count() as u64;
    for i in (0..4096u32).step_by(97) {
        assert_eq!(f.reads(RUN1, k, slice(i as u64, 1)), vec![i]);
    }
    let (v1, p1) = counters(&f);
    assert_eq!(v1 - v0, lookups, "each lookup examines exactly its slice");
    assert!(
        p1 - p0 <= 48 * lookups,
        "{} index nodes traversed for {lookups} lookups of 4096 entries",
        p1 - p0
    );
    assert_eq!(f.reads(RUN1, k, slice(100, 3)), vec![100, 101, 102]);
    assert_eq!(counters(&f).0 - v1, 3);

    // 32 × 32 tiles of 4 × 4 bytes of a 128 × 128 matrix. The spans of the 32 tiles of
    // a row band all intersect (they interleave row by row); the index's column hulls
    // still leave one candidate per tile.
    let k2 = f.key();
    let m = TensorView::contiguous(DataType::U8, &[128, 128]).unwrap();
    let tile = |i: u64, j: u64, h: u64, w: u64| {
        Footprint::of_view(&m.window(&[i * 4, j * 4], &[h * 4, w * 4]).unwrap())
    };
    let id = |i: u64, j: u64| 10_000 + (i * 32 + j) as u32;
    for i in 0..32 {
        for j in 0..32 {
            f.write(RUN1, k2, tile(i, j, 1, 1), id(i, j));
        }
    }
    assert_eq!(f.m.borrow().indexed(&k2), (true, false));
    let (v0, p0) = counters(&f);
    let mut lookups = 0;
    for (i, j) in [(0, 0), (5, 17), (16, 31), (31, 0), (31, 31), (20, 9)] {
        assert_eq!(f.reads(RUN1, k2, tile(i, j, 1, 1)), vec![id(i, j)]);
        lookups += 1;
    }
    let (v1, p1) = counters(&f);
    assert_eq!(v1 - v0, lookups, "each lookup examines exactly its tile");
    assert!(p1 - p0 <= 64 * lookups, "{} index nodes traversed", p1 - p0);
    // A block of 2 × 2 tiles examines four.
    assert_eq!(
        f.reads(RUN1, k2, tile(7, 7, 2, 2)),
        vec![id(7, 7), id(7, 8), id(8, 7), id(8, 8)]
    );
    assert_eq!(counters(&f).0 - v1, 4);
    // A dense byte range (off the grid) meets the spans of the 32 tiles of its band,
    // and depends on them all (conservatively: a range and a tile are not compared
    // per axis).
    let (v2, _) = counters(&f);
    let row = Footprint::bytes(9 * 4 * 128, (9 * 4 + 1) * 128).unwrap();
    let band: Vec<u32> = (0..32).map(|j| id(9, j)).collect();
    assert_eq!(f.reads(RUN1, k2, row), band);
    assert_eq!(counters(&f).0 - v2, 32);
    // Readers of tiles; a write of a tile examines its writer and its reader only.
    for j in 0..32 {
        f.access(RUN1, k2, tile(3, j, 1, 1), ArgTag::Input, 20_000 + j as u32);
    }
    for j in 0..32 {
        f.access(RUN1, k2, tile(4, j, 1, 1), ArgTag::Input, 20_100 + j as u32);
    }
    // The first write lookup walks the reader list, which then gets its index.
    assert_eq!(f.writes(RUN1, k2, tile(0, 0, 1, 1)), vec![id(0, 0)]);
    assert_eq!(f.m.borrow().indexed(&k2), (true, true));
    let (v3, _) = counters(&f);
    assert_eq!(f.writes(RUN1, k2, tile(4, 6, 1, 1)), vec![id(4, 6), 20_106]);
    assert_eq!(counters(&f).0 - v3, 2);
    // Consuming every task retires the entries; compaction drops the indexes.
    for t in (0..4096)
        .chain(10_000..11_024)
        .chain(20_000..20_032)
        .chain(20_100..20_132)
    {
        f.kill(t);
    }
    assert_eq!(f.live_entries(RUN1), 0);
    assert_eq!(f.m.borrow().indexed(&k), (false, false));
    assert_eq!(f.m.borrow().indexed(&k2), (false, false));
    assert!(f.reads(RUN1, k2, Footprint::WHOLE).is_empty());
}

/// Brute force: every entry recorded, as the semantics define it.
#[derive(Default)]
struct Model {
    writers: Vec<(u32, Footprint, u64)>,
    readers: Vec<(u32, Footprint, u64)>,
}

impl Model {
    fn deps(&self, dead: &HashSet<u32>, run: u64, fp: &Footprint, tag: ArgTag) -> Vec<u32> {
        if !tag.tracked() {
            return vec![];
        }
        let hits = |l: &[(u32, Footprint, u64)]| -> Vec<u32> {
            l.iter()
                .filter(|(t, e, r)| {
                    *r == run && !dead.contains(t) && fp.overlap(e) != Overlap::None
                })
                .map(|(t, _, _)| *t)
                .collect()
        };
        let mut v = hits(&self.writers);
        if tag.writes() {
            v.extend(hits(&self.readers));
        }
        v
    }
    fn record(&mut self, run: u64, fp: &Footprint, tag: ArgTag, task: u32) {
        if !tag.tracked() {
            return;
        }
        if tag.writes() {
            let kept =
                |(_, e, r): &(u32, Footprint, u64)| *r != run || fp.overlap(e) != Overlap::Covered;
            self.writers.retain(kept);
            self.readers.retain(kept);
            self.writers.push((task, fp.clone(), run));
        } else {
            self.readers.push((task, fp.clone(), run));
        }
    }
    fn live(&self, l: bool, dead: &HashSet<u32>, run: u64) -> Vec<u32> {
        let l = if l { &self.readers } else { &self.writers };
        l.iter()
            .filter(|(t, _, r)| *r == run && !dead.contains(t))
            .map(|(t, _, _)| *t)
            .collect()
    }
}

/// Views of a 32 × 32 byte matrix: mostly aligned 4 × 4 tiles, also blocks of tiles,
/// rows, columns, unaligned windows, dense ranges, views on another grid (the buffer
/// as 64 × 16) and the whole buffer.
fn arb_fp(sel: u64, a: u64, b: u64, c: u64, d: u64) -> Footprint {
    let m = TensorView::contiguous(DataType::U8, &[32, 32]).unwrap();
    let v = match sel {
        0..=9 => m.window(&[a % 8 * 4, b % 8 * 4], &[4, 4]).unwrap(),
        10 | 11 => m
            .window(&[a % 7 * 4, b % 7 * 4], &[4 + c % 2 * 4, 4 + d % 2 * 4])
            .unwrap(),
        12 => m.slice(0, a % 32, a % 32 + 1 + c % (32 - a % 32)).unwrap(),
        13 => m.slice(1, b % 32, b % 32 + 1 + d % (32 - b % 32)).unwrap(),
        14 => {
            let (r, cc) = (a % 32, b % 32);
            m.window(&[r, cc], &[1 + c % (32 - r), 1 + d % (32 - cc)])
                .unwrap()
        }
        15 => {
            let s = (a * 32 + b) % 1024;
            return Footprint::bytes(s, s + 1 + (c * 32 + d) % (1024 - s)).unwrap();
        }
        16 => m
            .reshape(&[64, 16])
            .unwrap()
            .window(&[a % 56, b % 12], &[1 + c % 8, 1 + d % 4])
            .unwrap(),
        _ => return Footprint::WHOLE,
    };
    Footprint::of_view(&v)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
    /// Random accesses, consumptions and run changes on one buffer: every lookup
    /// finds exactly the entries the brute-force model finds, in the same order, with
    /// lists long enough to be indexed.
    #[test]
    fn span_index_edges_match_brute_force(
        ops in proptest::collection::vec(
            (0u64..100, 0u64..18, 0u64..64, 0u64..64, 0u64..64, 0u64..64),
            200..700,
        )
    ) {
        let f = Fixture::new();
        let k = f.key();
        let mut model = Model::default();
        let mut run = RUN1;
        let mut live_tasks: Vec<u32> = vec![];
        // Writers and readers of the 64 tiles, then a write lookup: both lists are
        // long and indexed before the random steps.
        for x in 0..128u32 {
            let fp = arb_fp(0, (x % 64 / 8) as u64, (x % 8) as u64, 0, 0);
            let tag = if x < 64 { ArgTag::OutputExisting } else { ArgTag::Input };
            f.access(run, k, fp.clone(), tag, 100_000 + x);
            model.record(run, &fp, tag, 100_000 + x);
            live_tasks.push(100_000 + x);
        }
        let fp = arb_fp(0, 0, 0, 0, 0);
        proptest::prop_assert_eq!(f.writes(run, k, fp), vec![100_000, 100_064]);
        proptest::prop_assert_eq!(f.m.borrow().indexed(&k), (true, true));
        for (step, &(op, sel, a, b, c, d)) in ops.iter().enumerate() {
            let task = step as u32;
            match op {
                // Consume a task: retire its journal, or (not yet recycled) only
                // mark it dead.
                0..=11 if !live_tasks.is_empty() => {
                    let t = live_tasks.swap_remove((a * 64 + b) as usize % live_tasks.len());
                    if op < 8 {
                        f.kill(t);
                    } else {
                        f.dead.borrow_mut().insert(t);
                    }
                }
                12 => run += 1,
                _ => {
                    let fp = arb_fp(sel, a, b, c, d);
                    let tag = [
                        ArgTag::Input,
                        ArgTag::Input,
                        ArgTag::Output,
                        ArgTag::InOut,
                        ArgTag::OutputExisting,
                        ArgTag::NoDep,
                    ][(op % 6) as usize];
                    let want = model.deps(&f.dead.borrow(), run, &fp, tag);
                    proptest::prop_assert_eq!(f.deps(run, k, fp.clone(), tag), want, "step {}", step);
                    f.access(run, k, fp.clone(), tag, task);
                    model.record(run, &fp, tag, task);
                    live_tasks.push(task);
                }
            }
            let dead = f.dead.borrow().clone();
            let live = |t: &TaskRef| !dead.contains(&t.index);
            let m = f.m.borrow();
            let ids = |v: Vec<TaskRef>| v.into_iter().map(|t| t.index).collect::<Vec<_>>();
            proptest::prop_assert_eq!(ids(m.writers(run, &k, &live)), model.live(false, &dead, run));
            proptest::prop_assert_eq!(ids(m.readers(run, &k, &live)), model.live(true, &dead, run));
        }
    }
}
