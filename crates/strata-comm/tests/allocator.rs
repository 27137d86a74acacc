//! The parent side: arena validation, domains, window buffers, per-run lifetime,
//! persistence, and the typed errors of misuse.

mod common;

use common::*;
use std::sync::Arc;
use strata_comm::*;
use strata_types::DataType;

#[test]
fn arena_header_is_validated() {
    let a = CommArena::anonymous(1 << 20, 3).unwrap();
    assert_eq!((a.world_size(), a.len()), (3, 1 << 20));
    // SAFETY: `a` outlives the view.
    let v = unsafe { CommArena::from_raw(a.base_ptr(), a.len()) }.unwrap();
    assert_eq!(v.world_size(), 3);
    drop(v);
    // SAFETY: the pointers are inside a live arena mapping, or rejected before use.
    let short = unsafe { CommArena::from_raw(a.base_ptr(), a.len() - 4096) };
    assert!(
        matches!(short, Err(CommError::BadArena { .. })),
        "{short:?}"
    );
    // SAFETY: the pointers are inside a live arena mapping, or rejected before use.
    let odd = unsafe { CommArena::from_raw(a.base_ptr().add(64), 1 << 19) };
    assert!(matches!(odd, Err(CommError::BadArena { .. })));
    // SAFETY: the pointers are inside a live arena mapping, or rejected before use.
    let null = unsafe { CommArena::from_raw(std::ptr::null_mut(), 1 << 20) };
    assert!(matches!(null, Err(CommError::BadArena { .. })));
    // Memory that was never initialised has no magic.
    let blank = CommArena::anonymous(1 << 20, 1).unwrap();
    // SAFETY: overwriting the header of an arena nobody else uses.
    unsafe { std::ptr::write_bytes(blank.base_ptr(), 0, 64) };
    // SAFETY: the pointers are inside a live arena mapping, or rejected before use.
    let e = unsafe { CommArena::from_raw(blank.base_ptr(), blank.len()) };
    assert!(matches!(e, Err(CommError::BadArena { reason }) if reason.contains("STRATACM")));
    assert!(matches!(
        CommArena::anonymous(1 << 20, 0),
        Err(CommError::BadArena { .. })
    ));
    assert!(matches!(
        CommArena::anonymous(1 << 20, 65),
        Err(CommError::BadArena { .. })
    ));
    // Too small for header + table + a page: anonymous rounds up, init refuses.
    let tiny = CommArena::anonymous(1, 2).unwrap();
    assert_eq!(tiny.len(), layout::MIN_ARENA_BYTES);
    // SAFETY: the pointers are inside a live arena mapping, or rejected before use.
    let e = unsafe { CommArena::init(tiny.base_ptr(), 4096, 2) };
    assert!(matches!(e, Err(CommError::BadArena { .. })));
}

#[test]
fn domains_validate_their_members() {
    let mut w = world(4, 1 << 20);
    for bad in [&[][..], &[1, 1], &[0, 4], &[5]] {
        let e = w.alloc.domain(bad);
        assert!(
            matches!(e, Err(CommError::BadMembers { .. })),
            "{bad:?}: {e:?}"
        );
    }
    let d = w.alloc.domain(&[3, 1]).unwrap();
    assert_eq!(
        (d.nranks(), w.alloc.members(&d).unwrap()),
        (2, &[3u32, 1][..])
    );
    let world1 = w.alloc.world().unwrap();
    assert_eq!(w.alloc.world().unwrap(), world1, "cached within a run");
    assert_eq!(w.alloc.members(&world1).unwrap(), &[0, 1, 2, 3]);
    w.alloc.end_run();
    assert!(matches!(
        w.alloc.members(&d),
        Err(CommError::StaleDomain { .. })
    ));
    assert!(matches!(
        w.alloc.alloc_window_buffer(&d, 64),
        Err(CommError::StaleDomain { .. })
    ));
    let world2 = w.alloc.world().unwrap();
    assert_ne!(world2, world1, "a new world domain per run");
}

