//! The reference runtime's example workloads (reference/chip.md §8) ported to the
//! emulator, each checked against a golden computed on the host: E1 vector_add (and its
//! ring configurations E1b and memory round trips E1c), E2 a small DAG with a nested scope,
//! E4 mixed-shape tasks, E5 SPMD context accessors, E6 dependency-only tasks, E7
//! orchestration data access, a batched tiled matmul, an SPMD intra-task barrier, and the
//! negative suite (fatal codes).
//!
//! Each function builds its own [`ChipWorker`] from the given configuration, runs, checks,
//! closes, and returns a short summary — the integration tests, the `chip_*` examples and
//! the benchmark call them.

use crate::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use strata_types::{CallConfig, DataType, RingOverride};

/// A workload that did not produce its golden, or whose chip failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The chip reported an error.
    #[error(transparent)]
    Chip(#[from] ChipError),
    /// A value differs from the host golden.
    #[error("{tensor}[{index}] = {got}, expected {want}")]
    Mismatch {
        /// Which tensor.
        tensor: String,
        /// Flat index.
        index: usize,
        /// The emulator's value.
        got: f64,
        /// The golden.
        want: f64,
    },
    /// A run that should have failed with a fatal code did something else.
    #[error("{case}: expected code {want}, got {got}")]
    WrongCode {
        /// The case.
        case: &'static str,
        /// Expected code.
        want: i32,
        /// What happened.
        got: String,
    },
}

/// What a workload did.
#[derive(Debug, Clone, Default)]
pub struct WorkloadReport {
    /// Runs executed.
    pub runs: u32,
    /// Tasks submitted over all runs.
    pub tasks: u64,
    /// Wall time of the runs.
    pub elapsed: Duration,
    /// The last run's report.
    pub last: Option<RunReport>,
}

impl WorkloadReport {
    fn add(&mut self, r: RunReport, t: Duration) {
        self.runs += 1;
        self.tasks += r.tasks;
        self.elapsed += t;
        self.last = Some(r);
    }
}

/// A deterministic generator of normally distributed f32 (splitmix64 + Box–Muller), so
/// goldens do not depend on an RNG crate.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator with a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// `n` samples of a standard normal distribution, scaled.
    pub fn randn(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let (u, v) = (self.uniform(), self.uniform());
                ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32 * scale
            })
            .collect()
    }
}

/// Compares `got` with `want` element-wise (`|g − w| ≤ atol + rtol·|w|`).
///
/// # Errors
/// [`WorkloadError::Mismatch`] at the first difference.
pub fn check_close(
    tensor: &str,
    got: &[f32],
    want: &[f32],
    rtol: f32,
    atol: f32,
) -> Result<(), WorkloadError> {
    if got.len() != want.len() {
        return Err(WorkloadError::Mismatch {
            tensor: format!("{tensor} (length)"),
            index: got.len(),
            got: got.len() as f64,
            want: want.len() as f64,
        });
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let close = (g - w).abs() <= atol + rtol * w.abs();
        if !close {
            return Err(WorkloadError::Mismatch {
                tensor: tensor.into(),
                index: i,
                got: g as f64,
                want: w as f64,
            });
        }
    }
    Ok(())
}

fn timed(
    chip: &mut ChipWorker,
    orch: &OrchHandle,
    args: &mut RunArgs<'_>,
    cfg: &CallConfig,
    rep: &mut WorkloadReport,
) -> Result<(), WorkloadError> {
    let t = Instant::now();
    let r = chip.run(orch, args, cfg)?;
    rep.add(r, t.elapsed());
    Ok(())
}

// ----- kernels -----------------------------------------------------------------------------

/// `out = a + b` over args `base`, `base+1` (inputs) and `base+2` (output), any shape.
pub fn add_kernel(
    base: usize,
) -> impl Fn(&mut KernelCtx<'_>) -> Result<(), KernelError> + Send + Sync + 'static {
    move |ctx| binary(ctx, base, |x, y| x + y)
}

/// `out = a * b` over args `base..base+3`.
pub fn mul_kernel(
    base: usize,
) -> impl Fn(&mut KernelCtx<'_>) -> Result<(), KernelError> + Send + Sync + 'static {
    move |ctx| binary(ctx, base, |x, y| x * y)
}

fn binary(
    ctx: &mut KernelCtx<'_>,
    base: usize,
    op: impl Fn(f32, f32) -> f32,
) -> Result<(), KernelError> {
    let a = ctx.input::<f32>(base)?;
    let b = ctx.input::<f32>(base + 1)?;
    let mut out = ctx.output::<f32>(base + 2)?;
    if let (Some(a), Some(b), Some(o)) = (a.as_slice(), b.as_slice(), out.as_mut_slice()) {
        if a.len() != o.len() || b.len() != o.len() {
            return Err(KernelError::new(format!(
                "length mismatch: {} + {} -> {}",
                a.len(),
                b.len(),
                o.len()
            )));
        }
        for ((o, x), y) in o.iter_mut().zip(a).zip(b) {
            *o = op(*x, *y);
        }
        return Ok(());
    }
    let (av, bv) = (a.to_vec(), b.to_vec());
    if av.len() != out.numel() || bv.len() != out.numel() {
        return Err(KernelError::new("length mismatch"));
    }
    for i in 0..av.len() {
        out.set_flat(i as u64, op(av[i], bv[i]));
    }
    Ok(())
}

/// `out(1) = in(0) + scalar 0 (f32)`.
pub fn add_scalar_kernel(ctx: &mut KernelCtx<'_>) -> Result<(), KernelError> {
    let s: f32 = ctx.scalar(0)?;
    let a = ctx.input::<f32>(0)?;
    let mut out = ctx.output::<f32>(1)?;
    let a = a.as_slice().ok_or("input must be contiguous")?;
    for (o, x) in out
        .as_mut_slice()
        .ok_or("output must be contiguous")?
        .iter_mut()
        .zip(a)
    {
        *o = x + s;
    }
    Ok(())
}

/// `C(base+2) = A(base) @ B(base+1)`; 2-D views, or 1-D views read as square matrices.
pub fn matmul_kernel(
    base: usize,
) -> impl Fn(&mut KernelCtx<'_>) -> Result<(), KernelError> + Send + Sync + 'static {
    move |ctx| {
        let a = ctx.input::<f32>(base)?;
        let b = ctx.input::<f32>(base + 1)?;
        let mut c = ctx.output::<f32>(base + 2)?;
        let dims = |v: &[u64], n: usize| -> Option<(usize, usize)> {
            match v {
                [r, c] => Some((*r as usize, *c as usize)),
                [len] => {
                    let s = (*len as f64).sqrt() as usize;
                    (s * s == n).then_some((s, s))
                }
                _ => None,
            }
        };
        let (m, k) = dims(a.shape(), a.numel()).ok_or("A must be 2-D")?;
        let (k2, n) = dims(b.shape(), b.numel()).ok_or("B must be 2-D")?;
        if k != k2 || c.numel() != m * n {
            return Err(KernelError::new(format!(
                "shape mismatch {m}x{k} @ {k2}x{n} -> {}",
                c.numel()
            )));
        }
        let av = a.to_vec();
        let bv = b.to_vec();
        let mut acc = vec![0f32; m * n];
        for i in 0..m {
            for p in 0..k {
                let x = av[i * k + p];
                let brow = &bv[p * n..p * n + n];
                for (o, y) in acc[i * n..i * n + n].iter_mut().zip(brow) {
                    *o += x * y;
                }
            }
        }
        match c.runs_mut() {
            Some(runs) => {
                let mut pos = 0;
                for run in runs {
                    run.copy_from_slice(&acc[pos..pos + run.len()]);
                    pos += run.len();
                }
            }
            None => return Err("C must not overlap itself".into()),
        }
        Ok(())
    }
}

fn host_matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                c[i * n + j] += a[i * k + p] * b[p * n + j];
            }
        }
    }
    c
}

