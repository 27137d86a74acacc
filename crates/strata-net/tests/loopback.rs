//! Remote level-3 workers over loopback, end to end (`harness = false`: the binary is
//! both the test driver and the program the node daemon starts).
//!
//! The driver starts `strata-node serve` (port 0, a 0600 secret file, this binary as its
//! one `--program`) and runs each case as a child process of this binary
//! (`--case NAME`). A case builds a level-4 worker with remote children and runs it; the
//! daemon starts this same binary with the same arguments for each remote child, which
//! reaches the same `init` and serves instead of returning. Every case checks behaviour
//! against what it set up (values computed here, error text naming the worker), then
//! that nothing is left: no child process of the case, and, at the end, no process of
//! this binary but the driver and no daemon.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use strata_dist::{DistConfig, DistError, DistWorker};
use strata_net::{add_remote_worker, RemoteSpec, Secret};
use strata_types::{ArgTag, TaskArgs};

const DAEMON: &str = "STRATA_TEST_DAEMON";
const OTHER_DAEMON: &str = "STRATA_TEST_OTHER_DAEMON";
const V6_DAEMON: &str = "STRATA_TEST_V6_DAEMON";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--case") {
        let name = args.get(i + 1).cloned().unwrap_or_default();
        match run_case(&name) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("case {name}: {e}");
                std::process::exit(1)
            }
        }
    }
    // libtest-style filtering and the --list cargo may pass.
    if args.iter().any(|a| a == "--list") {
        for c in CASES {
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

const CASES: &[&str] = &[
    "two_remote_workers_run_tasks_on_shared_tensors",
    "a_remote_task_failure_poisons_downstream_and_the_worker_stays_usable",
    "a_wrong_secret_is_refused",
    "an_unknown_build_id_is_refused_with_the_fix",
    "a_registry_mismatch_is_refused",
    "a_remote_node_killed_mid_task_fails_its_task_naming_the_worker",
    "a_silent_client_does_not_block_other_sessions",
    "corrupted_and_oversized_frames_are_refused",
    "remote_device_memory_round_trips_at_offsets_and_feeds_tasks",
    "remote_device_memory_misuse_is_a_typed_error_naming_the_worker",
    "tasks_longer_than_the_heartbeat_timeout_complete_two_in_flight",
    "large_copies_in_many_pieces_round_trip_both_ways",
    "a_node_stopped_mid_copy_fails_the_copy_within_the_heartbeat_bound",
    "a_node_on_ipv6_loopback_serves",
    "a_node_named_by_host_name_is_resolved_within_the_bound",
    "closed_sessions_leave_no_descriptor_behind_in_the_root",
    "a_stalled_remote_task_says_what_it_waited_for",
];

struct Daemon {
    child: Child,
    addr: String,
}

fn start_daemon(secret: &Path, program: &Path) -> Daemon {
    start_daemon_on("127.0.0.1:0", secret, program).expect("start strata-node serve")
}

/// A daemon listening on `listen`; `None` if it did not start (printed).
fn start_daemon_on(listen: &str, secret: &Path, program: &Path) -> Option<Daemon> {
    let node = PathBuf::from(env!("CARGO_BIN_EXE_strata-node"));
    let mut child = Command::new(node)
        .args(["serve", "--listen", listen, "--secret-file"])
        .arg(secret)
        .arg("--program")
        .arg(program)
        .args(["--handshake-timeout", "5", "--drain-timeout", "5"])
        .stdout(Stdio::piped())
        .spawn()
        .ok()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take()?)
        .read_line(&mut line)
        .ok()?;
    let Some(addr) = line.trim().strip_prefix("listening ") else {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    };
    let addr = addr.to_owned();
    Some(Daemon { child, addr })
}

fn stop_daemon(mut d: Daemon) -> Result<Duration, String> {
    // SAFETY: signalling a child this driver started.
    unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        if let Ok(Some(st)) = d.child.try_wait() {
            return if st.success() {
                Ok(t.elapsed())
            } else {
                Err(format!("daemon exited {st}"))
            };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = d.child.kill();
    Err("the daemon did not drain within 30 s".into())
}

fn processes_of(exe: &Path) -> Vec<i32> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if std::fs::read_link(e.path().join("exe")).is_ok_and(|p| p == exe) {
                v.push(pid);
            }
        }
    }
    v
}

fn driver(filter: &[&String]) -> i32 {
    let exe = std::env::current_exe().expect("current exe");
    let dir = std::env::temp_dir().join(format!("strata-net-loopback-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let secret = dir.join("secret");
    std::fs::write(&secret, "loopback-test-secret-0123456789abcdef\n").expect("write secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let daemon = start_daemon(&secret, &exe);
    // A daemon that knows another program only (for the build-id case).
    let other = start_daemon(&secret, Path::new(env!("CARGO_BIN_EXE_strata-node")));
    // One on IPv6 loopback: where the kernel has no IPv6, its case skips (printed).
    let v6 = start_daemon_on("[::1]:0", &secret, &exe);
    let (mut passed, mut failed) = (0, 0);
    for case in CASES {
        if !filter.is_empty() && !filter.iter().any(|f| case.contains(f.as_str())) {
            continue;
        }
        if case.contains("ipv6") && v6.is_none() {
            println!(
                "test {case} ... skipped: no daemon could listen on [::1] (no IPv6 on this kernel)"
            );
            continue;
        }
        let t = Instant::now();
        let status = Command::new(&exe)
            .args(["--case", case])
            .env(DAEMON, &daemon.addr)
            .env(OTHER_DAEMON, &other.addr)
            .env(V6_DAEMON, v6.as_ref().map_or("", |d| d.addr.as_str()))
            .env(strata_net::ENV_SECRET_FILE, &secret)
            .status();
        let ok = matches!(status, Ok(s) if s.success());
        println!(
            "test {case} ... {} ({:.2?})",
            if ok { "ok" } else { "FAILED" },
            t.elapsed()
        );
        if ok {
            passed += 1
        } else {
            failed += 1
        }
    }
    match stop_daemon(daemon) {
        Ok(t) => println!("daemon drained in {t:.2?}"),
        Err(e) => {
            println!("daemon: {e}");
            failed += 1;
        }
    }
    let _ = stop_daemon(other);
    if let Some(d) = v6 {
        if let Err(e) = stop_daemon(d) {
            println!("IPv6 daemon: {e}");
            failed += 1;
        }
    }
    if filter.is_empty() || filter.iter().any(|f| "mpirun_launch".contains(f.as_str())) {
        match mpirun_launch(&exe) {
            Ok(true) => passed += 1,
            Ok(false) => {}
            Err(e) => {
                println!("test mpirun_launch ... FAILED: {e}");
                failed += 1;
            }
        }
    }
    // Nothing of this binary is left but the driver (nodes reaped by the daemon).
    let left: Vec<i32> = processes_of(&exe)
        .into_iter()
        .filter(|&p| p != std::process::id() as i32)
        .collect();
    if !left.is_empty() {
        println!("leak: processes of this binary still running: {left:?}");
        failed += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    i32::from(failed > 0)
}

// ----- the cases (each runs as its own process: the root, and, started by the daemon,
// its remote nodes) -------------------------------------------------------------------

fn daemon_addr(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| "127.0.0.1:1".into())
}

fn spec() -> RemoteSpec {
    RemoteSpec::new(daemon_addr(DAEMON)).sub_workers(1)
}

fn check(cond: bool, what: impl Into<String>) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what.into())
    }
}