#[test]
fn buffers_are_zeroed_rounded_and_accounted() {
    let mut w = world(2, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let b = w.alloc.alloc_window_buffer(&dom, 100).unwrap();
    assert_eq!((b.bytes(), b.domain()), (128, dom));
    assert_eq!(w.alloc.bytes_in_use(), 4096);
    let t = w.alloc.window(&b, 0, &[32], DataType::I32).unwrap();
    w.alloc.host_write(&t, 0, 0, &[7i32; 32]).unwrap();
    w.alloc.host_write(&t, 1, 0, &[9i32; 32]).unwrap();
    w.alloc.end_run();
    assert_eq!(w.alloc.bytes_in_use(), 0);
    // The same memory comes back zeroed.
    let dom = w.alloc.world().unwrap();
    let b2 = w.alloc.alloc_window_buffer(&dom, 128).unwrap();
    let t2 = w.alloc.window(&b2, 0, &[32], DataType::I32).unwrap();
    for r in 0..2 {
        let mut v = [1i32; 32];
        w.alloc.host_read(&t2, r, 0, &mut v).unwrap();
        assert_eq!(v, [0; 32]);
    }
    assert!(w.alloc.stats().bytes_zeroed >= 256);
    assert!(matches!(
        w.alloc.alloc_window_buffer(&dom, 0),
        Err(CommError::BadArgument { .. })
    ));
    // Views must fit, be aligned, have 1..=5 dims.
    for (off, shape, dt) in [
        (0u64, vec![33u64], DataType::I32),
        (64, vec![17], DataType::I32),
        (2, vec![1], DataType::I32),
        (0, vec![], DataType::I32),
        (0, vec![1, 1, 1, 1, 1, 1], DataType::I32),
        (u64::MAX - 3, vec![1], DataType::I32),
    ] {
        let e = w.alloc.window(&b2, off, &shape, dt);
        assert!(
            matches!(e, Err(CommError::BadTensor { .. })),
            "{off} {shape:?}: {e:?}"
        );
    }
}

#[test]
fn stale_tensors_are_refused_after_end_run_even_when_the_slot_is_reused() {
    let mut w = world(2, 1 << 20);
    let dom = w.alloc.world().unwrap();
    let b = w.alloc.alloc_window_buffer(&dom, 64).unwrap();
    let t = w.alloc.window(&b, 0, &[16], DataType::I32).unwrap();
    w.alloc.end_run();
    let check = |alloc: &CommAllocator| {
        assert!(matches!(
            alloc.window(&b, 0, &[4], DataType::I32),
            Err(CommError::StaleTensor { .. })
        ));
        assert!(matches!(
            alloc.host_read(&t, 0, 0, &mut [0i32; 4]),
            Err(CommError::StaleTensor { .. })
        ));
        let out = run_ranks(alloc.arena(), &[0], TIMEOUT, |comm| {
            comm.window(&t).map(|_| ())
        });
        assert!(
            matches!(&out[0], Err(CommError::StaleTensor { slot, generation, .. }) if *slot == t.table_slot() && *generation == t.generation()),
            "{:?}",
            out[0]
        );
    };
    check(&w.alloc);
    let dom = w.alloc.world().unwrap();
    let b2 = w.alloc.alloc_window_buffer(&dom, 64).unwrap();
    assert_eq!(b2.table_slot(), b.table_slot());
    check(&w.alloc);
}

#[test]
fn persistent_buffers_survive_runs_zeroed_or_not() {
    let mut w = world(2, 1 << 20);
    let dom = w.alloc.domain(&[1, 0]).unwrap();
    let keep_zero = w.alloc.alloc_window_buffer(&dom, 64).unwrap();
    let keep = w.alloc.alloc_window_buffer(&dom, 64).unwrap();
    let gone = w.alloc.alloc_window_buffer(&dom, 64).unwrap();
    w.alloc.make_persistent(&keep_zero, true).unwrap();
    w.alloc.make_persistent(&keep, false).unwrap();
    assert!(w.alloc.is_persistent(&keep) && !w.alloc.is_persistent(&gone));
    let tz = w.alloc.window(&keep_zero, 0, &[16], DataType::I32).unwrap();
    let tk = w.alloc.window(&keep, 0, &[16], DataType::I32).unwrap();
    // A run: the ranks leave values in both (a signal tally in the kept one).
    run_ranks(&w.arena, &[0, 1], TIMEOUT, |comm| {
        let (z, k) = (comm.window(&tz).unwrap(), comm.window(&tk).unwrap());
        z.write(z.rank(), 0, &[5i32; 16]).unwrap();
        k.notify(1 - k.rank(), &[3], 2, NotifyOp::AtomicAdd)
            .unwrap();
    });
    for run in 0..3 {
        w.alloc.end_run();
        assert_eq!(w.alloc.live_buffers(), 2);
        assert_eq!(w.alloc.bytes_in_use(), 2 * 4096);
        assert_eq!(w.alloc.members(&dom).unwrap(), &[1, 0], "the domain stays");
        assert!(matches!(
            w.alloc.window(&gone, 0, &[1], DataType::I32),
            Err(CommError::StaleTensor { .. })
        ));
        for r in 0..2 {
            let (mut z, mut k) = ([9i32; 16], [0i32; 16]);
            w.alloc.host_read(&tz, r, 0, &mut z).unwrap();
            w.alloc.host_read(&tk, r, 0, &mut k).unwrap();
            assert_eq!(z, [0; 16], "zeroed between runs (run {run})");
            assert_eq!(k[3], 2, "kept as it was (run {run})");
        }
        assert_eq!(w.alloc.stats().persistent_zero_fills, run + 1);
    }
    // An explicit reset (after a failed run, say) clears the kept one too.
    w.alloc.zero(&keep).unwrap();
    let mut k = [1i32; 16];
    w.alloc.host_read(&tk, 0, 0, &mut k).unwrap();
    assert_eq!(k, [0; 16]);
    // A buffer allocated in this run is not disturbed by releasing the persistent ones.
    let now = w.alloc.alloc_window_buffer(&dom, 64).unwrap();
    w.alloc.release_persistent();
    assert!(matches!(
        w.alloc.window(&keep, 0, &[1], DataType::I32),
        Err(CommError::StaleTensor { .. })
    ));
    assert!(w.alloc.window(&now, 0, &[1], DataType::I32).is_ok());
    w.alloc.end_run();
    assert_eq!((w.alloc.bytes_in_use(), w.alloc.live_buffers()), (0, 0));
    assert!(matches!(
        w.alloc.members(&dom),
        Err(CommError::StaleDomain { .. })
    ));
    let s = w.alloc.stats();
    assert_eq!((s.buffers_allocated, s.buffers_freed), (4, 4));
}

#[test]
fn a_full_arena_and_a_full_table_are_typed_errors_and_space_comes_back() {
    let mut w = world(2, 1 << 20);
    let cap = w.arena.data_capacity();
    let dom = w.alloc.world().unwrap();
    match w.alloc.alloc_window_buffer(&dom, cap) {
        Err(CommError::ArenaFull {
            requested,
            per_rank,
            nranks,
            capacity,
            largest_free,
            ..
        }) => {
            let stride = cap + signal_area_bytes(2); // cap is a multiple of 128
            assert_eq!(
                (requested, per_rank, nranks),
                ((2 * stride).div_ceil(4096) * 4096, stride, 2)
            );
            assert_eq!((capacity, largest_free), (cap, cap));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        w.alloc.alloc_window_buffer(&dom, u64::MAX),
        Err(CommError::ArenaFull { .. })
    ));
    // Fill the table with tiny buffers (4 KiB each, 1 MiB arena: only ~230 fit).
    let mut n = 0;
    let err = loop {
        match w.alloc.alloc_window_buffer(&dom, 64) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, CommError::ArenaFull { .. }), "{err:?}");
    assert_eq!(n as u64, cap / 4096);
    w.alloc.end_run();
    // Freed ranges coalesce: one buffer of the whole capacity fits again.
    let dom = w.alloc.world().unwrap();
    let all = w
        .alloc
        .alloc_window_buffer(&dom, cap / 2 - signal_area_bytes(2))
        .unwrap();
    assert_eq!(w.alloc.bytes_in_use(), cap);
    let _ = all;
    w.alloc.end_run();
    // A big arena runs out of table slots first.
    let mut w = world(1, 4 << 20);
    let dom = w.alloc.world().unwrap();
    for _ in 0..layout::TABLE_SLOTS {
        w.alloc.alloc_window_buffer(&dom, 64).unwrap();
    }
    assert!(matches!(
        w.alloc.alloc_window_buffer(&dom, 64),
        Err(CommError::TableFull { slots: 256 })
    ));
}

