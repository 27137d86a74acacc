//! Property test: random DAGs of tagged reads and writes over random views of a few small
//! buffers, executed by a scheduler that claims and completes READY tasks in random
//! order (reads happen at claim, writes at completion, so tasks genuinely overlap), must
//! leave exactly the bytes that running the tasks one by one in submit order leaves.

use proptest::prelude::*;
use std::collections::HashMap;
use strata_graph::*;
use strata_types::{ArgTag, DataType, IdentityMinter, TensorView};

const BUFS: usize = 3;
const ROWS: u64 = 6;
const COLS: u64 = 8;

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

fn random_view(rng: &mut Rng) -> TensorView {
    let m = TensorView::contiguous(DataType::U8, &[ROWS, COLS]).unwrap();
    match rng.below(5) {
        0 => m,
        1 => {
            let r = rng.below(ROWS);
            m.slice(0, r, r + 1 + rng.below(ROWS - r)).unwrap()
        }
        2 => {
            let (r, c) = (rng.below(ROWS), rng.below(COLS));
            m.window(&[r, c], &[1 + rng.below(ROWS - r), 1 + rng.below(COLS - c)])
                .unwrap()
        }
        3 => {
            let c = rng.below(COLS);
            m.slice(1, c, c + 1 + rng.below(COLS - c))
                .unwrap()
                .transpose(0, 1)
                .unwrap()
        }
        _ => {
            let flat = m.reshape(&[ROWS * COLS]).unwrap();
            let s = rng.below(ROWS * COLS);
            flat.slice(0, s, s + 1 + rng.below(ROWS * COLS - s))
                .unwrap()
        }
    }
}

fn bytes(v: &TensorView) -> Vec<u64> {
    v.element_offsets().collect()
}

fn random_ops(seed: u64, n: usize) -> Vec<Op> {
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
                    let a = Acc {
                        buf: rng.below(BUFS as u64) as usize,
                        view: random_view(&mut rng),
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

fn initial() -> Vec<Vec<u8>> {
    (0..BUFS)
        .map(|b| {
            (0..ROWS * COLS)
                .map(|x| (x as u8).wrapping_mul(7).wrapping_add(b as u8))
                .collect()
        })
        .collect()
}

fn sequential(ops: &[Op]) -> Vec<Vec<u8>> {
    let mut bufs = initial();
    for (i, op) in ops.iter().enumerate() {
        if let Op::Task(accs) = op {
            let h = read_phase(i, accs, &bufs);
            write_phase(i, h, accs, &mut bufs);
        }
    }
    bufs
}

fn through_graph(ops: &[Op], split: usize, exec_seed: u64, cfg: GraphConfig) -> Vec<Vec<u8>> {
    let (mut orch, mut sched) = graph::<usize>(cfg).unwrap();
    let minter = IdentityMinter::new();
    let keys: Vec<BufferKey> = (0..BUFS)
        .map(|_| BufferKey::new(minter.mint(), KeySpace::Host))
        .collect();
    let mut ready: Vec<ReadyTask> = vec![];
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
                    if s.ready {
                        ready.push(orch.ready_task(s.task));
                    }
                }
            }
        }
        orch.close_run().unwrap();
    }
    let mut bufs = initial();
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
            sched.complete(t, Ok(()), &mut ready).unwrap();
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
        let ops = random_ops(seed, n);
        let split = (n as f64 * split_frac) as usize;
        let got = through_graph(&ops, split, exec_seed, GraphConfig::default());
        prop_assert_eq!(got, sequential(&ops));
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
            for op in random_ops(seed * 1000 + chunk, 4) {
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
        let keys: Vec<BufferKey> = (0..BUFS)
            .map(|_| BufferKey::new(minter.mint(), KeySpace::Host))
            .collect();
        let ops = std::sync::Arc::new(ops);
        let (tx, rx) = mpsc::channel::<Option<TaskRef>>();
        let sched_ops = ops.clone();
        let exec_seed = rng.next();
        let t = std::thread::spawn(move || {
            let mut bufs = initial();
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
        assert_eq!(got, sequential(&ops), "seed {seed}");
    }
}
