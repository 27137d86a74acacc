//! iceoryx2 peer of `cargo xtask bench mailbox`: the round trip of an 8-byte message
//! between two processes over two iceoryx2 publish-subscribe services ("ping" and
//! "pong"), both sides busy-polling their subscriber (no event / wait-set wake-ups), as
//! strata's mailbox spins while it waits. The parent (this process, pinned to CPU 0)
//! starts a copy of itself as the child (pinned to CPU 1), like the mailbox bench's
//! parent and forked child.
//!
//! Usage: `iceoryx2-pingpong <batches> <per_batch> <warmup> <pinned 0|1>`; prints, as its
//! last line, `<median ns> <min ns>` over the per-batch averages of the round-trip time.

use iceoryx2::prelude::*;
use std::time::{Duration, Instant};

type Pub = iceoryx2::port::publisher::Publisher<ipc::Service, u64, ()>;
type Sub = iceoryx2::port::subscriber::Subscriber<ipc::Service, u64, ()>;

const BOUND: Duration = Duration::from_secs(30);
const STOP: u64 = u64::MAX;

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; `cpu` is far below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The ports of one side: it publishes on `out` and subscribes to `inp`.
fn ports(node: &Node<ipc::Service>, tag: &str, out: &str, inp: &str) -> (Pub, Sub) {
    let service = |which: &str| {
        let name = format!("strata-bench/iceoryx2/{tag}/{which}");
        node.service_builder(&name.as_str().try_into().expect("service name"))
            .publish_subscribe::<u64>()
            .max_publishers(1)
            .max_subscribers(1)
            .subscriber_max_buffer_size(4)
            .history_size(0)
            .open_or_create()
            .expect("service")
    };
    let publisher = service(out)
        .publisher_builder()
        .create()
        .expect("publisher");
    let subscriber = service(inp)
        .subscriber_builder()
        .create()
        .expect("subscriber");
    (publisher, subscriber)
}

/// Busy-polls until a message arrives (None after `BOUND`).
fn recv(sub: &Sub) -> Option<u64> {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        // `has_samples` is the lighter poll; `receive` only once something is there.
        if sub.has_samples().expect("has_samples") {
            if let Some(s) = sub.receive().expect("receive") {
                return Some(*s);
            }
        }
        std::hint::spin_loop();
        spins = spins.wrapping_add(1);
        if spins % 4096 == 0 && start.elapsed() > BOUND {
            return None;
        }
    }
}

fn child(tag: &str, pinned: bool) {
    if pinned {
        pin(1);
    }
    let node = NodeBuilder::new().create::<ipc::Service>().expect("node");
    let (publisher, subscriber) = ports(&node, tag, "pong", "ping");
    loop {
        let Some(v) = recv(&subscriber) else {
            eprintln!("iceoryx2 child: no message for {BOUND:?}");
            std::process::exit(1);
        };
        publisher.send_copy(v).expect("send");
        if v == STOP {
            return;
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        return child(&args[2], args[3] == "1");
    }
    let num = |i: usize, default: usize| {
        args.get(i)
            .and_then(|a| a.parse::<usize>().ok())
            .unwrap_or(default)
    };
    let (batches, per_batch, warmup) = (num(1, 40), num(2, 1000), num(3, 20_000));
    let pinned = num(4, 1) == 1;
    let tag = format!("{}", std::process::id());
    let node = NodeBuilder::new().create::<ipc::Service>().expect("node");
    let (publisher, subscriber) = ports(&node, &tag, "ping", "pong");
    let mut kid = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args(["child", &tag, if pinned { "1" } else { "0" }])
        .spawn()
        .expect("child");
    if pinned {
        pin(0);
    }
    // Until the child's subscriber is connected a message can be lost: resend until the
    // first answer comes back, then drain.
    let start = Instant::now();
    'connect: loop {
        publisher.send_copy(0).expect("send");
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(1) {
            if subscriber.receive().expect("receive").is_some() {
                break 'connect;
            }
        }
        assert!(start.elapsed() < BOUND, "the iceoryx2 child never answered");
    }
    std::thread::sleep(Duration::from_millis(20));
    while subscriber.receive().expect("receive").is_some() {}
    let round = |i: u64| {
        publisher.send_copy(i).expect("send");
        let v = recv(&subscriber).expect("the iceoryx2 child stopped answering");
        debug_assert_eq!(v, i);
    };
    for i in 0..warmup as u64 {
        round(i + 1);
    }
    let mut per = Vec::with_capacity(batches);
    for b in 0..batches {
        let t = Instant::now();
        for i in 0..per_batch {
            round((b * per_batch + i) as u64 + 1);
        }
        per.push(t.elapsed().as_nanos() as f64 / per_batch as f64);
    }
    publisher.send_copy(STOP).expect("send");
    let _ = recv(&subscriber);
    let status = kid.wait().expect("wait");
    assert!(status.success(), "iceoryx2 child: {status}");
    per.sort_by(f64::total_cmp);
    let median = if per.is_empty() {
        f64::NAN
    } else if per.len() % 2 == 1 {
        per[per.len() / 2]
    } else {
        (per[per.len() / 2 - 1] + per[per.len() / 2]) / 2.0
    };
    println!(
        "{median:.1} {:.1}",
        per.first().copied().unwrap_or(f64::NAN)
    );
}
