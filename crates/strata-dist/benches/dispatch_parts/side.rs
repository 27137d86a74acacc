//! The side-by-side parts of `cargo xtask bench dispatch` added for issue 15: strata's
//! own mailbox round trip (the goal's yardstick for an L3 round trip), the graph core
//! running the same DAGs (the yardstick for Process-mode µs per task), six bare forks
//! (the yardstick for `init`), and the Python peers (`multiprocessing` and Ray).

use super::{Dag, CHAIN, FAN_ROUNDS, FAN_WIDTH, TILE, WAVE};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use strata_graph::{
    graph, Access, BufferKey, Footprint, GraphConfig, KeySpace, Orchestrator, Scheduler, TaskRef,
    TaskSpec,
};
use strata_mailbox::{
    encode_args_blob, Child, ChildProcess, EncodedConfig, FailureReport, FrameIdentity, Handler,
    Mailbox, Parent, ServeExit, TaskPublication, TaskRequest, TaskSlot, WaitOptions,
};
use strata_testkit::bench::{fork, median, pin, reap};
use strata_testkit::peer;
use strata_types::{ArgTag, CallableId, DataType, IdentityMinter, TaskArgs, TensorView};

// ----- the mailbox round trip ----------------------------------------------------------

const MB_WARMUP: usize = 20_000;
const MB_BATCHES: usize = 40;
const MB_PER_BATCH: usize = 1_000;

struct NoOp;

impl Handler for NoOp {
    fn task(&mut self, _req: &TaskRequest<'_>) -> Result<(), FailureReport> {
        Ok(())
    }
}

/// Per-batch average round trips (µs) of a no-op task through a strata mailbox to a
/// forked child (publish, wait for done, reset), pinned to CPU 0 / CPU 1 as the floor
/// is: what `cargo xtask bench mailbox` measures.
pub fn mailbox_rtt(pinned: bool) -> Vec<f64> {
    let saved = strata_testkit::bench::affinity();
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
    let blob = encode_args_blob(&TaskArgs::new()).expect("encode");
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
        parent
            .wait_task(TaskSlot::Slot0, &opts, &mut live)
            .expect("completion");
        parent.reset(TaskSlot::Slot0).expect("reset");
    };
    for _ in 0..MB_WARMUP {
        round(&mut parent);
    }
    let mut out = Vec::with_capacity(MB_BATCHES);
    for _ in 0..MB_BATCHES {
        let t = Instant::now();
        for _ in 0..MB_PER_BATCH {
            round(&mut parent);
        }
        out.push(t.elapsed().as_secs_f64() * 1e6 / MB_PER_BATCH as f64);
    }
    parent.request_shutdown();
    assert_eq!(
        reap(child, Duration::from_secs(30)),
        Some(0),
        "mailbox child"
    );
    if let Some(s) = saved {
        strata_testkit::bench::restore_affinity(&s);
    }
    out
}

// ----- six forks -------------------------------------------------------------------------

/// Milliseconds to fork `n` children that exit at once and reap them all: the bare
/// process cost of a worker with `n` children.
pub fn forks_ms(n: usize) -> f64 {
    let t = Instant::now();
    let pids: Vec<i32> = (0..n).map(|_| fork(|| 0)).collect();
    for pid in pids {
        assert_eq!(reap(pid, Duration::from_secs(30)), Some(0), "forked child");
    }
    t.elapsed().as_secs_f64() * 1e3
}

// ----- the graph core on the same DAGs ---------------------------------------------------

/// The access lists of `dag` as the L3 bench submits them (slices and tiles of one
/// buffer where it uses views of one tensor), for strata-graph directly.
pub fn core_tasks(dag: Dag) -> Vec<Vec<Access>> {
    let m = IdentityMinter::new();
    let key = || BufferKey::new(m.mint(), KeySpace::Host);
    let whole = |k: BufferKey, tag: ArgTag| Access::new(k, Footprint::WHOLE, tag);
    let mut tasks = Vec::with_capacity(dag.tasks());
    match dag {
        Dag::Chain => {
            let x = key();
            tasks.resize(CHAIN, vec![whole(x, ArgTag::InOut)]);
        }
        Dag::Fan => {
            let (x, ys) = (key(), key());
            let y = TensorView::contiguous(DataType::U64, &[FAN_WIDTH as u64]).expect("y");
            for _ in 0..FAN_ROUNDS {
                tasks.push(vec![whole(x, ArgTag::InOut)]);
                for i in 0..FAN_WIDTH as u64 {
                    let v = y.slice(0, i, i + 1).expect("slice");
                    tasks.push(vec![
                        whole(x, ArgTag::Input),
                        Access::new(ys, Footprint::of_view(&v), ArgTag::OutputExisting),
                    ]);
                }
                tasks.push(vec![
                    Access::new(ys, Footprint::of_view(&y), ArgTag::Input),
                    whole(x, ArgTag::InOut),
                ]);
            }
        }
        Dag::Wavefront | Dag::WavefrontSep => {
            let (n, b) = (WAVE as u64, TILE);
            let grid = TensorView::contiguous(DataType::U64, &[n * b, n * b]).expect("grid");
            let one = key();
            let own: Vec<BufferKey> = (0..n * n).map(|_| key()).collect();
            let tile = |i: u64, j: u64, tag: ArgTag| {
                if dag == Dag::WavefrontSep {
                    return whole(own[(i * n + j) as usize], tag);
                }
                let v = grid.window(&[i * b, j * b], &[b, b]).expect("tile");
                Access::new(one, Footprint::of_view(&v), tag)
            };
            for i in 0..n {
                for j in 0..n {
                    let mut a = Vec::with_capacity(3);
                    if i > 0 {
                        a.push(tile(i - 1, j, ArgTag::Input));
                    }
                    if j > 0 {
                        a.push(tile(i, j - 1, ArgTag::Input));
                    }
                    a.push(tile(i, j, ArgTag::OutputExisting));
                    tasks.push(a);
                }
            }
        }
    }
    tasks
}

