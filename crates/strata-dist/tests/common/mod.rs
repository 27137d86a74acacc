//! Fixtures shared by strata-dist's suites (`processes.rs`, `threads.rs` and the
//! contracts both run): the execution modes as suite variants, worker constructors, the
//! two-chip vector sum with its host golden, and counters and logs in shared memory that
//! a callable can update from a forked child as well as from a thread.
//!
//! They stay here rather than in strata-testkit because they are built on strata-dist's
//! own API (`DistWorker`, registered kernels and orchestrations), and strata-testkit sits
//! below every crate it tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use strata_chip::{ChipConfig, CoreArgs, KernelError, OrchHandle};
use strata_dist::*;
use strata_host::{ExecMode, SharedTensor};
pub use strata_testkit::suite::Variant;
pub use strata_testkit::*;
use strata_types::{ArgTag, DataType, TaskArgs, TensorArg};

/// An execution mode as a suite variant: the contracts are generic over it.
pub trait Mode: Variant<Value = ExecMode> {}
impl<V: Variant<Value = ExecMode>> Mode for V {}

/// Children as forked processes.
pub struct Process;
impl Variant for Process {
    type Value = ExecMode;
    const VALUE: ExecMode = ExecMode::Process;
    const NAME: &'static str = "process";
}

/// Children as threads of this process.
pub struct Threads;
impl Variant for Threads {
    type Value = ExecMode;
    const VALUE: ExecMode = ExecMode::Threads;
    const NAME: &'static str = "threads";
}

/// A level-3 configuration: `chips` default chips and `subs` sub-workers, in `mode`.
pub fn l3_config(mode: ExecMode, chips: usize, subs: usize) -> DistConfig {
    DistConfig::l3(vec![ChipConfig::default(); chips], subs).with_exec_mode(mode)
}

/// A new level-3 worker (see [`l3_config`]).
pub fn l3(mode: ExecMode, chips: usize, subs: usize) -> DistWorker {
    DistWorker::new(l3_config(mode, chips, subs)).expect("a valid level-3 configuration")
}

/// A new level-4 worker with `subs` sub-workers, in `mode`.
pub fn l4(mode: ExecMode, subs: usize) -> DistWorker {
    DistWorker::new(DistConfig::l4(subs).with_exec_mode(mode))
        .expect("a valid level-4 configuration")
}

/// Task arguments from tensors then raw scalar words.
pub fn args(tensors: &[TensorArg], scalars: &[u64]) -> TaskArgs {
    suite::task_args(tensors, scalars)
}

