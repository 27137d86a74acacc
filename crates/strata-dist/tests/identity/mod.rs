//! Identities and host access under misuse (issue 10, items 2–4), in both modes: a
//! descriptor kept past its run or forged from bytes is refused at submit; host copies
//! refuse while a task names the tensor; a sub-worker's safe accessor refuses NO_DEP
//! arguments; a shared tensor dropped mid-run keeps its pages for the task running on it;
//! and (threads only, `threads.rs`) the memory a detached child may still write is
//! quarantined rather than handed to the next worker.

use crate::common::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use strata_dist::*;
use strata_host::{HostError, SharedMemory};
use strata_types::wire::{decode_tensor, encode_tensor, TENSOR_WIRE_BYTES};
use strata_types::{ArgTag, DataType, TaskArgs, TensorArg};

/// Every scenario here, for the mode `M`.
pub fn suite<M: Mode>() -> Vec<Scenario> {
    contracts![M;
        a_run_tensor_kept_from_an_earlier_run_is_refused_once_its_bytes_are_reused,
        a_forged_descriptor_is_refused_at_submit,
        host_copies_refuse_while_a_task_names_the_tensor,
        the_safe_sub_accessor_refuses_no_dep_arguments,
        a_shared_tensor_dropped_mid_run_keeps_its_pages_until_its_task_ends,
    ]
}

/// How long a gated callable waits for the test before giving up (a bound, never met in
/// a passing run).
const GATE: Duration = Duration::from_secs(20);

fn wait_word(words: &SharedWords, i: usize, n: u64) -> Result<(), String> {
    words.wait_at_least(i, n, GATE)
}

/// Item 2: a `RunTensor` from run 1 names heap-ring bytes that run 2 hands to a fresh
/// intermediate. Submitting (stale INOUT, fresh INPUT) — two keys over the same bytes —
/// must be a typed error, never a task holding `&mut` and `&` over them.
pub fn a_run_tensor_kept_from_an_earlier_run_is_refused_once_its_bytes_are_reused<M: Mode>(
) -> Outcome {
    let mut w = l3(M::VALUE, 0, 1);
    let touch = w.register_sub("touch", |call| {
        if let Some(ArgTag::InOut) = call.tag(0) {
            call.tensor_mut::<f32>(0)?.fill(1.0);
        }
        Ok(())
    });
    let kept: Arc<Mutex<Option<RunTensor>>> = Arc::default();
    let verdict: Arc<Mutex<Option<Result<(), String>>>> = Arc::default();
    let (k, v) = (kept.clone(), verdict.clone());
    let orch = w.register_orchestration("keep_then_alias", move |o, _| {
        let fresh = o.alloc(&[256], DataType::F32)?;
        o.submit_sub(&touch, &args(&[fresh.arg(ArgTag::InOut)], &[]))?;
        let mut kept = k.lock().unwrap();
        let Some(stale) = *kept else {
            *kept = Some(fresh);
            return Ok(());
        };
        if stale.arg(ArgTag::Input).buffer.location() != fresh.arg(ArgTag::Input).buffer.location()
        {
            return Ok(()); // not reused yet: the test runs again
        }
        let r = o.submit_sub(
            &touch,
            &args(&[stale.arg(ArgTag::InOut), fresh.arg(ArgTag::Input)], &[]),
        );
        *v.lock().unwrap() = Some(match r {
            Err(DistError::StaleTensor { index: 0, reason }) => {
                println!("    refused: {reason}");
                Ok(())
            }
            Err(e) => Err(format!("refused, but not as a stale tensor: {e}")),
            Ok(()) => Err(format!(
                "a RunTensor of {:?} aliasing a fresh one was admitted in {:?}",
                stale.run(),
                o.run_id()
            )),
        });
        Ok(())
    });
    w.init().ctx("init")?;
    for _ in 0..20 {
        w.run(&orch, &TaskArgs::new()).ctx("run")?;
        if verdict.lock().unwrap().is_some() {
            break;
        }
    }
    let verdict = verdict.lock().unwrap().take();
    w.close().ctx("close")?;
    verdict.unwrap_or_else(|| Err("the heap ring never reused the address in 20 runs".into()))
}

