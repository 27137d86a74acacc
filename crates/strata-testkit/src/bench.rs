//! What the side-by-side benchmarks share: statistics over samples, CPU pinning, forking
//! from a single-threaded process, and the machine's floor — a raw cache-line ping-pong
//! between two processes, which every hand-off figure is compared with in the same run.
//!
//! The floor's ping-pong polls its flag with nothing but strata-sync's CPU hint between
//! loads, on purpose: it is the bare cost of a cache-line hand-off that strata's own
//! spin-then-park waits (strata-sync's `Spin`) are measured against, so it must not use them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The median (NaN for no samples).
///
/// ```
/// assert_eq!(strata_testkit::bench::median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
/// ```
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The `q`-quantile (nearest rank; NaN for no samples).
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(((v.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// The smallest sample (infinity for none).
pub fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

/// Pins the calling thread to `cpu`; false if that is not possible.
pub fn pin(cpu: usize) -> bool {
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays in bounds (checked).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// The calling thread's CPU affinity, to restore with [`restore_affinity`].
pub fn affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is valid; the kernel fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
            .then_some(set)
    }
}

/// Restores an affinity saved with [`affinity`].
pub fn restore_affinity(set: &libc::cpu_set_t) {
    // SAFETY: `set` is a valid cpu_set_t.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
}

/// Panics unless this process is single-threaded: a fork now could deadlock the child.
pub fn assert_single_threaded(before: &str) {
    let n = crate::other_threads().unwrap_or(usize::MAX);
    assert_eq!(
        n, 0,
        "{before}: this process runs {n} other thread(s); a fork now could deadlock the child"
    );
}

/// Forks a child that runs `body` and leaves through `_exit` with its result.
///
/// # Panics
/// If this process runs other threads, or `fork` fails.
pub fn fork(body: impl FnOnce() -> i32) -> i32 {
    assert_single_threaded("fork");
    // SAFETY: the process is single-threaded (checked above); the child leaves through
    // `_exit` without unwinding into the parent's frames.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => panic!("fork failed: {}", std::io::Error::last_os_error()),
        0 => {
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(101);
            // SAFETY: see above.
            unsafe { libc::_exit(code) }
        }
        pid => pid,
    }
}

/// Waits (at most `bound`, then SIGKILLs) for child `pid`; its exit code, or `None` if
/// it was killed by a signal.
pub fn reap(pid: i32, bound: Duration) -> Option<i32> {
    let end = Instant::now() + bound;
    let mut status = 0;
    loop {
        // SAFETY: waiting for a child this process forked.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if r == -1 || Instant::now() >= end {
            // SAFETY: as above; kill and reap it.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status))
}

/// Sizes of a floor measurement.
#[derive(Debug, Clone, Copy)]
pub struct FloorSpec {
    /// Round trips before timing.
    pub warmup: usize,
    /// Timed batches.
    pub batches: usize,
    /// Round trips per batch.
    pub per_batch: usize,
}

/// Per-batch average round-trip times in **nanoseconds** of a raw one-cache-line
/// ping-pong between this process and a forked child, both spinning; pinned to CPU 0 /
/// CPU 1 when `pinned`. This process's CPU affinity is restored afterwards.
///
/// # Panics
/// If this process is not single-threaded, or the child fails.
pub fn pingpong_floor_ns(pinned: bool, spec: FloorSpec) -> Vec<f64> {
    let saved = affinity();
    // SAFETY: an anonymous shared mapping of one page, unmapped below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(page, libc::MAP_FAILED, "mmap of a shared page failed");
    // SAFETY: offset 0 of a page-aligned, zeroed page, used only atomically, which lives
    // until the munmap below (after the child is reaped).
    let flag = unsafe { &*page.cast::<AtomicU64>() };
    let total = (spec.warmup + spec.batches * spec.per_batch) as u64;
    let child = fork(|| {
        if pinned {
            pin(1);
        }
        for i in 1..=total {
            let want = 2 * i - 1;
            let start = Instant::now();
            let mut spins = 0u32;
            while flag.load(Ordering::Acquire) != want {
                strata_sync::sync::spin_hint();
                spins = spins.wrapping_add(1);
                if spins % 4096 == 0 && start.elapsed() > Duration::from_secs(30) {
                    return 1;
                }
            }
            flag.store(want + 1, Ordering::Release);
        }
        0
    });
    if pinned {
        pin(0);
    }
    let mut i = 0u64;
    let mut round = || {
        i += 1;
        flag.store(2 * i - 1, Ordering::Release);
        while flag.load(Ordering::Acquire) != 2 * i {
            strata_sync::sync::spin_hint();
        }
    };
    for _ in 0..spec.warmup {
        round();
    }
    let mut out = Vec::with_capacity(spec.batches);
    for _ in 0..spec.batches {
        let t = Instant::now();
        for _ in 0..spec.per_batch {
            round();
        }
        out.push(t.elapsed().as_nanos() as f64 / spec.per_batch as f64);
    }
    assert_eq!(reap(child, Duration::from_secs(30)), Some(0), "floor child");
    // SAFETY: the mapping from above; nobody uses it any more.
    unsafe { libc::munmap(page, 4096) };
    if let Some(set) = saved {
        restore_affinity(&set);
    }
    out
}

/// Median round trip in **nanoseconds** of a raw one-cache-line ping-pong between two
/// threads of this process pinned to CPUs 0 and 1: six batches of `rounds` round trips,
/// the first discarded. No fork, so it can run beside other threads (a worker's); it shows
/// where the machine placed the two CPUs at that moment. The calling thread is not pinned.
///
/// # Panics
/// If a ping-pong thread panics.
pub fn pingpong_threads_ns(rounds: u64) -> f64 {
    let flag = AtomicU64::new(0);
    let flag = &flag;
    std::thread::scope(|sc| {
        sc.spawn(move || {
            pin(1);
            for i in 1..=6 * rounds {
                while flag.load(Ordering::Acquire) != 2 * i - 1 {
                    strata_sync::sync::spin_hint();
                }
                flag.store(2 * i, Ordering::Release);
            }
        });
        sc.spawn(move || {
            pin(0);
            let mut i = 0u64;
            let mut v = Vec::new();
            for _ in 0..6 {
                let t = Instant::now();
                for _ in 0..rounds {
                    i += 1;
                    flag.store(2 * i - 1, Ordering::Release);
                    while flag.load(Ordering::Acquire) != 2 * i {
                        strata_sync::sync::spin_hint();
                    }
                }
                v.push(t.elapsed().as_nanos() as f64 / rounds as f64);
            }
            median(&v[1..])
        })
        .join()
        .expect("ping-pong thread")
    })
}

// ----- the machine a figure was measured on ----------------------------------------------

/// The machine at the moment of a measurement: its CPU model and load average, which every
/// bench prints beside its figures (another process's load or a different CPU moves them).
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// `model name` of the first CPU in `/proc/cpuinfo` ("unknown" if unreadable).
    pub cpu_model: String,
    /// CPUs this process may run on.
    pub cpus: usize,
    /// The 1-, 5- and 15-minute load averages of `/proc/loadavg` (NaN if unreadable).
    pub load: [f64; 3],
}

/// The 1-, 5- and 15-minute load averages (NaN if `/proc/loadavg` is unreadable).
pub fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = text
        .split_whitespace()
        .map(|f| f.parse::<f64>().unwrap_or(f64::NAN));
    let mut next = || it.next().unwrap_or(f64::NAN);
    [next(), next(), next()]
}

