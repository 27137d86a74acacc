//! Mailbox round-trip benchmark (`harness = false`; `cargo xtask bench mailbox`).
//!
//! 1. **Floor**: two processes (fork) ping-pong one cache-line flag in a `MAP_SHARED`
//!    page, both spinning, pinned to CPU 0 and CPU 1.
//! 2. **Mailbox**: the child serves a no-op task handler; the parent publishes a task into
//!    task frame 0, waits for `TASK_DONE` (it spins: the default 50 µs spin budget is far
//!    above the round trip), and resets the frame to IDLE.
//! 3. **iceoryx2** (the peer): the same parent/child shape with the iceoryx2 crate, an
//!    8-byte ping-pong over two publish-subscribe services, both sides busy-polling
//!    (`benches/peers/iceoryx2`, its own cargo workspace, built here with
//!    `cargo build --release` into `target/peers/iceoryx2` on first use; one launch
//!    per round, pinned like the others). If it cannot be built the bench says why and
//!    its figures are `null`. Goal (issue 15): strata's mailbox no slower than iceoryx2
//!    (`ratio_vs_iceoryx2` ≤ 1).
//! 4. **Idle CPU**: the child sits parked in its serve loop for one idle second; its CPU
//!    time over that second (from `/proc/<pid>/schedstat`, nanoseconds; cross-checked
//!    with utime+stime from `/proc/<pid>/stat`) as a percentage of one core.
//!
//! Floor, mailbox and iceoryx2 alternate in `ROUNDS` rounds (floor, mailbox, mailbox, floor, …: a
//! fresh child each time), each timing `BATCHES / ROUNDS` batches; a round's figure is the
//! median of its per-batch averages. Reported: each side's median over the rounds (and
//! the minimum batch), the ratio of the two medians, and the median of the per-round
//! ratios. The idle measurement runs once, after the rounds. Prints the machine (CPU model,
//! load average), a table, then as its very last line one JSON object:
//! `{"rtt_ns_median": .., "floor_rtt_ns_median": .., "ratio": .., "idle_cpu_percent": ..,
//! "ratio_round_median": .., "rounds": .., "machine_…": ..}`.

// The mailbox API is compiled out under `--cfg loom` (only the protocol core is
// model-checked there), so this binary is empty in that configuration.
#[cfg(not(loom))]
mod bench {

    use std::time::{Duration, Instant};
    use strata_mailbox::*;
    use strata_types::{CallableId, TaskArgs};

    const BATCHES: usize = 200;
    const PER_BATCH: usize = 1000;
    const WARMUP: usize = 20_000;
    /// Floor, mailbox and iceoryx2 alternate in this many rounds of `BATCHES / ROUNDS`
    /// batches each.
    const ROUNDS: usize = 5;
    const ICE: &str = "iceoryx2: 8-byte ping-pong RTT";

    use std::path::{Path, PathBuf};
    use std::process::Command;
    use strata_testkit::bench::{fork, median, min, pin, reap, FloorSpec, Json, Machine, Rounds};
    use strata_testkit::peer;

    /// Builds the iceoryx2 peer (its own cargo workspace under `benches/peers/iceoryx2`)
    /// into `<target>/peers/iceoryx2`; the program, or why it cannot be had.
    fn build_iceoryx2() -> Result<PathBuf, String> {
        let manifest =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers/iceoryx2/Cargo.toml");
        let target = peer::target_dir().join("peers/iceoryx2");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        println!("iceoryx2 peer: cargo build --release (the first build takes minutes) ...");
        peer::run_peer(
            Command::new(&cargo)
                .args(["build", "--release", "-q", "--manifest-path"])
                .arg(&manifest)
                .arg("--target-dir")
                .arg(&target)
                .env_remove("RUSTFLAGS"),
        )
        .map_err(|e| format!("building benches/peers/iceoryx2 failed: {e}"))?;
        let exe = target.join("release/iceoryx2-pingpong");
        if exe.exists() {
            Ok(exe)
        } else {
            Err(format!("{} was not built", exe.display()))
        }
    }

    /// One launch of the iceoryx2 peer: the median of its per-batch average RTTs (ns).
    fn iceoryx2(exe: &Path, pinned: bool, batches: usize) -> f64 {
        peer::run_peer(Command::new(exe).args([
            batches.to_string(),
            PER_BATCH.to_string(),
            WARMUP.to_string(),
            u8::from(pinned).to_string(),
        ]))
        .map(|o| peer::last_line_numbers(&o))
        .ok()
        .and_then(|v| v.first().copied())
        .unwrap_or(f64::NAN)
    }