// ----- E1 ----------------------------------------------------------------------------------

struct E1 {
    chip: ChipWorker,
    orch: OrchHandle,
}

fn e1_chip(config: ChipConfig) -> Result<E1, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    let add = chip.register_kernel_fn("vector_add", add_kernel(0))?;
    let orch = chip.register_orchestration(
        strata_types::CallableDescriptor::new(
            strata_types::CallableKind::ChipOrchestration,
            "vector_add_orchestration",
        )
        .with_signature(&[
            strata_types::ParamDirection::In,
            strata_types::ParamDirection::In,
            strata_types::ParamDirection::Out,
        ]),
        move |o: &mut ChipOrch, args: &ChipArgs| {
            let mut a = CoreArgs::new();
            a.input(&args.tensor(0)?)
                .input(&args.tensor(1)?)
                .output(&args.tensor(2)?);
            o.submit_aiv(add, &a)?;
            Ok(())
        },
    )?;
    chip.init()?;
    Ok(E1 { chip, orch })
}

fn e1_once(e: &mut E1, cfg: &CallConfig, rep: &mut WorkloadReport) -> Result<(), WorkloadError> {
    let mut rng = Rng::new(42);
    let a = rng.randn(128 * 128, 1.0);
    let b = rng.randn(128 * 128, 1.0);
    let mut out = vec![0f32; 128 * 128];
    let mut args = RunArgs::new();
    args.input(&a, &[128, 128])
        .input(&b, &[128, 128])
        .output(&mut out, &[128, 128]);
    timed(&mut e.chip, &e.orch, &mut args, cfg, rep)?;
    let golden: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    check_close("out", &out, &golden, 1e-5, 1e-5)
}

/// E1: one AIV task `out = a + b` over 128×128 f32 (randn, seed 42).
///
/// # Errors
/// A chip error or a mismatch.
pub fn e1_vector_add(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    let mut e = e1_chip(config)?;
    let mut rep = WorkloadReport::default();
    e1_once(&mut e, &CallConfig::default(), &mut rep)?;
    e.chip.close()?;
    Ok(rep)
}

/// The four ring configurations of E1b: `{window 16, heap 1 MiB, dep 64}`, `{128, 8 MiB,
/// 256}`, per-ring `{[128,64,32,16], [8,4,2,1] MiB, [256,128,64,64]}`, and defaults.
pub fn e1b_ring_configs() -> Vec<CallConfig> {
    let all = |w, h, d| CallConfig {
        rings: [RingOverride {
            task_window: w,
            heap_bytes: h,
            dep_pool: d,
        }; 4],
        ..CallConfig::default()
    };
    let mut per_ring = CallConfig::default();
    for (i, r) in per_ring.rings.iter_mut().enumerate() {
        *r = RingOverride {
            task_window: [128, 64, 32, 16][i],
            heap_bytes: [8u64, 4, 2, 1][i] << 20,
            dep_pool: [256, 128, 64, 64][i],
        };
    }
    vec![
        all(16, 1 << 20, 64),
        all(128, 8 << 20, 256),
        per_ring,
        CallConfig::default(),
    ]
}

/// E1b: E1 under each of [`e1b_ring_configs`] on one chip.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e1b_ring_configs_run(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    let mut e = e1_chip(config)?;
    let mut rep = WorkloadReport::default();
    for cfg in e1b_ring_configs() {
        e1_once(&mut e, &cfg, &mut rep)?;
    }
    e.chip.close()?;
    Ok(rep)
}

/// E1c: malloc / copy_to / copy_from / free round trips (4096, 65536, 12345 bytes of a
/// deterministic pattern), three distinct live allocations, 8× alloc/free churn, and the
/// committed-memory accounting.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e1c_malloc(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    chip.init()?;
    let base = chip.committed_device_memory()?;
    let sizes = [4096usize, 65536, 12345];
    let mut ptrs = Vec::new();
    for (k, &n) in sizes.iter().enumerate() {
        let p = chip.malloc(n as u64)?;
        let after = chip.committed_device_memory()?;
        if after < base + n as u64 {
            return Err(WorkloadError::Mismatch {
                tensor: "committed_device_memory".into(),
                index: k,
                got: after as f64,
                want: (base + n as u64) as f64,
            });
        }
        let pattern: Vec<u8> = (0..n).map(|i| ((i * 7 + k * 13) % 251) as u8).collect();
        chip.copy_to(p, &pattern, n, CopyOffsets::default())?;
        let mut back = vec![0u8; n];
        chip.copy_from(&mut back, p, n, CopyOffsets::default())?;
        if let Some(i) = back.iter().zip(&pattern).position(|(a, b)| a != b) {
            return Err(WorkloadError::Mismatch {
                tensor: format!("round trip of {n} bytes"),
                index: i,
                got: back[i] as f64,
                want: pattern[i] as f64,
            });
        }
        ptrs.push(p);
    }
    for i in 0..ptrs.len() {
        for j in i + 1..ptrs.len() {
            if ptrs[i].addr() == ptrs[j].addr() {
                return Err(WorkloadError::Mismatch {
                    tensor: "distinct allocations".into(),
                    index: j,
                    got: ptrs[j].addr() as f64,
                    want: -1.0,
                });
            }
        }
    }
    for p in ptrs {
        let before = chip.committed_device_memory()?;
        chip.free(p)?;
        if chip.committed_device_memory()? >= before {
            return Err(WorkloadError::Mismatch {
                tensor: "committed after free".into(),
                index: 0,
                got: chip.committed_device_memory()? as f64,
                want: before as f64,
            });
        }
    }
    for round in 0..8 {
        let p = chip.malloc(65536)?;
        chip.copy_to(
            p,
            &[round as u8; 64],
            64,
            CopyOffsets {
                device: 1000,
                host: 0,
            },
        )?;
        chip.free(p)?;
    }
    if chip.committed_device_memory()? != base {
        return Err(WorkloadError::Mismatch {
            tensor: "committed after churn".into(),
            index: 0,
            got: chip.committed_device_memory()? as f64,
            want: base as f64,
        });
    }
    chip.close()?;
    Ok(WorkloadReport::default())
}