/// strata-graph alone on one thread: submit the whole run, then claim and complete every
/// task in dependency order. µs per task of the whole run.
pub struct Core {
    tasks: Vec<Vec<Access>>,
    orch: Orchestrator<()>,
    sched: Scheduler<()>,
}

impl Core {
    pub fn new(dag: Dag) -> Core {
        let (orch, sched) = graph::<()>(GraphConfig::default()).expect("graph");
        Core {
            tasks: core_tasks(dag),
            orch,
            sched,
        }
    }

    pub fn run(&mut self) -> f64 {
        let (orch, sched) = (&mut self.orch, &mut self.sched);
        let t = Instant::now();
        let run = orch.begin_run().expect("begin");
        let mut queue: VecDeque<TaskRef> = VecDeque::new();
        for a in &self.tasks {
            let s = orch.submit(TaskSpec::new((), a)).expect("submit");
            if s.ready {
                queue.push_back(s.task);
            }
        }
        orch.close_run().expect("close");
        let mut newly = Vec::new();
        let mut done = 0;
        while let Some(task) = queue.pop_front() {
            if sched.claim(task).is_some() {
                sched.complete(task, Ok(()), &mut newly).expect("complete");
                done += 1;
                queue.extend(newly.drain(..).map(|r| r.task));
            }
        }
        assert_eq!(orch.wait_run(run, None).expect("wait"), Some(Ok(())));
        let us = t.elapsed().as_secs_f64() * 1e6 / self.tasks.len() as f64;
        assert_eq!(done, self.tasks.len());
        orch.release_run(run).expect("release");
        us
    }
}

// ----- Python peers ------------------------------------------------------------------------

/// Round trips and chain length each Python peer measures per launch; Ray's are
/// shorter (its round trip is ~1 ms).
pub const PY_RTT: usize = 2_000;
pub const PY_CHAIN_REPS: usize = 3;
pub const RAY_RTT: usize = 300;

/// A Python peer: its name in the table and JSON, the interpreter, the mode argument.
pub struct PyPeer {
    pub name: &'static str,
    pub python: PathBuf,
    pub mode: &'static str,
    pub rtt_runs: usize,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers/dispatch_peers.py")
}

/// The Python peers that can run here, and why each missing one is missing.
pub fn py_peers() -> (Vec<PyPeer>, Vec<(&'static str, String)>) {
    let mut ok = vec![];
    let mut missing = vec![];
    let base = std::env::var("STRATA_PYTHON").unwrap_or_else(|_| "python3".into());
    if peer::runs_ok(&base, &["-c", "import multiprocessing"]) {
        for (name, mode) in [("mp_pipe", "pipe"), ("mp_pool", "pool")] {
            ok.push(PyPeer {
                name,
                python: PathBuf::from(&base),
                mode,
                rtt_runs: PY_RTT,
            });
        }
    } else {
        let why = format!("`{base}` with multiprocessing not found (Debian: python3)");
        missing.push(("mp_pipe", why.clone()));
        missing.push(("mp_pool", why));
    }
    match peer::python_venv("ray", &["ray==2.60.0"], "import ray") {
        Ok(python) => ok.push(PyPeer {
            name: "ray",
            python,
            mode: "ray",
            rtt_runs: RAY_RTT,
        }),
        Err(why) => missing.push(("ray", why)),
    }
    (ok, missing)
}

impl PyPeer {
    /// One launch: (µs per round trip, µs per chain task), NaN where it failed.
    pub fn measure(&self) -> (f64, f64) {
        let out = peer::run_peer(
            Command::new(&self.python)
                .arg(script())
                .arg(self.mode)
                .arg(self.rtt_runs.to_string())
                .arg(CHAIN.to_string())
                .arg(PY_CHAIN_REPS.to_string()),
        );
        match out {
            Ok(o) => {
                let kv = peer::key_values(&o);
                let get = |k: &str| kv.get(k).copied().unwrap_or(f64::NAN);
                (get("rtt_us"), get("chain_us"))
            }
            Err(e) => {
                eprintln!("{} peer failed: {e}", self.name);
                (f64::NAN, f64::NAN)
            }
        }
    }
}

/// The median of per-round ratios `a[i] / b[i]` (NaN if none is finite).
pub fn ratio_median(a: &[f64], b: &[f64]) -> f64 {
    let r: Vec<f64> = a
        .iter()
        .zip(b)
        .map(|(x, y)| x / y)
        .filter(|x| x.is_finite())
        .collect();
    median(&r)
}
