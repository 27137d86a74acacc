//! `cargo xtask bench net` (its MPI part; feature `mpi`): strata-net's MPI transport next
//! to its TCP transport and next to raw MPI between the same two processes, in one run.
//!
//! The bench starts itself as `mpirun -n 2 strata-node launch --transport mpi -- <bench>`:
//! rank 0 is the level-4 root, rank 1 a remote level-3 worker (one chip) reached over MPI.
//! Rank 0 also starts a `strata-node serve` daemon on loopback and adds a second remote
//! worker (one chip) through it, over TCP. Then, in `ROUNDS` interleaved rounds:
//!
//! 1. **Round trip**: a run with one no-op remote task (→ an empty chip orchestration on
//!    the node's chip, and with an empty host orchestration only) over MPI and over TCP,
//!    next to a raw ping-pong (`MPI_Send` 64 B / `MPI_Recv` 32 B, blocking on both sides)
//!    between the same two processes' MPI progress threads.
//! 2. **Bulk**: `RemoteWorker::copy_to` / `copy_from` of `BULK` bytes over MPI and over
//!    TCP, next to one raw `MPI_Send` / `MPI_Recv` of the same bytes.
//!
//! A figure is the median over the rounds, a ratio the median of the per-round ratios.
//! Last line: one JSON object (`mpi_rtt_us`, `mpi_host_rtt_us`, `tcp_rtt_us`,
//! `tcp_host_rtt_us`, `raw_mpi_rtt_us`, `rtt_ratio` = MPI task / raw MPI (goal ≤ 1.3),
//! `host_rtt_ratio`, `tcp_vs_mpi_rtt`, `mpi_copy_to_gbps`, `mpi_copy_from_gbps`,
//! `tcp_copy_to_gbps`, `tcp_copy_from_gbps`, `raw_mpi_send_gbps`, `raw_mpi_recv_gbps`,
//! `copy_to_ratio`, `copy_from_ratio` (vs raw MPI, goal ≥ 0.8), `rounds`, `machine_`…).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use strata_dist::{DistConfig, DistWorker, HostOrchHandle};
use strata_net::mpi_link::{raw, RawOp};
use strata_net::{add_launched_workers, add_remote_worker, RemoteSpec, RemoteWorker};
use strata_testkit::bench::{median, Json, Machine, Rounds};
use strata_types::{DataType, TaskArgs};

const ROUNDS: usize = 5;
const RTT_RUNS: usize = 1_000;
const RTT_WARMUP: usize = 300;
const BULK: usize = 64 << 20;
const ENV_DAEMON: &str = "STRATA_BENCH_NET_DAEMON";
/// The whole job is killed past this (never a hang).
const JOB_TIMEOUT: Duration = Duration::from_secs(900);

struct Top {
    top: DistWorker,
    mpi: RemoteWorker,
    tcp: RemoteWorker,
    mpi_chip: HostOrchHandle,
    mpi_host: HostOrchHandle,
    tcp_chip: HostOrchHandle,
    tcp_host: HostOrchHandle,
}

/// Built identically by the root, the MPI rank and the daemon's node (the nodes serve
/// from `init` and never return).
fn build(daemon: &str) -> Top {
    let mut top = DistWorker::new(DistConfig::l4(0)).expect("level-4 worker");
    let empty_chip = top
        .register_chip_orchestration("bench.empty_chip", |_, _| Ok(()))
        .expect("chip orchestration");
    let noop = top.register_orchestration("bench.noop", |_, _| Ok(()));
    let on_chip = top.register_orchestration("bench.on_chip", move |o, _| {
        o.submit_next_level(empty_chip, &TaskArgs::new(), 0)?;
        Ok(())
    });
    let mpi = add_launched_workers(&mut top, RemoteSpec::launched().chips(1))
        .expect("the MPI rank")
        .into_iter()
        .next()
        .expect("one launched rank");
    let tcp = add_remote_worker(&mut top, RemoteSpec::new(daemon).chips(1)).expect("TCP node");
    let one = |top: &mut DistWorker, name: &str, orch, w: usize| {
        top.register_orchestration(name, move |o, _| {
            o.submit_next_level(orch, &TaskArgs::new(), w)?;
            Ok(())
        })
    };
    let (m, t) = (mpi.id(), tcp.id());
    let mpi_chip = one(&mut top, "bench.mpi_chip", on_chip, m);
    let mpi_host = one(&mut top, "bench.mpi_host", noop, m);
    let tcp_chip = one(&mut top, "bench.tcp_chip", on_chip, t);
    let tcp_host = one(&mut top, "bench.tcp_host", noop, t);
    Top {
        top,
        mpi,
        tcp,
        mpi_chip,
        mpi_host,
        tcp_chip,
        tcp_host,
    }
}