/// The case's own children are all gone after close (nodes are the daemon's).
fn no_children() -> Result<(), String> {
    let me = std::process::id().to_string();
    let kids =
        std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")).unwrap_or_default();
    check(
        kids.trim().is_empty(),
        format!("children left after close: {kids}"),
    )
}

fn run_case(name: &str) -> Result<(), String> {
    match name {
        "two_remote_workers_run_tasks_on_shared_tensors" => two_workers(),
        "a_remote_task_failure_poisons_downstream_and_the_worker_stays_usable" => failure(),
        "a_wrong_secret_is_refused" => wrong_secret(),
        "an_unknown_build_id_is_refused_with_the_fix" => unknown_build(),
        "a_registry_mismatch_is_refused" => registry_mismatch(),
        "a_remote_node_killed_mid_task_fails_its_task_naming_the_worker" => node_killed(),
        "a_silent_client_does_not_block_other_sessions" => silent_client(),
        "corrupted_and_oversized_frames_are_refused" => bad_frames(),
        "remote_device_memory_round_trips_at_offsets_and_feeds_tasks" => device_memory(),
        "remote_device_memory_misuse_is_a_typed_error_naming_the_worker" => device_misuse(),
        "a_node_on_ipv6_loopback_serves" => ipv6(),
        "a_node_named_by_host_name_is_resolved_within_the_bound" => hostname(),
        "closed_sessions_leave_no_descriptor_behind_in_the_root" => no_fd_leak(),
        "a_stalled_remote_task_says_what_it_waited_for" => stalled(),
        "tasks_longer_than_the_heartbeat_timeout_complete_two_in_flight" => long_tasks(),
        "large_copies_in_many_pieces_round_trip_both_ways" => many_pieces(),
        "a_node_stopped_mid_copy_fails_the_copy_within_the_heartbeat_bound" => stopped_mid_copy(),
        "launched" => launched(),
        other => Err(format!("no case {other}")),
    }
}

