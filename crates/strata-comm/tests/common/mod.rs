//! Ranks as threads over one anonymous MAP_SHARED arena, and typed value helpers.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;
use strata_comm::*;
use strata_types::{bf16, f16, DataType};

/// The wait deadline of test ranks: generous (the VM is small and noisy), never reached by
/// a correct test.
pub const TIMEOUT: Duration = Duration::from_secs(30);

pub struct World {
    pub arena: Arc<CommArena>,
    pub alloc: CommAllocator,
}

pub fn world(ranks: u32, bytes: usize) -> World {
    let arena = Arc::new(CommArena::anonymous(bytes, ranks).expect("arena"));
    let alloc = CommAllocator::new(arena.clone());
    World { arena, alloc }
}

/// Runs `f` on every listed world rank, each in its own thread with its own
/// `RankContext`; returns the results in the order of `ranks`.
pub fn run_ranks<R: Send>(
    arena: &Arc<CommArena>,
    ranks: &[u32],
    timeout: Duration,
    f: impl Fn(Comm<'_>) -> R + Sync,
) -> Vec<R> {
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|&r| {
                let ctx = RankContext::new(arena.clone(), r, timeout);
                s.spawn(move || f(Comm::from_rank(&ctx)))
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

/// Every rank of the world.
pub fn all(n: u32) -> Vec<u32> {
    (0..n).collect()
}

pub fn to_f64(dtype: DataType, v: f64) -> f64 {
    match dtype {
        DataType::F16 => f16::from_f64(v).to_f64(),
        DataType::BF16 => bf16::from_f64(v).to_f64(),
        DataType::F32 => v as f32 as f64,
        DataType::I32 => v as i32 as f64,
        _ => unreachable!(),
    }
}

/// Host-writes `vals` (converted to the tensor's dtype) into domain rank `rank`'s copy.
pub fn host_put(alloc: &CommAllocator, t: &DistributedTensor, rank: u32, vals: &[f64]) {
    match t.dtype() {
        DataType::F32 => {
            let v: Vec<f32> = vals.iter().map(|&x| x as f32).collect();
            alloc.host_write(t, rank, 0, &v).unwrap()
        }
        DataType::F16 => {
            let v: Vec<f16> = vals.iter().map(|&x| f16::from_f64(x)).collect();
            alloc.host_write(t, rank, 0, &v).unwrap()
        }
        DataType::BF16 => {
            let v: Vec<bf16> = vals.iter().map(|&x| bf16::from_f64(x)).collect();
            alloc.host_write(t, rank, 0, &v).unwrap()
        }
        DataType::I32 => {
            let v: Vec<i32> = vals.iter().map(|&x| x as i32).collect();
            alloc.host_write(t, rank, 0, &v).unwrap()
        }
        d => panic!("no helper for {d}"),
    }
}

/// Host-reads domain rank `rank`'s copy of `t` as f64s.
pub fn host_get(alloc: &CommAllocator, t: &DistributedTensor, rank: u32) -> Vec<f64> {
    let n = t.numel() as usize;
    match t.dtype() {
        DataType::F32 => {
            let mut v = vec![0f32; n];
            alloc.host_read(t, rank, 0, &mut v).unwrap();
            v.iter().map(|&x| x as f64).collect()
        }
        DataType::F16 => {
            let mut v = vec![f16::ZERO; n];
            alloc.host_read(t, rank, 0, &mut v).unwrap();
            v.iter().map(|x| x.to_f64()).collect()
        }
        DataType::BF16 => {
            let mut v = vec![bf16::ZERO; n];
            alloc.host_read(t, rank, 0, &mut v).unwrap();
            v.iter().map(|x| x.to_f64()).collect()
        }
        DataType::I32 => {
            let mut v = vec![0i32; n];
            alloc.host_read(t, rank, 0, &mut v).unwrap();
            v.iter().map(|&x| x as f64).collect()
        }
        d => panic!("no helper for {d}"),
    }
}

/// A rank writes `vals` into its own copy through its window.
pub fn put_own(w: &Window<'_>, vals: &[f64]) {
    let me = w.rank();
    match w.tensor().dtype() {
        DataType::F32 => {
            let v: Vec<f32> = vals.iter().map(|&x| x as f32).collect();
            w.write(me, 0, &v).unwrap()
        }
        DataType::F16 => {
            let v: Vec<f16> = vals.iter().map(|&x| f16::from_f64(x)).collect();
            w.write(me, 0, &v).unwrap()
        }
        DataType::BF16 => {
            let v: Vec<bf16> = vals.iter().map(|&x| bf16::from_f64(x)).collect();
            w.write(me, 0, &v).unwrap()
        }
        DataType::I32 => {
            let v: Vec<i32> = vals.iter().map(|&x| x as i32).collect();
            w.write(me, 0, &v).unwrap()
        }
        d => panic!("no helper for {d}"),
    }
}

/// The golden fold of `op` over `inputs[rank][i]` (exact for the small integers the tests
/// use), converted to `dtype`.
pub fn fold(op: ReduceOp, dtype: DataType, inputs: &[Vec<f64>]) -> Vec<f64> {
    let n = inputs[0].len();
    (0..n)
        .map(|i| {
            let mut a = inputs[0][i];
            for x in &inputs[1..] {
                a = match op {
                    ReduceOp::Sum => a + x[i],
                    ReduceOp::Max => a.max(x[i]),
                    ReduceOp::Min => a.min(x[i]),
                    ReduceOp::Prod => a * x[i],
                };
            }
            to_f64(dtype, a)
        })
        .collect()
}

/// Deterministic pseudo-random small integers suited to `op` (results exact in every dtype).
pub fn values(op: ReduceOp, seed: u64, n: usize) -> Vec<f64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match op {
                ReduceOp::Sum => (x % 17) as f64 - 8.0,
                ReduceOp::Max | ReduceOp::Min => (x % 201) as f64 - 100.0,
                ReduceOp::Prod => [-2.0, -1.0, 1.0, 2.0][(x % 4) as usize],
            }
        })
        .collect()
}

