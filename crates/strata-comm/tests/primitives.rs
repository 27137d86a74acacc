//! One-sided data movement and signals with ranks as threads over one shared arena: the
//! scenarios of the distributed model (reference/distributed.md §7) and the error paths.

mod common;

use common::*;
use std::time::{Duration, Instant};
use strata_comm::*;
use strata_types::{bf16, f16, DataType};

/// A window buffer with an `[p, 64]`-ish data view `x`, an output view `y` of the same
/// shape, and a signal view of `cells` i32 (for hand-rolled notify / wait).
fn xy_sig(
    w: &mut World,
    dom: &Domain,
    shape: &[u64],
    dtype: DataType,
    cells: u64,
) -> (DistributedTensor, DistributedTensor, DistributedTensor) {
    let b = r64(shape.iter().product::<u64>() * dtype.size_bytes() as u64);
    let buf = w.alloc.alloc_window_buffer(dom, 2 * b + cells * 4).unwrap();
    let x = w.alloc.window(&buf, 0, shape, dtype).unwrap();
    let y = w.alloc.window(&buf, b, shape, dtype).unwrap();
    let s = w
        .alloc
        .window(&buf, 2 * b, &[cells], DataType::I32)
        .unwrap();
    (x, y, s)
}

fn input(rank: u32, round: u32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (10_000 * round + 100 * rank + i as u32) as f32)
        .collect()
}

/// S8: push (put, remote_store) gives `y[r] = x[(r−1) % P]`; pull (get, remote_load)
/// gives `y[r] = x[(r+1) % P]`, at P = 2, 3, 4.
#[test]
fn s8_put_get_and_tile_shifts() {
    for p in [2u32, 3, 4] {
        for tiles in [false, true] {
            for push in [true, false] {
                let mut w = world(p, 1 << 20);
                let dom = w.alloc.world().unwrap();
                let (x, y, s) = xy_sig(&mut w, &dom, &[8, 8], DataType::F32, 64);
                let outs = run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
                    let (xw, yw, sw) = (
                        comm.window(&x).unwrap(),
                        comm.window(&y).unwrap(),
                        comm.window(&s).unwrap(),
                    );
                    let (me, n) = (xw.rank(), xw.nranks());
                    let mine = input(me, 0, 64);
                    xw.write(me, 0, &mine).unwrap();
                    let mut out = vec![0f32; 64];
                    if push {
                        let next = (me + 1) % n;
                        if tiles {
                            yw.store_tile(next, &[0, 0], &[8, 8], &mine, StoreOp::Overwrite)
                                .unwrap();
                        } else {
                            yw.write(next, 0, &mine).unwrap();
                        }
                        sw.barrier().unwrap();
                        yw.read(me, 0, &mut out).unwrap();
                    } else {
                        sw.barrier().unwrap();
                        let next = (me + 1) % n;
                        if tiles {
                            xw.load_tile(next, &[0, 0], &[8, 8], &mut out).unwrap();
                        } else {
                            xw.read(next, 0, &mut out).unwrap();
                        }
                    }
                    out
                });
                for (r, out) in outs.iter().enumerate() {
                    let src = if push {
                        (r as u32 + p - 1) % p
                    } else {
                        (r as u32 + 1) % p
                    };
                    assert_eq!(
                        out,
                        &input(src, 0, 64),
                        "p={p} tiles={tiles} push={push} rank {r}"
                    );
                }
            }
        }
    }
    // P = 3 as in the reference: put y = [x2, x0, x1], get y = [x1, x2, x0] (checked above).
}