/// The first `model name` of `/proc/cpuinfo` ("unknown" if there is none).
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

impl Machine {
    /// Reads the machine now.
    pub fn now() -> Machine {
        Machine {
            cpu_model: cpu_model(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            load: load_average(),
        }
    }

    /// One human line: `machine: <model>, <n> CPUs, load average <1m> <5m> <15m>`.
    pub fn line(&self) -> String {
        let [a, b, c] = self.load;
        format!(
            "machine: {}, {} CPUs, load average {a:.2} {b:.2} {c:.2}",
            self.cpu_model, self.cpus
        )
    }
}

// ----- one JSON line ---------------------------------------------------------------------

/// A flat JSON object built field by field, in insertion order: the last line every bench
/// prints. Non-finite numbers are written as `null` (JSON has no NaN).
#[derive(Debug, Clone, Default)]
pub struct Json {
    fields: Vec<String>,
}

impl Json {
    /// An empty object.
    pub fn new() -> Json {
        Json::default()
    }

    /// A number with `decimals` digits after the point (`null` if not finite).
    pub fn num(&mut self, key: &str, value: f64, decimals: usize) -> &mut Json {
        let v = if value.is_finite() {
            format!("{value:.decimals$}")
        } else {
            "null".into()
        };
        self.fields.push(format!("{}: {v}", quote(key)));
        self
    }

