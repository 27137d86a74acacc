//! The MPI transport end to end (feature `mpi`; `harness = false`: the binary is both the
//! test driver and the program every rank runs).
//!
//! The driver runs each case as `mpirun -n 3 --oversubscribe strata-node launch
//! --transport mpi -- <this binary> --case NAME`, bounded by a timeout (the whole
//! process group is killed past it, and the case fails). Rank 0 is the level-4 root,
//! ranks 1 and 2 its remote level-3 workers; every rank runs the same case function and
//! only the root's returns (the others serve inside `init` and exit there). The root
//! checks results against values computed here and prints `ok: NAME`.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use strata_dist::{DistConfig, DistWorker};
use strata_net::RemoteSpec;
use strata_types::{ArgTag, DataType, TaskArgs};

/// How a case's job ends besides rank 0's `ok:` line.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ends {
    /// Every rank exits 0.
    Clean,
    /// A rank is killed: mpirun must let the job go on (`--enable-recovery`).
    RankKilled,
    /// The root refuses the other ranks: they exit non-zero, and mpirun must not end the
    /// job on that before the root reported (`orte_abort_on_non_zero_status 0`).
    NodesRefused,
    /// The root ends without closing its level-4 worker: its ranks are told, end their
    /// sessions and exit non-zero (mpirun told not to abort on that, as above).
    RootLeft,
}

const CASES: &[(&str, Ends)] = &[
    ("remote_vector_sum_over_mpi", Ends::Clean),
    ("quickstart_allreduce_on_every_rank_over_mpi", Ends::Clean),
    ("remote_device_memory_over_mpi", Ends::Clean),
    (
        "a_rank_killed_mid_task_fails_its_task_with_a_typed_error",
        Ends::RankKilled,
    ),
    (
        "a_rank_with_other_registrations_is_refused_at_startup",
        Ends::NodesRefused,
    ),
    (
        "a_root_that_exits_without_close_ends_its_ranks",
        Ends::RootLeft,
    ),
];

/// Past this a case's job is killed and the case fails (never a hang).
const CASE_TIMEOUT: Duration = Duration::from_secs(120);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--case") {
        let name = args.get(i + 1).cloned().unwrap_or_default();
        match run_case(&name) {
            Ok(()) => {
                println!("ok: {name}");
                std::process::exit(0)
            }
            Err(e) => {
                println!("case {name} FAILED: {e}");
                std::process::exit(1)
            }
        }
    }
    if args.iter().any(|a| a == "--list") {
        for (c, _) in CASES {
            println!("{c}: test");
        }
        return;
    }
    let filter: Vec<&String> = args
        .iter()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    std::process::exit(driver(&filter));
}

fn driver(filter: &[&String]) -> i32 {
    let exe = std::env::current_exe().expect("own path");
    if Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        println!("no mpirun: `cargo xtask ci` installs openmpi-bin");
        println!("0 passed, 0 failed");
        return 1;
    }
    let (mut passed, mut failed) = (0, 0);
    for &(name, ends) in CASES {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        match run_job(&exe, name, ends) {
            Ok(t) => {
                passed += 1;
                println!("test {name} ... ok ({t:.2?})");
            }
            Err(e) => {
                failed += 1;
                println!("test {name} ... FAILED\n{e}");
            }
        }
    }
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    i32::from(failed > 0)
}