/// Item 2: a descriptor decoded from bytes naming a live shared tensor's region under
/// another identity (no dependency edge with the real one) is refused.
pub fn a_forged_descriptor_is_refused_at_submit<M: Mode>() -> Outcome {
    let mut w = l3(M::VALUE, 0, 1);
    let x = w.shared_tensor(&[64], DataType::F32).ctx("x")?;
    let touch = w.register_sub("touch", |call| {
        call.tensor_mut::<f32>(0)?.fill(2.0);
        Ok(())
    });
    let mut bytes = [0u8; TENSOR_WIRE_BYTES];
    encode_tensor(&x.arg(ArgTag::InOut), &mut bytes);
    bytes[8] ^= 0x5a; // another buffer id, same region and offset
    let forged: TensorArg = decode_tensor(&bytes).ctx("decode")?;
    check!(
        forged.buffer.location() == x.buffer().location()
            && forged.buffer.identity() != x.buffer().identity(),
        "the forged descriptor names x's bytes under another identity"
    );
    let orch = w.register_orchestration("forged", move |o, _| {
        match o.submit_sub(&touch, &args(&[forged], &[])) {
            Err(DistError::StaleTensor { index: 0, .. }) => Ok(()),
            Err(e) => Err(format!("refused, but not as a stale tensor: {e}").into()),
            Ok(()) => Err("a forged descriptor was admitted".into()),
        }
    });
    w.init().ctx("init")?;
    w.run(&orch, &TaskArgs::new()).ctx("run")?;
    check!(
        x.to_vec::<f32>().ctx("read")? == vec![0.0; 64],
        "nothing ran on x's bytes"
    );
    w.close().ctx("close")?;
    Ok(())
}

/// Item 3: while a task that names `x` runs, `x.to_vec()` and `x.write()` refuse with
/// `Busy` (the documented choice: refuse, never wait); once the run is done they work.
pub fn host_copies_refuse_while_a_task_names_the_tensor<M: Mode>() -> Outcome {
    let mut w = l3(M::VALUE, 0, 1);
    let x = w.shared_tensor_from(&[4], &[1u32, 2, 3, 4]).ctx("x")?;
    let words = SharedWords::new(&w, 2);
    let ww = words.clone();
    let hold = w.register_sub("hold", move |call| {
        call.tensor_mut::<u32>(0)?.update(|v| v * 10);
        ww.bump(0);
        Ok(wait_word(&ww, 1, 1)?)
    });
    let xa = x.clone();
    let orch = w.register_orchestration("hold", move |o, _| {
        o.submit_sub(&hold, &args(&[xa.arg(ArgTag::InOut)], &[]))?;
        Ok(())
    });
    w.init().ctx("init")?;
    let handle = w.submit(&orch, &TaskArgs::new()).ctx("submit")?;
    wait_word(&words, 0, 1)?;
    let read = x.to_vec::<u32>();
    let write = x.write(&[0u32; 4]);
    words.bump(1);
    handle.result().ctx("run")?;
    check!(
        matches!(read, Err(HostError::Busy { tasks: 1, .. })),
        "to_vec while the task runs: {read:?}"
    );
    check!(
        matches!(write, Err(HostError::Busy { .. })),
        "write while the task runs: {write:?}"
    );
    check!(
        x.to_vec::<u32>().ctx("read after")? == vec![10, 20, 30, 40],
        "the task's result, and the refused write changed nothing"
    );
    x.write(&[5u32; 4]).ctx("write after")?;
    w.close().ctx("close")?;
    Ok(())
}

