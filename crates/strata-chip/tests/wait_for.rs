//! A stalled chip run explains itself: the error carries the wait-for state (which kernel
//! runs on which core, the signal cell it waits on and its value, which tasks wait for
//! which producers, which heap ring cannot make room and which tasks hold it), checked
//! against what each test set up.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use strata_chip::{
    codes, ChipConfig, ChipError, ChipWorker, CoreArgs, RingSizing, RunArgs, TensorCreateInfo,
};
use strata_types::{
    CallConfig, DataType, Executor, PendingTask, RingWait, RunningTask, SignalWait, WaitFor,
};

/// One AIV core and no AIC core: every kernel runs on core 0.
fn one_core() -> ChipConfig {
    ChipConfig {
        aic_cores: 0,
        aiv_cores: 1,
        device_memory_bytes: 512 << 20,
        ..ChipConfig::default()
    }
}

/// The running entries without their durations (never asserted: timings vary).
fn running(w: &WaitFor) -> Vec<RunningTask> {
    w.running
        .iter()
        .map(|r| RunningTask {
            for_ms: None,
            ..r.clone()
        })
        .collect()
}

#[test]
fn a_kernel_past_its_timeout_shows_the_signal_it_waits_on_and_who_waits_for_it() {
    let mut chip = ChipWorker::new(one_core()).unwrap();
    // A kernel waiting for a notify nobody sends: it says what it waits on (as
    // strata-comm's waits do), and stops only when cancelled.
    let waiter = chip
        .register_kernel_fn("wait_flag", |ctx| {
            let note = ctx.signal_note();
            note.waiting(0, 5, ">=", 1, 0);
            while !ctx.cancelled() {
                std::thread::sleep(Duration::from_millis(1));
                note.seen(0);
            }
            Err("cancelled".into())
        })
        .unwrap();
    let consumer = chip.register_kernel_fn("consumer", |_| Ok(())).unwrap();
    let ids = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let i = ids.clone();
    let orch = chip
        .register_orchestration_fn("o", move |o, _| {
            let a = o.submit_aiv(waiter, &CoreArgs::new())?;
            let b = o.submit_aiv(consumer, CoreArgs::new().dep(a.task_id()))?;
            i[0].store(a.task_id().id().unwrap(), Ordering::SeqCst);
            i[1].store(b.task_id().id().unwrap(), Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let c = CallConfig::default().with_timeout(Duration::from_millis(150));
    let e = chip.run(&orch, &mut RunArgs::new(), &c).unwrap_err();
    assert!(matches!(e, ChipError::KernelTimeout { .. }), "{e}");
    let (a, b) = (ids[0].load(Ordering::SeqCst), ids[1].load(Ordering::SeqCst));
    let w = e.wait_for().expect("a wait-for state");
    assert_eq!(w.place, "chip");
    assert_eq!(
        running(w),
        vec![RunningTask {
            task: a,
            name: "wait_flag".into(),
            on: Executor::Core(0),
            for_ms: None,
        }]
    );
    assert_eq!(
        w.signals,
        vec![SignalWait {
            task: a,
            core: 0,
            rank: 0,
            cell: 5,
            cmp: ">=".into(),
            expected: 1,
            value: 0,
            gave_up: false,
        }]
    );
    assert_eq!(
        w.pending,
        vec![PendingTask {
            task: b,
            name: "consumer".into(),
            ready: false,
            producers: vec![a],
            workers: vec![],
        }]
    );
    assert!(w.rings.is_empty() && w.omitted == 0);
    // The text is the end of the error's message; the headline is the message without it.
    let text = e.to_string();
    assert!(text.ends_with(&format!("\n{w}")), "{text}");
    assert!(
        text.contains("waits for signal cell 5 >= 1, value 0"),
        "{text}"
    );
    assert_eq!(format!("{}\n{w}", e.headline()), text);
    chip.close().unwrap();
}

#[test]
fn an_undersized_heap_ring_names_itself_its_size_and_the_task_holding_it() {
    let mut cfg = one_core();
    cfg.rings = [RingSizing {
        heap_bytes: 4096,
        ..RingSizing::default()
    }; 4];
    cfg.ring_wait_timeout = Duration::from_millis(150);
    let mut chip = ChipWorker::new(cfg).unwrap();
    // Holds its 3 KiB output until the orchestration gave up on the second allocation.
    let release = Arc::new(AtomicBool::new(false));
    let r = release.clone();
    let holder = chip
        .register_kernel_fn("holder", move |ctx| {
            while !r.load(Ordering::SeqCst) && !ctx.cancelled() {
                std::thread::sleep(Duration::from_millis(1));
            }
            Ok(())
        })
        .unwrap();
    let noop = chip.register_kernel_fn("noop", |_| Ok(())).unwrap();
    let held = Arc::new(AtomicU64::new(0));
    let h = held.clone();
    let rel = release.clone();
    let orch = chip
        .register_orchestration_fn("o", move |o, _| {
            let t = TensorCreateInfo::new(DataType::F32, &[768]); // 3072 bytes
            o.scope_begin()?;
            let a = o.submit_aiv(holder, CoreArgs::new().output_new(t))?;
            h.store(a.task_id().id().unwrap(), Ordering::SeqCst);
            o.scope_end()?;
            // The same ring (one scope deep: ring 1) cannot hold a second 3 KiB tensor
            // while the first one's task runs.
            o.scope_begin()?;
            let second = o.submit_aiv(noop, CoreArgs::new().output_new(t));
            rel.store(true, Ordering::SeqCst);
            second?;
            o.scope_end()?;
            Ok(())
        })
        .unwrap();
    chip.init().unwrap();
    let e = chip
        .run(&orch, &mut RunArgs::new(), &CallConfig::default())
        .unwrap_err();
    assert_eq!(e.code(), Some(codes::HEAP_RING_DEADLOCK), "{e}");
    let a = held.load(Ordering::SeqCst);
    let w = e.wait_for().expect("a wait-for state");
    assert_eq!(
        w.rings,
        vec![RingWait {
            ring: 1,
            heap_bytes: 4096,
            requested: 3072,
            free: 1024,
            held_by: vec![a],
        }]
    );
    assert_eq!(
        running(w),
        vec![RunningTask {
            task: a,
            name: "holder".into(),
            on: Executor::Core(0),
            for_ms: None,
        }]
    );
    let text = e.to_string();
    assert!(
        text.contains(&format!(
            "heap ring 1 (4096 bytes): 3072 bytes requested, 1024 free, held by tasks [{a}]"
        )),
        "{text}"
    );
    chip.close().unwrap();
}