/// Two remote level-3 workers each add their worker's value to their half of a shared
/// tensor through their own sub-worker; the root checks the sums.
fn two_workers() -> Result<(), String> {
    let n = 1000u64;
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let add = top.register_sub("add_scalar", |c| {
        let k = c.scalar::<u64>(0).ok_or("no scalar")?;
        c.tensor_mut::<u64>(0)?.update(|v| v + k);
        Ok(())
    });
    let inner = top.register_orchestration("inner", move |o, a| {
        o.submit_sub(&add, a)?;
        Ok(())
    });
    let w0 = add_remote_worker(&mut top, spec())
        .map_err(|e| e.to_string())?
        .id();
    let w1 = add_remote_worker(&mut top, spec())
        .map_err(|e| e.to_string())?
        .id();
    let x = top
        .shared_tensor_from(&[2 * n], &vec![1u64; 2 * n as usize])
        .map_err(|e| e.to_string())?;
    let xa = x.clone();
    let outer = top.register_orchestration("outer", move |o, _| {
        for (i, w) in [w0, w1].into_iter().enumerate() {
            let v = xa.view().slice(0, i as u64 * n, (i as u64 + 1) * n)?;
            let mut a = TaskArgs::new();
            a.push_tensor(xa.arg_view(v, ArgTag::InOut)?)?;
            a.push_scalar(10 * (i as u64 + 1))?;
            o.submit_next_level(inner, &a, w)?;
        }
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    for _ in 0..3 {
        top.run(&outer, &TaskArgs::new())
            .map_err(|e| format!("run: {e}"))?;
    }
    let got = x.to_vec::<u64>().map_err(|e| e.to_string())?;
    let want: Vec<u64> = (0..2 * n)
        .map(|i| if i < n { 1 + 30 } else { 1 + 60 })
        .collect();
    check(got == want, format!("sums differ: got {:?}…", &got[..4]))?;
    traced_remote_run(&mut top, &outer)?;
    top.close().map_err(|e| format!("close: {e}"))?;
    no_children()
}

/// A traced run over two remote nodes: each node's trace comes back with its DONE, on its
/// own track (its host's name) with the node's spans and its level-3 run, placed on the
/// root's clock by the task's round trip. Root and nodes share this host's clock here, so
/// the true offset is 0: the estimate must be within its own error bound of it, and the
/// node's run must sit inside the root's dispatch of it, give or take that bound.
fn traced_remote_run(
    top: &mut DistWorker,
    outer: &strata_dist::HostOrchHandle,
) -> Result<(), String> {
    let config = strata_types::CallConfig::default().with_trace(true);
    let mut h = top
        .submit_with(outer, &TaskArgs::new(), &config)
        .map_err(|e| e.to_string())?;
    h.wait(None).map_err(|e| format!("traced run: {e}"))?;
    let t = h.take_trace().ok_or("a traced run has a trace")?;
    check(t.notes.is_empty(), format!("notes: {:?}", t.notes))?;
    let names: Vec<(&str, &str)> = t
        .processes
        .iter()
        .map(|p| (p.name.as_str(), p.host.as_str()))
        .collect();
    let root = t
        .processes
        .iter()
        .find(|p| p.name == "host (level 4)" && p.host.is_empty())
        .ok_or(format!("no root track: {names:?}"))?;
    check(
        root.spans.iter().any(|s| s.name == "l4.run"),
        "the root's l4.run",
    )?;
    let nodes: Vec<_> = t
        .processes
        .iter()
        .filter(|p| !p.host.is_empty() && p.spans.iter().any(|s| s.name == "l3.run"))
        .collect();
    check(nodes.len() == 2, format!("two node tracks: {names:?}"))?;
    for node in nodes {
        let c = node.clock;
        println!(
            "{}: clock offset estimate {} ns, error bound {} ns",
            node.name, c.offset_ns, c.error_ns
        );
        check(
            c.error_ns < u64::MAX && c.offset_ns.unsigned_abs() <= c.error_ns,
            format!("{}: offset {c:?} (true offset 0 on one host)", node.name),
        )?;
        for n in ["node.task", "node.task.stage_in", "node.task.run", "l3.run"] {
            check(
                node.spans.iter().filter(|s| s.name == n).count() == 1,
                format!("{}: one {n}: {:?}", node.name, node.spans),
            )?;
        }
        // The root's view of the same worker: its dispatch span, on the root's track for
        // the lane (same name, this host).
        let seen = t
            .processes
            .iter()
            .find(|p| p.name == node.name && p.host.is_empty())
            .ok_or(format!("no root-side track for {}", node.name))?;
        let d = seen
            .spans
            .iter()
            .find(|s| s.name == "l4.run.dispatch")
            .ok_or("the root's dispatch span")?;
        let run = node.spans.iter().find(|s| s.name == "l3.run").unwrap();
        let (a, b) = (c.apply(run.ts), c.apply(run.end()));
        let e = c.error_ns;
        check(
            d.ts <= a.saturating_add(e) && b <= d.end().saturating_add(e),
            format!(
                "{}: the node's run [{a}, {b}] outside the root's dispatch {d:?} ± {e}",
                node.name
            ),
        )?;
        check(
            t.processes
                .iter()
                .any(|p| p.name == format!("{} / sub_worker 0", node.name)),
            format!("the node's sub-worker nested under it: {names:?}"),
        )?;
    }
    Ok(())
}

/// A remote orchestration fails: the run fails naming the remote worker, a task that
/// reads its output never runs, the other remote worker's independent task ran, and the
/// level-4 worker runs the next run.
fn failure() -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(1)).map_err(|e| e.to_string())?;
    let bump = top.register_sub("bump", |c| {
        c.tensor_mut::<u64>(0)?.update(|v| v + 1);
        Ok(())
    });
    let bad = top.register_orchestration("bad", |_, _| Err("deliberate remote failure".into()));
    let good = top.register_orchestration("good", move |o, a| {
        o.submit_sub(&bump, a)?;
        Ok(())
    });
    let w0 = add_remote_worker(&mut top, spec())
        .map_err(|e| e.to_string())?
        .id();
    let w1 = add_remote_worker(&mut top, spec())
        .map_err(|e| e.to_string())?
        .id();
    let x = top
        .shared_tensor_from(&[1], &[0u64])
        .map_err(|e| e.to_string())?;
    let y = top
        .shared_tensor_from(&[1], &[0u64])
        .map_err(|e| e.to_string())?;
    let (xa, ya) = (x.clone(), y.clone());
    let run = top.register_orchestration("run", move |o, _| {
        let mut a = TaskArgs::new();
        a.push_tensor(xa.arg(ArgTag::InOut))?;
        o.submit_next_level(bad, &a, w0)?;
        // Downstream of the failing task: must be poisoned.
        o.submit_sub(&bump, &a)?;
        let mut b = TaskArgs::new();
        b.push_tensor(ya.arg(ArgTag::InOut))?;
        o.submit_next_level(good, &b, w1)?;
        Ok(())
    });
    let yb = y.clone();
    let again = top.register_orchestration("again", move |o, _| {
        let mut b = TaskArgs::new();
        b.push_tensor(yb.arg(ArgTag::InOut))?;
        o.submit_next_level(good, &b, w0)?;
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    let e = top
        .run(&run, &TaskArgs::new())
        .err()
        .ok_or("the run should fail")?;
    let msg = e.to_string();
    check(
        matches!(e, DistError::TaskFailed(_)),
        format!("not TaskFailed: {msg}"),
    )?;
    check(
        msg.contains(&format!("worker {w0}"))
            && msg.contains("remote_worker")
            && msg.contains("deliberate remote failure"),
        format!("message: {msg}"),
    )?;
    check(
        x.to_vec::<u64>().map_err(|e| e.to_string())? == vec![0],
        "the downstream task ran",
    )?;
    check(
        y.to_vec::<u64>().map_err(|e| e.to_string())? == vec![1],
        "the independent task did not run",
    )?;
    // Usable afterwards: the next run works on both remote workers.
    top.run(&again, &TaskArgs::new())
        .map_err(|e| format!("next run: {e}"))?;
    check(
        y.to_vec::<u64>().map_err(|e| e.to_string())? == vec![2],
        "the next run did not run",
    )?;
    top.close().map_err(|e| format!("close: {e}"))?;
    no_children()
}

/// Two tasks on one remote worker, each running 2.5× the heartbeat timeout: while the
/// first runs, the node's main thread reads nothing, so its helper thread must read the
/// root's heartbeats (else the node takes the root for gone and ends the session) and the
/// second task, which runs when the first ends. Both results come back.
fn long_tasks() -> Result<(), String> {
    let timeout = Duration::from_millis(800);
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let slow_bump = top.register_sub("slow_bump", move |c| {
        std::thread::sleep(timeout * 5 / 2);
        c.tensor_mut::<u64>(0)?.update(|v| v + 1);
        Ok(())
    });
    let slow = top.register_orchestration("slow", move |o, a| {
        o.submit_sub(&slow_bump, a)?;
        Ok(())
    });
    let w = add_remote_worker(&mut top, spec().heartbeat_timeout(timeout))
        .map_err(|e| e.to_string())?
        .id();
    let x = top
        .shared_tensor_from(&[1], &[10u64])
        .map_err(|e| e.to_string())?;
    let y = top
        .shared_tensor_from(&[1], &[20u64])
        .map_err(|e| e.to_string())?;
    let (xa, ya) = (x.clone(), y.clone());
    let both = top.register_orchestration("both", move |o, _| {
        for t in [&xa, &ya] {
            let mut a = TaskArgs::new();
            a.push_tensor(t.arg(ArgTag::InOut))?;
            o.submit_next_level(slow, &a, w)?;
        }
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    top.run(&both, &TaskArgs::new())
        .map_err(|e| format!("the long tasks failed: {e}"))?;
    check(
        x.to_vec::<u64>().map_err(|e| e.to_string())? == vec![11]
            && y.to_vec::<u64>().map_err(|e| e.to_string())? == vec![21],
        "a long task's result did not come back",
    )?;
    top.close().map_err(|e| format!("close: {e}"))?;
    no_children()
}

/// Copies of 12 MiB through a 1 MiB staging area — 48 pieces of 256 KiB each way, two in
/// flight, the node's main thread copying one piece while its helper reads the next — round trip
/// byte for byte, four times over, within a 1 s heartbeat timeout: a hand-back between
/// the node's readers that left nobody reading would stall a copy until the timeout cut
/// the session (as it did, once in a few runs, before the protocol was model-checked).
fn many_pieces() -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let spec = spec()
        .chips(1)
        .staging_bytes(1 << 20)
        .heartbeat_timeout(Duration::from_secs(1));
    let w = add_remote_worker(&mut top, spec).map_err(|e| e.to_string())?;
    top.init().map_err(|e| format!("init: {e}"))?;
    let err = |e: strata_net::NetError| e.to_string();
    let n = 12usize << 20;
    let t = w
        .alloc(&mut top, 0, &[n as u64], strata_types::DataType::U8)
        .map_err(err)?;
    let mut back = vec![0u8; n];
    for round in 0..4u32 {
        let bytes: Vec<u8> = (0..n as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(round) >> 13) as u8)
            .collect();
        w.copy_to(&mut top, &t, 0, &bytes)
            .map_err(|e| format!("round {round}: copy_to: {}", err(e)))?;
        back.fill(0);
        w.copy_from(&mut top, &t, 0, &mut back)
            .map_err(|e| format!("round {round}: copy_from: {}", err(e)))?;
        check(back == bytes, format!("round {round}: the bytes differ"))?;
    }
    w.free(&mut top, t).map_err(err)?;
    top.close().map_err(|e| format!("close: {e}"))?;
    no_children()
}

/// A node is stopped (SIGSTOP) while a 64 MiB `copy_from` streams — four times, with a
/// fresh level-4 worker each (a lost remote child makes its worker unusable), stopped 3,
/// 10, 17 and 24 ms into the copy: while its chip copies a piece, between frames, or
/// (when its writer was waiting for socket space) in the middle of a DATA payload the
/// root's reader reads straight into the caller's buffer — then three times into a 64 MiB
/// `copy_to`, whose bytes the caller's thread writes itself until the stopped node's
/// socket is full. Each copy fails with a typed error once the heartbeat timeout passes
/// (or completes, if the stop came after its last byte: its bytes are checked), and the
/// worker closes: ending a session never waits behind a stalled read (`die` cuts the
/// socket before it waits for a landing payload) or a full socket. A watchdog fails the
/// case if anything hangs.
fn stopped_mid_copy() -> Result<(), String> {
    for k in 0..4u64 {
        stop_mid_copy(Duration::from_millis(3 + 7 * k), false)?;
    }
    // And into a `copy_to`, which the root writes from the caller's buffer itself: it
    // meets a full socket and must give up on the node's silence, not block in `send`.
    for ms in [3, 10, 24] {
        stop_mid_copy(Duration::from_millis(ms), true)?;
    }
    no_children()
}

fn stop_mid_copy(delay: Duration, to_device: bool) -> Result<(), String> {
    let timeout = Duration::from_secs(1);
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    // The node says its pid: its orchestration (on the node process's main thread) has
    // its sub-worker write it into the root's tensor.
    let report = top.register_sub("report_pid", |c| {
        let pid = c.scalar::<u64>(0).ok_or("no pid")?;
        c.tensor_mut::<u64>(0)?.update(|_| pid);
        Ok(())
    });
    let pid_of = top.register_orchestration("pid_of", move |o, a| {
        let mut b = a.clone();
        b.push_scalar(u64::from(std::process::id()))?;
        o.submit_sub(&report, &b)?;
        Ok(())
    });
    let w = add_remote_worker(&mut top, spec().chips(1).heartbeat_timeout(timeout))
        .map_err(|e| e.to_string())?;
    let pid = top
        .shared_tensor_from(&[1], &[0u64])
        .map_err(|e| e.to_string())?;
    let (pa, wid) = (pid.clone(), w.id());
    let ask = top.register_orchestration("ask", move |o, _| {
        let mut a = TaskArgs::new();
        a.push_tensor(pa.arg(ArgTag::InOut))?;
        o.submit_next_level(pid_of, &a, wid)?;
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    // (After `init`: a node process of this program never returns from it, and must not
    // fork its chips with this thread running.)
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(90));
        eprintln!("case stopped_mid_copy: hung for 90 s");
        std::process::exit(2);
    });
    top.run(&ask, &TaskArgs::new())
        .map_err(|e| format!("asking the node's pid: {e}"))?;
    let pid = pid.to_vec::<u64>().map_err(|e| e.to_string())?[0] as i32;
    check(pid > 1, format!("pid {pid}"))?;
    let err = |e: strata_net::NetError| e.to_string();
    let n = 64usize << 20;
    let t = w
        .alloc(&mut top, 0, &[n as u64], strata_types::DataType::U8)
        .map_err(err)?;
    w.copy_to(&mut top, &t, 0, &vec![7u8; n]).map_err(err)?;
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(delay);
        // SAFETY: stopping this case's own node process on purpose.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    });
    let mut back = vec![0u8; n];
    let started = Instant::now();
    let r = if to_device {
        w.copy_to(&mut top, &t, 0, &vec![9u8; n])
    } else {
        w.copy_from(&mut top, &t, 0, &mut back)
    };
    let took = started.elapsed();
    let _ = stopper.join();
    if to_device && r.is_ok() {
        // The stop came after the last byte: the node, resumed, holds all of them.
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        w.copy_from(&mut top, &t, 0, &mut back).map_err(err)?;
        check(
            back.iter().all(|&b| b == 9),
            "copy_to completed with other bytes",
        )?;
    }
    // SAFETY: as above; the daemon reaps it.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    println!(
        "  stopped {delay:?} into the copy {}: {} after {took:.2?}",
        if to_device {
            "to the node"
        } else {
            "from the node"
        },
        r.as_ref()
            .err()
            .map_or("completed".into(), |e| e.to_string())
    );
    match r {
        Ok(()) if to_device => {}
        // The stop came after the last byte: the copy is whole.
        Ok(()) => check(back.iter().all(|&b| b == 7), "the bytes differ")?,
        Err(e) => {
            check(
                matches!(e, strata_net::NetError::DeviceMemory { .. })
                    && took < timeout + Duration::from_secs(10),
                format!("{e} after {took:?}"),
            )?;
            // The copy's error told of the loss: the worker is unusable from then on,
            // and `close` does not report it again — whether or not the scheduler had
            // found the session dead by then.
            let later = w
                .committed_device_memory(&mut top, 0)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            check(
                later.contains("unusable") && later.contains("worker 0"),
                format!("a device-memory call after the loss: {later:?}"),
            )?;
            let closed = top.close();
            println!("  close: {closed:?}");
            return check(
                closed.is_ok(),
                format!("close after a reported loss: {closed:?}"),
            );
        }
    }
    let closed = top.close();
    println!("  close: {closed:?}");
    Ok(())
}

