//! What the side-by-side benchmarks share: statistics over samples, CPU pinning, forking
//! from a single-threaded process, and the machine's floor — a raw cache-line ping-pong
//! between two processes, which every hand-off figure is compared with in the same run.

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
                std::hint::spin_loop();
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
            std::hint::spin_loop();
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
                    std::hint::spin_loop();
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
                        std::hint::spin_loop();
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