// ----- E2 ----------------------------------------------------------------------------------

/// E2: a small DAG with a nested scope: `c = a + b` (runtime-created), then in a scope
/// `d = c + 1`, `e = c + 2`, `g = d · e`, `f = g + c`; with a = 2, b = 3 every `f` is 47.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e2_vector_example(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    const N: u64 = 16384;
    let mut chip = ChipWorker::new(config)?;
    let add = chip.register_kernel_fn("add", add_kernel(0))?;
    let add_s = chip.register_kernel_fn("add_scalar", add_scalar_kernel)?;
    let mul = chip.register_kernel_fn("mul", mul_kernel(0))?;
    let orch = chip.register_orchestration_fn("vector_example", move |o, args| {
        let (a, b, f) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let ci = TensorCreateInfo::new(DataType::F32, &[N]);
        let mut t = CoreArgs::new();
        t.input(&a).input(&b).output_new(ci);
        let c = o.submit_aiv(add, &t)?.get(0)?;
        o.scope(|o| {
            let mut t = CoreArgs::new();
            t.input(&c).output_new(ci).scalar(1.0f32).scalar(3u32);
            let d = o.submit_aiv(add_s, &t)?.get(0)?;
            let mut t = CoreArgs::new();
            t.input(&c).output_new(ci).scalar(2.0f32).scalar(3u32);
            let e = o.submit_aiv(add_s, &t)?.get(0)?;
            let mut t = CoreArgs::new();
            t.input(&d).input(&e).output_new(ci);
            let g = o.submit_aiv(mul, &t)?.get(0)?;
            let mut t = CoreArgs::new();
            t.input(&g).input(&c).output(&f);
            o.submit_aiv(add, &t)?;
            Ok(())
        })
    })?;
    chip.init()?;
    let a = vec![2.0f32; N as usize];
    let b = vec![3.0f32; N as usize];
    let mut f = vec![0f32; N as usize];
    let mut rep = WorkloadReport::default();
    let mut args = RunArgs::new();
    args.input(&a, &[N]).input(&b, &[N]).output(&mut f, &[N]);
    timed(
        &mut chip,
        &orch,
        &mut args,
        &CallConfig::default(),
        &mut rep,
    )?;
    check_close("f", &f, &vec![47.0; N as usize], 1e-5, 1e-5)?;
    chip.close()?;
    Ok(rep)
}

// ----- E4 ----------------------------------------------------------------------------------

/// E4: the five task shapes (MIX AIC+AIV0+AIV1, AIC, AIV, AIV0+AIV1, AIC+AIV0) over four
/// iterations, each in its own scope, writing slices of nine output tensors.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e4_mixed_example(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    const V: u64 = 16384;
    const ITERS: u64 = 4;
    let mut chip = ChipWorker::new(config)?;
    let mm0 = chip.register_kernel_fn("matmul@0", matmul_kernel(0))?;
    let add3 = chip.register_kernel_fn("add@3", add_kernel(3))?;
    let mul6 = chip.register_kernel_fn("mul@6", mul_kernel(6))?;
    let add0 = chip.register_kernel_fn("add@0", add_kernel(0))?;
    let mul3 = chip.register_kernel_fn("mul@3", mul_kernel(3))?;
    let orch = chip.register_orchestration_fn("mixed_example", move |o, args| {
        let t = |i: usize| args.tensor(i);
        let (a, b, d, e, g, h) = (t(0)?, t(1)?, t(3)?, t(4)?, t(6)?, t(7)?);
        let iters = t(2)?.numel() / V;
        for i in 0..iters {
            let v =
                |k: usize| -> Result<ChipTensor, ChipError> { t(k)?.slice(0, i * V, (i + 1) * V) };
            o.scope(|o| {
                let mut x = CoreArgs::new();
                x.input(&a)
                    .input(&b)
                    .output(&v(2)?)
                    .input(&d)
                    .input(&e)
                    .output(&v(5)?)
                    .input(&g)
                    .input(&h)
                    .output(&v(8)?);
                o.submit(
                    MixedKernels::none()
                        .with_aic(mm0)
                        .with_aiv0(add3)
                        .with_aiv1(mul6),
                    &x,
                )?;
                let mut x = CoreArgs::new();
                x.input(&a).input(&b).output(&v(9)?);
                o.submit_aic(mm0, &x)?;
                let mut x = CoreArgs::new();
                x.input(&d).input(&e).output(&v(10)?);
                o.submit_aiv(add0, &x)?;
                let mut x = CoreArgs::new();
                x.input(&d)
                    .input(&e)
                    .output(&v(11)?)
                    .input(&g)
                    .input(&h)
                    .output(&v(12)?);
                o.submit(MixedKernels::none().with_aiv0(add0).with_aiv1(mul3), &x)?;
                let mut x = CoreArgs::new();
                x.input(&a)
                    .input(&b)
                    .output(&v(13)?)
                    .input(&d)
                    .input(&e)
                    .output(&v(14)?);
                o.submit(MixedKernels::none().with_aic(mm0).with_aiv0(add3), &x)?;
                Ok(())
            })?;
        }
        Ok(())
    })?;
    chip.init()?;
    let mut rng = Rng::new(42);
    let a = rng.randn(128 * 128, 0.01);
    let b = rng.randn(128 * 128, 0.01);
    let d = rng.randn(V as usize, 0.01);
    let e = rng.randn(V as usize, 0.01);
    let g = rng.randn(V as usize, 0.01);
    let h = rng.randn(V as usize, 0.01);
    let n = (ITERS * V) as usize;
    let mut outs: Vec<Vec<f32>> = (0..9).map(|_| vec![0f32; n]).collect();
    let mut rep = WorkloadReport::default();
    {
        let mut args = RunArgs::new();
        args.input(&a, &[V]).input(&b, &[V]);
        let mut it = outs.iter_mut();
        let mut next = || it.next().expect("nine outputs");
        args.output(next(), &[n as u64]);
        args.input(&d, &[V])
            .input(&e, &[V])
            .output(next(), &[n as u64]);
        args.input(&g, &[V])
            .input(&h, &[V])
            .output(next(), &[n as u64]);
        for _ in 0..6 {
            args.output(next(), &[n as u64]);
        }
        timed(
            &mut chip,
            &orch,
            &mut args,
            &CallConfig::default(),
            &mut rep,
        )?;
    }
    let mm: Vec<f32> = host_matmul(&a, &b, 128, 128, 128);
    let add: Vec<f32> = d.iter().zip(&e).map(|(x, y)| x + y).collect();
    let mul: Vec<f32> = g.iter().zip(&h).map(|(x, y)| x * y).collect();
    let rep_n = |v: &Vec<f32>| -> Vec<f32> { (0..ITERS).flat_map(|_| v.iter().copied()).collect() };
    let names = ["C", "F", "I", "J", "K", "L", "M", "N", "O"];
    let goldens = [&mm, &add, &mul, &mm, &add, &add, &mul, &mm, &add];
    for ((name, out), golden) in names.iter().zip(&outs).zip(goldens) {
        check_close(name, out, &rep_n(golden), 1e-3, 1e-3)?;
    }
    chip.close()?;
    Ok(rep)
}