    /// Per-batch average RTTs (ns) of a raw cache-line ping-pong between two processes.
    fn floor(pinned: bool, batches: usize) -> Vec<f64> {
        let spec = FloorSpec {
            warmup: WARMUP,
            batches,
            per_batch: PER_BATCH,
        };
        strata_testkit::bench::pingpong_floor_ns(pinned, spec)
    }

    struct NoOp;

    impl Handler for NoOp {
        fn task(&mut self, _req: &TaskRequest<'_>) -> Result<(), FailureReport> {
            Ok(())
        }
    }

    /// CPU time of a process in ns: `/proc/<pid>/schedstat` (precise) and utime+stime from
    /// `/proc/<pid>/stat` (clock ticks, converted).
    fn cpu_ns(pid: i32) -> (Option<u64>, Option<u64>) {
        (
            strata_testkit::schedstat_ns(pid),
            strata_testkit::stat_cpu_ns(pid),
        )
    }

    struct MailboxFigures {
        batches: Vec<f64>,
        idle_percent: f64,
        idle_percent_ticks: Option<f64>,
    }

    /// `batches` timed batches of round trips with a fresh child; with `idle`, then the
    /// child's CPU over one idle second (NaN otherwise).
    fn mailbox(pinned: bool, batches: usize, idle: bool) -> MailboxFigures {
        let mb = Mailbox::create().expect("a mailbox");
        let child_mb = mb.try_clone().expect("a second mapping");
        let me = std::process::id();
        let child = fork(move || {
            if pinned {
                pin(1);
            }
            let mut c = Child::with_parent(child_mb, me);
            if c.init_ready(0).is_err() {
                return 3;
            }
            match c.serve(&mut NoOp) {
                Ok(ServeExit::Shutdown) => 0,
                _ => 4,
            }
        });
        if pinned {
            pin(0);
        }
        let mut live = ChildProcess::new(child);
        let mut parent = Parent::new(mb);
        let opts = WaitOptions::default();
        parent.wait_init(&opts, &mut live).expect("child ready");

        let config = EncodedConfig::default();
        let mut args = TaskArgs::new();
        args.push_scalar(1u64).expect("one scalar");
        let blob = encode_args_blob(&args).expect("encode");
        let callable = CallableId([0x5a; 32]);
        let mut dispatch = 0u64;
        let mut round = |parent: &mut Parent| {
            dispatch += 1;
            let id = FrameIdentity {
                run_id: 1,
                lease_slot: 0,
                lease_generation: 1,
                dispatch_id: dispatch,
            };
            let task = TaskPublication::run(callable, id, &config, &blob);
            parent.publish(TaskSlot::Slot0, &task).expect("publish");
            let done = parent
                .wait_task(TaskSlot::Slot0, &opts, &mut live)
                .expect("completion");
            debug_assert!(done.outcome.is_ok());
            parent.reset(TaskSlot::Slot0).expect("reset");
        };
        for _ in 0..WARMUP {
            round(&mut parent);
        }
        let mut timed = Vec::with_capacity(batches);
        for _ in 0..batches {
            let t = Instant::now();
            for _ in 0..PER_BATCH {
                round(&mut parent);
            }
            timed.push(t.elapsed().as_nanos() as f64 / PER_BATCH as f64);
        }
        let batches = timed;
        if !idle {
            parent.request_shutdown();
            assert_eq!(
                reap(child, Duration::from_secs(30)),
                Some(0),
                "mailbox child"
            );
            return MailboxFigures {
                batches,
                idle_percent: f64::NAN,
                idle_percent_ticks: None,
            };
        }

        // Idle: let the child fall through its spin budget and park, then measure 1 s.
        std::thread::sleep(Duration::from_millis(50));
        let (s0, t0) = cpu_ns(child);
        let w0 = Instant::now();
        std::thread::sleep(Duration::from_secs(1));
        let (s1, t1) = cpu_ns(child);
        let wall = w0.elapsed().as_nanos() as f64;
        let pct =
            |a: Option<u64>, b: Option<u64>| Some((b?.saturating_sub(a?)) as f64 / wall * 100.0);
        let idle_percent_ticks = pct(t0, t1);
        let idle_percent = pct(s0, s1).or(idle_percent_ticks).unwrap_or(f64::NAN);

        parent.request_shutdown();
        let exit = reap(child, Duration::from_secs(30));
        assert_eq!(exit, Some(0), "mailbox child");
        MailboxFigures {
            batches,
            idle_percent,
            idle_percent_ticks,
        }
    }

