//! The L3/L4 engine with real child processes: end-to-end goldens, closures in forked
//! children, concurrency, many rounds, children that die (killed, crashed), parents that
//! die, the fork-with-threads guard, idle cost, and leak checks.
//!
//! `harness = false`: a process that forks must be single-threaded at the fork, and the
//! libtest harness runs tests on threads. Every scenario runs inside strata-testkit's leak
//! check (descendant processes, `/dev/shm/strata-*`, threads of this process); this process
//! is a child subreaper, so orphans are counted too. Timing figures are printed, never
//! asserted; the idle-CPU bound is 10× the target so it cannot flake.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_chip::{ChipConfig, CoreArgs, KernelError, OrchHandle};
use strata_dist::*;
use strata_host::SharedTensor;
use strata_testkit::*;
use strata_types::{ArgTag, CallConfig, DataType, TaskArgs, TensorArg};

fn l3(chips: usize, subs: usize) -> DistConfig {
    DistConfig::l3(vec![ChipConfig::default(); chips], subs)
}

fn args(tensors: &[TensorArg], scalars: &[u64]) -> TaskArgs {
    let mut a = TaskArgs::new();
    for t in tensors {
        a.push_tensor(*t).unwrap();
    }
    for s in scalars {
        a.push_scalar_bits(*s).unwrap();
    }
    a
}

/// Kills `pid` with SIGKILL.
fn kill(pid: i32) -> Outcome {
    // SAFETY: signalling a process this scenario started.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        return Err(format!("kill {pid}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

// -------------------------------------------------------------------------------------
// The two-chip vector sum: each chip adds two vectors with a real kernel into a run-owned
// intermediate, then a sub-worker sums both intermediates on the host.
// -------------------------------------------------------------------------------------

const N: u64 = 4096;

struct PairSum {
    /// The level-3 orchestration: args = [a, b, c, d (inputs), out (output)].
    orch: HostOrchHandle,
}

/// Registers the kernel, the chip orchestration, the summing sub callable and the level-3
/// orchestration on `w` (a level-3 worker with 2 chips and a sub-worker, or a level-4
/// worker whose level-3 children inherit them).
fn register_pair_sum(w: &mut DistWorker) -> Result<PairSum, String> {
    let add = w
        .register_kernel("vadd", |ctx| {
            let a = ctx.input::<f32>(0)?.to_vec();
            let b = ctx.input::<f32>(1)?.to_vec();
            let mut o = ctx.output::<f32>(2)?;
            let out = o
                .as_mut_slice()
                .ok_or_else(|| KernelError::new("vadd needs a contiguous output"))?;
            for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(&b)) {
                *o = x + y;
            }
            Ok(())
        })
        .ctx("register vadd kernel")?;
    let vadd: OrchHandle = w
        .register_chip_orchestration("vadd", move |o, a| {
            o.submit_aiv(
                add,
                CoreArgs::new()
                    .input(&a.tensor(0)?)
                    .input(&a.tensor(1)?)
                    .output(&a.tensor(2)?),
            )?;
            Ok(())
        })
        .ctx("register chip orchestration")?;
    let sum = w.register_sub("sum", |call| {
        let x = call.tensor::<f32>(0)?.to_vec();
        let y = call.tensor::<f32>(1)?.to_vec();
        let mut o = call.tensor_mut::<f32>(2)?;
        for (i, (x, y)) in x.iter().zip(&y).enumerate() {
            o.set(&[i as u64], x + y)?;
        }
        Ok(())
    });
    let orch = w.register_orchestration("pair_sum", move |o, a| {
        let t = a.tensors();
        if t.len() != 5 {
            return Err(format!(
                "pair_sum takes 5 tensors (a, b, c, d, out), got {}",
                t.len()
            )
            .into());
        }
        let r0 = o.alloc(&[N], DataType::F32)?;
        let r1 = o.alloc(&[N], DataType::F32)?;
        let input = |i: usize| t[i].with_tag(ArgTag::Input);
        o.submit_next_level(
            vadd,
            &args(&[input(0), input(1), r0.arg(ArgTag::Output)], &[]),
            0,
        )?;
        o.submit_next_level(
            vadd,
            &args(&[input(2), input(3), r1.arg(ArgTag::Output)], &[]),
            1,
        )?;
        o.submit_sub(
            &sum,
            &args(
                &[
                    r0.arg(ArgTag::Input),
                    r1.arg(ArgTag::Input),
                    t[4].with_tag(ArgTag::OutputExisting),
                ],
                &[],
            ),
        )?;
        Ok(())
    });
    Ok(PairSum { orch })
}

