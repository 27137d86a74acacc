//! `cargo xtask bench net`: strata-net's costs next to raw TCP over the same path
//! (loopback, `harness = false`; the binary is also the program the node daemon starts).
//!
//! 1. **Round trip** of one run with one no-op remote task — `DistWorker::run` on the
//!    level-4 root → its scheduler → TASK over TCP → the node's level-3 worker → an empty
//!    chip orchestration on its chip process → DONE back → the run completes — next to a
//!    raw TCP request/response (64-byte request, 32-byte reply, `TCP_NODELAY`) between
//!    this process and a server process, on the same loopback. Also measured, to split
//!    the figure: the remote task with an empty *host* orchestration (no chip behind it:
//!    the network and session share), the same on a node that has no chips at all (no
//!    emulator threads competing for the CPUs), and a parked two-thread hand-off (the unit
//!    of what the session's thread hand-offs add).
//! 2. **Bulk copy** throughput: `RemoteWorker::copy_to` / `copy_from` of `BULK` bytes
//!    between this process and a remote chip tensor, next to raw TCP streaming the same
//!    bytes one way (the server acknowledges the end with one byte, or sends them).
//! 3. **Tasks per second** with many in flight: a run of `MANY` independent no-op remote
//!    tasks on one remote worker, and split across two.
//!
//! Each part alternates its variants in `ROUNDS` rounds (A B, B A, …); a figure is the
//! median over the rounds, a ratio the median of the per-round ratios (strata / raw TCP).
//! Prints a table, then as its last line one JSON object: `remote_rtt_us`,
//! `remote_host_rtt_us`, `tcp_rtt_us`, `handoff_rtt_us` (two parked thread hand-offs, the
//! unit of what a round trip adds to raw TCP), `rtt_ratio` (round median; goal ≤ 1.3),
//! `host_rtt_ratio`, `bare_rtt_us` / `bare_rtt_ratio` (a node without chips: no emulator
//! threads on its side), `copy_to_gbps`, `copy_from_gbps`, `tcp_send_gbps`, `tcp_recv_gbps`,
//! `copy_to_ratio`, `copy_from_ratio` (goal ≥ 0.8), `tasks_per_s_1`, `tasks_per_s_2`,
//! `chip_tasks_per_s_1`, `rounds` and the `machine_` keys.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::time::Instant;
use strata_dist::{DistConfig, DistWorker, HostOrchHandle};
use strata_net::{add_remote_worker, RemoteSpec, RemoteWorker};
use strata_testkit::bench::{median, Json, Machine, Rounds, RoundsReport};
use strata_types::{DataType, TaskArgs};

const ROUNDS: usize = 5;
/// Round trips per round (after `RTT_WARMUP` once).
const RTT_RUNS: usize = 1_000;
const RTT_WARMUP: usize = 300;
/// Bytes of one bulk transfer.
const BULK: usize = 64 << 20;
/// Tasks of the many-in-flight run.
const MANY: usize = 2_000;

const ENV_DAEMON: &str = "STRATA_BENCH_NET_DAEMON";

/// What the root uses, built identically by the root and by every node (the node serves
/// from the `init` and never returns).
struct Top {
    top: DistWorker,
    w: [RemoteWorker; 2],
    chip_one: HostOrchHandle,
    host_one: HostOrchHandle,
    bare_one: HostOrchHandle,
    many_one: HostOrchHandle,
    many_two: HostOrchHandle,
    chip_many_one: HostOrchHandle,
}

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
    let spec = || RemoteSpec::new(daemon).chips(1);
    let w0 = add_remote_worker(&mut top, spec()).expect("remote worker 0");
    let w1 = add_remote_worker(&mut top, spec()).expect("remote worker 1");
    // A node without chips: no emulator threads on its side at all.
    let bare = add_remote_worker(&mut top, RemoteSpec::new(daemon))
        .expect("remote worker 2")
        .id();
    let bare_one = top.register_orchestration("bench.bare_one", move |o, _| {
        o.submit_next_level(noop, &TaskArgs::new(), bare)?;
        Ok(())
    });
    let (a, b) = (w0.id(), w1.id());
    let chip_one = top.register_orchestration("bench.chip_one", move |o, _| {
        o.submit_next_level(on_chip, &TaskArgs::new(), a)?;
        Ok(())
    });
    let host_one = top.register_orchestration("bench.host_one", move |o, _| {
        o.submit_next_level(noop, &TaskArgs::new(), a)?;
        Ok(())
    });
    let many_one = top.register_orchestration("bench.many_one", move |o, _| {
        for _ in 0..MANY {
            o.submit_next_level(noop, &TaskArgs::new(), a)?;
        }
        Ok(())
    });
    let many_two = top.register_orchestration("bench.many_two", move |o, _| {
        for i in 0..MANY {
            o.submit_next_level(noop, &TaskArgs::new(), if i % 2 == 0 { a } else { b })?;
        }
        Ok(())
    });
    let chip_many_one = top.register_orchestration("bench.chip_many_one", move |o, _| {
        for _ in 0..MANY {
            o.submit_next_level(on_chip, &TaskArgs::new(), a)?;
        }
        Ok(())
    });
    Top {
        top,
        w: [w0, w1],
        chip_one,
        host_one,
        bare_one,
        many_one,
        many_two,
        chip_many_one,
    }
}