#[test]
fn partial_tiles_land_where_addressed() {
    let mut w = world(2, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let (x, _, s) = xy_sig(&mut w, &dom, &[2, 4, 6], DataType::I32, 64);
    let outs = run_ranks(&w.arena, &all(2), TIMEOUT, |comm| {
        let (xw, sw) = (comm.window(&x).unwrap(), comm.window(&s).unwrap());
        let me = xw.rank();
        if me == 0 {
            let tile: Vec<i32> = (1..=12).collect(); // [1, 3, 4]
            xw.store_tile(1, &[1, 1, 2], &[1, 3, 4], &tile, StoreOp::Overwrite)
                .unwrap();
        }
        sw.barrier().unwrap();
        let mut back = vec![0i32; 6];
        xw.load_tile(1, &[1, 2, 0], &[1, 1, 6], &mut back).unwrap();
        let mut all = vec![0i32; 48];
        xw.read(1, 0, &mut all).unwrap();
        (back, all)
    });
    let (back, all) = &outs[0];
    assert_eq!(back, &vec![0, 0, 5, 6, 7, 8]);
    let mut want = vec![0i32; 48];
    for j in 0..3 {
        for k in 0..4 {
            want[24 + (1 + j) * 6 + 2 + k] = (j * 4 + k + 1) as i32;
        }
    }
    assert_eq!(all, &want);
}

macro_rules! add_case {
    ($t:ty, $dtype:expr, $from:expr, $to:expr) => {{
        let p = 3u32;
        let mut w = world(p, 1 << 20);
        let dom = w.alloc.world().unwrap();
        let (x, _, s) = xy_sig(&mut w, &dom, &[4, 5], $dtype, 64);
        let outs = run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
            let (xw, sw) = (comm.window(&x).unwrap(), comm.window(&s).unwrap());
            let me = xw.rank();
            let tile: Vec<$t> = (0..6).map(|i| $from((i as i32 % 3) + me as i32)).collect();
            for _ in 0..4 {
                xw.store_tile(0, &[1, 1], &[2, 3], &tile, StoreOp::Add)
                    .unwrap();
            }
            sw.barrier().unwrap();
            let mut out: Vec<$t> = vec![$from(0); 20];
            xw.read(0, 0, &mut out).unwrap();
            out
        });
        let mut want = vec![0i32; 20];
        for i in 0..6usize {
            let (r, c) = (1 + i / 3, 1 + i % 3);
            want[r * 5 + c] = 4 * (3 * (i as i32 % 3) + 3);
        }
        let got: Vec<i32> = outs[0].iter().map(|&v| $to(v)).collect();
        assert_eq!(got, want, "{}", $dtype);
    }};
}