fn runs(top: &mut DistWorker, orch: &HostOrchHandle, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            top.run(orch, &TaskArgs::new()).expect("run");
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

/// The daemon, stopped (SIGTERM, reaped) when dropped — also when the bench panics, so a
/// failed run leaves no daemon behind.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: signalling a child this bench started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn start_daemon(dir: &std::path::Path) -> (Child, String) {
    let secret = dir.join("secret");
    std::fs::write(&secret, "bench-net-mpi-secret-0123456789abcdef\n").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::env::set_var(strata_net::ENV_SECRET_FILE, &secret);
    let exe = std::env::current_exe().expect("exe");
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata-node"))
        .args(["serve", "--listen", "127.0.0.1:0", "--secret-file"])
        .arg(&secret)
        .arg("--program")
        .arg(exe)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("strata-node serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("daemon address");
    let addr = line
        .trim()
        .strip_prefix("listening ")
        .expect("listening ADDR")
        .to_owned();
    (child, addr)
}

/// The driver (what `cargo bench` runs): the job under mpirun, bounded.
fn driver() -> i32 {
    let exe = std::env::current_exe().expect("exe");
    let mut child = match Command::new("mpirun")
        .args(["--oversubscribe", "--bind-to", "none", "-n", "2"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .arg(env!("CARGO_BIN_EXE_strata-node"))
        .args(["launch", "--transport", "mpi", "--"])
        .arg(exe)
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "bench net (MPI): cannot start mpirun ({e}); `cargo xtask ci` installs openmpi-bin"
            );
            return 1;
        }
    };
    let t = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return st.code().unwrap_or(1),
            Ok(None) if t.elapsed() > JOB_TIMEOUT => {
                // SAFETY: killing the process group this driver started.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.wait();
                eprintln!("bench net (MPI): the job did not end within {JOB_TIMEOUT:?}");
                return 1;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => {
                eprintln!("bench net (MPI): {e}");
                return 1;
            }
        }
    }
}