// ----- the raw TCP peer (a process of its own, as the node is) -------------------------

/// Serves raw TCP on one connection: `p` + 63 bytes → 32 bytes; `s` + u64 n + n bytes →
/// 1 byte; `f` + u64 n → n bytes.
fn raw_server() -> ! {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    println!("{}", l.local_addr().expect("addr"));
    std::io::stdout().flush().expect("flush");
    let (mut c, _) = l.accept().expect("accept");
    c.set_nodelay(true).expect("nodelay");
    let mut buf = vec![0u8; 1 << 20];
    let mut kind = [0u8; 1];
    while c.read_exact(&mut kind).is_ok() {
        match kind[0] {
            b'p' => {
                c.read_exact(&mut buf[..63]).expect("ping");
                c.write_all(&buf[..32]).expect("pong");
            }
            b's' | b'f' => {
                let mut n = [0u8; 8];
                c.read_exact(&mut n).expect("length");
                let mut left = u64::from_le_bytes(n) as usize;
                while left > 0 {
                    let k = left.min(buf.len());
                    if kind[0] == b's' {
                        c.read_exact(&mut buf[..k]).expect("sink");
                    } else {
                        c.write_all(&buf[..k]).expect("source");
                    }
                    left -= k;
                }
                if kind[0] == b's' {
                    c.write_all(&[1]).expect("ack");
                }
            }
            _ => break,
        }
    }
    std::process::exit(0)
}