/// Four input vectors seeded by `seed`, as shared tensors, and their host golden sum.
fn pair_inputs(w: &DistWorker, seed: f32) -> Result<(Vec<SharedTensor>, Vec<f32>), String> {
    let mut tensors = Vec::new();
    let mut golden = vec![0.0f32; N as usize];
    for k in 0..4 {
        let v: Vec<f32> = (0..N)
            .map(|i| seed * (k as f32 + 1.0) + (i as f32) * 0.25 - k as f32 * 3.0)
            .collect();
        for (g, x) in golden.iter_mut().zip(&v) {
            *g += x;
        }
        tensors.push(w.shared_tensor_from(&[N], &v).ctx("input tensor")?);
    }
    Ok((tensors, golden))
}

fn pair_args(inputs: &[SharedTensor], out: &SharedTensor) -> TaskArgs {
    let mut t: Vec<TensorArg> = inputs.iter().map(|x| x.arg(ArgTag::Input)).collect();
    t.push(out.arg(ArgTag::OutputExisting));
    args(&t, &[])
}

/// Exact comparison: the sums are of the same f32 values in the same order as the golden
/// except for association, which this data keeps exact (small multiples of 0.25).
fn same(got: &[f32], want: &[f32]) -> Outcome {
    check!(
        got.len() == want.len(),
        "length {} vs {}",
        got.len(),
        want.len()
    );
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        return Err(format!("element {i}: got {}, want {}", got[i], want[i]));
    }
    Ok(())
}

fn l3_two_chips_and_a_sub_worker_match_the_host_golden() -> Outcome {
    let mut w = DistWorker::new(l3(2, 1)).ctx("new")?;
    let p = register_pair_sum(&mut w)?;
    let (inputs, golden) = pair_inputs(&w, 1.5)?;
    let out = w.shared_tensor(&[N], DataType::F32).ctx("out")?;
    w.init().ctx("init")?;
    check!(
        w.child_pids().len() == 3,
        "2 chips + 1 sub-worker = 3 child processes"
    );
    for round in 0..5 {
        out.write(&vec![f32::NAN; N as usize]).ctx("poison out")?;
        w.run(&p.orch, &pair_args(&inputs, &out)).ctx("run")?;
        same(&out.to_vec::<f32>().ctx("read")?, &golden)
            .map_err(|e| format!("round {round}: {e}"))?;
    }
    w.close().ctx("close")?;
    Ok(())
}

fn l4_with_two_level_3_children_matches_the_host_golden() -> Outcome {
    let mut top = DistWorker::new(DistConfig::l4(1)).ctx("new l4")?;
    let p = register_pair_sum(&mut top)?;
    let add = top.register_sub("add", |call| {
        let x = call.tensor::<f32>(0)?.to_vec();
        let y = call.tensor::<f32>(1)?.to_vec();
        let mut o = call.tensor_mut::<f32>(2)?;
        for (i, (x, y)) in x.iter().zip(&y).enumerate() {
            o.set(&[i as u64], x + y)?;
        }
        Ok(())
    });
    let (in0, g0) = pair_inputs(&top, 1.0)?;
    let (in1, g1) = pair_inputs(&top, -2.0)?;
    let o0 = top.shared_tensor(&[N], DataType::F32).ctx("o0")?;
    let o1 = top.shared_tensor(&[N], DataType::F32).ctx("o1")?;
    let total = top.shared_tensor(&[N], DataType::F32).ctx("total")?;
    let c0 = top
        .add_worker(DistWorker::new(l3(2, 1)).ctx("child 0")?)
        .ctx("add 0")?;
    let c1 = top
        .add_worker(DistWorker::new(l3(2, 1)).ctx("child 1")?)
        .ctx("add 1")?;
    let (a0, a1) = (pair_args(&in0, &o0), pair_args(&in1, &o1));
    let (o0a, o1a, ta) = (o0.clone(), o1.clone(), total.clone());
    let outer = top.register_orchestration("outer", move |o, _| {
        o.submit_next_level(p.orch, &a0, c0)?;
        o.submit_next_level(p.orch, &a1, c1)?;
        o.submit_sub(
            &add,
            &args(
                &[
                    o0a.arg(ArgTag::Input),
                    o1a.arg(ArgTag::Input),
                    ta.arg(ArgTag::OutputExisting),
                ],
                &[],
            ),
        )?;
        Ok(())
    });
    top.init().ctx("init")?;
    check!(
        top.child_pids().len() == 3,
        "2 level-3 children + 1 sub-worker, got {:?}",
        top.child_pids()
    );
    let golden: Vec<f32> = g0.iter().zip(&g1).map(|(a, b)| a + b).collect();
    for round in 0..3 {
        total.write(&vec![f32::NAN; N as usize]).ctx("poison")?;
        top.run(&outer, &TaskArgs::new()).ctx("run")?;
        same(&o0.to_vec::<f32>().ctx("o0")?, &g0)
            .map_err(|e| format!("round {round} child 0: {e}"))?;
        same(&o1.to_vec::<f32>().ctx("o1")?, &g1)
            .map_err(|e| format!("round {round} child 1: {e}"))?;
        same(&total.to_vec::<f32>().ctx("total")?, &golden)
            .map_err(|e| format!("round {round} total: {e}"))?;
    }
    top.close().ctx("close")?;
    Ok(())
}