#[test]
fn windows_view_the_data_bytes_and_the_signal_area_follows_on_every_rank() {
    let mut w = world(3, 1 << 20);
    let dom = w.alloc.domain(&[2, 0]).unwrap();
    let b = w.alloc.alloc_window_buffer(&dom, 4000).unwrap();
    assert_eq!(b.bytes(), 4032);
    let t = w.alloc.window(&b, 256, &[2, 3, 4], DataType::BF16).unwrap();
    assert_eq!(
        (t.numel(), t.nbytes(), t.shape()),
        (24, 48, &[2u64, 3, 4][..])
    );
    assert_eq!((t.dtype(), t.byte_offset()), (DataType::BF16, 256));
    let p = w.alloc.placement(&b).unwrap();
    assert_eq!(
        (p.rank_stride, p.data_bytes, p.nranks),
        (4096 + signal_area_bytes(2), 4032, 2)
    );
    assert_eq!(p.arena_offset % 4096, 0);
    // A view ends at the data bytes: the signal area is not viewable.
    assert!(w.alloc.window(&b, 4032 - 4, &[1], DataType::I32).is_ok());
    assert!(matches!(
        w.alloc.window(&b, 4032, &[1], DataType::I32),
        Err(CommError::BadTensor { .. })
    ));
    assert_eq!(
        w.alloc.bytes_in_use(),
        (2 * p.rank_stride).div_ceil(4096) * 4096
    );
}

