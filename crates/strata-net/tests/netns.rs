//! Remote level-3 workers over real interfaces: a level-4 root and two node daemons in
//! three network namespaces joined by veth pairs, with faults injected inside the
//! namespaces (`harness = false`: the binary is the driver, each case's root, and the
//! program the daemons start).
//!
//! ```text
//!   netns R (root, the case process)        netns A (daemon A)       netns B (daemon B)
//!   ra 10.231.1.1/24 ──────── veth ──────── a0 10.231.1.2/24
//!   rb 10.231.2.1/24 ──────── veth ─────────────────────────────────  b0 10.231.2.2/24
//! ```
//!
//! Traffic goes only to these addresses (and loopback). The namespaces carry a unique
//! prefix with the driver's pid; a guard deletes them (and with them the veth ends) on
//! drop, and namespaces of earlier runs whose driver is gone are deleted at start. The
//! cases skip, with the reason printed, only where the kernel refuses to create a
//! namespace; a missing tool (`ip`, `iptables`, `ss`, `tc`) is installed with apt-get
//! first (`strata_testkit::peer::ensure_apt`), and a failure where it cannot be. Every wait is bounded; bounds are generous deadlines
//! on behaviour, and the measured figures are printed (`measured:` lines).
//!
//! After each case the driver checks that the daemons' sessions all ended (no child of
//! either daemon left) and that daemon A still serves a new session; at the end, that no
//! process of this binary is left, both daemons drained, and the namespaces are gone.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use strata_dist::{DistConfig, DistError, DistWorker, HostOrchHandle, SubHandle};
use strata_net::{add_remote_worker, RemoteSpec, Secret};
use strata_types::{ArgTag, TaskArgs};

/// Namespace names start with this, then the driver's pid.
const PREFIX: &str = "stnet";
const ADDR_R_A: &str = "10.231.1.1";
const ADDR_A: &str = "10.231.1.2";
const ADDR_R_B: &str = "10.231.2.1";
const ADDR_B: &str = "10.231.2.2";

/// What the driver hands a case (environment of the root; the nodes get the case's
/// arguments, which the daemon passes on).
const ENV_A: &str = "STRATA_NETNS_DAEMON_A";
const ENV_B: &str = "STRATA_NETNS_DAEMON_B";
const ENV_OTHER: &str = "STRATA_NETNS_OTHER";
const ENV_NS: &str = "STRATA_NETNS_NAMES";

/// The heartbeat timeout of the fault cases (both ends).
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A fault must surface as an error within this (generous: heartbeat timeout, grace,
/// a loaded 2-core machine).
const DETECT_BOUND: Duration = Duration::from_secs(15);
/// The longest a deliberately long remote task runs (it is cut short by the fault).
const LONG_TASK: Duration = Duration::from_secs(30);

const CASES: &[&str] = &[
    "veth_two_nodes_run_tasks_and_device_copies",
    "veth_node_killed_mid_task",
    "veth_dropped_connection_mid_task",
    "veth_partition_mid_task",
    "veth_slow_link",
    "veth_wrong_secret_is_refused",
    "veth_wrong_build_id_is_refused",
    "veth_oversized_and_corrupted_frames_are_refused",
    "veth_silent_client_does_not_block_other_sessions",
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--delay-proxy") {
        let target = args.get(i + 1).cloned().unwrap_or_default();
        let ms = args.get(i + 2).and_then(|v| v.parse().ok()).unwrap_or(20);
        delay_proxy(&target, Duration::from_millis(ms));
        std::process::exit(1)
    }
    if let Some(i) = args.iter().position(|a| a == "--case") {
        let name = args.get(i + 1).cloned().unwrap_or_default();
        let dir = args
            .iter()
            .position(|a| a == "--dir")
            .and_then(|j| args.get(j + 1))
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        match run_case(&name, &dir) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("case {name}: {e}");
                std::process::exit(1)
            }
        }
    }
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

// ----- the namespaces ------------------------------------------------------------------