// -------------------------------------------------------------------------------------
// Closures, concurrency, rounds
// -------------------------------------------------------------------------------------

fn closures_capture_state_and_run_in_the_children() -> Outcome {
    let mut w = DistWorker::new(l3(0, 2)).ctx("new")?;
    // Captured state: a table the parent built (never serialized) and a counter that the
    // children increment in their own copy of the address space.
    let table: Vec<u64> = (0..64).map(|i| i * i + 7).collect();
    let calls_here = Arc::new(AtomicU64::new(0));
    let c = calls_here.clone();
    let lookup = w.register_sub("lookup", move |call| {
        c.fetch_add(1, Ordering::SeqCst);
        let i: u64 = call.scalar(0).ok_or("index")?;
        let pid = std::process::id() as u64;
        let mut o = call.tensor_mut::<u64>(0)?;
        o.set(&[0], table[i as usize])?;
        o.set(&[1], pid)?;
        Ok(())
    });
    let outs: Vec<SharedTensor> = (0..8)
        .map(|_| w.shared_tensor(&[2], DataType::U64))
        .collect::<Result<_, _>>()
        .ctx("outs")?;
    let oa = outs.clone();
    let orch = w.register_orchestration("lookups", move |o, _| {
        for (i, t) in oa.iter().enumerate() {
            o.submit_sub(
                &lookup,
                &args(&[t.arg(ArgTag::OutputExisting)], &[i as u64 * 5]),
            )?;
        }
        Ok(())
    });
    w.init().ctx("init")?;
    w.run(&orch, &TaskArgs::new()).ctx("run")?;
    let me = std::process::id() as u64;
    let children: Vec<u64> = w.child_pids().iter().map(|&p| p as u64).collect();
    for (i, t) in outs.iter().enumerate() {
        let v = t.to_vec::<u64>().ctx("read")?;
        let k = i as u64 * 5;
        check!(v[0] == k * k + 7, "task {i}: captured table gave {}", v[0]);
        check!(
            v[1] != me && children.contains(&v[1]),
            "task {i} ran in pid {} (children {children:?})",
            v[1]
        );
    }
    check!(
        calls_here.load(Ordering::SeqCst) == 0,
        "the parent's counter changed: the closure ran in the parent"
    );
    w.close().ctx("close")?;
    Ok(())
}

fn three_sub_workers_sleeping_50ms_overlap() -> Outcome {
    let mut w = DistWorker::new(l3(0, 3)).ctx("new")?;
    let marks = w.shared_tensor(&[3, 2], DataType::U64).ctx("marks")?;
    let nap = w.register_sub("nap", |call| {
        let start = mono_ns();
        std::thread::sleep(Duration::from_millis(50));
        let mut t = call.tensor_mut::<u64>(0)?;
        t.set(&[0, 0], start)?;
        t.set(&[0, 1], mono_ns())?;
        Ok(())
    });
    let ma = marks.clone();
    let parallel = w.register_orchestration("parallel", move |o, _| {
        for i in 0..3 {
            let v = ma.view().slice(0, i, i + 1)?;
            o.submit_sub(&nap, &args(&[ma.arg_view(v, ArgTag::OutputExisting)?], &[]))?;
        }
        Ok(())
    });
    w.init().ctx("init")?;
    w.run(&parallel, &TaskArgs::new()).ctx("warm-up")?;
    let t0 = Instant::now();
    w.run(&parallel, &TaskArgs::new()).ctx("run")?;
    let wall = t0.elapsed();
    let m = marks.to_vec::<u64>().ctx("read")?;
    let latest_start = m.iter().step_by(2).max().copied().unwrap_or(0);
    let earliest_end = m.iter().skip(1).step_by(2).min().copied().unwrap_or(0);
    println!(
        "    3 × 50 ms sub tasks: {wall:.2?} wall, {:.2} × the 150 ms serial time",
        wall.as_secs_f64() / 0.150
    );
    check!(
        latest_start < earliest_end,
        "the three naps did not overlap: starts/ends {m:?}"
    );
    w.close().ctx("close")?;
    Ok(())
}