fn main() {
    let node = std::env::var_os(strata_net::ENV_NODE_WORKER).is_some();
    let rank = strata_net::launch_rank().ok().flatten();
    if !node && rank.is_none() {
        std::process::exit(driver());
    }
    if node || rank != Some(0) {
        // A node: the same registrations, then `init` serves and exits.
        let mut t = build(&std::env::var(ENV_DAEMON).unwrap_or_default());
        let _ = t.top.init();
        std::process::exit(1);
    }
    let machine = Machine::now();
    let dir = std::env::temp_dir().join(format!("strata-bench-net-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (daemon, addr) = start_daemon(&dir);
    let daemon = Daemon(daemon);
    std::env::set_var(ENV_DAEMON, &addr);
    let mut t = build(&addr);
    t.top.init().expect("init");
    let Top {
        top,
        mpi,
        tcp,
        mpi_chip,
        mpi_host,
        tcp_chip,
        tcp_host,
    } = &mut t;
    let top = std::cell::RefCell::new(top);
    let peer = 1u32;
    let raw_rtt = |n: usize| raw(RawOp::PingPong { peer, n: n as u32 }).expect("raw MPI ping-pong");

    raw_rtt(RTT_WARMUP);
    for orch in [&*mpi_chip, &*mpi_host, &*tcp_chip, &*tcp_host] {
        runs(&mut top.borrow_mut(), orch, RTT_WARMUP);
    }
    let rtt = Rounds::new(ROUNDS)
        .variant("raw MPI ping-pong", || median(&raw_rtt(RTT_RUNS)))
        .variant("MPI remote task -> chip", || {
            median(&runs(&mut top.borrow_mut(), mpi_chip, RTT_RUNS))
        })
        .variant("MPI remote task (host orch)", || {
            median(&runs(&mut top.borrow_mut(), mpi_host, RTT_RUNS))
        })
        .variant("TCP remote task -> chip", || {
            median(&runs(&mut top.borrow_mut(), tcp_chip, RTT_RUNS))
        })
        .variant("TCP remote task (host orch)", || {
            median(&runs(&mut top.borrow_mut(), tcp_host, RTT_RUNS))
        })
        .baseline("raw MPI ping-pong")
        .run();

    let alloc = |w: &RemoteWorker| {
        w.alloc(&mut top.borrow_mut(), 0, &[BULK as u64], DataType::U8)
            .expect("remote tensor")
    };
    let (dm, dt) = (alloc(mpi), alloc(tcp));
    let src: Vec<u8> = (0..BULK).map(|i| (i % 251) as u8).collect();
    let back = std::cell::RefCell::new(vec![0u8; BULK]);
    let gbps = |t: Instant| BULK as f64 / t.elapsed().as_secs_f64() / 1e9;
    let bulk = Rounds::new(ROUNDS)
        .warmup(1)
        .variant("raw MPI send", || {
            raw(RawOp::Send {
                peer,
                bytes: BULK as u64,
            })
            .expect("raw MPI send")[0]
        })
        .variant("MPI copy_to", || {
            let t0 = Instant::now();
            mpi.copy_to(&mut top.borrow_mut(), &dm, 0, &src)
                .expect("copy_to");
            gbps(t0)
        })
        .variant("TCP copy_to", || {
            let t0 = Instant::now();
            tcp.copy_to(&mut top.borrow_mut(), &dt, 0, &src)
                .expect("copy_to");
            gbps(t0)
        })
        .variant("raw MPI receive", || {
            raw(RawOp::Receive {
                peer,
                bytes: BULK as u64,
            })
            .expect("raw MPI receive")[0]
        })
        .variant("MPI copy_from", || {
            let t0 = Instant::now();
            mpi.copy_from(&mut top.borrow_mut(), &dm, 0, &mut back.borrow_mut())
                .expect("copy_from");
            gbps(t0)
        })
        .variant("TCP copy_from", || {
            let t0 = Instant::now();
            tcp.copy_from(&mut top.borrow_mut(), &dt, 0, &mut back.borrow_mut())
                .expect("copy_from");
            gbps(t0)
        })
        .baseline("raw MPI send")
        .run();
    {
        let mut b = back.into_inner();
        mpi.copy_from(&mut top.borrow_mut(), &dm, 0, &mut b)
            .expect("copy_from");
        assert!(b == src, "the MPI bulk copy's bytes differ");
    }
    mpi.free(&mut top.borrow_mut(), dm).expect("free");
    tcp.free(&mut top.borrow_mut(), dt).expect("free");
    let top = top.into_inner();
    top.close().expect("close");
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);

    println!("{}", machine.line());
    println!("\n1. round trip (µs), vs a raw MPI ping-pong between the same processes");
    print!("{}", rtt.table("µs", 1));
    println!(
        "\n2. bulk {} MiB (GB/s), vs one raw MPI_Send / MPI_Recv",
        BULK >> 20
    );
    print!("{}", bulk.table("GB/s", 3));
    let mut j = Json::new();
    j.num("mpi_rtt_us", rtt.median("MPI remote task -> chip"), 2)
        .num(
            "mpi_host_rtt_us",
            rtt.median("MPI remote task (host orch)"),
            2,
        )
        .num("tcp_rtt_us", rtt.median("TCP remote task -> chip"), 2)
        .num(
            "tcp_host_rtt_us",
            rtt.median("TCP remote task (host orch)"),
            2,
        )
        .num("raw_mpi_rtt_us", rtt.median("raw MPI ping-pong"), 2)
        .num("rtt_ratio", rtt.ratio_median("MPI remote task -> chip"), 3)
        .num(
            "host_rtt_ratio",
            rtt.ratio_median("MPI remote task (host orch)"),
            3,
        )
        .num(
            "tcp_vs_mpi_rtt",
            rtt.ratio_median_vs("TCP remote task -> chip", "MPI remote task -> chip"),
            3,
        )
        .num("mpi_copy_to_gbps", bulk.median("MPI copy_to"), 3)
        .num("mpi_copy_from_gbps", bulk.median("MPI copy_from"), 3)
        .num("tcp_copy_to_gbps", bulk.median("TCP copy_to"), 3)
        .num("tcp_copy_from_gbps", bulk.median("TCP copy_from"), 3)
        .num("raw_mpi_send_gbps", bulk.median("raw MPI send"), 3)
        .num("raw_mpi_recv_gbps", bulk.median("raw MPI receive"), 3)
        .num(
            "copy_to_ratio",
            bulk.ratio_median_vs("MPI copy_to", "raw MPI send"),
            3,
        )
        .num(
            "copy_from_ratio",
            bulk.ratio_median_vs("MPI copy_from", "raw MPI receive"),
            3,
        )
        .int("rounds", ROUNDS as u64)
        .machine(&machine);
    println!("{}", j.line());
}
