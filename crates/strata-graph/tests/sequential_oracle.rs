//! Property test: random DAGs of tagged reads and writes over random views of a few small
//! buffers, executed by a scheduler that claims and completes READY tasks in random
//! order (reads happen at claim, writes at completion, so tasks genuinely overlap), must
//! leave exactly the bytes that running the tasks one by one in submit order leaves.
//!
//! The execution also checks the edges against brute-force computations: at every step,
//! no task is released while an earlier task of the same run that shares a byte with it
//! (one of the two writing) is pending, and every task not released still waits for an
//! earlier one whose footprint does not provably miss its own. A second property runs hundreds of tasks over the
//! tiles of one buffer, so that the TensorMap's span index is exercised.

use proptest::prelude::*;
use std::collections::HashMap;
use strata_graph::*;
use strata_types::{ArgTag, DataType, IdentityMinter, TensorView};

/// The buffers of a test: `bufs` matrices of `rows` × `cols` bytes.
#[derive(Debug, Clone, Copy)]
struct Space {
    bufs: usize,
    rows: u64,
    cols: u64,
    /// Edge of the aligned tiles the tile generator favours (0: the mixed generator).
    tile: u64,
}

/// Three small buffers, views of every kind.
const SMALL: Space = Space {
    bufs: 3,
    rows: 6,
    cols: 8,
    tile: 0,
};

/// One 32 × 32 buffer (and a second, rarely used), mostly aligned 4 × 4 tiles.
const TILES: Space = Space {
    bufs: 2,
    rows: 32,
    cols: 32,
    tile: 4,
};

#[derive(Debug, Clone)]
struct Acc {
    buf: usize,
    view: TensorView,
    tag: ArgTag,
}