fn thousands_of_rounds_reuse_the_same_children() -> Outcome {
    let mut w = DistWorker::new(l3(1, 2)).ctx("new")?;
    let x = w.shared_tensor_from(&[2], &[0u64, 0]).ctx("x")?;
    let inc = w.register_sub("inc", |call| {
        call.tensor_mut::<u64>(0)?.update(|v| v + 1);
        Ok(())
    });
    let noop = w
        .register_chip_orchestration("noop", |_, _| Ok(()))
        .ctx("chip noop")?;
    let xa = x.clone();
    let orch = w.register_orchestration("round", move |o, _| {
        let v0 = xa.view().slice(0, 0, 1)?;
        let v1 = xa.view().slice(0, 1, 2)?;
        o.submit_sub(&inc, &args(&[xa.arg_view(v0, ArgTag::InOut)?], &[]))?;
        o.submit_sub(&inc, &args(&[xa.arg_view(v1, ArgTag::InOut)?], &[]))?;
        o.submit_next_level(noop, &TaskArgs::new(), 0)?;
        o.submit_sub(&inc, &args(&[xa.arg_view(v0, ArgTag::InOut)?], &[]))?;
        Ok(())
    });
    w.init().ctx("init")?;
    let rounds = 2000u64;
    let t0 = Instant::now();
    let mut in_flight = std::collections::VecDeque::new();
    for _ in 0..rounds {
        in_flight.push_back(w.submit(&orch, &TaskArgs::new()).ctx("submit")?);
        if in_flight.len() == 2 {
            in_flight
                .pop_front()
                .map(|h| h.result())
                .transpose()
                .ctx("run")?;
        }
    }
    for h in in_flight {
        h.result().ctx("run")?;
    }
    println!(
        "    {rounds} runs of 4 tasks: {:.1} µs per task",
        t0.elapsed().as_secs_f64() * 1e6 / (rounds * 4) as f64
    );
    check!(
        x.to_vec::<u64>().ctx("read")? == vec![2 * rounds, rounds],
        "counts {:?}",
        x.to_vec::<u64>()
    );
    w.close().ctx("close")?;
    Ok(())
}

// -------------------------------------------------------------------------------------
// Children that die
// -------------------------------------------------------------------------------------

/// Waits until the shared flag `t[0]` is non-zero.
fn wait_flag(t: &SharedTensor) -> Outcome {
    wait_for("the task to start", || {
        t.to_vec::<u64>().map(|v| v[0] != 0).unwrap_or(false)
    })
}