// ----- E5 ----------------------------------------------------------------------------------

fn spmd_writer(
    slot_of: fn(&KernelCtx<'_>) -> u64,
    aic: bool,
) -> impl Fn(&mut KernelCtx<'_>) -> Result<(), KernelError> + Send + Sync + 'static {
    move |ctx| {
        let out = ctx.shared::<f32>(0)?;
        let base = 16 * slot_of(ctx);
        out.store_flat(base, ctx.block_idx() as f32);
        out.store_flat(base + 1, ctx.block_num() as f32);
        if !aic {
            out.store_flat(base + 2, ctx.sub_block_id() as f32);
        }
        Ok(())
    }
}

/// E5: one MIX task (AIC, AIV0, AIV1) whose kernels write `[block_idx, block_num,
/// sub_block_id]` at float offset 16·slot of one INOUT tensor; compared exactly.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e5_spmd_basic(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    let k0 = chip.register_kernel_fn("spmd_aic", spmd_writer(|_| 0, true))?;
    let k1 = chip.register_kernel_fn(
        "spmd_aiv0",
        spmd_writer(|c| 1 + c.sub_block_id() as u64, false),
    )?;
    let k2 = chip.register_kernel_fn(
        "spmd_aiv1",
        spmd_writer(|c| 1 + c.sub_block_id() as u64, false),
    )?;
    let orch = chip.register_orchestration_fn("spmd_basic", move |o, args| {
        let mut x = CoreArgs::new();
        x.inout(&args.tensor(0)?);
        o.submit(
            MixedKernels::none()
                .with_aic(k0)
                .with_aiv0(k1)
                .with_aiv1(k2),
            &x,
        )?;
        Ok(())
    })?;
    chip.init()?;
    let mut out = vec![0f32; 48];
    let mut rep = WorkloadReport::default();
    let mut args = RunArgs::new();
    args.inout(&mut out, &[48]);
    timed(
        &mut chip,
        &orch,
        &mut args,
        &CallConfig::default(),
        &mut rep,
    )?;
    let mut golden = vec![0f32; 48];
    golden[..2].copy_from_slice(&[0.0, 1.0]);
    golden[16..19].copy_from_slice(&[0.0, 1.0, 0.0]);
    golden[32..35].copy_from_slice(&[0.0, 1.0, 1.0]);
    check_close("out", &out, &golden, 0.0, 0.0)?;
    chip.close()?;
    Ok(rep)
}

/// SPMD with many blocks: an AIV task with `block_num` blocks where each block writes
/// `[block_idx, block_num, 1]` at offset 4·block_idx (element-wise shared access).
///
/// # Errors
/// A chip error or a mismatch.
pub fn spmd_blocks(config: ChipConfig, block_num: u32) -> Result<WorkloadReport, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    let k = chip.register_kernel_fn("spmd_blocks", |ctx| {
        let out = ctx.shared::<f32>(0)?;
        let b = ctx.block_idx() as u64;
        out.store_flat(4 * b, ctx.block_idx() as f32);
        out.store_flat(4 * b + 1, ctx.block_num() as f32);
        out.store_flat(4 * b + 2, 1.0);
        Ok(())
    })?;
    let orch = chip.register_orchestration_fn("spmd_blocks", move |o, args| {
        let mut x = CoreArgs::new();
        x.inout(&args.tensor(0)?).block_num(args.scalar::<u32>(0)?);
        o.submit_aiv(k, &x)?;
        Ok(())
    })?;
    chip.init()?;
    let n = 4 * block_num as usize;
    let mut out = vec![-1f32; n];
    let mut rep = WorkloadReport::default();
    let mut args = RunArgs::new();
    args.inout(&mut out, &[n as u64]).scalar(block_num);
    timed(
        &mut chip,
        &orch,
        &mut args,
        &CallConfig::default(),
        &mut rep,
    )?;
    let golden: Vec<f32> = (0..block_num)
        .flat_map(|b| [b as f32, block_num as f32, 1.0, -1.0])
        .collect();
    check_close("out", &out, &golden, 0.0, 0.0)?;
    chip.close()?;
    Ok(rep)
}