#[derive(Debug, Clone)]
enum Op {
    Task(Vec<Acc>),
    ScopeBegin,
    ScopeEnd,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn random_view(rng: &mut Rng, sp: Space) -> TensorView {
    let (rows, cols) = (sp.rows, sp.cols);
    let m = TensorView::contiguous(DataType::U8, &[rows, cols]).unwrap();
    if sp.tile > 0 && rng.below(8) != 0 {
        // An aligned tile, or a block of 2 × 1, 1 × 2 or 2 × 2 tiles.
        let t = sp.tile;
        let (h, w) = (t * (1 + rng.below(2)), t * (1 + rng.below(2)));
        let r = t * rng.below((rows - h) / t + 1);
        let c = t * rng.below((cols - w) / t + 1);
        return m.window(&[r, c], &[h, w]).unwrap();
    }
    match rng.below(5) {
        0 => m,
        1 => {
            let r = rng.below(rows);
            m.slice(0, r, r + 1 + rng.below(rows - r)).unwrap()
        }
        2 => {
            let (r, c) = (rng.below(rows), rng.below(cols));
            m.window(&[r, c], &[1 + rng.below(rows - r), 1 + rng.below(cols - c)])
                .unwrap()
        }
        3 => {
            let c = rng.below(cols);
            m.slice(1, c, c + 1 + rng.below(cols - c))
                .unwrap()
                .transpose(0, 1)
                .unwrap()
        }
        _ => {
            let flat = m.reshape(&[rows * cols]).unwrap();
            let s = rng.below(rows * cols);
            flat.slice(0, s, s + 1 + rng.below(rows * cols - s))
                .unwrap()
        }
    }
}

fn bytes(v: &TensorView) -> Vec<u64> {
    v.element_offsets().collect()
}

fn random_ops(seed: u64, n: usize, sp: Space) -> Vec<Op> {
    let mut rng = Rng(seed | 1);
    let mut ops = vec![];
    let mut depth = 0;
    for _ in 0..n {
        match rng.below(10) {
            0 if depth < 5 => {
                depth += 1;
                ops.push(Op::ScopeBegin);
            }
            1 if depth > 0 => {
                depth -= 1;
                ops.push(Op::ScopeEnd);
            }
            _ => {
                let mut accs: Vec<Acc> = vec![];
                for _ in 0..1 + rng.below(3) {
                    let tag = [
                        ArgTag::Input,
                        ArgTag::Output,
                        ArgTag::InOut,
                        ArgTag::OutputExisting,
                    ][rng.below(4) as usize];
                    // The tile space uses its second buffer rarely.
                    let buf = match sp.tile {
                        0 => rng.below(sp.bufs as u64) as usize,
                        _ => (rng.below(10) == 0) as usize,
                    };
                    let a = Acc {
                        buf,
                        view: random_view(&mut rng, sp),
                        tag,
                    };
                    let alias = accs.iter().any(|p| {
                        p.buf == a.buf
                            && (p.tag.writes() || a.tag.writes())
                            && bytes(&p.view).iter().any(|b| bytes(&a.view).contains(b))
                    });
                    if !alias {
                        accs.push(a);
                    }
                }
                ops.push(Op::Task(accs));
            }
        }
    }
    ops
}

/// The deterministic "kernel" of task `i`: a digest of everything it reads.
fn read_phase(i: usize, accs: &[Acc], bufs: &[Vec<u8>]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ i as u64;
    for a in accs.iter().filter(|a| a.tag.reads()) {
        for off in bytes(&a.view) {
            h = (h ^ bufs[a.buf][off as usize] as u64).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

fn write_phase(i: usize, h: u64, accs: &[Acc], bufs: &mut [Vec<u8>]) {
    for (ai, a) in accs.iter().enumerate().filter(|(_, a)| a.tag.writes()) {
        for (e, off) in bytes(&a.view).into_iter().enumerate() {
            let v = (h.rotate_left((e % 64) as u32) as u8)
                .wrapping_add(i as u8)
                .wrapping_add(ai as u8 * 17);
            let cell = &mut bufs[a.buf][off as usize];
            *cell = if a.tag == ArgTag::InOut {
                cell.wrapping_mul(3).wrapping_add(v)
            } else {
                v
            };
        }
    }
}

fn initial(sp: Space) -> Vec<Vec<u8>> {
    (0..sp.bufs)
        .map(|b| {
            (0..sp.rows * sp.cols)
                .map(|x| (x as u8).wrapping_mul(7).wrapping_add(b as u8))
                .collect()
        })
        .collect()
}

fn sequential(ops: &[Op], sp: Space) -> Vec<Vec<u8>> {
    let mut bufs = initial(sp);
    for (i, op) in ops.iter().enumerate() {
        if let Op::Task(accs) = op {
            let h = read_phase(i, accs, &bufs);
            write_phase(i, h, accs, &mut bufs);
        }
    }
    bufs
}

/// Whether tasks `a` and `b` may conflict: an access pair on one buffer, one of them a
/// write, whose footprints do not provably miss (the graph may wait for such a pair).
fn conflict(a: &[Acc], b: &[Acc]) -> bool {
    a.iter().any(|x| {
        b.iter().any(|y| {
            x.buf == y.buf
                && (x.tag.writes() || y.tag.writes())
                && Footprint::of_view(&x.view).overlap(&Footprint::of_view(&y.view))
                    != Overlap::None
        })
    })
}

/// An access as the bytes it touches: buffer, whether it writes, a bit per byte.
type Touch = (usize, bool, Vec<u64>);

fn touches(a: &[Acc]) -> Vec<Touch> {
    a.iter()
        .map(|x| {
            let mut bits = vec![];
            for o in bytes(&x.view) {
                let (w, b) = ((o / 64) as usize, o % 64);
                if bits.len() <= w {
                    bits.resize(w + 1, 0u64);
                }
                bits[w] |= 1 << b;
            }
            (x.buf, x.tag.writes(), bits)
        })
        .collect()
}

/// Whether two tasks truly conflict: an access pair on one buffer, one of them a write,
/// that share a byte (the graph must wait for such a pair).
fn true_conflict(a: &[Touch], b: &[Touch]) -> bool {
    a.iter().any(|(xb, xw, xs)| {
        b.iter().any(|(yb, yw, ys)| {
            xb == yb && (*xw || *yw) && xs.iter().zip(ys).any(|(p, q)| p & q != 0)
        })
    })
}

/// The edges the graph must have: earlier tasks of the same run sharing a written byte.
fn true_edges(ops: &[Op], split: usize) -> Vec<Vec<usize>> {
    let run_of = |i: usize| (i >= split) as usize;
    let t: Vec<Option<Vec<Touch>>> = ops
        .iter()
        .map(|o| match o {
            Op::Task(a) => Some(touches(a)),
            _ => None,
        })
        .collect();
    (0..ops.len())
        .map(|i| {
            let Some(a) = &t[i] else {
                return vec![];
            };
            (0..i)
                .filter(|&j| run_of(j) == run_of(i))
                .filter(|&j| matches!(&t[j], Some(b) if true_conflict(a, b)))
                .collect()
        })
        .collect()
}

/// The edges the graph may have (conservative overlap): for each task op, the earlier
/// task ops of its run it may conflict with (empty for scope ops).
fn brute_force_edges(ops: &[Op], split: usize) -> Vec<Vec<usize>> {
    let run_of = |i: usize| (i >= split) as usize;
    (0..ops.len())
        .map(|i| {
            let Op::Task(a) = &ops[i] else {
                return vec![];
            };
            (0..i)
                .filter(|&j| run_of(j) == run_of(i))
                .filter(|&j| matches!(&ops[j], Op::Task(b) if conflict(a, b)))
                .collect()
        })
        .collect()
}

fn through_graph(
    ops: &[Op],
    split: usize,
    exec_seed: u64,
    cfg: GraphConfig,
    sp: Space,
) -> Vec<Vec<u8>> {
    let (mut orch, mut sched) = graph::<usize>(cfg).unwrap();
    let minter = IdentityMinter::new();
    let keys: Vec<BufferKey> = (0..sp.bufs)
        .map(|_| BufferKey::new(minter.mint(), KeySpace::Host))
        .collect();
    // A released task must not have a truly conflicting earlier task still pending; a
    // task not released must wait for something it may conflict with. (The conservative
    // rule is not the must-wait rule: a write that covers an earlier entry drops it, and
    // a later view may provably miss the covering write while only conservatively
    // overlapping the dropped entry, without sharing a byte with either.)
    let must = true_edges(ops, split);
    let edges = brute_force_edges(ops, split);
    let mut ready: Vec<ReadyTask> = vec![];
    let mut op_of: HashMap<TaskRef, usize> = HashMap::new();
    let mut released = vec![false; ops.len()];
    let mut done = vec![false; ops.len()];
    // Every task released so far must have had all its brute-force producers done, and
    // every task not yet released must still wait for one.
    let check = |ready: &[ReadyTask],
                 op_of: &HashMap<TaskRef, usize>,
                 released: &mut Vec<bool>,
                 done: &[bool],
                 submitted: usize| {
        for r in ready {
            let i = op_of[&r.task];
            if !released[i] {
                released[i] = true;
                let missing: Vec<_> = must[i].iter().filter(|&&j| !done[j]).collect();
                assert!(
                    missing.is_empty(),
                    "task {i} released before its producers {missing:?} completed"
                );
            }
        }
        for i in 0..submitted {
            if matches!(ops[i], Op::Task(_)) && !released[i] {
                assert!(
                    edges[i].iter().any(|&j| !done[j]),
                    "task {i} not released although its producers {:?} all completed",
                    edges[i]
                );
            }
        }
    };
    let mut runs = vec![];
    for (part, range) in [(0, 0..split), (1, split..ops.len())] {
        let _ = part;
        runs.push(orch.begin_run().unwrap());
        for i in range {
            match &ops[i] {
                Op::ScopeBegin => orch.scope_begin().unwrap(),
                Op::ScopeEnd => {
                    // Scopes left open at a run boundary were closed by close_run.
                    if orch.scope_depth() > 1 {
                        orch.scope_end().unwrap()
                    }
                }
                Op::Task(accs) => {
                    let a: Vec<Access> = accs
                        .iter()
                        .map(|x| Access::new(keys[x.buf], Footprint::of_view(&x.view), x.tag))
                        .collect();
                    let s = orch.submit(TaskSpec::new(i, &a)).unwrap();
                    op_of.insert(s.task, i);
                    if s.ready {
                        ready.push(orch.ready_task(s.task));
                    }
                }
            }
        }
        orch.close_run().unwrap();
    }
    check(&ready, &op_of, &mut released, &done, ops.len());
    let mut bufs = initial(sp);
    let mut rng = Rng(exec_seed | 1);
    let mut running: Vec<(TaskRef, usize, u64)> = vec![];
    let mut executed: HashMap<usize, usize> = HashMap::new();
    loop {
        let dispatchable = sched.dispatchable_run();
        let claimable: Vec<usize> = (0..ready.len())
            .filter(|&j| Some(ready[j].run) == dispatchable)
            .collect();
        if claimable.is_empty() && running.is_empty() {
            break;
        }
        let claim = !claimable.is_empty() && (running.is_empty() || rng.below(2) == 0);
        if claim {
            let j = claimable[rng.below(claimable.len() as u64) as usize];
            let r = ready.swap_remove(j);
            let c = sched.claim(r.task).expect("ready task claims");
            let i = c.payload;
            let Op::Task(accs) = &ops[i] else {
                unreachable!()
            };
            running.push((r.task, i, read_phase(i, accs, &bufs)));
        } else {
            let k = rng.below(running.len() as u64) as usize;
            let (t, i, h) = running.swap_remove(k);
            let Op::Task(accs) = &ops[i] else {
                unreachable!()
            };
            write_phase(i, h, accs, &mut bufs);
            *executed.entry(i).or_default() += 1;
            done[i] = true;
            sched.complete(t, Ok(()), &mut ready).unwrap();
            check(&ready, &op_of, &mut released, &done, ops.len());
        }
    }
    for r in runs {
        assert_eq!(
            orch.wait_run(r, Some(std::time::Duration::ZERO)).unwrap(),
            Some(Ok(()))
        );
    }
    let tasks = ops.iter().filter(|o| matches!(o, Op::Task(_))).count();
    assert_eq!(executed.len(), tasks, "every task ran");
    assert!(executed.values().all(|&n| n == 1), "no task ran twice");
    assert_eq!(orch.tensormap_entries(), 0, "every entry reclaimed");
    bufs
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn random_order_execution_matches_submit_order(
        seed in any::<u64>(), n in 1usize..120, split_frac in 0.0f64..1.0, exec_seed in any::<u64>()
    ) {
        let ops = random_ops(seed, n, SMALL);
        let split = (n as f64 * split_frac) as usize;
        let got = through_graph(&ops, split, exec_seed, GraphConfig::default(), SMALL);
        prop_assert_eq!(got, sequential(&ops, SMALL));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Hundreds of tasks over the 64 tiles (and blocks, rows, columns, ranges) of one
    /// buffer: long TensorMap lists that get a span index.
    #[test]
    fn many_tiles_of_one_buffer_match_submit_order_and_brute_force_edges(
        seed in any::<u64>(), n in 100usize..500, split_frac in 0.0f64..1.0, exec_seed in any::<u64>()
    ) {
        let ops = random_ops(seed, n, TILES);
        let split = (n as f64 * split_frac) as usize;
        let got = through_graph(&ops, split, exec_seed, GraphConfig::default(), TILES);
        prop_assert_eq!(got, sequential(&ops, TILES));
    }
}

/// Orchestrator and scheduler on two threads with rings small enough that submission must
/// wait for the scheduler to reclaim: tasks go in scopes of four, the task window holds
/// two scopes' worth, the dependency pool a handful of edges.
#[test]
fn back_pressure_with_a_concurrent_scheduler_matches_submit_order() {
    use std::sync::mpsc;
    for seed in 1..=30u64 {
        let mut ops = vec![];
        let mut rng = Rng(seed * 0x9e37_79b9);
        for chunk in 0..40 {
            ops.push(Op::ScopeBegin);
            for op in random_ops(seed * 1000 + chunk, 4, SMALL) {
                if let Op::Task(a) = op {
                    ops.push(Op::Task(a));
                }
            }
            ops.push(Op::ScopeEnd);
        }
        let cfg = GraphConfig {
            rings: [RingConfig {
                heap_bytes: 1 << 16,
                task_window: Some(16),
                dep_pool: Some(24),
            }; RING_COUNT],
            ..GraphConfig::default()
        };
        let (mut orch, mut sched) = graph::<usize>(cfg).unwrap();
        let minter = IdentityMinter::new();
        let keys: Vec<BufferKey> = (0..SMALL.bufs)
            .map(|_| BufferKey::new(minter.mint(), KeySpace::Host))
            .collect();
        let ops = std::sync::Arc::new(ops);
        let (tx, rx) = mpsc::channel::<Option<TaskRef>>();
        let sched_ops = ops.clone();
        let exec_seed = rng.next();
        let t = std::thread::spawn(move || {
            let mut bufs = initial(SMALL);
            let mut rng = Rng(exec_seed | 1);
            let mut ready: Vec<TaskRef> = vec![];
            let mut newly: Vec<ReadyTask> = vec![];
            let mut running: Vec<(TaskRef, usize, u64)> = vec![];
            let mut closed = false;
            loop {
                while let Ok(m) = rx.try_recv() {
                    match m {
                        Some(t) => ready.push(t),
                        None => closed = true,
                    }
                }
                if ready.is_empty() && running.is_empty() {
                    if closed {
                        break;
                    }
                    match rx.recv() {
                        Ok(Some(t)) => ready.push(t),
                        _ => closed = true,
                    }
                    continue;
                }
                if !ready.is_empty() && (running.is_empty() || rng.below(2) == 0) {
                    let t = ready.swap_remove(rng.below(ready.len() as u64) as usize);
                    let c = sched.claim(t).expect("ready");
                    let Op::Task(accs) = &sched_ops[c.payload] else {
                        unreachable!()
                    };
                    running.push((t, c.payload, read_phase(c.payload, accs, &bufs)));
                } else {
                    let (t, i, h) = running.swap_remove(rng.below(running.len() as u64) as usize);
                    let Op::Task(accs) = &sched_ops[i] else {
                        unreachable!()
                    };
                    write_phase(i, h, accs, &mut bufs);
                    sched.complete(t, Ok(()), &mut newly).unwrap();
                    ready.extend(newly.drain(..).map(|r| r.task));
                }
            }
            bufs
        });
        let run = orch.begin_run().unwrap();
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::ScopeBegin => orch.scope_begin().unwrap(),
                Op::ScopeEnd => orch.scope_end().unwrap(),
                Op::Task(accs) => {
                    let a: Vec<Access> = accs
                        .iter()
                        .map(|x| Access::new(keys[x.buf], Footprint::of_view(&x.view), x.tag))
                        .collect();
                    let s = orch
                        .submit(TaskSpec::new(i, &a))
                        .unwrap_or_else(|e| panic!("seed {seed} op {i}: {e}"));
                    if s.ready {
                        tx.send(Some(s.task)).unwrap();
                    }
                }
            }
        }
        orch.close_run().unwrap();
        tx.send(None).unwrap();
        let got = t.join().unwrap();
        assert_eq!(orch.wait_run(run, None).unwrap(), Some(Ok(())));
        assert_eq!(got, sequential(&ops, SMALL), "seed {seed}");
    }
}