    /// A number, or `null` for `None`.
    pub fn opt(&mut self, key: &str, value: Option<f64>, decimals: usize) -> &mut Json {
        self.num(key, value.unwrap_or(f64::NAN), decimals)
    }

    /// An integer.
    pub fn int(&mut self, key: &str, value: u64) -> &mut Json {
        self.fields.push(format!("{}: {value}", quote(key)));
        self
    }

    /// A string.
    pub fn str(&mut self, key: &str, value: &str) -> &mut Json {
        self.fields
            .push(format!("{}: {}", quote(key), quote(value)));
        self
    }

    /// The machine's fields: `machine_cpu_model`, `machine_cpus`, the load average when
    /// `start` was read (`machine_load_{1,5,15}m`) and now (`machine_load_end_1m`).
    /// Comparisons of two builds skip every `machine_` key.
    pub fn machine(&mut self, start: &Machine) -> &mut Json {
        self.str("machine_cpu_model", &start.cpu_model)
            .int("machine_cpus", start.cpus as u64);
        for (k, v) in ["1m", "5m", "15m"].iter().zip(start.load) {
            self.num(&format!("machine_load_{k}"), v, 2);
        }
        self.num("machine_load_end_1m", load_average()[0], 2)
    }

    /// The object on one line.
    pub fn line(&self) -> String {
        format!("{{{}}}", self.fields.join(", "))
    }
}

/// `s` as a JSON string literal.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// ----- variants in rounds ----------------------------------------------------------------

/// A variant: its name and the closure that measures it once, returning one figure.
type Variant<'a> = (String, Box<dyn FnMut() -> f64 + 'a>);

/// Named variants measured in alternating rounds. On a machine whose speed drifts (vCPU
/// placement, other tenants), figures taken one after the other are not comparable, but
/// figures taken in the same round are: each round measures every variant once, in
/// declaration order in even rounds and reversed in odd ones (A B, B A, A B …, so neither
/// variant always runs first), and a variant is compared with the baseline by the median
/// of its **per-round** ratios.
///
/// ```
/// use strata_testkit::bench::Rounds;
/// let mut t = 0.0;
/// let report = Rounds::new(4)
///     .variant("floor", || 2.0)
///     .variant("mine", || { t += 1.0; 3.0 + t })
///     .baseline("floor")
///     .run();
/// assert_eq!(report.figures("mine"), vec![4.0, 5.0, 6.0, 7.0]);
/// assert_eq!(report.median("mine"), 5.5);
/// assert_eq!(report.ratio_median("mine"), 2.75);
/// ```
pub struct Rounds<'a> {
    rounds: usize,
    warmup: usize,
    baseline: Option<String>,
    variants: Vec<Variant<'a>>,
}

impl<'a> Rounds<'a> {
    /// `rounds` measured rounds (at least one).
    pub fn new(rounds: usize) -> Rounds<'a> {
        Rounds {
            rounds: rounds.max(1),
            warmup: 0,
            baseline: None,
            variants: Vec::new(),
        }
    }

    /// Rounds run first and discarded (caches, page faults, lazily grown tables).
    pub fn warmup(mut self, rounds: usize) -> Rounds<'a> {
        self.warmup = rounds;
        self
    }

    /// Adds a variant: `measure` runs it once and returns its figure (NaN if it could
    /// not be measured this round).
    pub fn variant(mut self, name: impl Into<String>, measure: impl FnMut() -> f64 + 'a) -> Self {
        self.variants.push((name.into(), Box::new(measure)));
        self
    }

    /// The variant the others' ratios are taken against (the floor or the peer).
    pub fn baseline(mut self, name: &str) -> Rounds<'a> {
        self.baseline = Some(name.to_owned());
        self
    }

    /// Runs every round.
    ///
    /// # Panics
    /// If the baseline names no variant.
    pub fn run(self) -> RoundsReport {
        self.run_until(|_| false)
    }

    /// Runs rounds until `enough` (asked after each round with what was measured so far)
    /// says so, or the round count given to [`new`](Self::new) is reached.
    ///
    /// # Panics
    /// If the baseline names no variant.
    pub fn run_until(mut self, mut enough: impl FnMut(&RoundsReport) -> bool) -> RoundsReport {
        let names: Vec<String> = self.variants.iter().map(|v| v.0.clone()).collect();
        let baseline = self.baseline.as_ref().map(|b| {
            names
                .iter()
                .position(|n| n == b)
                .unwrap_or_else(|| panic!("baseline {b:?} is not one of {names:?}"))
        });
        let mut report = RoundsReport {
            names,
            baseline,
            figures: Vec::new(),
            orders: Vec::new(),
        };
        for _ in 0..self.warmup {
            for v in &mut self.variants {
                (v.1)();
            }
        }
        let n = self.variants.len();
        for round in 0..self.rounds {
            let order: Vec<usize> = if round % 2 == 0 {
                (0..n).collect()
            } else {
                (0..n).rev().collect()
            };
            let mut figures = vec![f64::NAN; n];
            for &k in &order {
                figures[k] = (self.variants[k].1)();
            }
            report.figures.push(figures);
            report.orders.push(order);
            if enough(&report) {
                break;
            }
        }
        report
    }
}