/// The reference's `merge_pipeline_barrier`: one AIV task of `blocks` blocks started
/// together (`require_sync_start`); every block waits at an intra-task barrier for all
/// its siblings (so they must run concurrently), then writes `2x + 3` over its chunk of
/// 1024 f32.
///
/// # Errors
/// A chip error or a mismatch.
pub fn spmd_barrier(config: ChipConfig, blocks: u32) -> Result<WorkloadReport, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    let arrived = Arc::new(AtomicU32::new(0));
    let arr = arrived.clone();
    let k = chip.register_kernel_fn("merge_pipeline_barrier", move |ctx| {
        let n = ctx.block_num();
        arr.fetch_add(1, Ordering::AcqRel);
        let t = Instant::now();
        while arr.load(Ordering::Acquire) < n {
            if ctx.cancelled() || t.elapsed() > Duration::from_secs(60) {
                return Err(KernelError::new("barrier: a sibling block never arrived"));
            }
            std::thread::yield_now();
        }
        let x = ctx.input::<f32>(0)?;
        let out = ctx.shared::<f32>(1)?;
        let len = x.numel() as u64;
        let chunk = len / n as u64;
        let start = ctx.block_idx() as u64 * chunk;
        let xs = x.as_slice().ok_or("x must be contiguous")?;
        for i in start..start + chunk {
            out.store_flat(i, 2.0 * xs[i as usize] + 3.0);
        }
        Ok(())
    })?;
    let orch = chip.register_orchestration_fn("merge_pipeline_barrier", move |o, args| {
        let mut x = CoreArgs::new();
        x.input(&args.tensor(0)?)
            .output(&args.tensor(1)?)
            .block_num(args.scalar::<u32>(0)?)
            .require_sync_start(true);
        o.submit_aiv(k, &x)?;
        Ok(())
    })?;
    chip.init()?;
    let x: Vec<f32> = (0..1024).map(|i| i as f32 * 0.5).collect();
    let mut out = vec![0f32; 1024];
    let mut rep = WorkloadReport::default();
    let mut args = RunArgs::new();
    args.input(&x, &[1024])
        .output(&mut out, &[1024])
        .scalar(blocks);
    timed(
        &mut chip,
        &orch,
        &mut args,
        &CallConfig::default(),
        &mut rep,
    )?;
    let golden: Vec<f32> = x.iter().map(|v| 2.0 * v + 3.0).collect();
    check_close("out", &out, &golden, 0.0, 0.0)?;
    chip.close()?;
    Ok(rep)
}

// ----- E6 ----------------------------------------------------------------------------------

/// E6: dependency-only tasks in four cases (a dummy between a writer and a reader; four
/// chained dummies; a dummy with explicit dependencies on two writers; 18 dummies fanning
/// out of a writer into a consumer with 18 explicit dependencies); compared exactly.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e6_dummy_task(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    let write = chip.register_kernel_fn("write_const", |ctx| {
        let mut t = ctx.output::<f32>(0)?;
        t.set_flat(0, 42.0);
        Ok(())
    })?;
    let copy = chip.register_kernel_fn("copy_first", |ctx| {
        let v = ctx.input::<f32>(0)?.get_flat(0).ok_or("empty input")?;
        ctx.output::<f32>(1)?.set_flat(0, v);
        Ok(())
    })?;
    let orch = chip.register_orchestration_fn("dummy_task", move |o, args| {
        let (x, y, w) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let case: u32 = args.scalar(0)?;
        let mut wx = CoreArgs::new();
        wx.inout(&x);
        let mut cp = CoreArgs::new();
        cp.input(&x).inout(&y);
        match case {
            1 => {
                o.submit_aic(write, &wx)?;
                o.submit_dummy(CoreArgs::new().inout(&x))?;
                o.submit_aic(copy, &cp)?;
            }
            2 => {
                o.submit_aic(write, &wx)?;
                for _ in 0..4 {
                    o.submit_dummy(CoreArgs::new().inout(&x))?;
                }
                o.submit_aic(copy, &cp)?;
            }
            3 => {
                let a = o.submit_aic(write, &wx)?.task_id();
                let b = o.submit_aic(write, CoreArgs::new().inout(&w))?.task_id();
                let d = o.submit_dummy(CoreArgs::new().dep(a).dep(b))?.task_id();
                o.submit_aic(copy, cp.clone().dep(d))?;
            }
            _ => {
                let a = o.submit_aic(write, &wx)?.task_id();
                let mut consumer = cp.clone();
                for _ in 0..18 {
                    let d = o.submit_dummy(CoreArgs::new().dep(a))?.task_id();
                    consumer.dep(d);
                }
                o.submit_aic(copy, &consumer)?;
            }
        }
        Ok(())
    })?;
    let cfg = CallConfig {
        aicpu_thread_num: 2,
        ..CallConfig::default()
    };
    chip.init()?;
    let mut rep = WorkloadReport::default();
    for case in 1..=4u32 {
        let (mut x, mut y, mut w) = (vec![-1f32; 16], vec![-1f32; 16], vec![-1f32; 16]);
        let mut args = RunArgs::new();
        args.inout(&mut x, &[16])
            .inout(&mut y, &[16])
            .inout(&mut w, &[16])
            .scalar(case);
        timed(&mut chip, &orch, &mut args, &cfg, &mut rep)?;
        let mut gx = vec![-1f32; 16];
        gx[0] = 42.0;
        let mut gw = vec![-1f32; 16];
        if case == 3 {
            gw[0] = 42.0;
        }
        check_close(&format!("case {case} x"), &x, &gx, 0.0, 0.0)?;
        check_close(&format!("case {case} y"), &y, &gx, 0.0, 0.0)?;
        check_close(&format!("case {case} w"), &w, &gw, 0.0, 0.0)?;
    }
    chip.close()?;
    Ok(rep)
}

// ----- E7 ----------------------------------------------------------------------------------