/// Runs case `name` on 3 ranks under mpirun, in its own process group, killed past
/// [`CASE_TIMEOUT`].
fn run_job(exe: &Path, name: &str, ends: Ends) -> Result<Duration, String> {
    let t = Instant::now();
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "--bind-to", "none", "-n", "3"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove(strata_net::ENV_SECRET_FILE);
    match ends {
        Ends::Clean => {}
        // mpirun ends the whole job when a rank dies, unless told to let it go on: the
        // root must see the loss itself.
        Ends::RankKilled => {
            cmd.arg("--enable-recovery");
        }
        Ends::NodesRefused | Ends::RootLeft => {
            cmd.args(["--mca", "orte_abort_on_non_zero_status", "0"]);
        }
    }
    cmd.arg(env!("CARGO_BIN_EXE_strata-node"))
        .args(["launch", "--transport", "mpi", "--"])
        .arg(exe)
        .args(["--case", name])
        .stdin(Stdio::null())
        .process_group(0);
    // Output to files and a polled wait: the driver stays single-threaded, so every
    // spawn forks a one-thread process.
    let dir = std::env::temp_dir();
    let (so, se) = (
        dir.join(format!("strata-mpi-test-{}-{name}.out", std::process::id())),
        dir.join(format!("strata-mpi-test-{}-{name}.err", std::process::id())),
    );
    let file = |p: &Path| std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()));
    cmd.stdout(file(&so)?).stderr(file(&se)?);
    let shm_before = shm_entries();
    let mut child = cmd.spawn().map_err(|e| format!("mpirun: {e}"))?;
    let pid = child.id() as i32;
    let status = loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(st) => break Some(st),
            None if t.elapsed() > CASE_TIMEOUT => break None,
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let read = |p: &Path| {
        let s = std::fs::read_to_string(p).unwrap_or_default();
        let _ = std::fs::remove_file(p);
        s
    };
    let Some(status) = status else {
        // SAFETY: killing the process group this driver started.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        let _ = child.wait();
        return Err(format!(
            "the job did not end within {CASE_TIMEOUT:?}\n{}{}",
            read(&so),
            read(&se)
        ));
    };
    let (text, errs) = (read(&so), read(&se));
    // Nothing of the job is left: no process of this program, no shared memory.
    let exe_s = exe.to_string_lossy().to_string();
    let left: Vec<String> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .parse::<u32>()
                .is_ok_and(|p| p != std::process::id())
        })
        .filter_map(|e| std::fs::read_link(e.path().join("exe")).ok())
        .map(|p| p.to_string_lossy().to_string())
        .filter(|p| *p == exe_s)
        .collect();
    let shm_after = shm_entries();
    let new_shm: Vec<&String> = shm_after
        .iter()
        .filter(|e| !shm_before.contains(e))
        .collect();
    if !left.is_empty() || !new_shm.is_empty() {
        return Err(format!(
            "left behind: {} processes of the program, shared memory {new_shm:?}",
            left.len()
        ));
    }
    // A refused rank says why before it exits (mpirun, told not to abort on it, exits 0).
    let status_ok = status.success()
        && match ends {
            Ends::NodesRefused => errs.contains("the root ended the session: the program on"),
            // Both ranks (their lines may interleave: the phrase is counted).
            Ends::RootLeft => errs.matches("the root ended the session").count() == 2,
            Ends::Clean | Ends::RankKilled => true,
        };
    if !text.lines().any(|l| l == format!("ok: {name}")) || !status_ok {
        return Err(format!("{status}\n--- stdout\n{text}--- stderr\n{errs}"));
    }
    for l in text.lines().filter(|l| l.starts_with("  ")) {
        println!("{l}");
    }
    Ok(t.elapsed())
}

/// Open MPI's shared-memory segments in `/dev/shm` (strata's own regions of these
/// processes are anonymous memfds, gone with them; other users of the machine may create
/// named ones meanwhile, so those are not compared).
fn shm_entries() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("vader_segment"))
        .collect()
}

fn check(cond: bool, what: impl Into<String>) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what.into())
    }
}

fn run_case(name: &str) -> Result<(), String> {
    match name {
        "remote_vector_sum_over_mpi" => vector_sum(),
        "quickstart_allreduce_on_every_rank_over_mpi" => allreduce(),
        "remote_device_memory_over_mpi" => device_memory(),
        "a_rank_killed_mid_task_fails_its_task_with_a_typed_error" => rank_killed(),
        "a_rank_with_other_registrations_is_refused_at_startup" => registry_mismatch(),
        "a_root_that_exits_without_close_ends_its_ranks" => root_left(),
        other => Err(format!("no case {other}")),
    }
}