/// Item 3: `SubCall::tensor` refuses a NO_DEP argument (a safe slice over untracked
/// bytes could race a writer); the `unsafe` `tensor_untracked` reaches it.
pub fn the_safe_sub_accessor_refuses_no_dep_arguments<M: Mode>() -> Outcome {
    let mut w = l3(M::VALUE, 0, 1);
    let x = w.shared_tensor_from(&[2], &[7u64, 8]).ctx("x")?;
    let out = w.shared_tensor(&[1], DataType::U64).ctx("out")?;
    let probe = w.register_sub("probe", |call| {
        let refused = call
            .tensor::<u64>(0)
            .err()
            .ok_or("tensor() gave a safe view of a NO_DEP argument")?;
        if !refused.contains("NO_DEP") {
            return Err(format!("unexpected refusal: {refused}").into());
        }
        // SAFETY: no other task of this test touches x while this one runs.
        let sum: u64 = unsafe { call.tensor_untracked::<u64>(0) }?.iter().sum();
        // SAFETY: as above (and a tracked argument is refused by the unchecked accessor).
        if unsafe { call.tensor_untracked::<u64>(1) }.is_ok() {
            return Err("tensor_untracked gave a view of a tracked argument".into());
        }
        Ok(call.tensor_mut::<u64>(1)?.set(&[0], sum)?)
    });
    let (xa, oa) = (x.clone(), out.clone());
    let orch = w.register_orchestration("probe", move |o, _| {
        o.submit_sub(
            &probe,
            &args(
                &[xa.arg(ArgTag::NoDep), oa.arg(ArgTag::OutputExisting)],
                &[],
            ),
        )?;
        Ok(())
    });
    w.init().ctx("init")?;
    w.run(&orch, &TaskArgs::new()).ctx("run")?;
    check!(
        out.to_vec::<u64>().ctx("out")? == vec![15],
        "the untracked read"
    );
    w.close().ctx("close")?;
    Ok(())
}

/// Item 4: the last handle of a shared tensor dropped while a task writes it: the task
/// keeps live pages until it ends (it reads back what it wrote), and the region is
/// released after. A task dispatched after the drop fails with a typed error.
pub fn a_shared_tensor_dropped_mid_run_keeps_its_pages_until_its_task_ends<M: Mode>() -> Outcome {
    let mut w = l3(M::VALUE, 0, 1);
    let words = SharedWords::new(&w, 2);
    let x = w.shared_tensor(&[1024], DataType::U64).ctx("x")?;
    let region = x.region();
    let ww = words.clone();
    let keep = w.register_sub("write_wait_check", move |call| {
        call.tensor_mut::<u64>(0)?.fill(42);
        ww.bump(0);
        wait_word(&ww, 1, 1)?;
        let t = call.tensor::<u64>(0)?;
        if t.iter().any(|v| v != 42) {
            return Err("the tensor's pages were discarded under the running task".into());
        }
        Ok(())
    });
    let after = w.register_sub("after", |call| {
        call.tensor::<u64>(0)?;
        Ok(())
    });
    let slot = Arc::new(Mutex::new(Some(x)));
    let s = slot.clone();
    let orch = w.register_orchestration("drop_mid_run", move |o, _| {
        let x = s.lock().unwrap().clone().ok_or("x was dropped")?;
        o.submit_sub(&keep, &args(&[x.arg(ArgTag::InOut)], &[]))?;
        o.submit_sub(&after, &args(&[x.arg(ArgTag::Input)], &[]))?;
        Ok(()) // this clone drops here; the slot keeps x alive until the test drops it
    });
    w.init().ctx("init")?;
    let handle = w.submit(&orch, &TaskArgs::new()).ctx("submit")?;
    wait_word(&words, 0, 1)?;
    drop(slot.lock().unwrap().take()); // the last handle of x, while its task runs
    let mem = SharedMemory::process();
    check!(
        mem.task_uses(region) == 1 && mem.ptr(region, 0, 8).is_ok(),
        "the running task holds x's region in use"
    );
    words.bump(1);
    let err = match handle.result() {
        Ok(()) => return Err("the task dispatched after the drop ran".into()),
        Err(e) => e.to_string(),
    };
    check!(
        err.contains("released") && !err.contains("discarded"),
        "the first task succeeded, the second failed naming the release: {err}"
    );
    check!(
        mem.task_uses(region) == 0
            && matches!(mem.ptr(region, 0, 8), Err(HostError::RegionReleased { .. })),
        "the region is released once its task ended"
    );
    w.close().ctx("close")?;
    Ok(())
}