fn a_sub_child_killed_mid_task_fails_the_run_naming_it() -> Outcome {
    let mut w = DistWorker::new(l3(0, 2)).ctx("new")?;
    let started = w.shared_tensor(&[1], DataType::U64).ctx("flag")?;
    let downstream = w.shared_tensor(&[1], DataType::U64).ctx("downstream")?;
    let hang = w.register_sub("hang", |call| {
        call.tensor_mut::<u64>(0)?.set(&[0], 1)?;
        std::thread::sleep(Duration::from_secs(120));
        Ok(())
    });
    let mark = w.register_sub("mark", |call| {
        call.tensor_mut::<u64>(1)?.set(&[0], 1)?;
        Ok(())
    });
    let (sa, da) = (started.clone(), downstream.clone());
    let orch = w.register_orchestration("hang", move |o, _| {
        o.submit_sub(&hang, &args(&[sa.arg(ArgTag::OutputExisting)], &[]))?;
        o.submit_sub(
            &mark,
            &args(
                &[sa.arg(ArgTag::Input), da.arg(ArgTag::OutputExisting)],
                &[],
            ),
        )?;
        Ok(())
    });
    w.init().ctx("init")?;
    let pids = w.child_pids();
    let handle = w.submit(&orch, &TaskArgs::new()).ctx("submit")?;
    wait_flag(&started)?;
    // The hanging task runs on sub_worker 0 or 1; find which by killing both in turn
    // would be racy, so kill the one whose task it is: the other is idle, and killing an
    // idle child must also make the worker unusable. Kill both: the error must name one.
    let t0 = Instant::now();
    for &p in &pids {
        kill(p)?;
    }
    let err = match handle.result() {
        Ok(()) => return Err("the run succeeded although its child was killed".into()),
        Err(e) => e.to_string(),
    };
    println!("    death noticed and reported after {:.2?}", t0.elapsed());
    check!(
        err.contains("sub_worker 0") || err.contains("sub_worker 1"),
        "the error names the worker: {err}"
    );
    check!(
        err.contains("SIGKILL") || err.contains("signal"),
        "the error says how it died: {err}"
    );
    check!(
        downstream.to_vec::<u64>().ctx("read")?[0] == 0,
        "the dependent task was poisoned, not run"
    );
    wait_for("the worker to report itself unusable", || {
        w.unusable_reason().is_some()
    })?;
    match w.submit(&orch, &TaskArgs::new()) {
        Err(DistError::Unusable(why)) => check!(why.contains("sub_worker"), "{why}"),
        Err(e) => return Err(format!("expected Unusable, got {e}")),
        Ok(_) => return Err("an unusable worker accepted a run".into()),
    }
    w.close().ctx("close after a death")?;
    Ok(())
}

fn a_chip_child_killed_mid_kernel_fails_the_run_and_close_reaps_everything() -> Outcome {
    let mut w = DistWorker::new(l3(2, 1)).ctx("new")?;
    let started = w.shared_tensor(&[1], DataType::U64).ctx("flag")?;
    // A kernel sees device memory, which reaches the host only when the task ends; the
    // flag is written through the shared mapping the chip child inherited.
    let flag = started.clone();
    let stall = w
        .register_kernel("stall", move |_| {
            flag.write(&[1u64])
                .map_err(|e| KernelError::new(e.to_string()))?;
            std::thread::sleep(Duration::from_secs(120));
            Ok(())
        })
        .ctx("kernel")?;
    let chip_stall = w
        .register_chip_orchestration("stall", move |o, a| {
            o.submit_aiv(stall, CoreArgs::new().inout(&a.tensor(0)?))?;
            Ok(())
        })
        .ctx("chip orch")?;
    let sa = started.clone();
    let orch = w.register_orchestration("stall", move |o, _| {
        o.submit_next_level(chip_stall, &args(&[sa.arg(ArgTag::InOut)], &[]), 1)?;
        Ok(())
    });
    w.init().ctx("init")?;
    let chip1 = w.child_pids()[1];
    let handle = w.submit(&orch, &TaskArgs::new()).ctx("submit")?;
    wait_flag(&started)?;
    kill(chip1)?;
    let err = handle
        .result()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    check!(
        err.starts_with("worker 1: chip_process dev=1 (pid") && err.contains("SIGKILL"),
        "the error names chip 1 and how it died: {err:?}"
    );
    check!(w.unusable_reason().is_some(), "the worker is unusable");
    let t0 = Instant::now();
    w.close().ctx("close")?;
    println!("    close after a chip death: {:.2?}", t0.elapsed());
    Ok(())
}