#[test]
fn store_tile_add_accumulates_atomically_in_every_dtype() {
    add_case!(f32, DataType::F32, |v: i32| v as f32, |v: f32| v as i32);
    add_case!(
        f16,
        DataType::F16,
        |v: i32| f16::from_f32(v as f32),
        |v: f16| v.to_f32() as i32
    );
    add_case!(
        bf16,
        DataType::BF16,
        |v: i32| bf16::from_f32(v as f32),
        |v: bf16| v.to_f32() as i32
    );
    add_case!(i32, DataType::I32, |v: i32| v, |v: i32| v);
    add_case!(i16, DataType::I16, |v: i32| v as i16, |v: i16| v as i32);
    add_case!(i8, DataType::I8, |v: i32| v as i8, |v: i8| v as i32);
    // Not for other dtypes: refused before anything is written.
    let mut w = world(1, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let (x, _, _) = xy_sig(&mut w, &dom, &[4], DataType::F64, 16);
    run_ranks(&w.arena, &[0], TIMEOUT, |comm| {
        let xw = comm.window(&x).unwrap();
        let e = xw.store_tile(0, &[0], &[2], &[1.0f64, 2.0], StoreOp::Add);
        assert!(
            matches!(e, Err(CommError::UnsupportedDtype { .. })),
            "{e:?}"
        );
        let mut out = [9.0f64; 4];
        xw.read(0, 0, &mut out).unwrap();
        assert_eq!(out, [0.0; 4]);
    });
}

/// S4: rank r AtomicAdds `r+1` into peer `(r+1) % 2`, waits `>= 1` on its own cell and
/// reads it: `[[[2]], [[1]]]`. Also with parking waits (zero spin) and a late notifier.
#[test]
fn s4_notify_wait_handshake() {
    for spin in [RankContext::DEFAULT_SPIN, Duration::ZERO] {
        let mut w = world(2, 1 << 20);
        let dom = w.alloc.world().unwrap();
        let buf = w.alloc.alloc_window_buffer(&dom, 64).unwrap();
        let s = w.alloc.window(&buf, 0, &[1, 1], DataType::I32).unwrap();
        let arena = w.arena.clone();
        let outs: Vec<i32> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..2u32)
                .map(|r| {
                    let ctx = RankContext::new(arena.clone(), r, TIMEOUT).with_spin(spin);
                    sc.spawn(move || {
                        let comm = Comm::from_rank(&ctx);
                        let sw = comm.window(&s).unwrap();
                        if r == 1 {
                            // Let rank 0 park first.
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        sw.notify((r + 1) % 2, &[0, 0], r as i32 + 1, NotifyOp::AtomicAdd)
                            .unwrap();
                        sw.wait(&[0, 0], 1, WaitCmp::Ge).unwrap();
                        sw.load_signal(&[0, 0]).unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(outs, vec![2, 1], "spin {spin:?}");
    }
}

/// S6: the hand-rolled barrier's tally is exact: `y[r][i] = 0 if i == r else 1`.
#[test]
fn s6_hand_rolled_barrier_tally() {
    for p in [2u32, 4] {
        let mut w = world(p, 1 << 20);
        let dom = w.alloc.world().unwrap();
        let buf = w.alloc.alloc_window_buffer(&dom, 64).unwrap();
        let s = w
            .alloc
            .window(&buf, 0, &[p as u64, 1], DataType::I32)
            .unwrap();
        let outs = run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
            let sw = comm.window(&s).unwrap();
            let (me, n) = (sw.rank(), sw.nranks());
            for peer in (0..n).filter(|&q| q != me) {
                sw.notify(peer, &[me as u64, 0], 1, NotifyOp::AtomicAdd)
                    .unwrap();
            }
            for peer in (0..n).filter(|&q| q != me) {
                sw.wait(&[peer as u64, 0], 1, WaitCmp::Ge).unwrap();
            }
            (0..n as u64)
                .map(|i| sw.load_signal(&[i, 0]).unwrap())
                .collect::<Vec<_>>()
        });
        for (r, col) in outs.iter().enumerate() {
            let want: Vec<i32> = (0..p as usize).map(|i| i32::from(i != r)).collect();
            assert_eq!(col, &want);
        }
        if p == 2 {
            assert_eq!(outs, vec![vec![0, 1], vec![1, 0]]);
        }
    }
}

/// S7: the builtin barrier orders a remote load (`y[r] = x[(r+1) % P]`), and the same
/// buffer's signal area serves a second round with different data; the rows end clear.
#[test]
fn s7_builtin_barrier_orders_a_remote_load_and_is_reusable() {
    for p in [2u32, 3, 4] {
        let mut w = world(p, 1 << 20);
        let dom = w.alloc.world().unwrap();
        let (x, _, _) = xy_sig(&mut w, &dom, &[1, 64], DataType::F32, p as u64);
        let outs = run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
            // The barrier of the buffer, called on the data window itself.
            let xw = comm.window(&x).unwrap();
            let sw = &xw;
            let (me, n) = (xw.rank(), xw.nranks());
            (0..2)
                .map(|round| {
                    xw.write(me, 0, &input(me, round, 64)).unwrap();
                    sw.barrier().unwrap();
                    let mut y = vec![0f32; 64];
                    xw.load_tile((me + 1) % n, &[0, 0], &[1, 64], &mut y)
                        .unwrap();
                    sw.barrier().unwrap(); // nobody overwrites x before everyone loaded it
                    y
                })
                .collect::<Vec<_>>()
        });
        for (r, ys) in outs.iter().enumerate() {
            for (round, y) in ys.iter().enumerate() {
                assert_eq!(y, &input((r as u32 + 1) % p, round as u32, 64));
            }
        }
        let buf = w.alloc.live_buffer(&x).unwrap();
        assert!(rows_clear(&w.alloc, &buf, p));
    }
}

/// S9: rank identity `y[r] = x[r] + r` (8 x 8), and a window round trip `y == x`.
#[test]
fn s9_rank_identity_and_window_round_trip() {
    let p = 2;
    let mut w = world(p, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let (x, y, _) = xy_sig(&mut w, &dom, &[8, 8], DataType::F32, 16);
    for r in 0..p {
        w.alloc.host_write(&x, r, 0, &input(r, 0, 64)).unwrap();
    }
    run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
        let (xw, yw) = (comm.window(&x).unwrap(), comm.window(&y).unwrap());
        let me = xw.rank();
        let mut v = vec![0f32; 64];
        xw.read(me, 0, &mut v).unwrap();
        let out: Vec<f32> = v.iter().map(|a| a + me as f32).collect();
        yw.write(me, 0, &out).unwrap();
    });
    for r in 0..p {
        let mut got = vec![0f32; 64];
        w.alloc.host_read(&y, r, 0, &mut got).unwrap();
        let want: Vec<f32> = input(r, 0, 64).iter().map(|a| a + r as f32).collect();
        assert_eq!(got, want);
        let mut back = vec![0f32; 64];
        w.alloc.host_read(&x, r, 0, &mut back).unwrap();
        assert_eq!(back, input(r, 0, 64));
    }
}