/// Item 4 (threads only): a thread child detached at close while still running keeps
/// writing into its run tensor's heap ring. The next worker must not get that ring: its
/// own intermediate keeps the value its task wrote.
#[allow(dead_code)] // run by threads.rs only
pub fn a_detached_thread_childs_heap_ring_is_quarantined() -> Outcome {
    // A heap size no other scenario uses, so the pool can only hand the first worker's
    // ring to the second.
    let heap = (64 << 20) + 7 * 1024;
    let config = || {
        let mut c = l3_config(strata_host::ExecMode::Threads, 0, 1);
        c.heap_ring_bytes = heap;
        c.close_grace = Duration::from_millis(200);
        c
    };
    let mem = SharedMemory::process();
    let quarantined_before = mem.quarantined().0;
    let mut first = DistWorker::new(config()).ctx("first")?;
    let words = SharedWords::new(&first, 3);
    let ww = words.clone();
    let linger = first.register_sub("linger", move |call| {
        let mut r = call.tensor_mut::<u64>(0)?;
        r.set(&[0], 1)?;
        ww.bump(0);
        // Held past the close grace: the worker detaches this thread.
        wait_word(&ww, 1, 1)?;
        r.set(&[0], 0xdead)?;
        ww.bump(2);
        Ok(())
    });
    let orch = first.register_orchestration("linger", move |o, _| {
        let r = o.alloc(&[1], DataType::U64)?;
        o.submit_sub(&linger, &args(&[r.arg(ArgTag::InOut)], &[]))?;
        Ok(())
    });
    first.init().ctx("init first")?;
    let handle = first.submit(&orch, &TaskArgs::new()).ctx("submit")?;
    wait_word(&words, 0, 1)?;
    let closed = first.close();
    drop(handle);
    check!(closed.is_err(), "close reports the detached child");
    let quarantined = mem.quarantined();

    let mut second = DistWorker::new(config()).ctx("second")?;
    let out = second.shared_tensor(&[1], DataType::U64).ctx("out")?;
    let fill = second.register_sub("fill", |call| {
        Ok(call.tensor_mut::<u64>(0)?.set(&[0], 7)?)
    });
    let ww = words.clone();
    let check_r = second.register_sub("check", move |call| {
        ww.bump(1); // the detached writer writes now
        wait_word(&ww, 2, 1)?;
        let v = call.tensor::<u64>(0)?.get(&[0])?;
        Ok(call.tensor_mut::<u64>(1)?.set(&[0], v)?)
    });
    let oa = out.clone();
    let orch = second.register_orchestration("fill_check", move |o, _| {
        let r = o.alloc(&[1], DataType::U64)?;
        o.submit_sub(&fill, &args(&[r.arg(ArgTag::Output)], &[]))?;
        o.submit_sub(
            &check_r,
            &args(&[r.arg(ArgTag::Input), oa.arg(ArgTag::OutputExisting)], &[]),
        )?;
        Ok(())
    });
    second.init().ctx("init second")?;
    second.run(&orch, &TaskArgs::new()).ctx("run second")?;
    let seen = out.to_vec::<u64>().ctx("out")?[0];
    second.close().ctx("close second")?;
    check!(
        seen == 7,
        "the second worker's intermediate was overwritten by the first worker's detached child ({seen:#x})"
    );
    check!(
        quarantined.0 >= quarantined_before + strata_graph::RING_COUNT,
        "the heap rings were quarantined: {quarantined:?}"
    );
    Ok(())
}