/// E7: orchestration data access — `get_tensor_data` / `set_tensor_data` on external and
/// runtime tensors, `alloc_tensors` with an initial value, INOUT re-registration,
/// orchestration→kernel read-after-write, write-after-read/write-after-write waits on a
/// runtime tensor, and an external write-after-read through `output(b)`.
/// Golden: result = a + b, check = `[2, 102, 77, 77, 79, 42, 12, 88, 55]`.
///
/// # Errors
/// A chip error or a mismatch.
pub fn e7_scalar_data(config: ChipConfig) -> Result<WorkloadReport, WorkloadError> {
    const N: u64 = 16384;
    let mut chip = ChipWorker::new(config)?;
    let add = chip.register_kernel_fn("add", add_kernel(0))?;
    let add_io = chip.register_kernel_fn("add_inout", |ctx| {
        let x = ctx.input::<f32>(1)?;
        let mut acc = ctx.output::<f32>(0)?;
        let xs = x.as_slice().ok_or("x must be contiguous")?;
        for (o, v) in acc
            .as_mut_slice()
            .ok_or("acc must be contiguous")?
            .iter_mut()
            .zip(xs)
        {
            *o += v;
        }
        Ok(())
    })?;
    let noop = chip.register_kernel_fn("noop", |_| Ok(()))?;
    let orch = chip.register_orchestration_fn("scalar_data", move |o, args| {
        let (a, b, result, check) = (
            args.tensor(0)?,
            args.tensor(1)?,
            args.tensor(2)?,
            args.tensor(3)?,
        );
        let ci = TensorCreateInfo::new(DataType::F32, &[N]);
        let mut vals = [0f32; 9];
        // 1. kernel c = a + b (runtime-created c).
        let c = o
            .submit_aiv(add, CoreArgs::new().input(&a).input(&b).output_new(ci))?
            .get(0)?;
        // 2. read an external input (no producer).
        vals[0] = o.get_tensor_data(&a, &[0])?;
        // 3. read a kernel output: waits for the producer.
        vals[1] = o.get_tensor_data(&c, &[100])?;
        // 4. alloc_tensors with an initial value.
        let s = o.alloc_tensors(&[ci.with_initial_value(77.0f32)])?.get(0)?;
        vals[2] = o.get_tensor_data(&s, &[0])?;
        // 5. a task that touches nothing does not disturb it.
        o.submit_aiv(noop, &CoreArgs::new())?;
        vals[3] = o.get_tensor_data(&s, &[10])?;
        // 6. a kernel reads the allocated tensor: s2 = s + a.
        let s2 = o
            .submit_aiv(add, CoreArgs::new().input(&s).input(&a).output_new(ci))?
            .get(0)?;
        vals[4] = o.get_tensor_data(&s2, &[0])?;
        // 7. write a kernel output after its producer (and readers) finished.
        o.set_tensor_data(&c, &[5], 42.0f32)?;
        vals[5] = o.get_tensor_data(&c, &[5])?;
        // 8. INOUT re-registration: v = 10, then v += a through an INOUT task.
        let v = o.alloc_tensors(&[ci.with_initial_value(10.0f32)])?.get(0)?;
        o.submit_aiv(add_io, CoreArgs::new().inout(&v).input(&a))?;
        vals[6] = o.get_tensor_data(&v, &[0])?;
        // 9. WAW + WAR: writing v waits for the INOUT task.
        o.submit_aiv(add_io, CoreArgs::new().inout(&v).input(&a))?;
        o.set_tensor_data(&v, &[1], 88.0f32)?;
        vals[7] = o.get_tensor_data(&v, &[1])?;
        // 10. result = a + b reads b; then b is overwritten (external write-after-read).
        o.submit_aiv(add, CoreArgs::new().input(&a).input(&b).output(&result))?;
        let w = o.alloc_tensors(&[ci.with_initial_value(53.0f32)])?.get(0)?;
        o.submit_aiv(add, CoreArgs::new().input(&a).input(&w).output(&b))?;
        // 11. read the overwritten external tensor.
        vals[8] = o.get_tensor_data(&b, &[0])?;
        // 12–13. publish the observed values.
        for (i, val) in vals.iter().enumerate() {
            o.set_tensor_data(&check, &[i as u64], *val)?;
        }
        Ok(())
    })?;
    chip.init()?;
    let a = vec![2.0f32; N as usize];
    let b: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let mut result = vec![0f32; N as usize];
    let mut check = vec![0f32; 9];
    let mut rep = WorkloadReport::default();
    let mut args = RunArgs::new();
    args.input(&a, &[N])
        .input(&b, &[N])
        .output(&mut result, &[N])
        .output(&mut check, &[9]);
    timed(
        &mut chip,
        &orch,
        &mut args,
        &CallConfig::default(),
        &mut rep,
    )?;
    let golden: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    check_close("result", &result, &golden, 1e-5, 1e-5)?;
    check_close(
        "check",
        &check,
        &[2.0, 102.0, 77.0, 77.0, 79.0, 42.0, 12.0, 88.0, 55.0],
        0.0,
        0.0,
    )?;
    chip.close()?;
    Ok(rep)
}

// ----- batched matmul -----------------------------------------------------------------------

/// A batched tiled matmul `C[b] = A[b] @ B[b]` (`batch` × `n`×`n`, tiles of `tile`): per
/// output tile and k-step an AIC task multiplies two tile views into a runtime-created
/// partial product and an AIV task accumulates it into the INOUT tile view of C — several
/// hundred tasks whose independence comes from disjoint tile views of the same buffers.
///
/// # Errors
/// A chip error or a mismatch against a host matmul.
pub fn batched_matmul(
    config: ChipConfig,
    batch: u64,
    n: u64,
    tile: u64,
) -> Result<WorkloadReport, WorkloadError> {
    let mut chip = ChipWorker::new(config)?;
    let mm = chip.register_kernel_fn("tile_matmul", matmul_kernel(0))?;
    let acc = chip.register_kernel_fn("tile_accumulate", |ctx| {
        let p = ctx.input::<f32>(0)?;
        let mut c = ctx.output::<f32>(1)?;
        let p = p.as_slice().ok_or("partial product must be contiguous")?;
        let mut pos = 0;
        for run in c.runs_mut().ok_or("C tile overlaps itself")? {
            for (o, v) in run.iter_mut().zip(&p[pos..]) {
                *o += v;
            }
            pos += run.len();
        }
        Ok(())
    })?;
    let orch = chip.register_orchestration_fn("batched_matmul", move |o, args| {
        let (a, b, c) = (args.tensor(0)?, args.tensor(1)?, args.tensor(2)?);
        let tiles = n / tile;
        let ci = TensorCreateInfo::new(DataType::F32, &[tile, tile]);
        let tile_of = |t: &ChipTensor, bi: u64, r: u64, k: u64| -> Result<ChipTensor, ChipError> {
            let w = t.window(&[bi, r * tile, k * tile], &[1, tile, tile])?;
            let v = w.view();
            // Drop the unit batch axis: a strided 2-D view of the tile.
            let view = strata_types::TensorView::new(
                v.dtype(),
                &[tile, tile],
                &v.strides()[1..],
                v.byte_offset(),
            )?;
            w.with_view(view)
        };
        for bi in 0..batch {
            for i in 0..tiles {
                for j in 0..tiles {
                    let c_tile = tile_of(&c, bi, i, j)?;
                    o.scope(|o| {
                        for k in 0..tiles {
                            let mut x = CoreArgs::new();
                            x.input(&tile_of(&a, bi, i, k)?)
                                .input(&tile_of(&b, bi, k, j)?)
                                .output_new(ci);
                            let p = o.submit_aic(mm, &x)?.get(0)?;
                            o.submit_aiv(acc, CoreArgs::new().input(&p).inout(&c_tile))?;
                        }
                        Ok(())
                    })?;
                }
            }
        }
        Ok(())
    })?;
    chip.init()?;
    let mut rng = Rng::new(7);
    let len = (batch * n * n) as usize;
    let a = rng.randn(len, 0.1);
    let b = rng.randn(len, 0.1);
    let mut c = vec![0f32; len];
    let mut rep = WorkloadReport::default();
    let mut args = RunArgs::new();
    args.input(&a, &[batch, n, n])
        .input(&b, &[batch, n, n])
        .inout(&mut c, &[batch, n, n]);
    timed(
        &mut chip,
        &orch,
        &mut args,
        &CallConfig::default(),
        &mut rep,
    )?;
    let m = (n * n) as usize;
    for bi in 0..batch as usize {
        let golden = host_matmul(
            &a[bi * m..(bi + 1) * m],
            &b[bi * m..(bi + 1) * m],
            n as usize,
            n as usize,
            n as usize,
        );
        check_close(
            &format!("C[{bi}]"),
            &c[bi * m..(bi + 1) * m],
            &golden,
            1e-3,
            1e-4,
        )?;
    }
    chip.close()?;
    Ok(rep)
}