const CHIPS: usize = 2;

/// The level-4 vector sum with its two level-3 workers on ranks 1 and 2: chip `r` of
/// worker `w` adds `a[w][r] + b[w][r]`, the worker's sub-worker sums its chips' results
/// into `partial[w]`. Three runs; every element checked.
fn vector_sum() -> Result<(), String> {
    const N: u64 = 1 << 14;
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let workers: Vec<usize> = strata_net::add_launched_workers(
        &mut top,
        RemoteSpec::launched().chips(CHIPS).sub_workers(1),
    )
    .map_err(|e| e.to_string())?
    .iter()
    .map(|w| w.id())
    .collect();
    let add = top
        .register_kernel("vadd", |ctx| {
            let a = ctx.input::<f32>(0)?.to_vec();
            let b = ctx.input::<f32>(1)?.to_vec();
            let mut o = ctx.output::<f32>(2)?;
            let out = o
                .as_mut_slice()
                .ok_or_else(|| strata_chip::KernelError::new("vadd needs a contiguous output"))?;
            for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(&b)) {
                *o = x + y;
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let vadd = top
        .register_chip_orchestration("vadd", move |o, a| {
            let mut core = strata_chip::CoreArgs::new();
            core.input(&a.tensor(0)?)
                .input(&a.tensor(1)?)
                .output(&a.tensor(2)?);
            o.submit_aiv(add, &core)?;
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let sum = top.register_sub("sum", |call| {
        let n = call.num_tensors();
        let mut total = call.tensor::<f32>(0)?.to_vec();
        for i in 1..n - 1 {
            for (t, x) in total.iter_mut().zip(call.tensor::<f32>(i)?.to_vec()) {
                *t += x;
            }
        }
        call.tensor_mut::<f32>(n - 1)?.copy_from_slice(&total)?;
        Ok(())
    });
    let level3 = top.register_orchestration("l3_vector_sum", move |o, args| {
        let [a, b, partial] = args.tensors() else {
            return Err("l3_vector_sum takes 3 tensors".into());
        };
        let mut results = TaskArgs::new();
        for r in 0..o.world_size() {
            let result = o.alloc(&[1, N], DataType::F32)?;
            let args = TaskArgs::new()
                .input(a.slice(1, r as u64, r as u64 + 1)?)
                .input(b.slice(1, r as u64, r as u64 + 1)?)
                .output(&result);
            o.submit_next_level(vadd, &args, r)?;
            results = results.input(&result);
        }
        o.submit_sub(&sum, &results.output_existing(*partial))?;
        Ok(())
    });
    let nw = workers.len();
    let n = N as usize;
    let row = |k: usize| (0..N).map(move |i| (i % 512) as f32 * 0.25 + k as f32);
    let a: Vec<f32> = (0..nw * CHIPS).flat_map(|r| row(2 * r)).collect();
    let b: Vec<f32> = (0..nw * CHIPS).flat_map(|r| row(2 * r + 1)).collect();
    let shape = [nw as u64, CHIPS as u64, N];
    let at = top
        .shared_tensor_from(&shape, &a)
        .map_err(|e| e.to_string())?;
    let bt = top
        .shared_tensor_from(&shape, &b)
        .map_err(|e| e.to_string())?;
    let pt = top
        .shared_tensor_from(&[nw as u64, N], &vec![0f32; nw * n])
        .map_err(|e| e.to_string())?;
    let (aa, ba, pa, ws) = (at.clone(), bt.clone(), pt.clone(), workers.clone());
    let outer = top.register_orchestration("l4_vector_sum", move |o, _| {
        for (i, &w) in ws.iter().enumerate() {
            let args = TaskArgs::new()
                .input(aa.arg(ArgTag::Input).row(i)?)
                .input(ba.arg(ArgTag::Input).row(i)?)
                .output_existing(pa.arg(ArgTag::OutputExisting).row(i)?);
            o.submit_next_level(level3, &args, w)?;
        }
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    check(nw == 2, format!("{nw} remote workers, 2 expected"))?;
    for _ in 0..3 {
        top.run(&outer, &TaskArgs::new())
            .map_err(|e| format!("run: {e}"))?;
    }
    let got = pt.to_vec::<f32>().map_err(|e| e.to_string())?;
    for w in 0..nw {
        for i in 0..n {
            let want = (0..CHIPS).fold(0.0f32, |s, c| {
                let r = w * CHIPS + c;
                s + (a[r * n + i] + b[r * n + i])
            });
            check(
                got[w * n + i] == want,
                format!("partial[{w}][{i}] = {}, want {want}", got[w * n + i]),
            )?;
        }
    }
    top.close().map_err(|e| format!("close: {e}"))
}

/// The distributed quickstart on every remote rank: each level-3 worker's two chips
/// allreduce their rows through a window buffer; the root checks every rank's result.
fn allreduce() -> Result<(), String> {
    use strata_comm::prelude::*;
    const N: u64 = 1024;
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let workers: Vec<usize> =
        strata_net::add_launched_workers(&mut top, RemoteSpec::launched().chips(2))
            .map_err(|e| e.to_string())?
            .iter()
            .map(|w| w.id())
            .collect();
    // Tensor 0: this chip's input row; 1: its output row; 2: its copy of the data window.
    let kernel = top
        .register_kernel("allreduce_user", |ctx| {
            let data = ctx.window(2)?;
            data.write(data.rank(), 0, &ctx.input::<f32>(0)?.to_vec())?;
            data.allreduce(ReduceOp::Sum, AllreduceAlgo::Auto)?;
            let mut out = ctx.output::<f32>(1)?;
            let out = out
                .as_mut_slice()
                .ok_or_else(|| strata_chip::KernelError::new("contiguous output"))?;
            data.read(data.rank(), 0, out)?;
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let chip_orch = top
        .register_chip_orchestration("allreduce_user", move |o, a| {
            let mut core = strata_chip::CoreArgs::new();
            core.input(&a.tensor(0)?)
                .output(&a.tensor(1)?)
                .inout(&a.tensor(2)?);
            o.submit_aiv(kernel, &core)?;
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    // What each remote level-3 worker runs: its [1, 2, N] input and output rows.
    let quickstart = top.register_orchestration("quickstart", move |o, args| {
        let [x, y] = args.tensors() else {
            return Err("quickstart takes 2 tensors".into());
        };
        let buf = o.alloc_window_buffer(4 * N)?;
        let data = o.window(&buf, 0, &[1, N], DataType::F32)?;
        for r in 0..o.world_size() as u64 {
            let a = TaskArgs::new()
                .input(x.slice(1, r, r + 1)?)
                .output_existing(y.slice(1, r, r + 1)?)
                .inout(&data);
            o.submit_next_level(chip_orch, &a, r as usize)?;
        }
        Ok(())
    });
    let nw = workers.len() as u64;
    // Worker w's chip r holds (r * 9 + 1 + w) * i.
    let xs: Vec<f32> = (0..nw)
        .flat_map(|w| {
            (0..2u64).flat_map(move |r| (1..=N).map(move |i| ((r * 9 + 1 + w) * i) as f32))
        })
        .collect();
    let x = top
        .shared_tensor_from(&[nw, 2, N], &xs)
        .map_err(|e| e.to_string())?;
    let y = top
        .shared_tensor_from(&[nw, 2, N], &vec![0f32; xs.len()])
        .map_err(|e| e.to_string())?;
    let (xa, ya, ws) = (x.clone(), y.clone(), workers.clone());
    let outer = top.register_orchestration("outer", move |o, _| {
        for (i, &w) in ws.iter().enumerate() {
            let args = TaskArgs::new()
                .input(xa.arg(ArgTag::Input).slice(0, i as u64, i as u64 + 1)?)
                .output_existing(ya.arg(ArgTag::OutputExisting).slice(
                    0,
                    i as u64,
                    i as u64 + 1,
                )?);
            o.submit_next_level(quickstart, &args, w)?;
        }
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    check(nw == 2, format!("{nw} remote workers, 2 expected"))?;
    top.run(&outer, &TaskArgs::new())
        .map_err(|e| format!("run: {e}"))?;
    let got = y.to_vec::<f32>().map_err(|e| e.to_string())?;
    for w in 0..nw {
        for r in 0..2u64 {
            for i in 1..=N {
                let want = ((1 + w) + (10 + w)) as f32 * i as f32;
                let at = ((w * 2 + r) * N + i - 1) as usize;
                check(
                    got[at] == want,
                    format!("worker {w} chip {r} element {i}: {}, want {want}", got[at]),
                )?;
            }
        }
    }
    top.close().map_err(|e| format!("close: {e}"))
}

/// Registers a chip kernel `y = x + k` (tensor 0 in, tensor 1 out, scalar 0 = k as f32
/// bits) and a host orchestration submitting it to the chip named by scalar 1.
fn register_add_on_chip(top: &mut DistWorker) -> Result<strata_dist::HostOrchHandle, String> {
    let k = top
        .register_kernel("add_k", |ctx| {
            let x = ctx.input::<f32>(0)?.to_vec();
            let add = f32::from_bits(ctx.scalars()[0] as u32);
            let mut y = ctx.output::<f32>(1)?;
            let y = y
                .as_mut_slice()
                .ok_or_else(|| strata_chip::KernelError::new("add_k needs a contiguous output"))?;
            for (o, v) in y.iter_mut().zip(x) {
                *o = v + add;
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let chip_orch = top
        .register_chip_orchestration("add_k_chip", move |o, a| {
            let mut core = strata_chip::CoreArgs::new();
            core.input(&a.tensor(0)?)
                .output(&a.tensor(1)?)
                .scalar_bits(a.scalar::<u64>(0)?);
            o.submit_aiv(k, &core)?;
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    Ok(top.register_orchestration("add_on_chip", move |o, a| {
        let chip = a.scalar_at::<u64>(1).ok_or("no chip scalar")? as usize;
        let mut t = TaskArgs::new();
        t.push_tensor(a.tensors()[0])?.push_tensor(a.tensors()[1])?;
        t.push_scalar(a.scalar_at::<u64>(0).ok_or("no k scalar")?)?;
        o.submit_next_level(chip_orch, &t, chip)?;
        Ok(())
    }))
}

/// Device memory of rank 1's chips over MPI: offset writes and reads checked byte for
/// byte against a host model, a 3 MiB copy in several pieces each way, and remote
/// tensors as arguments of a kernel (`y = x + 5`).
fn device_memory() -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let add = register_add_on_chip(&mut top)?;
    let ws = strata_net::add_launched_workers(
        &mut top,
        RemoteSpec::launched().chips(2).staging_bytes(4 << 20),
    )
    .map_err(|e| e.to_string())?;
    let w = ws.first().ok_or("no remote worker")?.clone();
    let wid = w.id();
    let cell: std::sync::Arc<std::sync::Mutex<Vec<strata_net::RemoteTensor>>> = Default::default();
    let c2 = cell.clone();
    let run = top.register_orchestration("run", move |o, a| {
        let k = a.scalar_at::<u64>(0).ok_or("no k")?;
        let ts = c2.lock().map_err(|_| "poisoned")?.clone();
        for (chip, pair) in ts.chunks(2).enumerate() {
            let mut t = TaskArgs::new();
            t.push_tensor(pair[0].arg(ArgTag::Input))?
                .push_tensor(pair[1].arg(ArgTag::OutputExisting))?;
            t.push_scalar(k)?.push_scalar(chip as u64)?;
            o.submit_next_level(add, &t, wid)?;
        }
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    let err = |e: strata_net::NetError| e.to_string();
    let n = 4096usize;
    let mut model: Vec<Vec<u8>> = Vec::new();
    let mut tensors = Vec::new();
    for chip in 0..2 {
        let x = w
            .alloc(&mut top, chip, &[n as u64], DataType::F32)
            .map_err(err)?;
        let y = w
            .alloc(&mut top, chip, &[n as u64], DataType::F32)
            .map_err(err)?;
        let vals: Vec<f32> = (0..n).map(|i| (i + 1000 * chip) as f32).collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.copy_to(&mut top, &x, 0, &bytes).map_err(err)?;
        model.push(bytes);
        tensors.push(x);
        tensors.push(y);
    }
    let patch: Vec<u8> = (0..333u32).map(|i| (i * 7 % 251) as u8).collect();
    w.copy_to(&mut top, &tensors[0], 403, &patch).map_err(err)?;
    model[0][403..403 + 333].copy_from_slice(&patch);
    let mut back = vec![0u8; 1000];
    w.copy_from(&mut top, &tensors[0], 397, &mut back)
        .map_err(err)?;
    check(back == model[0][397..1397], "offset read-back differs")?;
    *cell.lock().map_err(|_| "poisoned")? = tensors.clone();
    let mut args = TaskArgs::new();
    args.push_scalar(5.0f32.to_bits() as u64)
        .map_err(|e| e.to_string())?;
    top.run(&run, &args).map_err(|e| format!("run: {e}"))?;
    for chip in 0..2 {
        let mut y = vec![0u8; 4 * n];
        w.copy_from(&mut top, &tensors[2 * chip + 1], 0, &mut y)
            .map_err(err)?;
        let want: Vec<u8> = model[chip]
            .chunks_exact(4)
            .flat_map(|c| (f32::from_le_bytes([c[0], c[1], c[2], c[3]]) + 5.0).to_le_bytes())
            .collect();
        check(y == want, format!("chip {chip}: y != x + 5"))?;
    }
    let big_n = (3 << 20) / 4 + 17;
    let big = w
        .alloc(&mut top, 1, &[big_n as u64], DataType::F32)
        .map_err(err)?;
    let data: Vec<u8> = (0..big_n * 4 - 5)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect();
    w.copy_to(&mut top, &big, 5, &data).map_err(err)?;
    let mut got = vec![0u8; data.len()];
    w.copy_from(&mut top, &big, 5, &mut got).map_err(err)?;
    check(got == data, "the multi-piece copy differs")?;
    w.free(&mut top, big).map_err(err)?;
    for t in tensors {
        w.free(&mut top, t).map_err(err)?;
    }
    top.close().map_err(|e| format!("close: {e}"))
}

/// Rank 1 dies (SIGKILL) while it runs a task: the run fails with the endpoint's typed
/// error naming worker and rank within the heartbeat bound, the task reading its output
/// never runs, rank 2's independent task ran, later submits are refused, close returns.
fn rank_killed() -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(1)).map_err(|e| e.to_string())?;
    let ws: Vec<usize> = strata_net::add_launched_workers(
        &mut top,
        RemoteSpec::launched()
            .sub_workers(1)
            .heartbeat_timeout(Duration::from_secs(1)),
    )
    .map_err(|e| e.to_string())?
    .iter()
    .map(|w| w.id())
    .collect();
    let die = top.register_orchestration("die", |_, _| {
        // The node runs orchestrations on its main thread: it dies mid-task.
        // SAFETY: killing this process on purpose.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        Ok(())
    });
    let bump = top.register_sub("bump", |c| {
        c.tensor_mut::<u64>(0)?.update(|v| v + 1);
        Ok(())
    });
    let bump_remote = top.register_orchestration("bump_remote", move |o, a| {
        o.submit_sub(&bump, a)?;
        Ok(())
    });
    let x = top
        .shared_tensor_from(&[2], &[0u64, 0])
        .map_err(|e| e.to_string())?;
    let (xa, ws2) = (x.clone(), ws.clone());
    let run = top.register_orchestration("run", move |o, _| {
        let mut a = TaskArgs::new();
        a.push_tensor(xa.arg_view(xa.view().slice(0, 0, 1)?, ArgTag::InOut)?)?;
        o.submit_next_level(die, &a, ws2[0])?;
        o.submit_sub(&bump, &a)?;
        let mut b = TaskArgs::new();
        b.push_tensor(xa.arg_view(xa.view().slice(0, 1, 2)?, ArgTag::InOut)?)?;
        o.submit_next_level(bump_remote, &b, ws2[1])?;
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    check(
        ws.len() == 2,
        format!("{} remote workers, 2 expected", ws.len()),
    )?;
    let t = Instant::now();
    let mut h = top
        .submit(&run, &TaskArgs::new())
        .map_err(|e| e.to_string())?;
    let e = h
        .wait(Some(Duration::from_secs(60)))
        .err()
        .ok_or("the run should fail")?;
    let msg = e.to_string();
    println!("  failed in {:.2?}: {msg}", t.elapsed());
    check(
        matches!(
            e,
            strata_dist::DistError::TaskFailed(ref f) if f.kind() == strata_graph::FailureKind::Endpoint
        ),
        format!("not an endpoint failure: {e:?}"),
    )?;
    check(
        msg.contains(&format!("worker {}", ws[0])) && msg.contains("rank=1"),
        msg.clone(),
    )?;
    check(
        x.to_vec::<u64>().map_err(|e| e.to_string())? == vec![0, 1],
        format!(
            "x = {:?}: the downstream task ran or rank 2's did not",
            x.to_vec::<u64>()
        ),
    )?;
    let later = top
        .submit(&run, &TaskArgs::new())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    check(
        later.contains("unusable") || later.contains("close"),
        format!("later submit: {later:?}"),
    )?;
    let _ = top.close();
    Ok(())
}

/// Rank 1 registers one callable more than the others (as a program started with other
/// arguments would): the root's `init` refuses it after its NODE_HELLO with the same
/// typed error as over TCP, naming the registry digests.
fn registry_mismatch() -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    strata_net::add_launched_workers(&mut top, RemoteSpec::launched())
        .map_err(|e| e.to_string())?;
    top.register_orchestration("common", |_, _| Ok(()));
    if strata_net::launch_rank().map_err(|e| e.to_string())? == Some(1) {
        top.register_orchestration("only_on_rank_1", |_, _| Ok(()));
    }
    let e = top.init().err().ok_or("init should fail")?;
    let msg = e.to_string();
    println!("  refused: {msg}");
    check(
        msg.contains("rank=1") && msg.contains("registered different callables"),
        msg,
    )
}

/// The root runs a task on each rank, then the process exits without closing its
/// level-4 worker: at exit the MPI progress thread tells both ranks, which end their
/// sessions (their stderr says so, checked by the driver) instead of waiting out the
/// heartbeat timeout, and the job ends within its bound.
fn root_left() -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let ws: Vec<usize> = strata_net::add_launched_workers(&mut top, RemoteSpec::launched())
        .map_err(|e| e.to_string())?
        .iter()
        .map(|w| w.id())
        .collect();
    let noop = top.register_orchestration("noop", |_, _| Ok(()));
    let run = top.register_orchestration("run", move |o, _| {
        for &w in &ws {
            o.submit_next_level(noop, &TaskArgs::new(), w)?;
        }
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    top.run(&run, &TaskArgs::new())
        .map_err(|e| format!("run: {e}"))?;
    println!("ok: a_root_that_exits_without_close_ends_its_ranks");
    // No close, no destructors: what the exit handler finds.
    std::process::exit(0)
}