    pub fn main() {
        let machine = Machine::now();
        let pinned = machine.cpus >= 2 && pin(0);
        let started = Instant::now();
        let per_round = BATCHES / ROUNDS;
        let (mut fl, mut mbx_batches) = (Vec::new(), Vec::new());
        let ice = build_iceoryx2();
        if let Err(why) = &ice {
            println!("iceoryx2 peer skipped: {why}");
        }
        let mut rounds = Rounds::new(ROUNDS)
            .variant("floor: cache-line ping-pong RTT", || {
                let b = floor(pinned, per_round);
                fl.extend_from_slice(&b);
                median(&b)
            })
            .variant("mailbox: no-op task RTT", || {
                let b = mailbox(pinned, per_round, false).batches;
                mbx_batches.extend_from_slice(&b);
                median(&b)
            })
            .baseline("floor: cache-line ping-pong RTT");
        if let Ok(exe) = &ice {
            rounds = rounds.variant(ICE, move || iceoryx2(exe, pinned, per_round));
        }
        let report = rounds.run();
        let has_ice = report.names().iter().any(|n| n == ICE);
        let ice_med = has_ice
            .then(|| report.median(ICE))
            .filter(|v| v.is_finite());
        let vs_ice = ice_med
            .map(|_| report.ratio_median_vs("mailbox: no-op task RTT", ICE))
            .filter(|v| v.is_finite());
        let mbx = mailbox(pinned, 0, true);
        let floor_min = min(&fl);
        let mbx_min = min(&mbx_batches);
        let floor_med = report.median("floor: cache-line ping-pong RTT");
        let rtt_med = report.median("mailbox: no-op task RTT");
        let ratio = rtt_med / floor_med;
        let ratio_rounds = report.ratio_median("mailbox: no-op task RTT");

        println!();
        println!("{}", machine.line());
        println!(
            "strata-mailbox round trip: parent and forked child{}",
            if pinned {
                ", pinned to CPU 0 / CPU 1"
            } else {
                " (not pinned: fewer than 2 CPUs)"
            }
        );
        println!("{ROUNDS} rounds alternating floor and mailbox, each {per_round} batches x {PER_BATCH} round trips after {WARMUP} warm-up round trips; a round's figure is the median of its per-batch averages");
        println!();
        print!("{}", report.table("ns", 1));
        println!();
        println!("{:<46} {:>10} {:>10}", "measurement", "median", "min batch");
        println!(
            "{:<46} {:>7.0} ns {:>7.0} ns",
            "floor: cache-line ping-pong RTT (spinning)", floor_med, floor_min
        );
        println!(
            "{:<46} {:>7.0} ns {:>7.0} ns",
            "mailbox: no-op task RTT (publish/wait/reset)", rtt_med, mbx_min
        );
        println!(
            "{:<46} {:>10.2}",
            "ratio mailbox / floor (goal <= 1.5)", ratio
        );
        println!(
            "{:<46} {:>10.2}",
            "  median of the per-round ratios", ratio_rounds
        );
        match (ice_med, vs_ice) {
            (Some(i), Some(r)) => {
                println!(
                    "{:<46} {:>7.0} ns",
                    "iceoryx2: 8-byte ping-pong RTT (busy-poll)", i
                );
                println!(
                    "{:<46} {:>10.2} ({})",
                    "mailbox / iceoryx2, per-round median (goal <= 1)",
                    r,
                    if r <= 1.0 { "met" } else { "missed" }
                );
            }
            _ => println!("{:<46} {:>10}", "iceoryx2", "null (see above)"),
        }
        println!(
            "{:<46} {:>9.3} %",
            "idle child CPU over 1 s (goal <= 1 %)", mbx.idle_percent
        );
        if let Some(t) = mbx.idle_percent_ticks {
            println!(
                "{:<46} {:>9.3} %",
                "  same from utime+stime (clock-tick resolution)", t
            );
        }
        println!("total bench time {:.1} s", started.elapsed().as_secs_f64());
        let mut json = Json::new();
        json.num("rtt_ns_median", rtt_med, 1)
            .num("floor_rtt_ns_median", floor_med, 1)
            .num("ratio", ratio, 3)
            .num("idle_cpu_percent", mbx.idle_percent, 3)
            .num("ratio_round_median", ratio_rounds, 3)
            .opt("iceoryx2_rtt_ns_median", ice_med, 1)
            .opt("ratio_vs_iceoryx2", vs_ice, 3)
            .int("rounds", report.rounds() as u64)
            .machine(&machine);
        println!("{}", json.line());
    }
}

fn main() {
    #[cfg(not(loom))]
    bench::main();
}