/// Runs a command; `Err` with its output if it fails.
fn sh(cmd: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            format!(
                "{}: {e} (is it installed? the netns driver installs iproute2 and iptables with apt-get)",
                cmd[0]
            )
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{}` failed ({}): {}",
            cmd.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `cmd` inside namespace `ns`.
fn in_ns(ns: &str, cmd: &[&str]) -> Result<String, String> {
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(cmd);
    sh(&full)
}

/// The three namespaces of one driver; deleted on drop.
struct Lab {
    r: String,
    a: String,
    b: String,
}

impl Lab {
    /// Deletes namespaces of earlier runs whose driver is gone.
    fn remove_stale() {
        let Ok(list) = sh(&["ip", "netns", "list"]) else {
            return;
        };
        for line in list.lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            let Some(rest) = name.strip_prefix(PREFIX) else {
                continue;
            };
            let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let alive = !pid.is_empty() && Path::new(&format!("/proc/{pid}")).exists();
            if !alive {
                let _ = sh(&["ip", "netns", "del", name]);
                println!("removed a stale namespace {name}");
            }
        }
    }

    /// Creates the namespaces and links. `Ok(Err(reason))`: the kernel refuses
    /// namespaces here (the tests skip); `Err`: something else failed.
    fn create() -> Result<Result<Lab, String>, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Ok(Err("network namespaces need root".into()));
        }
        sh(&["ip", "-V"])?;
        Lab::remove_stale();
        let pid = std::process::id();
        let lab = Lab {
            r: format!("{PREFIX}{pid}r"),
            a: format!("{PREFIX}{pid}a"),
            b: format!("{PREFIX}{pid}b"),
        };
        // Try first: the kernel (or a sandbox) may forbid namespaces.
        if let Err(e) = sh(&["ip", "netns", "add", &lab.r]) {
            if e.contains("not permitted")
                || e.contains("Permission denied")
                || e.contains("not supported")
            {
                return Ok(Err(format!(
                    "the kernel refuses network namespaces here: {e}"
                )));
            }
            return Err(e);
        }
        let steps: Vec<Vec<String>> = vec![
            vec!["ip", "netns", "add", &lab.a],
            vec!["ip", "netns", "add", &lab.b],
            vec!["ip", "-n", &lab.r, "link", "set", "lo", "up"],
            vec!["ip", "-n", &lab.a, "link", "set", "lo", "up"],
            vec!["ip", "-n", &lab.b, "link", "set", "lo", "up"],
            // Both ends are created inside the namespaces: nothing in the host's.
            vec![
                "ip", "-n", &lab.r, "link", "add", "ra", "type", "veth", "peer", "name", "a0",
                "netns", &lab.a,
            ],
            vec![
                "ip", "-n", &lab.r, "link", "add", "rb", "type", "veth", "peer", "name", "b0",
                "netns", &lab.b,
            ],
            vec![
                "ip",
                "-n",
                &lab.r,
                "addr",
                "add",
                &format!("{ADDR_R_A}/24"),
                "dev",
                "ra",
            ],
            vec![
                "ip",
                "-n",
                &lab.r,
                "addr",
                "add",
                &format!("{ADDR_R_B}/24"),
                "dev",
                "rb",
            ],
            vec![
                "ip",
                "-n",
                &lab.a,
                "addr",
                "add",
                &format!("{ADDR_A}/24"),
                "dev",
                "a0",
            ],
            vec![
                "ip",
                "-n",
                &lab.b,
                "addr",
                "add",
                &format!("{ADDR_B}/24"),
                "dev",
                "b0",
            ],
            vec!["ip", "-n", &lab.r, "link", "set", "ra", "up"],
            vec!["ip", "-n", &lab.r, "link", "set", "rb", "up"],
            vec!["ip", "-n", &lab.a, "link", "set", "a0", "up"],
            vec!["ip", "-n", &lab.b, "link", "set", "b0", "up"],
        ]
        .into_iter()
        .map(|v| v.into_iter().map(String::from).collect())
        .collect();
        for s in &steps {
            let v: Vec<&str> = s.iter().map(String::as_str).collect();
            sh(&v)?;
        }
        Ok(Ok(lab))
    }

    /// Removes every fault a case injected (a case that failed half-way may leave some).
    fn heal(&self) {
        for ns in [&self.r, &self.a, &self.b] {
            let _ = in_ns(ns, &["iptables", "-F"]);
        }
        for (ns, dev) in [
            (&self.r, "ra"),
            (&self.r, "rb"),
            (&self.a, "a0"),
            (&self.b, "b0"),
        ] {
            let _ = in_ns(ns, &["tc", "qdisc", "del", "dev", dev, "root"]);
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in [&self.r, &self.a, &self.b] {
            let _ = sh(&["ip", "netns", "del", ns]);
        }
    }
}

// ----- the driver ----------------------------------------------------------------------

struct Daemon {
    child: Child,
    addr: String,
}

fn start_daemon(ns: &str, listen: &str, secret: &Path, program: &Path) -> Result<Daemon, String> {
    let node = PathBuf::from(env!("CARGO_BIN_EXE_strata-node"));
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(node)
        .args(["serve", "--listen", listen, "--secret-file"])
        .arg(secret)
        .arg("--program")
        .arg(program)
        .args(["--handshake-timeout", "5", "--drain-timeout", "5"])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("start strata-node serve in {ns}: {e}"))?;
    let mut line = String::new();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let addr = line
        .trim()
        .strip_prefix("listening ")
        .ok_or_else(|| format!("daemon in {ns} printed {line:?}"))?
        .to_owned();
    Ok(Daemon { child, addr })
}

fn stop_daemon(mut d: Daemon) -> Result<Duration, String> {
    // SAFETY: signalling a child this driver started (`ip netns exec` execs the daemon,
    // so the pid is the daemon's).
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
    let _ = d.child.wait();
    Err("the daemon did not drain within 30 s".into())
}

/// The direct children of `pid`.
fn children_of(pid: u32) -> Vec<String> {
    let mut v = Vec::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in rd.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                v.extend(s.split_whitespace().map(String::from));
            }
        }
    }
    v
}

/// Waits (bounded) until the daemon's sessions all ended.
fn sessions_ended(d: &Daemon, bound: Duration) -> Result<Duration, String> {
    let t = Instant::now();
    loop {
        let kids = children_of(d.child.id());
        if kids.is_empty() {
            return Ok(t.elapsed());
        }
        if t.elapsed() > bound {
            return Err(format!(
                "the daemon at {} still has session processes {kids:?} after {bound:?}",
                d.addr
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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

fn shm_entries() -> usize {
    std::fs::read_dir("/dev/shm").map_or(0, |d| d.count())
}

fn driver(filter: &[&String]) -> i32 {
    // `cargo test --workspace` on a fresh machine: the tools come from the distribution.
    let tools = || {
        use strata_testkit::peer::runs_ok;
        runs_ok("ip", &["-V"])
            && runs_ok("ss", &["-V"])
            && runs_ok("tc", &["-V"])
            && runs_ok("iptables", &["--version"])
    };
    if let Err(e) =
        strata_testkit::peer::ensure_apt("netns tests", &["iproute2", "iptables"], tools)
    {
        println!("netns setup failed: {e}");
        println!("\ntest result: FAILED. 0 passed; 1 failed");
        return 1;
    }
    let lab = match Lab::create() {
        Ok(Ok(l)) => l,
        Ok(Err(reason)) => {
            println!("netns tests skipped: {reason}");
            println!(
                "\ntest result: ok. 0 passed; 0 failed; {} skipped",
                CASES.len()
            );
            return 0;
        }
        Err(e) => {
            println!("netns setup failed: {e}");
            println!("\ntest result: FAILED. 0 passed; 1 failed");
            return 1;
        }
    };
    let code = drive(&lab, filter);
    drop(lab);
    // The guard removed the namespaces (and the veth ends with them).
    let left = sh(&["ip", "netns", "list"]).unwrap_or_default();
    let ours = format!("{PREFIX}{}", std::process::id());
    if left.contains(&ours) {
        println!("leak: namespaces left: {left}");
        return 1;
    }
    code
}

fn drive(lab: &Lab, filter: &[&String]) -> i32 {
    let exe = std::env::current_exe().expect("current exe");
    let dir = std::env::temp_dir().join(format!("strata-net-netns-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let secret = dir.join("secret");
    let prep = std::fs::write(&secret, "netns-test-secret-0123456789abcdef\n")
        .and_then(|()| std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)));
    if let Err(e) = prep {
        println!("cannot write the secret file: {e}");
        return 1;
    }
    let shm_before = shm_entries();
    let fds_before = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let started = (|| -> Result<(Daemon, Daemon, Daemon), String> {
        let a = start_daemon(&lab.a, &format!("{ADDR_A}:0"), &secret, &exe)?;
        let b = start_daemon(&lab.b, &format!("{ADDR_B}:0"), &secret, &exe)?;
        // A daemon that knows another program only (the build-id case).
        let other = start_daemon(
            &lab.a,
            &format!("{ADDR_A}:0"),
            &secret,
            Path::new(env!("CARGO_BIN_EXE_strata-node")),
        )?;
        Ok((a, b, other))
    })();
    let (da, db, other) = match started {
        Ok(d) => d,
        Err(e) => {
            println!("cannot start the daemons: {e}");
            return 1;
        }
    };
    let names = format!("{} {} {}", lab.r, lab.a, lab.b);
    let run = |case: &str| -> Result<(), String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &lab.r])
            .arg(&exe)
            .args(["--case", case, "--dir"])
            .arg(&dir)
            .env(ENV_A, &da.addr)
            .env(ENV_B, &db.addr)
            .env(ENV_OTHER, &other.addr)
            .env(ENV_NS, &names)
            .env(strata_net::ENV_SECRET_FILE, &secret)
            .stdin(Stdio::null())
            .status()
            .map_err(|e| e.to_string())?;
        if out.success() {
            Ok(())
        } else {
            Err(format!("case {case} exited {out}"))
        }
    };
    let (mut passed, mut failed) = (0, 0);
    for case in CASES {
        if !filter.is_empty() && !filter.iter().any(|f| case.contains(f.as_str())) {
            continue;
        }
        let t = Instant::now();
        let mut r = run(case);
        lab.heal();
        // The node side: every session of this case ended (nodes that lost their root
        // end themselves within the heartbeat timeout and a grace).
        for d in [&da, &db] {
            match sessions_ended(d, DETECT_BOUND) {
                Ok(took) if r.is_ok() => {
                    println!(
                        "  measured: {case}: sessions at {} ended {took:.2?} after the case",
                        d.addr
                    )
                }
                Ok(_) => {}
                Err(e) if r.is_ok() => r = Err(e),
                Err(e) => println!("  also: {e}"),
            }
        }
        // The node host still serves new sessions.
        if r.is_ok() && *case != CASES[0] {
            r = run("healthy_a")
                .map_err(|e| format!("daemon A does not serve after the case: {e}"));
            if r.is_ok() {
                r = sessions_ended(&da, DETECT_BOUND).map(drop);
            }
        }
        println!(
            "test {case} ... {} ({:.2?})",
            if r.is_ok() { "ok" } else { "FAILED" },
            t.elapsed()
        );
        match r {
            Ok(()) => passed += 1,
            Err(e) => {
                println!("  {e}");
                failed += 1
            }
        }
    }
    for (name, d) in [("A", da), ("B", db), ("other", other)] {
        match stop_daemon(d) {
            Ok(t) => println!("daemon {name} drained in {t:.2?}"),
            Err(e) => {
                println!("daemon {name}: {e}");
                failed += 1;
            }
        }
    }
    // Nothing left: no process of this binary but the driver, no shared-memory file, no
    // descriptor of the driver's.
    let left: Vec<i32> = processes_of(&exe)
        .into_iter()
        .filter(|&p| p != std::process::id() as i32)
        .collect();
    if !left.is_empty() {
        println!("leak: processes of this binary still running: {left:?}");
        failed += 1;
    }
    let shm_after = shm_entries();
    if shm_after > shm_before {
        println!("leak: /dev/shm had {shm_before} entries, now {shm_after}");
        failed += 1;
    }
    let fds_after = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    if fds_after > fds_before {
        println!("leak: the driver had {fds_before} descriptors, now {fds_after}");
        failed += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "\ntest result: {}. {passed} passed; {failed} failed",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    i32::from(failed > 0)
}

// ----- the cases (each runs as the root in namespace R; the daemons start the same
// binary with the same arguments as its remote nodes, which serve from the same `init`)

fn check(cond: bool, what: impl Into<String>) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what.into())
    }
}

fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_default()
}

/// Namespace `k` (0 = R, 1 = A, 2 = B).
fn ns(k: usize) -> String {
    env(ENV_NS)
        .split_whitespace()
        .nth(k)
        .unwrap_or_default()
        .to_owned()
}

fn is_node() -> bool {
    std::env::var_os(strata_net::ENV_NODE_WORKER).is_some()
}

/// The case's own children are all gone after close.
fn no_children() -> Result<(), String> {
    let kids = children_of(std::process::id());
    check(
        kids.is_empty(),
        format!("children left after close: {kids:?}"),
    )
}

fn spec(var: &str) -> RemoteSpec {
    RemoteSpec::new(env(var)).sub_workers(1)
}

fn run_case(name: &str, dir: &Path) -> Result<(), String> {
    match name {
        "veth_two_nodes_run_tasks_and_device_copies" => two_nodes(),
        "veth_node_killed_mid_task" => mid_task_fault(dir, Fault::Kill),
        "veth_dropped_connection_mid_task" => mid_task_fault(dir, Fault::Reset),
        "veth_partition_mid_task" => mid_task_fault(dir, Fault::Partition),
        "veth_slow_link" => slow_link(),
        "veth_wrong_secret_is_refused" => wrong_secret(),
        "veth_wrong_build_id_is_refused" => wrong_build(),
        "veth_oversized_and_corrupted_frames_are_refused" => bad_frames(),
        "veth_silent_client_does_not_block_other_sessions" => silent_client(),
        "healthy_a" => healthy_a(),
        other => Err(format!("no case {other}")),
    }
}

/// The registrations every case makes (the nodes make the same): a sub-worker closure
/// that adds scalar 0 to every element of tensor 0, and a host orchestration running it.
fn adder(top: &mut DistWorker) -> (SubHandle, HostOrchHandle) {
    let add = top.register_sub("add_scalar", |c| {
        let k = c.scalar::<u64>(0).ok_or("no scalar")?;
        c.tensor_mut::<u64>(0)?.update(|v| v + k);
        Ok(())
    });
    let inner = top.register_orchestration("inner", move |o, a| {
        o.submit_sub(&add, a)?;
        Ok(())
    });
    (add, inner)
}

/// One remote worker on daemon A runs a task: daemon A serves.
fn healthy_a() -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let (_, inner) = adder(&mut top);
    let w = add_remote_worker(&mut top, spec(ENV_A))
        .map_err(|e| e.to_string())?
        .id();
    let x = top
        .shared_tensor_from(&[8], &[1u64; 8])
        .map_err(|e| e.to_string())?;
    let xa = x.clone();
    let run = top.register_orchestration("run", move |o, _| {
        let mut a = TaskArgs::new();
        a.push_tensor(xa.arg(ArgTag::InOut))?;
        a.push_scalar(4u64)?;
        o.submit_next_level(inner, &a, w)?;
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    top.run(&run, &TaskArgs::new()).map_err(|e| e.to_string())?;
    check(
        x.to_vec::<u64>().map_err(|e| e.to_string())? == vec![5; 8],
        "daemon A's worker computed a wrong sum",
    )?;
    top.close().map_err(|e| format!("close: {e}"))?;
    no_children()
}

/// Two remote workers (one per namespace) add to their halves of a shared tensor, and
/// device memory of a chip in namespace B makes a round trip.
fn two_nodes() -> Result<(), String> {
    let n = 1 << 16;
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let (_, inner) = adder(&mut top);
    let wa = add_remote_worker(&mut top, spec(ENV_A))
        .map_err(|e| e.to_string())?
        .id();
    let wb = add_remote_worker(&mut top, spec(ENV_B).chips(1)).map_err(|e| e.to_string())?;
    let wbid = wb.id();
    let x = top
        .shared_tensor_from(&[2 * n], &vec![1u64; 2 * n as usize])
        .map_err(|e| e.to_string())?;
    let xa = x.clone();
    let run = top.register_orchestration("run", move |o, _| {
        for (i, w) in [wa, wbid].into_iter().enumerate() {
            let v = xa.view().slice(0, i as u64 * n, (i as u64 + 1) * n)?;
            let mut a = TaskArgs::new();
            a.push_tensor(xa.arg_view(v, ArgTag::InOut)?)?;
            a.push_scalar(10 * (i as u64 + 1))?;
            o.submit_next_level(inner, &a, w)?;
        }
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    let t = Instant::now();
    for _ in 0..3 {
        top.run(&run, &TaskArgs::new()).map_err(|e| e.to_string())?;
    }
    println!(
        "  measured: 3 runs over veth ({} KiB each way per worker) in {:.2?}",
        n * 8 / 1024,
        t.elapsed()
    );
    let got = x.to_vec::<u64>().map_err(|e| e.to_string())?;
    let want: Vec<u64> = (0..2 * n).map(|i| if i < n { 31 } else { 61 }).collect();
    check(got == want, "sums over veth differ")?;
    let dev = wb
        .alloc(&mut top, 0, &[1 << 18], strata_types::DataType::U32)
        .map_err(|e| e.to_string())?;
    let bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
    wb.copy_to(&mut top, &dev, 0, &bytes)
        .map_err(|e| e.to_string())?;
    let mut back = vec![0u8; bytes.len() - 11];
    wb.copy_from(&mut top, &dev, 11, &mut back)
        .map_err(|e| e.to_string())?;
    check(back == bytes[11..], "device read-back over veth differs")?;
    wb.free(&mut top, dev).map_err(|e| e.to_string())?;
    top.close().map_err(|e| format!("close: {e}"))?;
    no_children()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL the node process.
    Kill,
    /// Reset the connection (`ss -K` on both ends).
    Reset,
    /// Blackhole every packet between R and A (iptables DROP inside A).
    Partition,
}

/// A long task runs on the node in A while an independent task ran on B; then the fault:
/// the run fails with an error naming worker A within the bound, the task downstream of
/// A's never runs, the level-4 worker closes, nothing is left.
fn mid_task_fault(dir: &Path, fault: Fault) -> Result<(), String> {
    let marker = dir.join(format!("started-{fault:?}"));
    let _ = std::fs::remove_file(&marker);
    let mut top = DistWorker::new(DistConfig::l4(1)).map_err(|e| e.to_string())?;
    let (add, inner) = adder(&mut top);
    let m2 = marker.clone();
    let long = top.register_orchestration("long", move |_, _| {
        // Runs on the node: say so (with the pid, for the kill), then wait, bounded.
        std::fs::write(&m2, std::process::id().to_string()).map_err(|e| e.to_string())?;
        let t = Instant::now();
        while t.elapsed() < LONG_TASK {
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    });
    let wa = add_remote_worker(&mut top, spec(ENV_A).heartbeat_timeout(HEARTBEAT))
        .map_err(|e| e.to_string())?
        .id();
    // Worker B keeps the default heartbeat timeout: only A's link is faulted, and a
    // loaded machine must not end B's session for a stall.
    let wb = add_remote_worker(&mut top, spec(ENV_B))
        .map_err(|e| e.to_string())?
        .id();
    let x = top
        .shared_tensor_from(&[4], &[0u64; 4])
        .map_err(|e| e.to_string())?;
    let y = top
        .shared_tensor_from(&[4], &[0u64; 4])
        .map_err(|e| e.to_string())?;
    let (xa, ya) = (x.clone(), y.clone());
    let run = top.register_orchestration("run", move |o, _| {
        let mut a = TaskArgs::new();
        a.push_tensor(xa.arg(ArgTag::InOut))?;
        a.push_scalar(1u64)?;
        o.submit_next_level(long, &a, wa)?;
        // Downstream of A's task: must never run.
        o.submit_sub(&add, &a)?;
        let mut b = TaskArgs::new();
        b.push_tensor(ya.arg(ArgTag::InOut))?;
        b.push_scalar(7u64)?;
        o.submit_next_level(inner, &b, wb)?;
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    let mut h = top
        .submit(&run, &TaskArgs::new())
        .map_err(|e| e.to_string())?;
    // Wait (bounded) until the node runs the long task.
    let t = Instant::now();
    let pid = loop {
        if let Ok(p) = std::fs::read_to_string(&marker) {
            if let Ok(p) = p.trim().parse::<i32>() {
                break p;
            }
        }
        if t.elapsed() > DETECT_BOUND {
            return Err("the long task never started on the node".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let (r, a) = (ns(0), ns(1));
    let t = Instant::now();
    match fault {
        Fault::Kill => {
            // SAFETY: kill(2) of the node process the daemon started for this case (the
            // namespaces share the pid namespace).
            let r = unsafe { libc::kill(pid, libc::SIGKILL) };
            check(r == 0, "kill the node")?
        }
        Fault::Reset => {
            in_ns(&r, &["ss", "-K", "dst", ADDR_A])?;
            in_ns(&a, &["ss", "-K", "dst", ADDR_R_A])?;
        }
        Fault::Partition => {
            in_ns(
                &a,
                &["iptables", "-I", "INPUT", "-s", ADDR_R_A, "-j", "DROP"],
            )?;
            in_ns(
                &a,
                &["iptables", "-I", "OUTPUT", "-d", ADDR_R_A, "-j", "DROP"],
            )?;
        }
    }
    let e = h
        .wait(Some(DETECT_BOUND))
        .err()
        .ok_or("the run should fail")?;
    let took = t.elapsed();
    let msg = e.to_string();
    println!("  measured: {fault:?}: the run failed {took:.2?} after the fault: {msg}");
    check(
        !matches!(e, DistError::WaitTimeout { .. }),
        format!("no error within {DETECT_BOUND:?}"),
    )?;
    check(
        matches!(e, DistError::TaskFailed(_)),
        format!("not TaskFailed: {msg}"),
    )?;
    check(
        msg.contains(&format!("worker {wa}"))
            && msg.contains("remote_worker")
            && msg.contains(ADDR_A),
        format!("does not name the remote worker: {msg}"),
    )?;
    if fault == Fault::Partition {
        check(
            msg.contains("no frame from the node"),
            format!("a partition is told as silence: {msg}"),
        )?;
    }
    check(
        x.to_vec::<u64>().map_err(|e| e.to_string())? == vec![0; 4],
        "the task downstream of the failed one ran",
    )?;
    check(
        y.to_vec::<u64>().map_err(|e| e.to_string())? == vec![7; 4],
        "worker B's independent task did not run",
    )?;
    let t = Instant::now();
    let closed = top.close();
    println!(
        "  measured: {fault:?}: closed in {:.2?} ({closed:?})",
        t.elapsed()
    );
    if fault == Fault::Partition {
        // Heal, so the driver's next session reaches daemon A.
        in_ns(&a, &["iptables", "-F"])?;
    }
    no_children()
}

// ----- a delaying relay (where the kernel has no netem) --------------------------------

/// A TCP relay for the slow-link case on a kernel without `netem`: listens on the
/// loopback of the namespace it runs in, prints `listening ADDR`, and relays every
/// connection to `target`, each chunk forwarded `delay` after it was read, in both
/// directions — a one-way delay on a real path. At most [`RELAY_CHUNKS`] chunks wait per
/// direction, so once the relay is full the sender is held back by TCP. It runs until it
/// is killed (the case kills and reaps it).
fn delay_proxy(target: &str, delay: Duration) {
    let Ok(listener) = std::net::TcpListener::bind("127.0.0.1:0") else {
        return;
    };
    let Ok(addr) = listener.local_addr() else {
        return;
    };
    println!("listening {addr}");
    let _ = std::io::stdout().flush();
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let Ok(server) = TcpStream::connect(target) else {
            continue;
        };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        for (from, to) in [(&client, &server), (&server, &client)] {
            let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                continue;
            };
            relay(from, to, delay);
        }
    }
}

/// Chunks a [`delay_proxy`] direction holds before it stops reading.
const RELAY_CHUNKS: usize = 64;

/// One direction of [`delay_proxy`]: a reader thread stamps each chunk, a writer thread
/// forwards it once its delay has passed; end of stream (or an error) is forwarded too.
fn relay(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let (tx, rx) = std::sync::mpsc::sync_channel::<(Instant, Vec<u8>)>(RELAY_CHUNKS);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(n) if n > 0 => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
                _ => {
                    let _ = tx.send((Instant::now() + delay, Vec::new()));
                    return;
                }
            }
        }
    });
    std::thread::spawn(move || {
        while let Ok((due, bytes)) = rx.recv() {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if bytes.is_empty() || to.write_all(&bytes).is_err() {
                let _ = to.shutdown(std::net::Shutdown::Write);
                return;
            }
        }
    });
}

/// A [`delay_proxy`] child of the case process, in its namespace, relaying to `target`.
struct DelayProxy {
    child: Child,
    addr: String,
}

impl DelayProxy {
    fn start(target: &str, delay: Duration) -> Result<DelayProxy, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .args(["--delay-proxy", target, &delay.as_millis().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start the delaying relay: {e}"))?;
        let mut line = String::new();
        let read = child
            .stdout
            .take()
            .ok_or("no stdout")
            .and_then(|out| BufReader::new(out).read_line(&mut line).map_err(|_| "read"));
        match (read, line.trim().strip_prefix("listening ")) {
            (Ok(_), Some(addr)) => Ok(DelayProxy {
                addr: addr.to_owned(),
                child,
            }),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                Err(format!("the delaying relay printed {line:?}"))
            }
        }
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether this kernel has `tc netem` (asked inside namespace `space`, on device `dev`,
/// by adding it and taking it away again).
fn has_netem(space: &str, dev: &str) -> Result<bool, String> {
    match in_ns(
        space,
        &[
            "tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "1ms",
        ],
    ) {
        Ok(_) => {
            in_ns(space, &["tc", "qdisc", "del", "dev", dev, "root"])?;
            Ok(true)
        }
        Err(e) if e.contains("unknown") => Ok(false),
        Err(e) => Err(e),
    }
}

/// A slow, lossy link: delay and loss with `tc netem` where the kernel has it, else a
/// one-way delay of 20 ms each way through a relay in the root's namespace
/// ([`delay_proxy`]), a rate limit (`tc tbf`) and random loss (`iptables -m statistic`).
/// Runs still give the right results; no heartbeat timeout fires.
fn slow_link() -> Result<(), String> {
    let n = 1u64 << 17;
    let (r, a) = (ns(0), ns(1));
    // Decided before the worker is built: without netem the session goes through the
    // relay (the node's process, started with the same arguments, builds the same
    // registrations and never gets here: its `init` serves).
    let netem = is_node() || has_netem(&r, "ra")?;
    let proxy = if netem {
        None
    } else {
        Some(DelayProxy::start(&env(ENV_A), Duration::from_millis(20))?)
    };
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let (_, inner) = adder(&mut top);
    let remote = match &proxy {
        Some(p) => RemoteSpec::new(p.addr.clone()).sub_workers(1),
        None => spec(ENV_A),
    };
    let w = add_remote_worker(&mut top, remote.chips(1)).map_err(|e| e.to_string())?;
    let wid = w.id();
    let x = top
        .shared_tensor_from(&[n], &vec![1u64; n as usize])
        .map_err(|e| e.to_string())?;
    let xa = x.clone();
    let run = top.register_orchestration("run", move |o, _| {
        let mut a = TaskArgs::new();
        a.push_tensor(xa.arg(ArgTag::InOut))?;
        a.push_scalar(2u64)?;
        o.submit_next_level(inner, &a, wid)?;
        Ok(())
    });
    top.init().map_err(|e| format!("init: {e}"))?;
    let mut how = "tc netem delay 20ms loss 1% on both ends".to_owned();
    for (space, dev) in [(&r, "ra"), (&a, "a0")] {
        if netem {
            in_ns(
                space,
                &[
                    "tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", "20ms", "loss",
                    "1%",
                ],
            )?;
        } else {
            // This kernel has no netem: the relay delays, tbf limits the rate, iptables
            // drops packets at random.
            how = "20 ms each way through a delaying relay + tc tbf rate 20mbit + iptables statistic 1% loss on both ends (this kernel has no netem)".into();
            in_ns(
                space,
                &[
                    "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", "20mbit", "burst",
                    "32kb", "latency", "400ms",
                ],
            )?;
            in_ns(
                space,
                &[
                    "iptables",
                    "-I",
                    "INPUT",
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    "0.01",
                    "-j",
                    "DROP",
                ],
            )?;
        }
    }
    let t = Instant::now();
    let mut first = None;
    for _ in 0..3 {
        top.run(&run, &TaskArgs::new())
            .map_err(|e| format!("a run over the slow link failed: {e}"))?;
        first.get_or_insert(t.elapsed());
    }
    // The delay is on the path: a run is at least one round trip of 2 × 20 ms.
    let first = first.unwrap_or_default();
    check(
        first >= Duration::from_millis(40),
        format!("a run over a link delayed 20 ms each way took only {first:?}"),
    )?;
    let dev = w
        .alloc(&mut top, 0, &[1 << 19], strata_types::DataType::U32)
        .map_err(|e| e.to_string())?;
    let bytes: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 251) as u8).collect();
    w.copy_to(&mut top, &dev, 0, &bytes)
        .map_err(|e| e.to_string())?;
    let mut back = vec![0u8; bytes.len()];
    w.copy_from(&mut top, &dev, 0, &mut back)
        .map_err(|e| e.to_string())?;
    println!(
        "  measured: slow link ({how}): 3 runs of 1 MiB each way and a 2 MiB device round trip in {:.2?} (the first run {first:.2?})",
        t.elapsed()
    );
    check(back == bytes, "device read-back over the slow link differs")?;
    check(
        x.to_vec::<u64>().map_err(|e| e.to_string())? == vec![7; n as usize],
        "sums over the slow link differ",
    )?;
    top.close().map_err(|e| format!("close: {e}"))?;
    drop(proxy);
    no_children()
}

fn expect_init_error(spec: RemoteSpec, needles: &[&str]) -> Result<(), String> {
    let mut top = DistWorker::new(DistConfig::l4(0)).map_err(|e| e.to_string())?;
    let _ = adder(&mut top);
    add_remote_worker(&mut top, spec).map_err(|e| e.to_string())?;
    let t = Instant::now();
    let e = top.init().err().ok_or("init should fail")?.to_string();
    println!("  measured: refused in {:.2?}: {e}", t.elapsed());
    check(t.elapsed() < DETECT_BOUND, "refused too late")?;
    for n in needles {
        check(e.contains(n), format!("{e:?} does not mention {n:?}"))?;
    }
    top.close().map_err(|e| e.to_string())?;
    no_children()
}

fn wrong_secret() -> Result<(), String> {
    let wrong =
        Secret::new(b"not-the-daemons-secret-at-all".to_vec()).map_err(|e| e.to_string())?;
    expect_init_error(
        spec(ENV_A).secret(wrong),
        &["remote_worker", ADDR_A, "secret"],
    )
}

fn wrong_build() -> Result<(), String> {
    expect_init_error(
        spec(ENV_OTHER),
        &[
            "remote_worker",
            ADDR_A,
            "no program with build-id",
            "--program",
        ],
    )
}

/// Reads until the daemon closes (bounded); what it sent must be nothing or frames.
fn refused(mut c: TcpStream, what: &str) -> Result<(), String> {
    c.set_read_timeout(Some(DETECT_BOUND))
        .map_err(|e| e.to_string())?;
    let t = Instant::now();
    let mut reply = Vec::new();
    let _ = c.read_to_end(&mut reply);
    println!("  measured: {what}: closed after {:.2?}", t.elapsed());
    check(
        t.elapsed() < DETECT_BOUND,
        format!("{what}: not closed in time"),
    )?;
    check(
        reply.is_empty() || strata_net::wire::decode_frame(&reply).is_ok(),
        format!("{what}: a reply that is not a frame"),
    )
}

fn bad_frames() -> Result<(), String> {
    if is_node() {
        return healthy_a();
    }
    let addr = env(ENV_A);
    use strata_net::wire::{encode, FrameType, Hello};
    let hello =
        encode(FrameType::Hello, 7, 1, &Hello { nonce: [3; 32] }).map_err(|e| e.to_string())?;
    // Garbage instead of HELLO.
    let mut c = TcpStream::connect(&addr).map_err(|e| e.to_string())?;
    c.write_all(&[0xAB; 64]).map_err(|e| e.to_string())?;
    refused(c, "garbage")?;
    // An oversized frame: refused before the body is read.
    let mut c = TcpStream::connect(&addr).map_err(|e| e.to_string())?;
    let mut big = hello.clone();
    big[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    c.write_all(&big[..32]).map_err(|e| e.to_string())?;
    refused(c, "oversized")?;
    // A corrupted frame: one body byte flipped, the checksum no longer matches.
    let mut c = TcpStream::connect(&addr).map_err(|e| e.to_string())?;
    let mut bad = hello.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0x40;
    c.write_all(&bad).map_err(|e| e.to_string())?;
    refused(c, "corrupted")?;
    // A truncated frame, then silence: dropped at the handshake deadline.
    let mut c = TcpStream::connect(&addr).map_err(|e| e.to_string())?;
    c.write_all(&hello[..20]).map_err(|e| e.to_string())?;
    refused(c, "truncated")?;
    // The daemon still serves.
    healthy_a()
}

fn silent_client() -> Result<(), String> {
    if is_node() {
        return healthy_a();
    }
    let silent = TcpStream::connect(env(ENV_A)).map_err(|e| e.to_string())?;
    // A full session meanwhile.
    healthy_a()?;
    refused(silent, "silent client")
}
