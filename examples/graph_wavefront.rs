//! Longest common subsequence of two random strings, computed as a tiled wavefront of
//! tasks whose dependencies strata-graph infers from the tiles they read and write, run by
//! an orchestrator thread and a scheduler thread, and checked against the sequential DP.
//!
//! Every tile task reads the last row of the tile above, the last column of the tile to
//! its left and the corner of the tile up-left — all views of one `(N+1) x (N+1)` table —
//! and writes its own tile. Nobody states an edge: they follow from the views.
//!
//! strata-graph on its own (`strata::graph`): no chips, no processes, no programs — the
//! dependency-inference core is usable alone.
//!
//! Run with `cargo run --release --example graph_wavefront` (or `cargo xtask sim`). Prints
//! a final line starting with `ok:` and exits non-zero if the LCS differs from the
//! sequential DP's.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use strata::graph::*;
use strata::types::{ArgTag, DataType, IdentityMinter, TensorView};

const N: usize = 1536;
const TILE: usize = 64;
const TILES: usize = N / TILE;

/// The DP table `(N+1) x (N+1)` of u32, shared by the scheduler thread's tasks. Tasks
/// write disjoint tiles; the graph orders every read after the write it depends on.
struct Table {
    cells: Vec<AtomicU32>,
}

impl Table {
    fn at(&self, i: usize, j: usize) -> &AtomicU32 {
        &self.cells[i * (N + 1) + j]
    }
}

fn lcs_tile(t: &Table, a: &[u8], b: &[u8], ti: usize, tj: usize) {
    for i in ti * TILE + 1..=(ti + 1) * TILE {
        for j in tj * TILE + 1..=(tj + 1) * TILE {
            let v = if a[i - 1] == b[j - 1] {
                t.at(i - 1, j - 1).load(Ordering::Relaxed) + 1
            } else {
                t.at(i - 1, j)
                    .load(Ordering::Relaxed)
                    .max(t.at(i, j - 1).load(Ordering::Relaxed))
            };
            t.at(i, j).store(v, Ordering::Relaxed);
        }
    }
}

fn lcs_sequential(a: &[u8], b: &[u8]) -> u32 {
    let mut prev = vec![0u32; N + 1];
    let mut cur = vec![0u32; N + 1];
    for i in 1..=N {
        for j in 1..=N {
            cur[j] = if a[i - 1] == b[j - 1] {
                prev[j - 1] + 1
            } else {
                prev[j].max(cur[j - 1])
            };
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[N]
}

fn random_string(seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..N)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b"ACGT"[(x % 4) as usize]
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = Arc::new(random_string(0x5eed));
    let b = Arc::new(random_string(0xfeed));
    let table = Arc::new(Table {
        cells: (0..(N + 1) * (N + 1)).map(|_| AtomicU32::new(0)).collect(),
    });

    let (mut orch, mut sched) = graph::<(usize, usize)>(GraphConfig::default())?;
    let key = BufferKey::new(IdentityMinter::new().mint(), KeySpace::Host);
    let whole = TensorView::contiguous(DataType::U32, &[(N + 1) as u64, (N + 1) as u64])?;
    let view = |r0: usize, rows: usize, c0: usize, cols: usize, tag: ArgTag| {
        let v = whole.window(&[r0 as u64, c0 as u64], &[rows as u64, cols as u64])?;
        Ok::<_, strata::types::TypesError>(Access::new(key, Footprint::of_view(&v), tag))
    };

    // The scheduler thread: runs ready tiles, readies their consumers.
    let (tx, rx) = mpsc::channel::<Option<TaskRef>>();
    let (ta, tb, tt) = (a.clone(), b.clone(), table.clone());
    let scheduler = std::thread::spawn(move || {
        let mut queue = VecDeque::new();
        let mut ready = Vec::new();
        let mut ran = 0usize;
        let mut closed = false;
        loop {
            while let Ok(m) = rx.try_recv() {
                match m {
                    Some(t) => queue.push_back(t),
                    None => closed = true,
                }
            }
            let Some(t) = queue.pop_front() else {
                if closed {
                    break;
                }
                match rx.recv() {
                    Ok(Some(t)) => queue.push_back(t),
                    _ => closed = true,
                }
                continue;
            };
            let Some(claimed) = sched.claim(t) else {
                continue;
            };
            let (ti, tj) = claimed.payload;
            lcs_tile(&tt, &ta, &tb, ti, tj);
            sched.complete(t, Ok(()), &mut ready)?;
            ran += 1;
            queue.extend(ready.drain(..).map(|r| r.task));
        }
        Ok::<_, GraphError>(ran)
    });

    let started = Instant::now();
    let run = orch.begin_run()?;
    let mut accesses = Vec::with_capacity(4);
    for ti in 0..TILES {
        for tj in 0..TILES {
            let (r0, c0) = (ti * TILE + 1, tj * TILE + 1);
            accesses.clear();
            accesses.push(view(r0 - 1, 1, c0, TILE, ArgTag::Input)?); // row above
            accesses.push(view(r0, TILE, c0 - 1, 1, ArgTag::Input)?); // column to the left
            accesses.push(view(r0 - 1, 1, c0 - 1, 1, ArgTag::Input)?); // corner
            accesses.push(view(r0, TILE, c0, TILE, ArgTag::OutputExisting)?); // the tile
            let s = orch.submit(TaskSpec::new((ti, tj), &accesses))?;
            if s.ready {
                tx.send(Some(s.task))?;
            }
        }
    }
    orch.close_run()?;
    tx.send(None)?;
    let ran = scheduler
        .join()
        .map_err(|_| "scheduler thread panicked")??;
    let outcome = orch.wait_run(run, None)?;
    let elapsed = started.elapsed();
    if outcome != Some(Ok(())) {
        return Err(format!("run failed: {outcome:?}").into());
    }

    let got = table.at(N, N).load(Ordering::Relaxed);
    let expected = lcs_sequential(&a, &b);
    if got != expected || ran != TILES * TILES {
        return Err(format!("LCS {got} != sequential {expected} (ran {ran} tiles)").into());
    }
    println!(
        "ok: LCS of two {N}-base strings = {got} via {ran} tile tasks in {:.1} ms",
        elapsed.as_secs_f64() * 1e3
    );
    Ok(())
}