/// What [`Rounds`] measured: one figure per variant and round.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundsReport {
    names: Vec<String>,
    baseline: Option<usize>,
    /// `figures[round][variant]`, variants in declaration order.
    figures: Vec<Vec<f64>>,
    /// The order the variants ran in, per round.
    orders: Vec<Vec<usize>>,
}

impl RoundsReport {
    fn index(&self, name: &str) -> usize {
        self.names
            .iter()
            .position(|n| n == name)
            .unwrap_or_else(|| panic!("no variant {name:?} among {:?}", self.names))
    }

    /// Rounds measured.
    pub fn rounds(&self) -> usize {
        self.figures.len()
    }

    /// The variants' names, in declaration order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The baseline's name, if one was set.
    pub fn baseline(&self) -> Option<&str> {
        self.baseline.map(|b| self.names[b].as_str())
    }

    /// The names of the variants in the order they ran in `round`.
    pub fn order(&self, round: usize) -> Vec<&str> {
        self.orders[round]
            .iter()
            .map(|&k| self.names[k].as_str())
            .collect()
    }

    /// A variant's figure in each round.
    ///
    /// # Panics
    /// If no variant has that name.
    pub fn figures(&self, name: &str) -> Vec<f64> {
        let k = self.index(name);
        self.figures.iter().map(|r| r[k]).collect()
    }

    /// The median of a variant's figures.
    pub fn median(&self, name: &str) -> f64 {
        median(&self.figures(name))
    }

    /// A variant's figure divided by `base`'s, round by round.
    pub fn ratios_vs(&self, name: &str, base: &str) -> Vec<f64> {
        let (k, b) = (self.index(name), self.index(base));
        self.figures.iter().map(|r| r[k] / r[b]).collect()
    }

    /// The median of [`ratios_vs`](Self::ratios_vs).
    pub fn ratio_median_vs(&self, name: &str, base: &str) -> f64 {
        median(&self.ratios_vs(name, base))
    }

    /// A variant's figure divided by the baseline's, round by round (NaN without one).
    pub fn ratios(&self, name: &str) -> Vec<f64> {
        match self.baseline() {
            Some(b) => self.ratios_vs(name, b),
            None => vec![f64::NAN; self.rounds()],
        }
    }

    /// The median of the per-round ratios to the baseline (NaN without one).
    pub fn ratio_median(&self, name: &str) -> f64 {
        median(&self.ratios(name))
    }

    /// The same report restricted to the given rounds (e.g. those taken in one vCPU
    /// placement).
    pub fn only(&self, rounds: &[usize]) -> RoundsReport {
        RoundsReport {
            names: self.names.clone(),
            baseline: self.baseline,
            figures: rounds.iter().map(|&r| self.figures[r].clone()).collect(),
            orders: rounds.iter().map(|&r| self.orders[r].clone()).collect(),
        }
    }