/// Kills `pid` with SIGKILL.
pub fn kill(pid: i32) -> Outcome {
    // SAFETY: signalling a process this scenario started.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        return Err(format!("kill {pid}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Waits until the shared flag `t[0]` is non-zero. The task that sets it is still in
/// flight, so `to_vec` would refuse (`Busy`): the flag is read as an atomic word.
pub fn wait_flag(t: &SharedTensor) -> Outcome {
    let base = t
        .memory()
        .ptr(t.region(), 0, t.nbytes())
        .map_err(|e| e.to_string())?;
    // SAFETY: the region holds at least one u64 from a page-aligned start (aligned for
    // AtomicU64, valid for any bit pattern), and lives while `t` does; the child writes
    // the word, this thread only loads it atomically.
    let flag = unsafe { &*base.cast::<AtomicU64>() };
    wait_for("the task to start", || flag.load(Ordering::SeqCst) != 0)
}

// -------------------------------------------------------------------------------------
// Shared counters and logs
// -------------------------------------------------------------------------------------

/// Atomic words in a shared tensor: created before `init`, they are the same memory in
/// this process, in every forked child and in every child thread, so a callable can
/// count or rendezvous with its peers whatever the mode.
#[derive(Clone)]
pub struct SharedWords {
    tensor: SharedTensor,
    len: usize,
}

impl SharedWords {
    /// `len` zeroed words (before `init`).
    pub fn new(w: &DistWorker, len: usize) -> SharedWords {
        let tensor = w
            .shared_tensor(&[len as u64], DataType::U64)
            .expect("shared words are created before init");
        SharedWords { tensor, len }
    }

    /// Word `i`.
    pub fn at(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.len, "word {i} of {}", self.len);
        let base = self
            .tensor
            .memory()
            .ptr(self.tensor.region(), 0, self.tensor.nbytes())
            .expect("the words' region is mapped");
        // SAFETY: the region holds `len` u64 words from a page-aligned start (so aligned
        // for AtomicU64, valid for any bit pattern and meant to be shared); `i < len`; the
        // region lives as long as `self.tensor`, which `&self` borrows.
        unsafe { &*base.cast::<AtomicU64>().add(i) }
    }

    /// Increments word `i`, returning the new value.
    pub fn bump(&self, i: usize) -> u64 {
        self.at(i).fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Word `i`'s value.
    pub fn get(&self, i: usize) -> u64 {
        self.at(i).load(Ordering::SeqCst)
    }

    /// Waits (bounded by `within`) until word `i` is at least `n`.
    pub fn wait_at_least(&self, i: usize, n: u64, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        while self.get(i) < n {
            if Instant::now() > deadline {
                return Err(format!("word {i} stayed at {} < {n}", self.get(i)));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}

/// What gated chip tasks record, in shared memory: the labels (non-zero) in the order
/// their kernels started, and a hold on one label that the test releases.
#[derive(Clone)]
pub struct Lab {
    /// Word 0: the held label; word 1: how many labels were logged; then the log.
    words: SharedWords,
}

const LAB_LOG: usize = 64;

impl Lab {
    /// A new lab (before `init`).
    pub fn new(w: &DistWorker) -> Lab {
        Lab {
            words: SharedWords::new(w, 2 + LAB_LOG),
        }
    }

    /// Holds the kernel labelled `label` (0: none) until released.
    pub fn hold(&self, label: u64) {
        self.words.at(0).store(label, Ordering::SeqCst);
    }

    fn held(&self) -> u64 {
        self.words.get(0)
    }

    fn push(&self, label: u64) {
        let i = self.words.at(1).fetch_add(1, Ordering::SeqCst) as usize;
        assert!(i < LAB_LOG, "the lab's log is full");
        self.words.at(2 + i).store(label, Ordering::SeqCst);
    }

    /// The labels logged so far (one still being written is left out).
    pub fn log(&self) -> Vec<u64> {
        let n = (self.words.get(1) as usize).min(LAB_LOG);
        (0..n)
            .map(|i| self.words.get(2 + i))
            .filter(|&l| l != 0)
            .collect()
    }

    /// Waits (bounded) until `label` started.
    pub fn wait_started(&self, label: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.log().contains(&label) {
            assert!(Instant::now() < deadline, "{label} never started");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A chip orchestration whose kernel logs its scalar label and, if the label is the held
/// one, waits (bounded) until the hold is released.
pub fn gated(w: &mut DistWorker, lab: &Lab) -> OrchHandle {
    let l = lab.clone();
    let k = w
        .register_kernel("gated", move |ctx| {
            let label: u64 = ctx.scalar(0)?;
            l.push(label);
            let deadline = Instant::now() + Duration::from_secs(10);
            while l.held() == label {
                if Instant::now() > deadline {
                    return Err("never released".into());
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            Ok(())
        })
        .unwrap();
    w.register_chip_orchestration("gated", move |o, a| {
        o.submit_aiv(k, CoreArgs::new().scalar(a.scalar::<u64>(0)?))?;
        Ok(())
    })
    .unwrap()
}

// -------------------------------------------------------------------------------------
// The two-chip vector sum: each chip adds two vectors with a real kernel into a run-owned
// intermediate, then a sub-worker sums both intermediates on the host.
// -------------------------------------------------------------------------------------

/// Elements of each vector of the pair sum.
pub const N: u64 = 4096;

pub struct PairSum {
    /// The level-3 orchestration: args = [a, b, c, d (inputs), out (output)].
    pub orch: HostOrchHandle,
    /// The chip orchestration: args = [a, b (inputs), out (output)], one AIV vector add.
    pub vadd: OrchHandle,
    /// The sub callable: args = [x, y (inputs), out (output)], an element-wise sum.
    pub sum: SubHandle,
}

/// Registers the kernel, the chip orchestration, the summing sub callable and the level-3
/// orchestration on `w` (a level-3 worker with 2 chips and a sub-worker, or a level-4
/// worker whose level-3 children inherit them).
pub fn register_pair_sum(w: &mut DistWorker) -> Result<PairSum, String> {
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
    Ok(PairSum { orch, vadd, sum })
}

/// Four input vectors seeded by `seed`, as shared tensors, and their host golden sum.
pub fn pair_inputs(w: &DistWorker, seed: f32) -> Result<(Vec<SharedTensor>, Vec<f32>), String> {
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

pub fn pair_args(inputs: &[SharedTensor], out: &SharedTensor) -> TaskArgs {
    let mut t: Vec<TensorArg> = inputs.iter().map(|x| x.arg(ArgTag::Input)).collect();
    t.push(out.arg(ArgTag::OutputExisting));
    args(&t, &[])
}

/// Exact comparison: the sums are of the same f32 values in the same order as the golden
/// except for association, which this data keeps exact (small multiples of 0.25).
pub fn same(got: &[f32], want: &[f32]) -> Outcome {
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

/// The direct children a worker has in `mode`: `processes` of them, or none (threads have
/// no pids).
pub fn expected_pids(mode: ExecMode, processes: usize) -> usize {
    match mode {
        ExecMode::Process => processes,
        ExecMode::Threads => 0,
    }
}

// -------------------------------------------------------------------------------------
// Signals: chip tasks that synchronise through shared words rather than data, and log
// where they started (per-worker launch order).
// -------------------------------------------------------------------------------------

/// Scalar meaning "no word" in a [`Signals`] task.
pub const NO_WORD: u64 = u64::MAX;

/// Words of a [`Signals`] log (pairs of worker and label).
const SIGNAL_LOG: usize = 1024;
/// Signal words before the log.
const SIGNAL_WORDS: usize = 16;

/// Chip tasks that wait for a word, then set one, and log their start: programs whose
/// tasks synchronise through signals (the order the engine starts them in is then part
/// of the program's meaning).
#[derive(Clone)]
pub struct Signals {
    /// Words `0..SIGNAL_WORDS`: signals; then the log's length; then the log.
    pub words: SharedWords,
    /// The chip orchestration: scalars = [`Signals::task`].
    pub orch: OrchHandle,
}

impl Signals {
    /// Registers the kernel and its chip orchestration (before `init`).
    pub fn new(w: &mut DistWorker) -> Signals {
        let words = SharedWords::new(w, SIGNAL_WORDS + 1 + SIGNAL_LOG);
        let kw = words.clone();
        let k = w
            .register_kernel("signal", move |ctx| {
                let s: Vec<u64> = (0..6)
                    .map(|i| ctx.scalar::<u64>(i))
                    .collect::<Result<_, _>>()?;
                let [wait_word, wait_value, set_word, set_value, log, spin_us] = s[..] else {
                    return Err("a signal task takes 6 scalars".into());
                };
                if log != 0 {
                    let i = kw.at(SIGNAL_WORDS).fetch_add(2, Ordering::SeqCst) as usize;
                    assert!(i + 1 < SIGNAL_LOG, "the signal log is full");
                    kw.at(SIGNAL_WORDS + 1 + i)
                        .store(log >> 32, Ordering::SeqCst);
                    kw.at(SIGNAL_WORDS + 2 + i)
                        .store((log & 0xffff_ffff) - 1, Ordering::SeqCst);
                }
                let spin = Instant::now();
                while spin.elapsed() < Duration::from_micros(spin_us) {
                    std::hint::spin_loop();
                }
                let mut outcome = Ok(());
                if wait_word != NO_WORD {
                    let deadline = Instant::now() + Duration::from_secs(3);
                    while kw.get(wait_word as usize) < wait_value {
                        if Instant::now() > deadline {
                            outcome = Err(KernelError::new(format!(
                                "signal {wait_word} never reached {wait_value}"
                            )));
                            break;
                        }
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
                // Set even after a timeout, so that what waits for this task ends.
                if set_word != NO_WORD {
                    kw.at(set_word as usize)
                        .fetch_max(set_value, Ordering::SeqCst);
                }
                Ok(outcome?)
            })
            .unwrap();
        let orch = w
            .register_chip_orchestration("signal", move |o, a| {
                let mut c = CoreArgs::new();
                for i in 0..6 {
                    c.scalar_bits(a.scalar::<u64>(i)?);
                }
                o.submit_aiv(k, &c)?;
                Ok(())
            })
            .unwrap();
        Signals { words, orch }
    }

    /// A task's arguments: wait until word `wait.0` ≥ `wait.1`, then raise word `set.0` to
    /// `set.1` (either may be `(NO_WORD, 0)`), logging `(worker, label)` first if `label`
    /// is not 0 and spinning `spin_us` µs.
    pub fn task(
        tensors: &[TensorArg],
        wait: (u64, u64),
        set: (u64, u64),
        log: Option<(usize, u64)>,
        spin_us: u64,
    ) -> TaskArgs {
        // Label + 1: 0 means "no log".
        let log = log.map_or(0, |(w, l)| ((w as u64) << 32) | (l + 1));
        args(tensors, &[wait.0, wait.1, set.0, set.1, log, spin_us])
    }

    /// Empties the launch log.
    pub fn clear_log(&self) {
        self.words.at(SIGNAL_WORDS).store(0, Ordering::SeqCst);
    }

    /// The logged `(worker, label)` pairs, in start order.
    pub fn log(&self) -> Vec<(usize, u64)> {
        let n = (self.words.get(SIGNAL_WORDS) as usize).min(SIGNAL_LOG);
        (0..n / 2)
            .map(|i| {
                (
                    self.words.get(SIGNAL_WORDS + 1 + 2 * i) as usize,
                    self.words.get(SIGNAL_WORDS + 2 + 2 * i),
                )
            })
            .collect()
    }
}