fn tcp_rtt(c: &mut TcpStream, n: usize) -> Vec<f64> {
    let req = [b'p'; 64];
    let mut rep = [0u8; 32];
    (0..n)
        .map(|_| {
            let t = Instant::now();
            c.write_all(&req).expect("ping");
            c.read_exact(&mut rep).expect("pong");
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

fn tcp_send(c: &mut TcpStream, buf: &[u8]) -> f64 {
    let t = Instant::now();
    c.write_all(b"s").expect("kind");
    c.write_all(&(buf.len() as u64).to_le_bytes())
        .expect("length");
    c.write_all(buf).expect("send");
    c.read_exact(&mut [0u8; 1]).expect("ack");
    buf.len() as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn tcp_receive(c: &mut TcpStream, buf: &mut [u8]) -> f64 {
    let t = Instant::now();
    c.write_all(b"f").expect("kind");
    c.write_all(&(buf.len() as u64).to_le_bytes())
        .expect("length");
    c.read_exact(buf).expect("receive");
    buf.len() as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// The cost of the thread hand-offs a remote round trip makes beyond raw TCP's: a
/// ping-pong between this thread and a parked helper thread over std channels (two
/// wake-ups per round trip, as many as a raw TCP request/response).
struct HandOff {
    ping: std::sync::mpsc::Sender<()>,
    pong: std::sync::mpsc::Receiver<()>,
}

impl HandOff {
    fn new() -> HandOff {
        let (ping, rx) = std::sync::mpsc::channel::<()>();
        let (tx, pong) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            while rx.recv().is_ok() {
                if tx.send(()).is_err() {
                    break;
                }
            }
        });
        HandOff { ping, pong }
    }

    fn rtt(&self, n: usize) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let t = Instant::now();
                self.ping.send(()).expect("ping");
                self.pong.recv().expect("pong");
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect()
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

fn start_daemon(dir: &std::path::Path) -> (Child, String) {
    let secret = dir.join("secret");
    std::fs::write(&secret, "bench-net-secret-0123456789abcdef\n").expect("secret");
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

fn main() {
    if std::env::args().any(|a| a == "--raw-server") {
        raw_server();
    }
    if std::env::var_os(strata_net::ENV_NODE_WORKER).is_some() {
        // A node the daemon started: the same registrations, then `init` serves.
        let mut t = build(&std::env::var(ENV_DAEMON).unwrap_or_default());
        let _ = t.top.init();
        std::process::exit(1);
    }
    let machine = Machine::now();
    let dir = std::env::temp_dir().join(format!("strata-bench-net-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (daemon, addr) = start_daemon(&dir);
    let daemon = Daemon(daemon);
    std::env::set_var(ENV_DAEMON, &addr);
    let mut server = Command::new(std::env::current_exe().expect("exe"))
        .arg("--raw-server")
        .stdout(Stdio::piped())
        .spawn()
        .expect("raw server");
    let mut line = String::new();
    BufReader::new(server.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("server address");
    let raw = TcpStream::connect(line.trim()).expect("connect raw");
    raw.set_nodelay(true).expect("nodelay");

    let mut t = build(&addr);
    t.top.init().expect("init");
    let Top {
        top,
        w,
        chip_one,
        host_one,
        bare_one,
        many_one,
        many_two,
        chip_many_one,
    } = &mut t;
    let top = std::cell::RefCell::new(top);
    let raw = std::cell::RefCell::new(raw);

    // `STRATA_BENCH_ONLY=rtt|bulk|many` runs one part (the others print NaN / null).
    let only = std::env::var("STRATA_BENCH_ONLY").unwrap_or_default();
    let want = |part: &str| only.is_empty() || only == part;
    let rounds = |part: &str| Rounds::new(if want(part) { ROUNDS } else { 1 });
    let nan = |part: &str, f: &mut dyn FnMut() -> f64| if want(part) { f() } else { f64::NAN };

    // 1. round trips.
    if want("rtt") {
        tcp_rtt(&mut raw.borrow_mut(), RTT_WARMUP);
        runs(&mut top.borrow_mut(), chip_one, RTT_WARMUP);
        runs(&mut top.borrow_mut(), host_one, RTT_WARMUP);
        runs(&mut top.borrow_mut(), bare_one, RTT_WARMUP);
    }
    let hand = HandOff::new();
    let rtt = rounds("rtt")
        .variant("raw TCP request/response", || {
            nan("rtt", &mut || {
                median(&tcp_rtt(&mut raw.borrow_mut(), RTT_RUNS))
            })
        })
        .variant("two thread hand-offs (parked)", || {
            nan("rtt", &mut || median(&hand.rtt(RTT_RUNS)))
        })
        .variant("remote task -> chip, round trip", || {
            nan("rtt", &mut || {
                median(&runs(&mut top.borrow_mut(), chip_one, RTT_RUNS))
            })
        })
        .variant("remote task (host orch only)", || {
            nan("rtt", &mut || {
                median(&runs(&mut top.borrow_mut(), host_one, RTT_RUNS))
            })
        })
        .variant("remote task, node without chips", || {
            nan("rtt", &mut || {
                median(&runs(&mut top.borrow_mut(), bare_one, RTT_RUNS))
            })
        })
        .baseline("raw TCP request/response")
        .run();

    // 2. bulk.
    let dev = w[0]
        .alloc(&mut top.borrow_mut(), 0, &[BULK as u64], DataType::U8)
        .expect("remote tensor");
    let src: Vec<u8> = (0..BULK).map(|i| (i % 251) as u8).collect();
    let back = std::cell::RefCell::new(vec![0u8; BULK]);
    let gbps = |t: Instant| BULK as f64 / t.elapsed().as_secs_f64() / 1e9;
    let bulk = rounds("bulk")
        .warmup(usize::from(want("bulk")))
        .variant("raw TCP send", || {
            nan("bulk", &mut || tcp_send(&mut raw.borrow_mut(), &src))
        })
        .variant("copy_to", || {
            nan("bulk", &mut || {
                let t0 = Instant::now();
                w[0].copy_to(&mut top.borrow_mut(), &dev, 0, &src)
                    .expect("copy_to");
                gbps(t0)
            })
        })
        .variant("raw TCP receive", || {
            nan("bulk", &mut || {
                tcp_receive(&mut raw.borrow_mut(), &mut back.borrow_mut())
            })
        })
        .variant("copy_from", || {
            nan("bulk", &mut || {
                let t0 = Instant::now();
                w[0].copy_from(&mut top.borrow_mut(), &dev, 0, &mut back.borrow_mut())
                    .expect("copy_from");
                gbps(t0)
            })
        })
        .baseline("raw TCP send")
        .run();
    if want("bulk") {
        let mut back = back.into_inner();
        w[0].copy_from(&mut top.borrow_mut(), &dev, 0, &mut back)
            .expect("copy_from");
        assert!(back == src, "the bulk copy's bytes differ");
    }
    w[0].free(&mut top.borrow_mut(), dev).expect("free");

    // 3. many in flight.
    let per_s = |orch: &HostOrchHandle| {
        let t0 = Instant::now();
        top.borrow_mut().run(orch, &TaskArgs::new()).expect("run");
        MANY as f64 / t0.elapsed().as_secs_f64()
    };
    let many = rounds("many")
        .warmup(usize::from(want("many")))
        .variant("noop tasks/s, 1 remote worker", || {
            nan("many", &mut || per_s(many_one))
        })
        .variant("noop tasks/s, 2 remote workers", || {
            nan("many", &mut || per_s(many_two))
        })
        .variant("chip tasks/s, 1 remote worker", || {
            nan("many", &mut || per_s(chip_many_one))
        })
        .baseline("noop tasks/s, 1 remote worker")
        .run();

    let top = top.into_inner();
    top.close().expect("close");
    drop(raw);
    let _ = server.wait();
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);

    println!("{}", machine.line());
    println!("\n1. round trip (µs), vs raw TCP over loopback");
    print!("{}", rtt.table("µs", 1));
    println!("\n2. bulk {} MiB (GB/s)", BULK >> 20);
    print!("{}", bulk.table("GB/s", 3));
    println!("\n3. {MANY} tasks in flight in one run (tasks/s)");
    print!("{}", many.table("tasks/s", 0));
    let ratio = |r: &RoundsReport, a: &str, b: &str| r.ratio_median_vs(a, b);
    let mut j = Json::new();
    j.num(
        "remote_rtt_us",
        rtt.median("remote task -> chip, round trip"),
        2,
    )
    .num(
        "remote_host_rtt_us",
        rtt.median("remote task (host orch only)"),
        2,
    )
    .num("tcp_rtt_us", rtt.median("raw TCP request/response"), 2)
    .num(
        "handoff_rtt_us",
        rtt.median("two thread hand-offs (parked)"),
        2,
    )
    .num(
        "rtt_ratio",
        rtt.ratio_median("remote task -> chip, round trip"),
        3,
    )
    .num(
        "host_rtt_ratio",
        rtt.ratio_median("remote task (host orch only)"),
        3,
    )
    .num(
        "bare_rtt_us",
        rtt.median("remote task, node without chips"),
        2,
    )
    .num(
        "bare_rtt_ratio",
        rtt.ratio_median("remote task, node without chips"),
        3,
    )
    .num("copy_to_gbps", bulk.median("copy_to"), 3)
    .num("copy_from_gbps", bulk.median("copy_from"), 3)
    .num("tcp_send_gbps", bulk.median("raw TCP send"), 3)
    .num("tcp_recv_gbps", bulk.median("raw TCP receive"), 3)
    .num("copy_to_ratio", ratio(&bulk, "copy_to", "raw TCP send"), 3)
    .num(
        "copy_from_ratio",
        ratio(&bulk, "copy_from", "raw TCP receive"),
        3,
    )
    .num(
        "tasks_per_s_1",
        many.median("noop tasks/s, 1 remote worker"),
        0,
    )
    .num(
        "tasks_per_s_2",
        many.median("noop tasks/s, 2 remote workers"),
        0,
    )
    .num(
        "chip_tasks_per_s_1",
        many.median("chip tasks/s, 1 remote worker"),
        0,
    )
    .int("rounds", ROUNDS as u64)
    .machine(&machine);
    println!("{}", j.line());
}