#[test]
fn arenas_are_send_and_sync_and_shared_by_arc() {
    fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<CommArena>();
    is_send_sync::<RankContext>();
    is_send_sync::<Window<'static>>();
    let a = Arc::new(CommArena::anonymous(1 << 20, 1).unwrap());
    let _alloc = CommAllocator::new(a.clone());
    assert_eq!(Arc::strong_count(&a), 2);
}

#[test]
fn a_second_allocator_over_the_same_arena_still_hands_out_zeroed_memory() {
    let w = world(2, 1 << 20);
    let mut first = CommAllocator::new(w.arena.clone());
    let dom = first.world().unwrap();
    let b = first.alloc_window_buffer(&dom, 4096).unwrap();
    let t = first.window(&b, 0, &[1024], DataType::I32).unwrap();
    first.host_write(&t, 1, 0, &[-1i32; 1024]).unwrap();
    drop(first);
    let mut second = CommAllocator::new(w.arena.clone());
    // The first allocator's tensors are stale for the second.
    assert!(matches!(
        second.host_read(&t, 1, 0, &mut [0i32; 4]),
        Err(CommError::StaleTensor { .. })
    ));
    let dom = second.world().unwrap();
    let b2 = second.alloc_window_buffer(&dom, 4096).unwrap();
    let t2 = second.window(&b2, 0, &[1024], DataType::I32).unwrap();
    assert_ne!(t2.generation(), t.generation());
    let mut v = vec![7i32; 1024];
    second.host_read(&t2, 1, 0, &mut v).unwrap();
    assert!(v.iter().all(|&x| x == 0));
}