    /// A human table, one row per variant: median, min and max of its figures (in
    /// `unit`, `decimals` digits), and the median (min–max) of its per-round ratios to
    /// the baseline.
    pub fn table(&self, unit: &str, decimals: usize) -> String {
        let w = self.names.iter().map(String::len).max().unwrap_or(7).max(7);
        let mut out = format!(
            "{} rounds, order alternating (A B, B A, ...){}\n",
            self.rounds(),
            self.baseline().map_or(String::new(), |b| format!(
                "; ratio = variant / {b}, median of per-round ratios (min-max)"
            ))
        );
        let head = format!("median {unit}");
        let c = head.chars().count().max(12);
        out += &format!(
            "{:<w$} {head:>c$} {:>12} {:>12}   {}\n",
            "variant",
            "min",
            "max",
            if self.baseline.is_some() { "ratio" } else { "" }
        );
        for (k, name) in self.names.iter().enumerate() {
            let f = self.figures(name);
            let (lo, hi) = (
                f.iter().copied().fold(f64::INFINITY, f64::min),
                f.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            );
            let ratio = match self.baseline {
                Some(b) if b == k => "1 (baseline)".to_owned(),
                Some(_) => {
                    let r = self.ratios(name);
                    format!(
                        "{:.3} ({:.3}-{:.3})",
                        median(&r),
                        r.iter().copied().fold(f64::INFINITY, f64::min),
                        r.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                    )
                }
                None => String::new(),
            };
            out += &format!(
                "{name:<w$} {:>c$.decimals$} {lo:>12.decimals$} {hi:>12.decimals$}   {ratio}\n",
                median(&f)
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn rounds_alternate_their_order_and_skip_warmup() {
        let log = RefCell::new(Vec::new());
        let report = Rounds::new(4)
            .warmup(1)
            .variant("a", || {
                log.borrow_mut().push('a');
                1.0
            })
            .variant("b", || {
                log.borrow_mut().push('b');
                2.0
            })
            .variant("c", || {
                log.borrow_mut().push('c');
                3.0
            })
            .run();
        let ran: String = log.borrow().iter().collect();
        assert_eq!(
            ran,
            "abc" /* warm-up */
                .to_owned()
                + "abccbaabccba"
        );
        assert_eq!(report.rounds(), 4);
        assert_eq!(report.order(1), vec!["c", "b", "a"]);
        assert_eq!(report.figures("b"), vec![2.0; 4]);
        assert!(report.ratio_median("b").is_nan(), "no baseline, no ratio");
    }

    #[test]
    fn ratios_are_taken_per_round_not_of_medians() {
        // The machine doubles its speed in rounds 2 and 3: the per-round ratio stays 3,
        // while the ratio of the medians would not.
        let speed = [1.0, 1.0, 0.5, 0.5, 0.5];
        let (mut i, mut j) = (0, 0);
        let report = Rounds::new(5)
            .variant("floor", || {
                i += 1;
                10.0 * speed[i - 1]
            })
            .variant("mine", || {
                j += 1;
                30.0 * speed[j - 1]
            })
            .baseline("floor")
            .run();
        assert_eq!(report.ratios("mine"), vec![3.0; 5]);
        assert_eq!(report.ratio_median("mine"), 3.0);
        assert_eq!(report.median("floor"), 5.0);
        assert_eq!(report.median("mine"), 15.0);
        assert_eq!(report.ratio_median("floor"), 1.0);
        assert_eq!(report.ratio_median_vs("floor", "mine"), 1.0 / 3.0);
        let first_two = report.only(&[0, 1]);
        assert_eq!(first_two.figures("floor"), vec![10.0, 10.0]);
        assert_eq!(first_two.baseline(), Some("floor"));
        let table = report.table("ns", 1);
        assert!(table.contains("1 (baseline)") && table.contains("3.000 (3.000-3.000)"));
    }

    #[test]
    fn run_until_stops_when_enough() {
        let report = Rounds::new(9)
            .variant("x", || 1.0)
            .run_until(|r| r.rounds() == 3);
        assert_eq!(report.rounds(), 3);
    }

    #[test]
    #[should_panic(expected = "baseline \"nope\"")]
    fn an_unknown_baseline_is_named() {
        Rounds::new(1).variant("x", || 1.0).baseline("nope").run();
    }

    #[test]
    fn json_line_writes_null_for_nan_and_escapes_strings() {
        let mut j = Json::new();
        j.num("a", 1.23456, 2)
            .num("b", f64::NAN, 2)
            .opt("c", None, 1)
            .int("n", 5)
            .str("s", "x\"y\\z");
        assert_eq!(
            j.line(),
            r#"{"a": 1.23, "b": null, "c": null, "n": 5, "s": "x\"y\\z"}"#
        );
    }

    #[test]
    fn machine_header_names_the_cpu_and_load() {
        let m = Machine::now();
        assert!(!m.cpu_model.is_empty() && m.cpus >= 1);
        assert!(m.line().starts_with("machine: ") && m.line().contains("load average"));
        let mut j = Json::new();
        j.machine(&m);
        let line = j.line();
        for key in [
            "machine_cpu_model",
            "machine_cpus",
            "machine_load_1m",
            "machine_load_15m",
            "machine_load_end_1m",
        ] {
            assert!(line.contains(&format!("\"{key}\"")), "{key} in {line}");
        }
    }
}