fn expect_init_error(spec: RemoteSpec, needles: &[&str]) -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let _ = top.register_orchestration("noop", |_, _| Ok(()));
    add_remote_worker(&mut top, spec).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let e = top.init().err().ok_or("init should fail")?.to_string();
    println!("  refused in {:.2?}: {e}", t.elapsed());
    for n in needles {
        check(e.contains(n), format!("{e:?} does not mention {n:?}"))?;
    }
    top.close().map_err(|e| e.to_string())?;
    no_children()
}

fn wrong_secret() -> Result<(), String> {
    let wrong =
        Secret::new(b"not-the-daemons-secret-at-all".to_vec()).map_err(|e| e.to_string())?;
    expect_init_error(spec().secret(wrong), &["remote_worker", "secret"])
}

fn unknown_build() -> Result<(), String> {
    expect_init_error(
        RemoteSpec::new(daemon_addr(OTHER_DAEMON)).sub_workers(1),
        &["remote_worker", "no program with build-id", "--program"],
    )
}

fn registry_mismatch() -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    // Only the root registers this: the node's registry differs.
    if std::env::var_os(strata_net::ENV_NODE_WORKER).is_none() {
        let _ = top.register_orchestration("root_only", |_, _| Ok(()));
    }
    add_remote_worker(&mut top, spec()).map_err(|e| e.to_string())?;
    let e = top.init().err().ok_or("init should fail")?.to_string();
    check(
        e.contains("registry digest") && e.contains("same arguments"),
        e,
    )?;
    top.close().map_err(|e| e.to_string())?;
    no_children()
}