/// S10: each rank notifies its peer's cell `+1` four times, waits `>= 4`, then
/// self-notifies `AtomicAdd(−4)`: every cell reads 0.
#[test]
fn s10_self_notify_credit_reset() {
    for p in [2u32, 3] {
        let mut w = world(p, 1 << 20);
        let dom = w.alloc.world().unwrap();
        let buf = w.alloc.alloc_window_buffer(&dom, 64).unwrap();
        let s = w.alloc.window(&buf, 0, &[1], DataType::I32).unwrap();
        let outs = run_ranks(&w.arena, &all(p), TIMEOUT, |comm| {
            let sw = comm.window(&s).unwrap();
            let (me, n) = (sw.rank(), sw.nranks());
            for _ in 0..4 {
                sw.notify((me + 1) % n, &[0], 1, NotifyOp::AtomicAdd)
                    .unwrap();
            }
            assert_eq!(sw.wait(&[0], 4, WaitCmp::Ge).unwrap(), 4);
            sw.notify(me, &[0], -4, NotifyOp::AtomicAdd).unwrap();
            sw.load_signal(&[0]).unwrap()
        });
        assert_eq!(outs, vec![0; p as usize]);
    }
}

/// Every comparison, driven by a peer that sets values and waits for acks.
#[test]
fn wait_honours_every_comparison() {
    let steps: [(i32, WaitCmp, i32); 6] = [
        (5, WaitCmp::Eq, 5),
        (6, WaitCmp::Ne, 5),
        (7, WaitCmp::Gt, 6),
        (-3, WaitCmp::Lt, 0),
        (-3, WaitCmp::Le, -3),
        (9, WaitCmp::Ge, 9),
    ];
    let mut w = world(2, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let buf = w.alloc.alloc_window_buffer(&dom, 64).unwrap();
    let s = w.alloc.window(&buf, 0, &[2], DataType::I32).unwrap();
    let outs = run_ranks(&w.arena, &all(2), TIMEOUT, |comm| {
        let sw = comm.window(&s).unwrap();
        let mut seen = Vec::new();
        for (i, &(set, cmp, expected)) in steps.iter().enumerate() {
            if sw.rank() == 1 {
                sw.notify(0, &[0], set, NotifyOp::Set).unwrap();
                sw.wait(&[1], i as i32 + 1, WaitCmp::Ge).unwrap();
            } else {
                seen.push(sw.wait(&[0], expected, cmp).unwrap());
                sw.notify(1, &[1], 1, NotifyOp::AtomicAdd).unwrap();
            }
        }
        seen
    });
    assert_eq!(outs[0], vec![5, 6, 7, -3, -3, 9]);
}

#[test]
fn a_wait_nobody_answers_ends_in_a_timeout_naming_rank_cell_and_value() {
    let mut w = world(3, 1 << 20);
    let dom = w.alloc.domain(&[2, 0]).unwrap();
    let buf = w.alloc.alloc_window_buffer(&dom, 64).unwrap();
    let s = w.alloc.window(&buf, 0, &[2, 3], DataType::I32).unwrap();
    w.alloc.host_write(&s, 1, 5, &[3i32]).unwrap(); // domain rank 1 = world rank 0
    let t0 = Instant::now();
    let outs = run_ranks(&w.arena, &[0], Duration::from_millis(150), |comm| {
        comm.window(&s).unwrap().wait(&[1, 2], 7, WaitCmp::Ge)
    });
    match &outs[0] {
        Err(CommError::WaitTimeout {
            rank,
            domain_rank,
            cell,
            expected,
            cmp,
            seen,
            waited,
            what,
        }) => {
            assert_eq!((*rank, *domain_rank), (0, 1));
            assert_eq!(cell, &vec![1, 2]);
            assert_eq!((*expected, *cmp, *seen), (7, WaitCmp::Ge, 3));
            assert!(*waited >= Duration::from_millis(150));
            assert_eq!(what, "wait");
            let msg = outs[0].as_ref().unwrap_err().to_string();
            assert!(
                msg.contains("world rank 0") && msg.contains("[1, 2]") && msg.contains("saw 3"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(t0.elapsed() < TIMEOUT);
}

/// A domain over world ranks {1, 2} of 4 has its own numbering; non-members are refused;
/// notifies reach the right world rank's wake counter (parking waits, zero spin).
#[test]
fn a_domain_over_ranks_1_and_2_of_4() {
    for members in [[1u32, 2], [2, 1]] {
        let mut w = world(4, 1 << 20);
        let dom = w.alloc.domain(&members).unwrap();
        assert_eq!(w.alloc.members(&dom).unwrap(), &members);
        let cells = 16u64;
        let buf = w.alloc.alloc_window_buffer(&dom, 64 + cells * 4).unwrap();
        let x = w.alloc.window(&buf, 0, &[4], DataType::F32).unwrap();
        let s = w.alloc.window(&buf, 64, &[cells], DataType::I32).unwrap();
        let arena = w.arena.clone();
        let outs: Vec<_> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4u32)
                .map(|r| {
                    let ctx = RankContext::new(arena.clone(), r, TIMEOUT).with_spin(Duration::ZERO);
                    sc.spawn(move || {
                        let comm = Comm::from_rank(&ctx);
                        let xw = match comm.window(&x) {
                            Ok(xw) => xw,
                            Err(e) => return Err(e),
                        };
                        let sw = comm.window(&s).unwrap();
                        let me = xw.rank();
                        assert_eq!(xw.nranks(), 2);
                        assert_eq!(xw.world_rank_of(me).unwrap(), r);
                        xw.write(me, 0, &[me as f32 + 1.0; 4]).unwrap();
                        sw.barrier().unwrap();
                        let mut peer = [0f32; 4];
                        xw.read(1 - me, 0, &mut peer).unwrap();
                        sw.barrier().unwrap();
                        xw.allreduce(ReduceOp::Sum, AllreduceAlgo::Mesh).unwrap();
                        let mut sum = [0f32; 4];
                        xw.read(me, 0, &mut sum).unwrap();
                        Ok((me, peer[0], sum[0]))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, o) in outs.into_iter().enumerate() {
            let r = r as u32;
            match members.iter().position(|&m| m == r) {
                None => assert!(
                    matches!(&o, Err(CommError::NotAMember { world_rank, members: m }) if *world_rank == r && m == &members.to_vec()),
                    "{o:?}"
                ),
                Some(d) => {
                    let (me, peer, sum) = o.unwrap();
                    assert_eq!(me, d as u32);
                    assert_eq!(peer, (2 - d) as f32);
                    assert_eq!(sum, 3.0);
                }
            }
        }
    }
}

#[test]
fn bad_arguments_are_typed_errors() {
    let mut w = world(2, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let (x, _, s) = xy_sig(&mut w, &dom, &[2, 3], DataType::F32, 8);
    run_ranks(&w.arena, &[0], TIMEOUT, |comm| {
        let (xw, sw) = (comm.window(&x).unwrap(), comm.window(&s).unwrap());
        let mut f = [0f32; 3];
        let mut i = [0i32; 3];
        assert!(matches!(
            xw.read(2, 0, &mut f),
            Err(CommError::BadPeer { peer: 2, nranks: 2 })
        ));
        assert!(matches!(xw.write(7, 0, &f), Err(CommError::BadPeer { .. })));
        assert!(matches!(
            xw.read(0, 0, &mut i),
            Err(CommError::DtypeMismatch { .. })
        ));
        assert!(matches!(
            xw.read(0, 4, &mut f),
            Err(CommError::OutOfRange { .. })
        ));
        assert!(matches!(
            xw.read(0, u64::MAX, &mut f),
            Err(CommError::OutOfRange { .. })
        ));
        assert!(matches!(
            xw.load_tile(0, &[0, 1], &[2, 3], &mut [0f32; 6]),
            Err(CommError::OutOfRange { .. })
        ));
        assert!(matches!(
            xw.load_tile(0, &[0], &[3], &mut f),
            Err(CommError::OutOfRange { .. })
        ));
        assert!(matches!(
            xw.store_tile(0, &[0, 0], &[1, 3], &[0f32; 2], StoreOp::Overwrite),
            Err(CommError::OutOfRange { .. })
        ));
        assert!(matches!(
            xw.notify(1, &[0, 0], 1, NotifyOp::Set),
            Err(CommError::DtypeMismatch { .. })
        ));
        assert!(matches!(
            xw.wait(&[0, 0], 1, WaitCmp::Eq),
            Err(CommError::DtypeMismatch { .. })
        ));
        assert!(matches!(
            sw.notify(1, &[8], 1, NotifyOp::Set),
            Err(CommError::OutOfRange { .. })
        ));
        assert!(matches!(
            sw.notify(1, &[0, 0], 1, NotifyOp::Set),
            Err(CommError::OutOfRange { .. })
        ));
        assert!(matches!(
            sw.notify(3, &[0], 1, NotifyOp::Set),
            Err(CommError::BadPeer { .. })
        ));
        assert!(matches!(
            sw.load_signal(&[9]),
            Err(CommError::OutOfRange { .. })
        ));
        // A view larger than its buffer (forged with with_shape) is refused when opened.
        let big = x.with_shape(&[1 << 20], DataType::F32).unwrap();
        assert!(matches!(
            comm.window(&big),
            Err(CommError::BadTensor { .. })
        ));
        // The escape hatch points at this rank's copy.
        // SAFETY: reading 4 bytes of this rank's own copy, which nobody writes now.
        let v = unsafe { (xw.local_ptr() as *const f32).read() };
        assert_eq!(v, 0.0);
    });
}

/// Two mappings of one memfd at different addresses (as two rank processes would have):
/// only offsets travel, and a parked waiter on one mapping is woken through the other
/// (shared futexes are keyed by the page, not the address).
#[test]
fn ranks_on_different_mappings_of_one_memfd() {
    const LEN: usize = 1 << 20;
    // SAFETY: plain system calls on a fresh memfd; both mappings are unmapped at the end,
    // after every arena view over them is dropped.
    unsafe {
        let fd = libc::memfd_create(c"strata-comm-test".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, LEN as libc::off_t), 0);
        let map = || {
            let p = libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            p.cast::<u8>()
        };
        let (a, b) = (map(), map());
        assert_ne!(a, b);
        {
            let arena_a = std::sync::Arc::new(CommArena::init(a, LEN, 2).unwrap());
            let arena_b = std::sync::Arc::new(CommArena::from_raw(b, LEN).unwrap());
            let mut alloc = CommAllocator::new(arena_a.clone());
            let dom = alloc.world().unwrap();
            let cells = 16u64;
            let buf = alloc.alloc_window_buffer(&dom, 256 + cells * 4).unwrap();
            let x = alloc.window(&buf, 0, &[64], DataType::F32).unwrap();
            let s = alloc.window(&buf, 256, &[cells], DataType::I32).unwrap();
            let outs: Vec<Vec<f32>> = std::thread::scope(|sc| {
                let hs: Vec<_> = [(0u32, &arena_a), (1, &arena_b)]
                    .into_iter()
                    .map(|(r, arena)| {
                        let ctx =
                            RankContext::new(arena.clone(), r, TIMEOUT).with_spin(Duration::ZERO);
                        sc.spawn(move || {
                            let comm = Comm::from_rank(&ctx);
                            let (xw, sw) = (comm.window(&x).unwrap(), comm.window(&s).unwrap());
                            if r == 1 {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            xw.write(r, 0, &[r as f32 + 1.0; 64]).unwrap();
                            sw.barrier().unwrap();
                            xw.allreduce(ReduceOp::Sum, AllreduceAlgo::TwoPhase)
                                .unwrap();
                            let mut v = vec![0f32; 64];
                            xw.read(1 - r, 0, &mut v).unwrap();
                            v
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(outs.iter().all(|v| v.iter().all(|&e| e == 3.0)));
        }
        libc::munmap(a.cast(), LEN);
        libc::munmap(b.cast(), LEN);
        libc::close(fd);
    }
}