// ----- negative suite -----------------------------------------------------------------------

/// One case of the negative suite: its name, the fatal code it must produce, and the code
/// it produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegativeCase {
    /// Case name (as in the reference's `runtime_fatal_codes`).
    pub name: &'static str,
    /// Expected code.
    pub want: i32,
    /// The run's error.
    pub got: String,
}

fn expect_code(
    case: &'static str,
    want: i32,
    r: Result<RunReport, ChipError>,
) -> Result<NegativeCase, WorkloadError> {
    match r {
        Err(e) if e.code() == Some(want) => Ok(NegativeCase {
            name: case,
            want,
            got: e.to_string(),
        }),
        Err(e) => Err(WorkloadError::WrongCode {
            case,
            want,
            got: format!("code {:?}: {e}", e.code()),
        }),
        Ok(_) => Err(WorkloadError::WrongCode {
            case,
            want,
            got: "the run succeeded".into(),
        }),
    }
}

/// The negative suite: scope deadlock (1), heap-ring deadlock (2), flow-control deadlock
/// (3), dependency-pool overflow (4), invalid arguments (5), require-sync-start invalid
/// (7), tensor-wait timeout (8), explicit fatal (9), a hanging kernel (SCHEDULER_TIMEOUT,
/// 100) and a failing kernel (KERNEL_FAILED, 110) — each on the same chip, which stays
/// usable: a vector add run after every case must still succeed.
///
/// # Errors
/// [`WorkloadError::WrongCode`] if a case does not fail with its code, or a chip error.
pub fn negative_suite(mut config: ChipConfig) -> Result<Vec<NegativeCase>, WorkloadError> {
    config.tensor_wait_timeout = Duration::from_millis(300);
    let mut chip = ChipWorker::new(config)?;
    let add = chip.register_kernel_fn("vector_add", add_kernel(0))?;
    let hang = chip.register_kernel_fn("hang", |ctx| {
        while !ctx.cancelled() {
            std::thread::sleep(Duration::from_micros(200));
        }
        Err(KernelError::new("cancelled"))
    })?;
    let fail = chip.register_kernel_fn("fails", |_| Err(KernelError::new("deliberate failure")))?;
    let out16 = TensorCreateInfo::new(DataType::F32, &[16]);
    let scope_deadlock = chip.register_orchestration_fn("scope_deadlock", move |o, _| {
        for _ in 0..8 {
            o.submit_dummy(CoreArgs::new().output_new(out16))?;
        }
        Ok(())
    })?;
    let heap_deadlock = chip.register_orchestration_fn("heap_ring_deadlock", move |o, _| {
        o.submit_dummy(CoreArgs::new().output_new(TensorCreateInfo::new(DataType::F32, &[8192])))?;
        Ok(())
    })?;
    let flow_deadlock = chip.register_orchestration_fn("flow_control_deadlock", move |o, _| {
        for _ in 0..8 {
            o.scope_begin()?;
            for _ in 0..3 {
                o.submit_dummy(CoreArgs::new().output_new(out16))?;
            }
        }
        Ok(())
    })?;
    let dep_overflow = chip.register_orchestration_fn("dep_pool_overflow", move |o, args| {
        let x = args.tensor(0)?;
        for i in 0..128 {
            // Producers that own a created tensor stay live (retained by the scope).
            o.submit_dummy(
                CoreArgs::new()
                    .output(&x.slice(0, i, i + 1)?)
                    .output_new(out16),
            )?;
        }
        o.submit_dummy(CoreArgs::new().input(&x))?;
        Ok(())
    })?;
    let invalid = chip.register_orchestration_fn("invalid_args", move |o, _| {
        o.submit_dummy(CoreArgs::new().set_dependencies(&[ChipTaskId::INVALID; 4]))?;
        Ok(())
    })?;
    let sync_start =
        chip.register_orchestration_fn("require_sync_start_invalid", move |o, args| {
            o.submit_aiv(
                add,
                CoreArgs::new()
                    .input(&args.tensor(0)?)
                    .block_num(1000)
                    .require_sync_start(true),
            )?;
            Ok(())
        })?;
    let tensor_wait = chip.register_orchestration_fn("tensor_wait_timeout", move |o, args| {
        let x = args.tensor(0)?;
        o.submit_aiv(hang, CoreArgs::new().inout(&x))?;
        let _: f32 = o.get_tensor_data(&x, &[0])?;
        Ok(())
    })?;
    let explicit = chip.register_orchestration_fn("explicit_fatal", move |o, _| {
        let e = o.report_fatal(codes::EXPLICIT_ORCH_FATAL, "deliberate fatal");
        // Later calls are no-ops that return the latched error.
        let again = o.submit_dummy(&CoreArgs::new());
        if !matches!(again, Err(ChipError::Fatal { code: 9, .. })) {
            return Err(ChipError::Internal(
                "API call after a fatal was not a no-op".into(),
            ));
        }
        Err(e)
    })?;
    let hang_run = chip.register_orchestration_fn("aicore_hang", move |o, args| {
        o.submit_aiv(hang, CoreArgs::new().inout(&args.tensor(0)?))?;
        Ok(())
    })?;
    let fail_run = chip.register_orchestration_fn("kernel_failure", move |o, args| {
        let x = args.tensor(0)?;
        o.submit_aiv(fail, CoreArgs::new().inout(&x))?;
        // Downstream of the failure: poisoned, never runs.
        o.submit_aiv(
            add,
            CoreArgs::new().input(&x).input(&x).output(&args.tensor(1)?),
        )
        .map(|_| ())
        .or_else(|e| match e {
            ChipError::RunFailed { .. } => Ok(()),
            e => Err(e),
        })
    })?;
    let ok_run = chip.register_orchestration_fn("vector_add", move |o, args| {
        o.submit_aiv(
            add,
            CoreArgs::new()
                .input(&args.tensor(0)?)
                .input(&args.tensor(1)?)
                .output(&args.tensor(2)?),
        )?;
        Ok(())
    })?;
    chip.init()?;

    let rings = |w: u64, h: u64, d: u64| CallConfig {
        rings: [RingOverride {
            task_window: w,
            heap_bytes: h,
            dep_pool: d,
        }; 4],
        ..CallConfig::default()
    };
    let mut cases = Vec::new();
    let mut x = vec![1.0f32; 128];
    let mut y = vec![0.0f32; 128];
    let still_usable = |chip: &mut ChipWorker| -> Result<(), WorkloadError> {
        let a = vec![1.5f32; 64];
        let mut out = vec![0f32; 64];
        let mut args = RunArgs::new();
        args.input(&a, &[64])
            .input(&a, &[64])
            .output(&mut out, &[64]);
        chip.run(&ok_run, &mut args, &CallConfig::default())?;
        check_close("still usable", &out, &[3.0; 64], 0.0, 0.0)
    };
    let none = &mut RunArgs::new();
    cases.push(expect_code(
        "scope_deadlock",
        1,
        chip.run(&scope_deadlock, none, &rings(4, 0, 0)),
    )?);
    still_usable(&mut chip)?;
    cases.push(expect_code(
        "heap_ring_deadlock",
        2,
        chip.run(&heap_deadlock, none, &rings(0, 1024, 0)),
    )?);
    still_usable(&mut chip)?;
    cases.push(expect_code(
        "flow_control_deadlock",
        3,
        chip.run(&flow_deadlock, none, &rings(4, 0, 0)),
    )?);
    still_usable(&mut chip)?;
    {
        let mut a = RunArgs::new();
        a.inout(&mut x, &[128]);
        cases.push(expect_code(
            "dep_pool_overflow",
            4,
            chip.run(&dep_overflow, &mut a, &rings(0, 0, 4)),
        )?);
    }
    still_usable(&mut chip)?;
    cases.push(expect_code(
        "invalid_args",
        5,
        chip.run(&invalid, none, &CallConfig::default()),
    )?);
    still_usable(&mut chip)?;
    {
        let mut a = RunArgs::new();
        a.inout(&mut x, &[128]);
        cases.push(expect_code(
            "require_sync_start_invalid",
            7,
            chip.run(&sync_start, &mut a, &CallConfig::default()),
        )?);
    }
    still_usable(&mut chip)?;
    {
        let cfg = CallConfig {
            timeout_ms: 1500,
            ..CallConfig::default()
        };
        let mut a = RunArgs::new();
        a.inout(&mut x, &[128]);
        cases.push(expect_code(
            "tensor_wait_timeout",
            8,
            chip.run(&tensor_wait, &mut a, &cfg),
        )?);
    }
    still_usable(&mut chip)?;
    cases.push(expect_code(
        "explicit_fatal",
        9,
        chip.run(&explicit, none, &CallConfig::default()),
    )?);
    still_usable(&mut chip)?;
    {
        let cfg = CallConfig {
            timeout_ms: 200,
            ..CallConfig::default()
        };
        let mut a = RunArgs::new();
        a.inout(&mut x, &[128]);
        cases.push(expect_code(
            "aicore_hang",
            codes::SCHEDULER_TIMEOUT,
            chip.run(&hang_run, &mut a, &cfg),
        )?);
    }
    still_usable(&mut chip)?;
    {
        let before = y.clone();
        let mut a = RunArgs::new();
        a.inout(&mut x, &[128]).inout(&mut y, &[128]);
        cases.push(expect_code(
            "kernel_failure",
            codes::KERNEL_FAILED,
            chip.run(&fail_run, &mut a, &CallConfig::default()),
        )?);
        // Outputs are not copied back after a failed run.
        check_close("y after a failed run", &y, &before, 0.0, 0.0)?;
    }
    still_usable(&mut chip)?;
    chip.close()?;
    Ok(cases)
}