pub const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod];
pub const DTYPES: [DataType; 4] = [DataType::F32, DataType::F16, DataType::BF16, DataType::I32];
pub const ALGOS: [AllreduceAlgo; 4] = [
    AllreduceAlgo::Mesh,
    AllreduceAlgo::TwoPhase,
    AllreduceAlgo::Ring,
    AllreduceAlgo::Auto,
];

/// A rank reads domain rank `peer`'s copy through its window, as f64s.
pub fn get_from(w: &Window<'_>, peer: u32) -> Vec<f64> {
    let n = w.tensor().numel() as usize;
    match w.tensor().dtype() {
        DataType::F32 => {
            let mut v = vec![0f32; n];
            w.read(peer, 0, &mut v).unwrap();
            v.iter().map(|&x| x as f64).collect()
        }
        DataType::F16 => {
            let mut v = vec![f16::ZERO; n];
            w.read(peer, 0, &mut v).unwrap();
            v.iter().map(|x| x.to_f64()).collect()
        }
        DataType::BF16 => {
            let mut v = vec![bf16::ZERO; n];
            w.read(peer, 0, &mut v).unwrap();
            v.iter().map(|x| x.to_f64()).collect()
        }
        DataType::I32 => {
            let mut v = vec![0i32; n];
            w.read(peer, 0, &mut v).unwrap();
            v.iter().map(|&x| x as f64).collect()
        }
        d => panic!("no helper for {d}"),
    }
}

/// A rank reads its own copy.
pub fn get_own(w: &Window<'_>) -> Vec<f64> {
    get_from(w, w.rank())
}

/// Bytes rounded up to 64.
pub fn r64(b: u64) -> u64 {
    b.div_ceil(64) * 64
}

/// Every barrier row of every rank's copy of `buf`'s signal area is zero (the collectives
/// left no tally).
pub fn rows_clear(alloc: &CommAllocator, buf: &WindowBuffer, p: u32) -> bool {
    (0..p).all(|r| {
        let v = alloc.signal_area(buf, r).unwrap();
        v[..p as usize].iter().all(|&x| x == 0)
    })
}