fn a_stalled_chip_orchestration_ends_its_process_and_fails_the_run_naming_it() -> Outcome {
    // Forked chip children run their orchestrations on the serving thread
    // (OrchestratorPlacement::Auto resolves to Caller); a stall ends the child.
    let chip = ChipConfig {
        tensor_wait_timeout: Duration::from_millis(50),
        ring_wait_timeout: Duration::from_millis(50),
        ..ChipConfig::default()
    };
    let mut w = DistWorker::new(DistConfig::l3(vec![chip; 2], 0)).ctx("new")?;
    let spin = w
        .register_chip_orchestration("spin", |_, _| loop {
            std::thread::sleep(Duration::from_millis(5));
        })
        .ctx("chip orch")?;
    let fine = w
        .register_chip_orchestration("fine", |_, _| Ok(()))
        .ctx("chip orch")?;
    let orch = w.register_orchestration("stall", move |o, a| {
        let target = a.scalar::<u64>(0).ok_or("scalar")? as usize;
        o.submit_next_level(fine, &TaskArgs::new(), 1 - target)?;
        o.submit_next_level(spin, &TaskArgs::new(), target)?;
        Ok(())
    });
    w.init().ctx("init")?;
    let cfg = CallConfig {
        timeout_ms: 50,
        ..CallConfig::default()
    };
    let t0 = Instant::now();
    let err = w
        .run_with(&orch, &args(&[], &[0]), &cfg)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    println!(
        "    stalled chip orchestration reported after {:.2?}",
        t0.elapsed()
    );
    check!(
        err.starts_with("worker 0: chip_process dev=0 (pid")
            && err.contains("exit")
            && err.contains("70")
            && err.contains("made no progress"),
        "the error names chip 0, its exit and why: {err:?}"
    );
    check!(w.unusable_reason().is_some(), "the worker is unusable");
    w.close().ctx("close")?;
    Ok(())
}

fn a_crashing_sub_child_is_reported() -> Outcome {
    let mut w = DistWorker::new(l3(0, 1)).ctx("new")?;
    let crash = w.register_sub("crash", |_| std::process::abort());
    let orch = w.register_orchestration("crash", move |o, _| {
        o.submit_sub(&crash, &TaskArgs::new())?;
        Ok(())
    });
    w.init().ctx("init")?;
    let err = w
        .run(&orch, &TaskArgs::new())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    check!(
        err.contains("sub_worker 0") && err.contains("SIGABRT"),
        "the error names the worker and the signal: {err:?}"
    );
    w.close().ctx("close")?;
    Ok(())
}

fn children_exit_by_themselves_when_the_worker_process_is_killed() -> Outcome {
    // A forked process builds a level-4 tree (two level-3 children, each with a chip and a
    // sub-worker: 6 processes below it), reports the pids, and waits to be killed.
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors.
    check!(unsafe { libc::pipe(fds.as_mut_ptr()) } == 0, "pipe");
    // SAFETY: this process is single-threaded here (the runner runs scenarios in order
    // and every earlier worker was closed); the child leaves through `_exit`.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = std::panic::catch_unwind(|| {
            let mut top = DistWorker::new(DistConfig::l4(0)).expect("l4");
            for _ in 0..2 {
                top.add_worker(DistWorker::new(l3(1, 1)).expect("l3"))
                    .expect("add");
            }
            top.init().expect("init");
            let me = std::process::id() as i32;
            let below: Vec<i32> = descendants_of(me);
            let text = format!("{below:?}\n");
            // SAFETY: writing our own buffer to the pipe's write end.
            unsafe { libc::write(fds[1], text.as_ptr().cast(), text.len()) };
            std::thread::sleep(Duration::from_secs(300));
            0
        })
        .unwrap_or(101);
        // SAFETY: leave without running inherited destructors.
        unsafe { libc::_exit(code) }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(fds[1]) };
    let mut buf = vec![0u8; 4096];
    // SAFETY: reading into our own buffer.
    let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: closing the read end.
    unsafe { libc::close(fds[0]) };
    let text = String::from_utf8_lossy(&buf[..n.max(0) as usize]).to_string();
    let orphans: Vec<i32> = text
        .trim()
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    kill(pid)?;
    // SAFETY: reaping the process we forked.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    check!(orphans.len() == 6, "the tree below the worker: {text:?}");
    let t0 = Instant::now();
    // As subreaper we inherit the orphans: reap them as they exit.
    wait_for("every orphan to exit", || {
        orphans.iter().all(|&p| {
            // SAFETY: reaping a process that was reparented to us (or is gone: ECHILD).
            let r = unsafe { libc::waitpid(p, std::ptr::null_mut(), libc::WNOHANG) };
            r == p || r == -1
        })
    })?;
    println!(
        "    6 orphans exited by themselves within {:.2?}",
        t0.elapsed()
    );
    Ok(())
}