fn node_killed() -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(1)).map_err(|e| e.to_string())?;
    let w0 = add_remote_worker(&mut top, spec())
        .map_err(|e| e.to_string())?
        .id();
    let die = top.register_orchestration("die", |_, _| {
        // The node process runs orchestrations on its main thread: it dies mid-task.
        // SAFETY: killing this process on purpose.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        Ok(())
    });
    let bump = top.register_sub("bump", |c| {
        c.tensor_mut::<u64>(0)?.update(|v| v + 1);
        Ok(())
    });
    let x = top
        .shared_tensor_from(&[1], &[0u64])
        .map_err(|e| e.to_string())?;
    let xa = x.clone();
    let run = top.register_orchestration("run", move |o, _| {
        let mut a = TaskArgs::new();
        a.push_tensor(xa.arg(ArgTag::InOut))?;
        o.submit_next_level(die, &a, w0)?;
        o.submit_sub(&bump, &a)?;
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    let t = Instant::now();
    let mut h = top
        .submit(&run, &TaskArgs::new())
        .map_err(|e| e.to_string())?;
    let e = h
        .wait(Some(Duration::from_secs(30)))
        .err()
        .ok_or("the run should fail")?;
    let msg = e.to_string();
    println!("  failed in {:.2?}: {msg}", t.elapsed());
    check(
        msg.contains(&format!("worker {w0}")) && msg.contains("remote_worker"),
        msg.clone(),
    )?;
    check(
        x.to_vec::<u64>().map_err(|e| e.to_string())? == vec![0],
        "the downstream task ran",
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
    let t = Instant::now();
    let _ = top.close();
    println!("  closed in {:.2?}", t.elapsed());
    no_children()
}

/// Whether this process is a node the daemon started (it must only reach the same
/// `init` as its root; the raw-socket parts of a case are the root's).
fn is_node() -> bool {
    std::env::var_os(strata_net::ENV_NODE_WORKER).is_some()
}

fn silent_client() -> Result<(), String> {
    if is_node() {
        return two_workers();
    }
    let addr = daemon_addr(DAEMON);
    let mut silent = TcpStream::connect(&addr).map_err(|e| e.to_string())?;
    // A full session meanwhile.
    two_workers()?;
    // The daemon dropped the silent client at its handshake deadline (5 s in these tests).
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut b = [0u8; 64];
    let t = Instant::now();
    let n = silent.read(&mut b).unwrap_or(0);
    println!("  silent client closed after {:.2?} more", t.elapsed());
    check(
        n == 0,
        "the daemon sent something to a client that never said HELLO",
    )?;
    Ok(())
}

fn bad_frames() -> Result<(), String> {
    if is_node() {
        return two_workers();
    }
    let addr = daemon_addr(DAEMON);
    // Garbage instead of HELLO: an ERROR frame (or a close), never a hang.
    let mut c = TcpStream::connect(&addr).map_err(|e| e.to_string())?;
    c.write_all(&[0xAB; 64]).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    let _ = c.read_to_end(&mut reply);
    check(
        reply.is_empty() || strata_net::wire::decode_frame(&reply).is_ok(),
        "a reply that is not a frame",
    )?;
    // An oversized frame: refused before allocating.
    let mut c = TcpStream::connect(&addr).map_err(|e| e.to_string())?;
    let mut f = strata_net::wire::encode(
        strata_net::wire::FrameType::Hello,
        7,
        1,
        &strata_net::wire::Hello { nonce: [0; 32] },
    )
    .map_err(|e| e.to_string())?;
    f[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    c.write_all(&f[..32]).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    let _ = c.read_to_end(&mut reply);
    check(
        reply.is_empty() || strata_net::wire::decode_frame(&reply).is_ok(),
        "a reply that is not a frame",
    )?;
    // The daemon still serves.
    two_workers()
}

/// `mpirun -n 3 strata-node launch -- <this binary> --case launched`: rank 0 is the
/// root, ranks 1 and 2 its remote level-3 workers. Debian's `openmpi-bin` is installed
/// first if `mpirun` is missing; skipped (printed) only where it cannot be.
fn mpirun_launch(exe: &Path) -> Result<bool, String> {
    let present = || strata_testkit::peer::runs_ok("mpirun", &["--version"]);
    if let Err(why) = strata_testkit::peer::ensure_apt("mpirun_launch", &["openmpi-bin"], present) {
        println!("test mpirun_launch ... skipped: {why}");
        return Ok(false);
    }
    let t = Instant::now();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "3"])
        .arg(env!("CARGO_BIN_EXE_strata-node"))
        .args(["launch", "--"])
        .arg(exe)
        .args(["--case", "launched"])
        .env_remove(strata_net::ENV_SECRET_FILE)
        .output()
        .map_err(|e| e.to_string())?;
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || !text.contains("launched: 2 remote workers ok") {
        return Err(format!("{}: {text}", out.status));
    }
    println!("test mpirun_launch ... ok ({:.2?})", t.elapsed());
    Ok(true)
}

/// Every rank runs this; rank 0 (the root) adds the other ranks as remote workers and
/// runs a task on each.
fn launched() -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let ids: Vec<usize> =
        strata_net::add_launched_workers(&mut top, RemoteSpec::launched().sub_workers(1))
            .map_err(|e| e.to_string())?
            .iter()
            .map(|w| w.id())
            .collect();
    let add = top.register_sub("add_rank", |c| {
        let k = c.scalar::<u64>(0).ok_or("no scalar")?;
        c.tensor_mut::<u64>(0)?.update(|v| v + k);
        Ok(())
    });
    let inner = top.register_orchestration("inner", move |o, a| {
        o.submit_sub(&add, a)?;
        Ok(())
    });
    let x = top
        .shared_tensor_from(&[ids.len() as u64], &vec![0u64; ids.len()])
        .map_err(|e| e.to_string())?;
    let (xa, ids2) = (x.clone(), ids.clone());
    let outer = top.register_orchestration("outer", move |o, _| {
        for (i, &w) in ids2.iter().enumerate() {
            let v = xa.view().slice(0, i as u64, i as u64 + 1)?;
            let mut a = TaskArgs::new();
            a.push_tensor(xa.arg_view(v, ArgTag::InOut)?)?;
            a.push_scalar(i as u64 + 1)?;
            o.submit_next_level(inner, &a, w)?;
        }
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    top.run(&outer, &TaskArgs::new())
        .map_err(|e| format!("run: {e}"))?;
    let got = x.to_vec::<u64>().map_err(|e| e.to_string())?;
    let want: Vec<u64> = (1..=ids.len() as u64).collect();
    check(got == want, format!("got {got:?}, want {want:?}"))?;
    top.close().map_err(|e| format!("close: {e}"))?;
    println!("launched: {} remote workers ok", ids.len());
    Ok(())
}

/// Registers `name`: a chip kernel writing `y[i] = x[i] + k` (tensor 0 in, tensor 1 out,
/// scalar 0 = k as f32 bits) and a host orchestration that submits it to the chip named
/// by scalar 1.
fn register_add_on_chip(top: &mut DistWorker) -> Result<strata_dist::HostOrchHandle, String> {
    use strata_chip::{CoreArgs, KernelError};
    let k = top
        .register_kernel("add_k", |ctx| {
            let x = ctx.input::<f32>(0)?.to_vec();
            let add = f32::from_bits(ctx.scalars()[0] as u32);
            let mut y = ctx.output::<f32>(1)?;
            let y = y
                .as_mut_slice()
                .ok_or_else(|| KernelError::new("add_k needs a contiguous output"))?;
            for (o, v) in y.iter_mut().zip(x) {
                *o = v + add;
            }
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let chip_orch = top
        .register_chip_orchestration("add_k_chip", move |o, a| {
            let mut core = CoreArgs::new();
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

/// A remote node's kernel that waits for a signal that never comes, until its chip's
/// kernel timeout cancels it: the root's error carries the node's wait-for state (the
/// kernel running on core 0, its signal wait) as data, as a local child's would.
fn stalled() -> Result<(), String> {
    use strata_chip::{ChipConfig, CoreArgs, KernelError};
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let stuck = top
        .register_kernel("stuck", |ctx| {
            ctx.signal_note().waiting(0, 5, ">=", 1, 0);
            while !ctx.cancelled() {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(KernelError::new("cancelled").into())
        })
        .map_err(|e| e.to_string())?;
    let chip_orch = top
        .register_chip_orchestration("stuck_chip", move |o, _| {
            o.submit_aiv(stuck, &CoreArgs::new())?;
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let on_node = top.register_orchestration("stuck_on_node", move |o, _| {
        o.submit_next_level(chip_orch, &TaskArgs::new(), 0)?;
        Ok(())
    });
    let chip = ChipConfig {
        aic_cores: 0,
        aiv_cores: 1,
        kernel_timeout: Duration::from_millis(300),
        ..ChipConfig::default()
    };
    let w = add_remote_worker(&mut top, spec().chip_configs(vec![chip]))
        .map_err(|e| e.to_string())?
        .id();
    let outer = top.register_orchestration("outer", move |o, _| {
        o.submit_next_level(on_node, &TaskArgs::new(), w)?;
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    let e = top
        .run(&outer, &TaskArgs::new())
        .err()
        .ok_or("the stuck kernel fails the run")?;
    let DistError::TaskFailed(f) = &e else {
        return Err(format!("not a task failure: {e:?}"));
    };
    let wait_for = f
        .wait_for()
        .ok_or_else(|| format!("no wait-for state came back from the node: {e}"))?;
    let text = wait_for.to_string();
    check(
        text.contains("on core 0") && text.contains("waits for signal cell 5 >= 1"),
        format!("the node's wait-for state names the kernel and its wait: {text}"),
    )?;
    check(
        e.to_string().contains("remote_worker"),
        format!("the failure names the remote worker: {e}"),
    )?;
    top.close().map_err(|e| format!("close: {e}"))?;
    no_children()
}

/// Device memory of a remote worker's two chips: whole and offset copies both ways
/// (checked byte for byte against a host model of the bytes), a copy spanning several
/// pieces, and remote tensors as arguments of a task that runs a kernel on the chip.
fn device_memory() -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let add = register_add_on_chip(&mut top)?;
    // A small staging area: a 3 MiB copy goes in 1 MiB pieces, two in flight.
    let w = add_remote_worker(&mut top, spec().chips(2).staging_bytes(4 << 20))
        .map_err(|e| e.to_string())?;
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

    // Offsets and lengths chosen to be unaligned.
    let n = 4096usize;
    let mut model: Vec<Vec<u8>> = Vec::new();
    let mut tensors = Vec::new();
    for chip in 0..2 {
        let x = w
            .alloc(&mut top, chip, &[n as u64], strata_types::DataType::F32)
            .map_err(err)?;
        let y = w
            .alloc(&mut top, chip, &[n as u64], strata_types::DataType::F32)
            .map_err(err)?;
        let vals: Vec<f32> = (0..n).map(|i| (i + 1000 * chip) as f32).collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.copy_to(&mut top, &x, 0, &bytes).map_err(err)?;
        model.push(bytes);
        tensors.push(x);
        tensors.push(y);
    }
    // An overwrite at an odd offset, read back at another odd offset.
    let patch: Vec<u8> = (0..333u32).map(|i| (i * 7 % 251) as u8).collect();
    w.copy_to(&mut top, &tensors[0], 4 * 100 + 3, &patch)
        .map_err(err)?;
    model[0][403..403 + 333].copy_from_slice(&patch);
    let mut back = vec![0u8; 1000];
    w.copy_from(&mut top, &tensors[0], 397, &mut back)
        .map_err(err)?;
    check(back == model[0][397..1397], "offset read-back differs")?;
    let mut whole = vec![0u8; 4 * n];
    w.copy_from(&mut top, &tensors[2], 0, &mut whole)
        .map_err(err)?;
    check(whole == model[1], "chip 1 read-back differs")?;

    // The chips' tensors as task arguments: y = x + 5 on each chip.
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

    // A copy of several pieces, at an unaligned offset.
    let big_n = (3 << 20) / 4 + 17;
    let big = w
        .alloc(&mut top, 1, &[big_n as u64], strata_types::DataType::F32)
        .map_err(err)?;
    let data: Vec<u8> = (0..big_n * 4 - 5)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect();
    let t = Instant::now();
    w.copy_to(&mut top, &big, 5, &data).map_err(err)?;
    let mut got = vec![0u8; data.len()];
    w.copy_from(&mut top, &big, 5, &mut got).map_err(err)?;
    println!(
        "  {} MiB there and back in {:.2?}",
        data.len() >> 20,
        t.elapsed()
    );
    check(got == data, "the multi-piece copy differs")?;
    let held = w.committed_device_memory(&mut top, 1).map_err(err)?;
    check(
        held >= (big_n as u64 * 4) + 2 * 4 * n as u64,
        format!("chip 1 holds {held} bytes"),
    )?;
    w.free(&mut top, big).map_err(err)?;
    let after = w.committed_device_memory(&mut top, 1).map_err(err)?;
    check(
        after < held,
        format!("free did not release: {held} -> {after}"),
    )?;
    for t in tensors {
        w.free(&mut top, t).map_err(err)?;
    }
    top.close().map_err(|e| format!("close: {e}"))?;
    no_children()
}

/// Misuse of remote device memory: each a typed error naming the remote worker, and the
/// session stays usable after each.
fn device_misuse() -> Result<(), String> {
    use strata_net::{MemoryFault, NetError};
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let add = register_add_on_chip(&mut top)?;
    let w0 = add_remote_worker(&mut top, spec().chips(1)).map_err(|e| e.to_string())?;
    let w1 = add_remote_worker(&mut top, spec().chips(1)).map_err(|e| e.to_string())?;
    let w1id = w1.id();
    let cell: std::sync::Arc<std::sync::Mutex<Vec<strata_net::RemoteTensor>>> = Default::default();
    let c2 = cell.clone();
    let run = top.register_orchestration("run", move |o, _| {
        let ts = c2.lock().map_err(|_| "poisoned")?.clone();
        let mut t = TaskArgs::new();
        t.push_tensor(ts[0].arg(ArgTag::Input))?
            .push_tensor(ts[1].arg(ArgTag::OutputExisting))?;
        t.push_scalar(0)?.push_scalar(0)?;
        o.submit_next_level(add, &t, w1id)?;
        Ok(())
    });
    // Before init: not connected.
    let e = w0
        .alloc(&mut top, 0, &[4], strata_types::DataType::F32)
        .err()
        .ok_or("alloc before init should fail")?;
    check(
        e.to_string().contains("init") || matches!(e, NetError::Dist(_)),
        format!("before init: {e}"),
    )?;
    top.init().map_err(|e| format!("init: {e}"))?;
    let fault = |e: NetError, want: MemoryFault, worker: usize| -> Result<(), String> {
        let msg = e.to_string();
        println!("  {want:?}: {msg}");
        match e {
            NetError::DeviceMemory { fault, .. } if fault == want => check(
                msg.contains(&format!("worker {worker}")) && msg.contains("remote_worker"),
                format!("does not name the worker: {msg}"),
            ),
            other => Err(format!("expected {want:?}, got {other:?}")),
        }
    };
    let a = w0
        .alloc(&mut top, 0, &[16], strata_types::DataType::F32)
        .map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 64];
    // Out of range: past the end, and an offset that overflows.
    fault(
        w0.copy_from(&mut top, &a, 1, &mut buf)
            .err()
            .ok_or("out of range")?,
        MemoryFault::OutOfRange,
        w0.id(),
    )?;
    fault(
        w0.copy_to(&mut top, &a, u64::MAX, &buf[..2])
            .err()
            .ok_or("overflow")?,
        MemoryFault::OutOfRange,
        w0.id(),
    )?;
    // Another worker's tensor.
    fault(
        w1.copy_to(&mut top, &a, 0, &buf)
            .err()
            .ok_or("other worker")?,
        MemoryFault::OtherWorker,
        w1.id(),
    )?;
    // No such chip.
    fault(
        w0.alloc(&mut top, 3, &[4], strata_types::DataType::F32)
            .err()
            .ok_or("no chip 3")?,
        MemoryFault::NoSuchChip,
        w0.id(),
    )?;
    // The chip's allocator refuses an absurd size: the node's message comes back.
    fault(
        w0.alloc(&mut top, 0, &[1 << 40], strata_types::DataType::F32)
            .err()
            .ok_or("absurd alloc")?,
        MemoryFault::Node,
        w0.id(),
    )?;
    // A task of worker 1 naming worker 0's tensors: the engine refuses it.
    let b = w0
        .alloc(&mut top, 0, &[16], strata_types::DataType::F32)
        .map_err(|e| e.to_string())?;
    *cell.lock().map_err(|_| "poisoned")? = vec![a, b];
    let e = top
        .run(&run, &TaskArgs::new())
        .err()
        .ok_or("a task naming another worker's tensor should fail")?
        .to_string();
    println!("  task on the wrong worker: {e}");
    check(
        e.contains("device memory of worker") && e.contains(&format!("worker {w1id}")),
        e,
    )?;
    // Freed: copies and tasks refuse it.
    w0.free(&mut top, a).map_err(|e| e.to_string())?;
    fault(
        w0.copy_to(&mut top, &a, 0, &buf)
            .err()
            .ok_or("freed copy")?,
        MemoryFault::Freed,
        w0.id(),
    )?;
    fault(
        w0.free(&mut top, a).err().ok_or("double free")?,
        MemoryFault::Freed,
        w0.id(),
    )?;
    // Still usable: a round trip on worker 0 and on worker 1.
    w0.copy_to(&mut top, &b, 8, &buf[..56])
        .map_err(|e| e.to_string())?;
    let mut back = vec![1u8; 56];
    w0.copy_from(&mut top, &b, 8, &mut back)
        .map_err(|e| e.to_string())?;
    check(back == buf[..56], "round trip after the errors")?;
    let c = w1
        .alloc(&mut top, 0, &[2], strata_types::DataType::U64)
        .map_err(|e| e.to_string())?;
    w1.copy_to(&mut top, &c, 0, &[9u8; 16])
        .map_err(|e| e.to_string())?;
    top.close().map_err(|e| format!("close: {e}"))?;
    // After close: the session is gone, a typed error.
    let e = w1
        .copy_to(&mut top, &c, 0, &[9u8; 16])
        .err()
        .ok_or("copy after close")?;
    println!("  after close: {e}");
    no_children()
}

/// One remote worker at `addr` adds 3 to a shared tensor (checked).
fn one_worker_at(addr: &str) -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let add = top.register_sub("add_scalar", |c| {
        let k = c.scalar::<u64>(0).ok_or("no scalar")?;
        c.tensor_mut::<u64>(0)?.update(|v| v + k);
        Ok(())
    });
    let inner = top.register_orchestration("inner", move |o, a| {
        o.submit_sub(&add, a)?;
        Ok(())
    });
    let w = add_remote_worker(&mut top, RemoteSpec::new(addr).sub_workers(1))
        .map_err(|e| e.to_string())?
        .id();
    let x = top
        .shared_tensor_from(&[64], &[1u64; 64])
        .map_err(|e| e.to_string())?;
    let xa = x.clone();
    let run = top.register_orchestration("run", move |o, _| {
        let mut a = TaskArgs::new();
        a.push_tensor(xa.arg(ArgTag::InOut))?;
        a.push_scalar(3u64)?;
        o.submit_next_level(inner, &a, w)?;
        Ok(())
    });
    let t = Instant::now();
    top.init().map_err(|e| format!("init: {e}"))?;
    println!("  connected to {addr} in {:.2?}", t.elapsed());
    top.run(&run, &TaskArgs::new())
        .map_err(|e| format!("run: {e}"))?;
    check(
        x.to_vec::<u64>().map_err(|e| e.to_string())? == vec![4; 64],
        "wrong sum",
    )?;
    top.close().map_err(|e| format!("close: {e}"))?;
    no_children()
}

/// A daemon listening on `[::1]`, reached as `[::1]:PORT`.
fn ipv6() -> Result<(), String> {
    let addr = daemon_addr(V6_DAEMON);
    // (A node's process gets the daemon's environment, not the case's: only the root
    // knows the address.)
    check(
        is_node() || addr.starts_with("[::1]:"),
        format!("the daemon listens on {addr}"),
    )?;
    one_worker_at(&addr)
}

/// The IPv4 daemon reached as `localhost:PORT`: the name is resolved (bounded) and every
/// address it has is tried in turn (`localhost` may name `::1` first, where nothing
/// listens on this port).
fn hostname() -> Result<(), String> {
    let addr = daemon_addr(DAEMON);
    let port = addr.rsplit_once(':').map(|(_, p)| p).unwrap_or("1");
    one_worker_at(&format!("localhost:{port}"))
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Level-4 workers with a remote child, one after the other in one root process: once
/// each is closed its session's descriptors are gone (after the first, which starts the
/// runtime's own).
fn no_fd_leak() -> Result<(), String> {
    let addr = daemon_addr(DAEMON);
    one_worker_at(&addr)?;
    let settled = |limit: usize| {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if fd_count() <= limit {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    };
    // The first session's tasks end within a heartbeat interval of its close.
    std::thread::sleep(Duration::from_millis(500));
    let before = fd_count();
    for _ in 0..3 {
        one_worker_at(&addr)?;
    }
    let ok = settled(before);
    println!(
        "  descriptors: {before} before, {} after 3 more sessions",
        fd_count()
    );
    if !ok {
        if let Ok(rd) = std::fs::read_dir("/proc/self/fd") {
            for e in rd.flatten() {
                println!(
                    "  fd {:?} -> {:?}",
                    e.file_name(),
                    std::fs::read_link(e.path())
                );
            }
        }
    }
    check(
        ok,
        format!("descriptors leaked: {before} before, {} after", fd_count()),
    )
}