/// The CPU time (user + system) the threads of an initialised, idle chip consumed during
/// `idle` — about zero when its threads park. Only the chip's own threads are counted (by
/// thread name, `chip<id>-…`), so other threads of the process do not disturb it.
///
/// # Errors
/// A chip error.
pub fn idle_cpu(config: ChipConfig, idle: Duration) -> Result<Duration, WorkloadError> {
    let prefix = format!("chip{}-", config.chip_id);
    let mut chip = ChipWorker::new(config)?;
    chip.init()?;
    std::thread::sleep(Duration::from_millis(50)); // let the threads park
    let before = threads_cpu_time(&prefix);
    std::thread::sleep(idle);
    let used = threads_cpu_time(&prefix).saturating_sub(before);
    chip.close()?;
    Ok(used)
}

/// CPU time (user + system) used so far by this process's threads whose name starts
/// with `prefix`, from `/proc/self/task/*/stat` (`Duration::ZERO` where unavailable).
pub fn threads_cpu_time(prefix: &str) -> Duration {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Duration::ZERO;
    };
    let mut total = Duration::ZERO;
    for e in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let name = stat
            .split_once('(')
            .and_then(|(_, r)| r.rsplit_once(')'))
            .map(|(n, _)| n);
        if name.is_some_and(|n| n.starts_with(prefix)) {
            total += stat_cpu(&stat);
        }
    }
    total
}

fn stat_cpu(stat: &str) -> Duration {
    // Fields after the parenthesised name; utime and stime are fields 14 and 15, i.e.
    // indices 11 and 12 counting from the state field (3).
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return Duration::ZERO;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    Duration::from_millis((ticks(11) + ticks(12)) * 10) // USER_HZ = 100 on Linux
}

/// CPU time (user + system) this process has used, from `/proc/self/stat`
/// (`Duration::ZERO` where unavailable).
pub fn process_cpu_time() -> Duration {
    std::fs::read_to_string("/proc/self/stat").map_or(Duration::ZERO, |s| stat_cpu(&s))
}

/// Directions used in signatures (re-exported for examples).
pub use strata_types::ParamDirection;