fn close_cuts_off_a_stuck_task_after_the_grace_period() -> Outcome {
    let mut cfg = l3(0, 2);
    cfg.close_grace = Duration::from_millis(200);
    let mut w = DistWorker::new(cfg).ctx("new")?;
    let started = w.shared_tensor(&[1], DataType::U64).ctx("flag")?;
    let stuck = w.register_sub("stuck", |call| {
        call.tensor_mut::<u64>(0)?.set(&[0], 1)?;
        std::thread::sleep(Duration::from_secs(300));
        Ok(())
    });
    let sa = started.clone();
    let orch = w.register_orchestration("stuck", move |o, _| {
        o.submit_sub(&stuck, &args(&[sa.arg(ArgTag::OutputExisting)], &[]))?;
        Ok(())
    });
    w.init().ctx("init")?;
    let handle = w.submit(&orch, &TaskArgs::new()).ctx("submit")?;
    wait_flag(&started)?;
    let t0 = Instant::now();
    let closed = w.close();
    let took = t0.elapsed();
    println!("    close with a stuck task (grace 200 ms): {took:.2?}");
    match closed {
        Err(DistError::Close(why)) => check!(
            why.contains("sub_worker") && why.contains("SIGKILL"),
            "close names the child it had to kill: {why}"
        ),
        other => return Err(format!("expected DistError::Close, got {other:?}")),
    }
    let err = handle
        .result()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    check!(
        err.contains("closed before this task finished"),
        "the run failed: {err:?}"
    );
    Ok(())
}

fn init_close_cycles_reuse_the_heap_rings_and_dropped_tensors_are_refused() -> Outcome {
    let mem = strata_host::SharedMemory::process();
    let mut regions_after_first = 0;
    for cycle in 0..5 {
        let mut w = DistWorker::new(l3(1, 1)).ctx("new")?;
        let x = w.shared_tensor_from(&[4], &[1u32, 2, 3, 4]).ctx("x")?;
        let dropped = w.shared_tensor(&[4], DataType::U32).ctx("dropped")?;
        let stale = dropped.arg(ArgTag::Input);
        let noop = w.register_sub("noop", |_| Ok(()));
        let xa = x.clone();
        let orch = w.register_orchestration("use", move |o, a| {
            let use_stale: u64 = a.scalar(0).ok_or("which")?;
            let t = if use_stale == 1 {
                stale
            } else {
                xa.arg(ArgTag::Input)
            };
            let scratch = o.alloc(&[1024], DataType::U8)?;
            o.submit_sub(&noop, &args(&[t, scratch.arg(ArgTag::Output)], &[]))?;
            Ok(())
        });
        w.init().ctx("init")?;
        drop(dropped);
        w.run(&orch, &args(&[], &[0])).ctx("run")?;
        let e = w
            .run(&orch, &args(&[], &[1]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        check!(
            e.contains("was released"),
            "a dropped tensor is refused: {e:?}"
        );
        w.close().ctx("close")?;
        // Each cycle creates two tensors; the four heap rings come from the pool.
        if cycle == 0 {
            regions_after_first = mem.regions();
        } else {
            check!(
                mem.regions() == regions_after_first + 2 * cycle,
                "cycle {cycle}: {} regions, expected {} (heap rings reused)",
                mem.regions(),
                regions_after_first + 2 * cycle
            );
        }
    }
    Ok(())
}

// -------------------------------------------------------------------------------------
// Fork guard, idle cost
// -------------------------------------------------------------------------------------

fn init_refuses_to_fork_while_threads_run_unless_opted_in() -> Outcome {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let bystander = std::thread::spawn(move || rx.recv());
    let mut w = DistWorker::new(l3(0, 1)).ctx("new")?;
    let noop = w.register_sub("noop", |_| Ok(()));
    let orch = w.register_orchestration("noop", move |o, _| {
        o.submit_sub(&noop, &TaskArgs::new())?;
        Ok(())
    });
    let err = match w.init() {
        Ok(()) => return Err("init forked while another thread ran".into()),
        Err(e) => e.to_string(),
    };
    check!(
        err.contains("thread") && err.contains("allow_fork_with_threads"),
        "the error explains the refusal and the opt-in: {err}"
    );
    // Opting in (the bystander holds no lock) works.
    let mut cfg = l3(0, 1);
    cfg.allow_fork_with_threads = true;
    let mut w = DistWorker::new(cfg).ctx("new")?;
    let noop = w.register_sub("noop", |_| Ok(()));
    let orch2 = w.register_orchestration("noop", move |o, _| {
        o.submit_sub(&noop, &TaskArgs::new())?;
        Ok(())
    });
    w.init().ctx("init with opt-in")?;
    w.run(&orch2, &TaskArgs::new()).ctx("run")?;
    w.close().ctx("close")?;
    drop(tx);
    let _ = bystander.join();
    let _ = orch;
    Ok(())
}

fn an_idle_worker_with_4_chips_and_2_sub_workers_barely_uses_the_cpu() -> Outcome {
    let mut w = DistWorker::new(l3(4, 2)).ctx("new")?;
    let noop = w.register_sub("noop", |_| Ok(()));
    let chip_noop = w
        .register_chip_orchestration("noop", |_, _| Ok(()))
        .ctx("chip noop")?;
    let orch = w.register_orchestration("touch_all", move |o, _| {
        for c in 0..4 {
            o.submit_next_level(chip_noop, &TaskArgs::new(), c)?;
        }
        o.submit_sub(&noop, &TaskArgs::new())?;
        o.submit_sub(&noop, &TaskArgs::new())?;
        Ok(())
    });
    let t0 = Instant::now();
    w.init().ctx("init")?;
    let init = t0.elapsed();
    w.run(&orch, &TaskArgs::new()).ctx("run")?;
    std::thread::sleep(Duration::from_millis(300)); // past every spin budget: parked
    let mut pids = w.child_pids();
    pids.push(std::process::id() as i32);
    let before: u64 = pids
        .iter()
        .map(|&p| process_cpu_ns(p))
        .sum::<Result<_, _>>()?;
    let t1 = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let after: u64 = pids
        .iter()
        .map(|&p| process_cpu_ns(p))
        .sum::<Result<_, _>>()?;
    let percent = (after - before) as f64 / t1.elapsed().as_nanos() as f64 * 100.0;
    let t2 = Instant::now();
    w.close().ctx("close")?;
    println!(
        "    idle 4 chips + 2 subs (+ this process): {percent:.3} % of one core; init {init:.2?}, close {:.2?}",
        t2.elapsed()
    );
    check!(
        percent < 10.0,
        "an idle worker used {percent:.2} % of a core"
    );
    Ok(())
}

fn main() {
    become_subreaper();
    run(&[
        (
            "l3_two_chips_and_a_sub_worker_match_the_host_golden",
            l3_two_chips_and_a_sub_worker_match_the_host_golden,
        ),
        (
            "l4_with_two_level_3_children_matches_the_host_golden",
            l4_with_two_level_3_children_matches_the_host_golden,
        ),
        (
            "closures_capture_state_and_run_in_the_children",
            closures_capture_state_and_run_in_the_children,
        ),
        (
            "three_sub_workers_sleeping_50ms_overlap",
            three_sub_workers_sleeping_50ms_overlap,
        ),
        (
            "thousands_of_rounds_reuse_the_same_children",
            thousands_of_rounds_reuse_the_same_children,
        ),
        (
            "a_sub_child_killed_mid_task_fails_the_run_naming_it",
            a_sub_child_killed_mid_task_fails_the_run_naming_it,
        ),
        (
            "a_chip_child_killed_mid_kernel_fails_the_run_and_close_reaps_everything",
            a_chip_child_killed_mid_kernel_fails_the_run_and_close_reaps_everything,
        ),
        (
            "a_stalled_chip_orchestration_ends_its_process_and_fails_the_run_naming_it",
            a_stalled_chip_orchestration_ends_its_process_and_fails_the_run_naming_it,
        ),
        (
            "a_crashing_sub_child_is_reported",
            a_crashing_sub_child_is_reported,
        ),
        (
            "close_cuts_off_a_stuck_task_after_the_grace_period",
            close_cuts_off_a_stuck_task_after_the_grace_period,
        ),
        (
            "children_exit_by_themselves_when_the_worker_process_is_killed",
            children_exit_by_themselves_when_the_worker_process_is_killed,
        ),
        (
            "init_close_cycles_reuse_the_heap_rings_and_dropped_tensors_are_refused",
            init_close_cycles_reuse_the_heap_rings_and_dropped_tensors_are_refused,
        ),
        (
            "init_refuses_to_fork_while_threads_run_unless_opted_in",
            init_refuses_to_fork_while_threads_run_unless_opted_in,
        ),
        (
            "an_idle_worker_with_4_chips_and_2_sub_workers_barely_uses_the_cpu",
            an_idle_worker_with_4_chips_and_2_sub_workers_barely_uses_the_cpu,
        ),
    ]);
}
