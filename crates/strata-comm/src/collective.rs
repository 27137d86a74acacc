//! Collectives built from the window primitives: allreduce (mesh, two-phase, ring),
//! broadcast, allgather, reduce-scatter, all-to-all, barrier. Every rank of the domain
//! calls the same collective on the same windows; all are in place on windows and
//! self-clearing (the signal area is left ready for the next call, run after run).
//!
//! One calling convention: a collective is a method of the window it is called on (its
//! data — in place for allreduce, broadcast and reduce-scatter, the stage of allgather and
//! all-to-all), then the other window it needs (the target), then its options (op,
//! algorithm, root). It synchronises through the **signal area of that window's buffer**
//! ([`signal_area_bytes`] per rank, allocated with the buffer and sized for every
//! collective over its domain), so no signal window is passed or sized by the caller.
//!
//! Signal-area layout (i32 cells; `P = nranks`, `R = round_up(P, 16)`; the area is
//! 64-byte aligned so each group has its own cache lines):
//!
//! | cells | what | written by |
//! |---|---|---|
//! | `[0, P)` | barrier rows (the credit barrier of [`Window::barrier`]) | peers (`+1`), owner (`-1`) |
//! | `R` | call sequence number of this signal window (local only) | owner |
//! | `[R+16, R+16 + 2·P·80)` | arrival slots: parity `p`, source `s` at `R+16 + (p·P + s)·80`: `flag, hash, status, -, inline data (256 B)` | source `s` |
//! | ring only: `2(P−1)` more (rounded to 16) | ring step flags: cell `t−1` = "left neighbour finished step `t`" | left neighbour |

use crate::arena::layout::MAX_RANKS;
use crate::comm::Window;
use crate::error::CommError;
use crate::reduce::{self, ReduceOp};
use crate::signal::{self, NotifyOp, WaitCmp};
use crate::tensor::DistributedTensor;
use std::cell::RefCell;
use std::sync::atomic::Ordering;

/// Messages up to this many bytes take the mesh allreduce's one-hand-off path: each rank
/// pushes its data into every peer's arrival slot (in the same cache lines as the flag)
/// and reduces locally — one cache-line hand-off per peer, no second barrier.
pub const SMALL_ALLREDUCE_BYTES: u64 = 256;

/// [`AllreduceAlgo::Auto`] picks the mesh algorithm (its inline path) up to this many
/// bytes, two-phase above.
pub const AUTO_MESH_MAX_BYTES: u64 = SMALL_ALLREDUCE_BYTES;

/// Cells per arrival slot: flag, hash, status, reserved, then 256 bytes of inline data
/// (5 cache lines).
const SLOT_CELLS: u64 = 80;
/// Header cells of an arrival slot.
const SLOT_HDR: u64 = 4;

/// How [`Window::allreduce`] moves and reduces the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllreduceAlgo {
    /// One phase: every rank reduces the whole tensor from every rank's copy (rank order),
    /// into a private buffer, then a barrier, then writes it back in place. Up to
    /// [`SMALL_ALLREDUCE_BYTES`] the data travels inline with the arrival flags instead
    /// (one hand-off in all).
    Mesh,
    /// Reduce-scatter then allgather, fused: rank `r` reduces chunk `r` (64-byte aligned
    /// chunks) straight from every rank's copy and writes the result into chunk `r` of
    /// every rank's copy (the allgather, pushed), then one barrier. Work and memory traffic
    /// are split across ranks: each rank reads and writes `numel` elements whatever `P`.
    TwoPhase,
    /// The ring: `P−1` reduce-scatter steps (rank `r` folds chunk `(r−1−s) mod P` of its
    /// left neighbour into its own) then `P−1` allgather steps (copies chunk `(r−s) mod P`
    /// from its left neighbour), each step gated by a flag from the left neighbour.
    /// Needs `numel % P == 0`.
    Ring,
    /// Mesh up to [`AUTO_MESH_MAX_BYTES`] (one hand-off), two-phase above (one barrier
    /// after a split reduction) — the fastest choice at every size measured.
    Auto,
}

impl AllreduceAlgo {
    /// Every algorithm, in code order.
    pub const ALL: [AllreduceAlgo; 4] = [
        AllreduceAlgo::Mesh,
        AllreduceAlgo::TwoPhase,
        AllreduceAlgo::Ring,
        AllreduceAlgo::Auto,
    ];

    /// The algorithm for a wire code (as carried in a task scalar), if any.
    pub fn from_code(code: u64) -> Option<AllreduceAlgo> {
        AllreduceAlgo::ALL.into_iter().find(|a| a.code() == code)
    }

    /// The algorithm's wire code (1..=4).
    pub fn code(self) -> u64 {
        match self {
            AllreduceAlgo::Mesh => 1,
            AllreduceAlgo::TwoPhase => 2,
            AllreduceAlgo::Ring => 3,
            AllreduceAlgo::Auto => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            AllreduceAlgo::Mesh => "allreduce(mesh)",
            AllreduceAlgo::TwoPhase => "allreduce(two-phase)",
            AllreduceAlgo::Ring => "allreduce(ring)",
            AllreduceAlgo::Auto => "allreduce",
        }
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Allreduce(AllreduceAlgo),
    Broadcast,
    Allgather,
    ReduceScatter,
    AllToAll,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Allreduce(a) => a.name(),
            Kind::Broadcast => "broadcast",
            Kind::Allgather => "allgather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::AllToAll => "all_to_all",
        }
    }

    fn code(self) -> u64 {
        match self {
            Kind::Allreduce(a) => 0x10 | a.code(),
            Kind::Broadcast => 0x20,
            Kind::Allgather => 0x30,
            Kind::ReduceScatter => 0x40,
            Kind::AllToAll => 0x50,
        }
    }
}

/// Where the collective structures sit in a signal window of `n` ranks.
#[derive(Clone, Copy)]
struct Layout {
    n: u64,
    seq: u64,
    slots: u64,
    ring: u64,
}

impl Layout {
    fn new(nranks: u32) -> Layout {
        let n = u64::from(nranks.max(1));
        let seq = n.div_ceil(16) * 16;
        let slots = seq + 16;
        Layout {
            n,
            seq,
            slots,
            ring: slots + 2 * n * SLOT_CELLS,
        }
    }

    fn slot(&self, parity: u64, src: u64) -> u64 {
        self.slots + (parity * self.n + src) * SLOT_CELLS
    }
}

/// Cells (i32) the signal area needs for [`Window::allreduce`] with `algo` over `nranks`
/// ranks (ring needs `2(P−1)` more, rounded to 16, than the others).
fn signal_cells(nranks: u32, algo: AllreduceAlgo) -> u64 {
    let l = Layout::new(nranks);
    match algo {
        AllreduceAlgo::Ring => l.ring + (2 * (l.n - 1)).div_ceil(16) * 16,
        _ => l.ring,
    }
}

/// Cells (i32) broadcast, allgather, reduce-scatter, all-to-all and the barrier need over
/// `nranks` ranks (the barrier rows, the sequence cell and the arrival slots).
#[cfg(test)]
fn collective_signal_cells(nranks: u32) -> u64 {
    Layout::new(nranks).ring
}

/// Alignment of a buffer's signal area in each rank's copy (and of its size): a pair of
/// cache lines, so the adjacent-line prefetcher never couples the signal lines with the
/// window data before them.
pub(crate) const SIGNAL_ALIGN: u64 = 128;

/// Where the signal area starts in each rank's copy of a buffer whose windows view
/// `data_bytes` bytes.
pub(crate) fn signal_offset(data_bytes: u64) -> u64 {
    data_bytes.div_ceil(SIGNAL_ALIGN) * SIGNAL_ALIGN
}

/// Bytes of the signal area every window buffer of an `nranks`-rank domain carries on each
/// rank, after the bytes its windows view (at the next multiple of 128): room for every
/// collective and barrier over the domain (the ring allreduce needs the most), rounded up
/// to 128. The runtime allocates it with the buffer; it is reported here for memory
/// accounting.
///
/// ```
/// use strata_comm::signal_area_bytes;
/// assert_eq!(signal_area_bytes(2), 1536); // 368 cells (rows, sequence, arrivals, ring flags)
/// assert!(signal_area_bytes(64) < 48 << 10);
/// ```
pub fn signal_area_bytes(nranks: u32) -> u64 {
    (signal_cells(nranks, AllreduceAlgo::Ring) * 4).div_ceil(SIGNAL_ALIGN) * SIGNAL_ALIGN
}

/// A word-wise multiplicative hash (FxHash-style), folded to 32 bits: the descriptor of a
/// call (kind, extra words such as op or root, and every tensor's encoding). Cheap enough
/// to compute on every call (a dozen multiplies).
fn descriptor_hash(kind: Kind, extra: &[u64], tensors: &[&DistributedTensor]) -> u32 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h: u64 = 0;
    let mut eat = |w: u64| h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    eat(kind.code());
    extra.iter().for_each(|&w| eat(w));
    for t in tensors {
        t.encode().into_iter().for_each(&mut eat);
    }
    (h ^ (h >> 29) ^ (h >> 32)) as u32
}

thread_local! {
    /// The mesh allreduce's private result buffer (grown, reused by the thread).
    static SCRATCH: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Copies `n` bytes.
///
/// # Safety
/// Both ranges are valid and disjoint, and nobody writes `src` or accesses `dst` meanwhile.
#[inline]
unsafe fn copy(src: *const u8, dst: *mut u8, n: u64) {
    if n > 0 {
        // SAFETY: per the function contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n as usize) };
    }
}

fn bad(what: String) -> CommError {
    CommError::BadArgument { what }
}

/// The signal area of `w`'s buffer for a collective called on `w` with `others` (problems
/// every rank sees alike — windows of another domain — reported at once, before any
/// signal is touched).
fn open_signal<'a>(
    w: &Window<'a>,
    kind: Kind,
    others: &[&Window<'_>],
) -> Result<(Window<'a>, Layout), CommError> {
    for o in others {
        if o.g.domain != w.g.domain {
            return Err(bad(format!(
                "{}: the windows of a collective must belong to the same comm domain",
                kind.name()
            )));
        }
    }
    let sig = w.signal();
    debug_assert!(sig.g.t.numel() >= signal_cells(sig.nranks(), AllreduceAlgo::Ring));
    let lay = Layout::new(sig.nranks());
    Ok((sig, lay))
}

struct Arrived {
    /// This call's flag value (its sequence number + 1).
    flag: i32,
    /// This call's arrival-slot parity.
    parity: u64,
}

/// The arrival: publishes this rank's descriptor (and inline data) into its slot of every
/// peer's signal copy and waits for every peer's, then checks them. `local` is this rank's
/// own verdict on its arguments: a rejected call still arrives (with status 1), so peers
/// report a mismatch instead of waiting for it, and every rank leaves the signal window
/// consistent.
fn arrive(
    sig: &Window<'_>,
    lay: &Layout,
    kind: Kind,
    hash: u32,
    local: Result<(), CommError>,
    inline: &[u8],
) -> Result<Arrived, CommError> {
    let g = &sig.g;
    let (me, n) = (sig.rank(), sig.nranks());
    let status = i32::from(local.is_err());
    let seq_cell = g.cell(me, lay.seq);
    let seq = seq_cell.load(Ordering::Relaxed) as u32;
    let parity = u64::from(seq & 1);
    let flag = seq.wrapping_add(1) as i32;
    let mine = lay.slot(parity, u64::from(me));
    debug_assert!(inline.len() as u64 <= (SLOT_CELLS - SLOT_HDR) * 4);
    for k in 1..n {
        let peer = (me + k) % n;
        g.cell(peer, mine + 1).store(hash as i32, Ordering::Relaxed);
        g.cell(peer, mine + 2).store(status, Ordering::Relaxed);
        if !inline.is_empty() {
            // SAFETY: the inline area lies inside the peer's signal copy (the signal has
            // at least `collective_signal_cells` cells); only this rank writes this slot,
            // and the peer reads it only after the flag below (which it cannot be waiting
            // on for an older call: see the parity argument in docs/comm.md).
            unsafe {
                copy(
                    inline.as_ptr(),
                    g.rank_ptr(peer).add(((mine + SLOT_HDR) * 4) as usize),
                    inline.len() as u64,
                )
            };
        }
        signal::notify_cell(g.cell(peer, mine), sig.wake(peer), flag, NotifyOp::Set);
    }
    seq_cell.store(seq.wrapping_add(1) as i32, Ordering::Relaxed);
    let mut first_bad = None;
    for k in 1..n {
        let src = (me + n - k) % n;
        let slot = lay.slot(parity, u64::from(src));
        sig.wait_flat(slot, flag, WaitCmp::Eq, || {
            format!("{}: arrival of domain rank {src}", kind.name())
        })?;
        let h = g.cell(me, slot + 1).load(Ordering::Relaxed) as u32;
        let st = g.cell(me, slot + 2).load(Ordering::Relaxed);
        if first_bad.is_none() && (h != hash || st != 0) {
            first_bad = Some((src, h, st));
        }
    }
    local?;
    if let Some((peer, theirs, st)) = first_bad {
        return Err(CommError::CollectiveMismatch {
            collective: kind.name(),
            rank: sig.context().world_rank(),
            domain_rank: me,
            peer,
            mine: hash,
            theirs,
            detail: if st != 0 {
                format!(" (domain rank {peer} rejected its own arguments)")
            } else {
                String::new()
            },
        });
    }
    Ok(Arrived { flag, parity })
}

fn first_err(checks: impl IntoIterator<Item = Option<CommError>>) -> Result<(), CommError> {
    match checks.into_iter().flatten().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn dtype_check(w: &Window<'_>, what: &'static str) -> Option<CommError> {
    let d = w.g.t.dtype;
    (!reduce::supported(d)).then_some(CommError::UnsupportedDtype {
        what,
        dtype: d,
        supported: reduce::SUPPORTED,
    })
}

fn overlap_check(a: &Window<'_>, b: &Window<'_>, what: &'static str) -> Option<CommError> {
    a.g.overlaps(&b.g).then(|| bad(what.to_owned()))
}

/// The collectives, called the same way by every rank of the window's domain. The window
/// a collective is called on is its data (for allgather and all-to-all: the stage); a
/// second window, if any, is the target; then the options. Each synchronises through the
/// signal area of the buffer of the window it is called on.
///
/// The collectives and barriers of one buffer run one at a time on each rank, in the same
/// order on every rank (a sequence number in the signal area pairs the ranks' calls).
/// Tasks guarantee it by themselves: the engine and the chip order every two tasks of one
/// rank that name windows of the same buffer, in submit order. Inside one task, call a
/// buffer's collectives from one kernel invocation at a time (an SPMD task's blocks share
/// the signal area). Collectives on windows of different buffers are independent.
impl Window<'_> {
    /// Allreduce in place: every rank's copy of this (data) window ends with the
    /// element-wise reduction over all ranks' copies. Dtypes f32, f16, bf16, i32. Every
    /// rank must call it with the same window, op and algorithm; a detected difference is
    /// [`CommError::CollectiveMismatch`] on every rank, before any data moved. Results are
    /// bitwise identical on all ranks.
    ///
    /// Floats are folded in f32; mesh and two-phase fold in rank order `0, 1, …, P−1`
    /// (rounding f16/bf16 once), the ring folds chunk `c` in ring order starting at rank
    /// `c+1` (rounding after each step).
    ///
    /// # Errors
    /// [`CommError::UnsupportedDtype`], [`CommError::BadArgument`] (ring with
    /// `numel % P != 0`), [`CommError::CollectiveMismatch`], [`CommError::WaitTimeout`].
    pub fn allreduce(&self, op: ReduceOp, algo: AllreduceAlgo) -> Result<(), CommError> {
        let data = self;
        let nbytes = data.g.t.nbytes();
        let n = u64::from(data.nranks());
        let algo = match algo {
            AllreduceAlgo::Auto if nbytes <= AUTO_MESH_MAX_BYTES => AllreduceAlgo::Mesh,
            AllreduceAlgo::Auto => AllreduceAlgo::TwoPhase,
            a => a,
        };
        let kind = Kind::Allreduce(algo);
        let (signal, lay) = open_signal(data, kind, &[])?;
        let signal = &signal;
        let numel = data.g.t.numel();
        let local = first_err([
            dtype_check(data, "allreduce"),
            (algo == AllreduceAlgo::Ring && numel % n != 0).then(|| {
                bad(format!(
                    "allreduce(ring): {numel} elements do not split into {n} equal chunks; use a multiple of {n} elements, or AllreduceAlgo::TwoPhase"
                ))
            }),
        ]);
        let hash = descriptor_hash(kind, &[op.code()], &[&data.g.t, &signal.g.t]);
        let me = data.rank();
        let own = data.g.rank_ptr(me);
        let push = local.is_ok() && algo == AllreduceAlgo::Mesh && nbytes <= SMALL_ALLREDUCE_BYTES;
        let inline: &[u8] = if push && n > 1 {
            // SAFETY: this rank's own copy of the data, which no peer touches on this path
            // (peers receive it inline) and this rank does not write until it reduces.
            unsafe { std::slice::from_raw_parts(own, nbytes as usize) }
        } else {
            &[]
        };
        let arrived = arrive(signal, &lay, kind, hash, local, inline)?;
        if n == 1 {
            return Ok(());
        }
        let dtype = data.g.t.dtype;
        let numel = numel as usize;
        let mut srcs = [std::ptr::null::<u8>(); MAX_RANKS];
        match algo {
            AllreduceAlgo::Mesh if push => {
                let parity = arrived.parity;
                for s in 0..n as u32 {
                    srcs[s as usize] = if s == me {
                        own
                    } else {
                        let cell = lay.slot(parity, u64::from(s)) + SLOT_HDR;
                        // SAFETY: the inline area of slot `s` in this rank's signal copy.
                        unsafe { signal.g.rank_ptr(me).add((cell * 4) as usize) }
                    };
                }
                // SAFETY: every source holds `numel` elements nobody writes now (the
                // slots' next writer waits for this rank's next arrival); `own` is ours.
                unsafe { reduce::reduce_into(dtype, op, &srcs[..n as usize], own, numel) };
                Ok(())
            }
            AllreduceAlgo::Mesh => {
                for s in 0..n as u32 {
                    srcs[s as usize] = data.g.rank_ptr(s);
                }
                SCRATCH.with(|cell| {
                    let mut buf = cell.borrow_mut();
                    let words = (nbytes as usize).div_ceil(8);
                    if buf.len() < words {
                        buf.resize(words, 0);
                    }
                    let tmp = buf.as_mut_ptr().cast::<u8>();
                    // SAFETY: after the arrival every rank's copy holds its input and
                    // nobody writes any copy until the barrier below; `tmp` is private.
                    unsafe { reduce::reduce_into(dtype, op, &srcs[..n as usize], tmp, numel) };
                    signal.rows_barrier("allreduce(mesh): every rank has read")?;
                    // SAFETY: after the barrier nobody reads this rank's copy any more.
                    unsafe { copy(tmp, own, nbytes) };
                    if buf.len() > (64 << 20) / 8 {
                        *buf = Vec::new();
                    }
                    Ok(())
                })
            }
            AllreduceAlgo::TwoPhase | AllreduceAlgo::Auto => {
                let es = dtype.size_bytes() as u64;
                let align = (64 / es).max(1);
                let ch = (numel as u64).div_ceil(n).div_ceil(align) * align;
                let lo = (u64::from(me) * ch).min(numel as u64);
                let hi = (u64::from(me + 1) * ch).min(numel as u64);
                if hi > lo {
                    let mut outs = [std::ptr::null_mut::<u8>(); MAX_RANKS];
                    for s in 0..n as u32 {
                        // SAFETY: chunk `me` of rank `s`'s copy, inside the tensor.
                        outs[s as usize] = unsafe { data.g.rank_ptr(s).add((lo * es) as usize) };
                        srcs[s as usize] = outs[s as usize];
                    }
                    // SAFETY: chunk `me` of every copy is read and written by this rank only
                    // (each rank owns one chunk of every copy) until the barrier below.
                    unsafe {
                        reduce::reduce_into_all(
                            dtype,
                            op,
                            &srcs[..n as usize],
                            &outs[..n as usize],
                            (hi - lo) as usize,
                        )
                    };
                }
                signal.rows_barrier("allreduce(two-phase): every chunk reduced and pushed")
            }
            AllreduceAlgo::Ring => {
                let n32 = n as u32;
                let es = dtype.size_bytes() as u64;
                let ch = numel as u64 / n;
                let left = (me + n32 - 1) % n32;
                let right = (me + 1) % n32;
                let lp = data.g.rank_ptr(left);
                let steps = 2 * (n32 - 1);
                for t in 1..=steps {
                    if t > 1 {
                        signal.wait_flat(
                            lay.ring + u64::from(t - 2),
                            arrived.flag,
                            WaitCmp::Eq,
                            || format!("allreduce(ring): step {} of domain rank {left}", t - 1),
                        )?;
                    }
                    if t < n32 {
                        let c = u64::from((me + 2 * n32 - 1 - t) % n32);
                        let off = (c * ch * es) as usize;
                        // SAFETY: the left neighbour finished writing its chunk `c` (step
                        // t−1) and rewrites it only after this rank's step t (ring
                        // coupling, docs/comm.md); the right neighbour reads this rank's
                        // chunk `c` only after the flag below.
                        unsafe {
                            reduce::reduce_into(
                                dtype,
                                op,
                                &[lp.add(off) as *const u8, own.add(off)],
                                own.add(off),
                                ch as usize,
                            )
                        };
                    } else {
                        let u = t - (n32 - 1);
                        let c = u64::from((me + n32 - u) % n32);
                        let off = (c * ch * es) as usize;
                        // SAFETY: as above; the left neighbour's chunk `c` is final.
                        unsafe { copy(lp.add(off), own.add(off), ch * es) };
                    }
                    if t < steps {
                        signal::notify_cell(
                            signal.g.cell(right, lay.ring + u64::from(t - 1)),
                            signal.wake(right),
                            arrived.flag,
                            NotifyOp::Set,
                        );
                    }
                }
                signal.rows_barrier("allreduce(ring): done")
            }
        }
    }

    /// Broadcast in place: every rank's copy ends equal to domain rank `root`'s. Root's
    /// data must be in its window before the call; non-roots copy it after the arrival,
    /// then a barrier keeps root from changing it before everyone has copied.
    ///
    /// # Errors
    /// As [`Window::allreduce`]; [`CommError::BadArgument`] for `root >= nranks`.
    pub fn broadcast(&self, root: u32) -> Result<(), CommError> {
        let data = self;
        let kind = Kind::Broadcast;
        let (signal, lay) = open_signal(data, kind, &[])?;
        let signal = &signal;
        let n = data.nranks();
        let local = first_err([(root >= n).then(|| {
            bad(format!(
                "broadcast: root {root} is not a rank of the domain (0..{n})"
            ))
        })]);
        let hash = descriptor_hash(kind, &[u64::from(root)], &[&data.g.t, &signal.g.t]);
        arrive(signal, &lay, kind, hash, local, &[])?;
        let me = data.rank();
        if me != root {
            // SAFETY: root's copy is stable until the barrier below; this rank's copy is
            // read by nobody during a broadcast.
            unsafe {
                copy(
                    data.g.rank_ptr(root),
                    data.g.rank_ptr(me),
                    data.g.t.nbytes(),
                )
            };
        }
        signal.rows_barrier("broadcast: every rank has copied")
    }

    /// Allgather, called on the stage: `target[src, :]` = rank `src`'s stage (this
    /// window), on every rank (`target` holds `nranks x stage.numel()` elements of the
    /// same dtype; rank `src`'s block is elements `src·m .. (src+1)·m`). Stage and target
    /// belong to one domain and must not overlap. Pull model: after the arrival every rank
    /// copies every rank's stage, then a barrier.
    ///
    /// # Errors
    /// As [`Window::allreduce`]; [`CommError::BadArgument`] for sizes or dtypes that do not
    /// fit, overlapping windows, or windows of different domains.
    pub fn allgather(&self, target: &Window<'_>) -> Result<(), CommError> {
        let stage = self;
        let kind = Kind::Allgather;
        let (signal, lay) = open_signal(stage, kind, &[target])?;
        let signal = &signal;
        let n = u64::from(signal.nranks());
        let (st, tt) = (&stage.g.t, &target.g.t);
        let local = first_err([
            (st.dtype != tt.dtype).then(|| {
                bad(format!(
                    "allgather: stage holds {} but target holds {}",
                    st.dtype, tt.dtype
                ))
            }),
            (tt.numel() != n * st.numel()).then(|| {
                bad(format!(
                    "allgather: target has {} elements, it needs nranks x stage = {n} x {} = {}",
                    tt.numel(),
                    st.numel(),
                    n * st.numel()
                ))
            }),
            overlap_check(
                stage,
                target,
                "allgather: stage and target overlap; use separate windows",
            ),
        ]);
        let hash = descriptor_hash(kind, &[], &[st, tt, &signal.g.t]);
        arrive(signal, &lay, kind, hash, local, &[])?;
        let me = signal.rank();
        let m = st.nbytes();
        let dst = target.g.rank_ptr(me);
        for k in 0..n as u32 {
            let s = (me + k) % n as u32;
            // SAFETY: every stage is stable until the barrier below (no rank writes
            // stages in an allgather); this rank's target is read by nobody.
            unsafe { copy(stage.g.rank_ptr(s), dst.add((u64::from(s) * m) as usize), m) };
        }
        signal.rows_barrier("allgather: every rank has copied")
    }

    /// Reduce-scatter in place: with this window seen as `nranks` equal chunks
    /// (`numel % nranks == 0`), rank `r` ends with the reduction over all ranks of chunk
    /// `r`, in chunk `r` of its own copy (`data[r, :]` for a `[P, m]` tensor); its other
    /// chunks are unchanged. Dtypes and fold order as two-phase allreduce.
    ///
    /// # Errors
    /// As [`Window::allreduce`].
    pub fn reduce_scatter(&self, op: ReduceOp) -> Result<(), CommError> {
        let data = self;
        let kind = Kind::ReduceScatter;
        let (signal, lay) = open_signal(data, kind, &[])?;
        let signal = &signal;
        let n = u64::from(data.nranks());
        let numel = data.g.t.numel();
        let local = first_err([
            dtype_check(data, "reduce_scatter"),
            (numel % n != 0).then(|| {
                bad(format!(
                    "reduce_scatter: {numel} elements do not split into {n} equal chunks"
                ))
            }),
        ]);
        let hash = descriptor_hash(kind, &[op.code()], &[&data.g.t, &signal.g.t]);
        arrive(signal, &lay, kind, hash, local, &[])?;
        let me = data.rank();
        let es = data.g.esize();
        let ch = numel / n;
        let off = (u64::from(me) * ch * es) as usize;
        let mut srcs = [std::ptr::null::<u8>(); MAX_RANKS];
        for s in 0..n as u32 {
            // SAFETY: chunk `me` of rank `s`'s copy, inside the tensor.
            srcs[s as usize] = unsafe { data.g.rank_ptr(s).add(off) };
        }
        if ch > 0 {
            // SAFETY: chunk `me` of every copy is read only by this rank, and written
            // only in its own copy.
            unsafe {
                reduce::reduce_into(
                    data.g.t.dtype,
                    op,
                    &srcs[..n as usize],
                    data.g.rank_ptr(me).add(off),
                    ch as usize,
                )
            };
        }
        signal.rows_barrier("reduce_scatter: every rank has read")
    }

    /// All-to-all, called on the stage: with the stage (this window) and `target` seen as
    /// `nranks` equal chunks, rank `r`'s `target` chunk `s` ends equal to rank `s`'s stage
    /// chunk `r` (what `s` prepared for `r`). Same dtype and size, `numel % nranks == 0`,
    /// separate windows of one domain.
    ///
    /// # Errors
    /// As [`Window::allgather`].
    pub fn all_to_all(&self, target: &Window<'_>) -> Result<(), CommError> {
        let stage = self;
        let kind = Kind::AllToAll;
        let (signal, lay) = open_signal(stage, kind, &[target])?;
        let signal = &signal;
        let n = u64::from(signal.nranks());
        let (st, tt) = (&stage.g.t, &target.g.t);
        let local = first_err([
            (st.dtype != tt.dtype).then(|| {
                bad(format!(
                    "all_to_all: stage holds {} but target holds {}",
                    st.dtype, tt.dtype
                ))
            }),
            (st.numel() != tt.numel() || st.numel() % n != 0).then(|| {
                bad(format!(
                    "all_to_all: stage ({}) and target ({}) need the same number of elements, a multiple of {n}",
                    st.numel(),
                    tt.numel()
                ))
            }),
            overlap_check(stage, target, "all_to_all: stage and target overlap; use separate windows"),
        ]);
        let hash = descriptor_hash(kind, &[], &[st, tt, &signal.g.t]);
        arrive(signal, &lay, kind, hash, local, &[])?;
        let me = signal.rank();
        let chb = st.nbytes() / n;
        let dst = target.g.rank_ptr(me);
        for k in 0..n as u32 {
            let s = (me + k) % n as u32;
            // SAFETY: stages are stable until the barrier; this rank's target is read by
            // nobody.
            unsafe {
                copy(
                    stage.g.rank_ptr(s).add((u64::from(me) * chb) as usize),
                    dst.add((u64::from(s) * chb) as usize),
                    chb,
                )
            };
        }
        signal.rows_barrier("all_to_all: every rank has copied")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_sizes() {
        assert_eq!(collective_signal_cells(2), 16 + 16 + 2 * 2 * 80);
        assert_eq!(signal_cells(2, AllreduceAlgo::Ring), 352 + 16);
        assert_eq!(signal_area_bytes(2), 1536);
        assert_eq!(
            signal_area_bytes(17),
            ((32 + 16 + 2 * 17 * 80 + 32) * 4u64).div_ceil(128) * 128
        );
        assert_eq!(
            (signal_offset(64), signal_offset(128), signal_offset(0)),
            (128, 128, 0)
        );
        assert_eq!(
            signal_cells(1, AllreduceAlgo::Ring),
            collective_signal_cells(1)
        );
        assert_eq!(collective_signal_cells(17), 32 + 16 + 2 * 17 * 80);
        let k = Kind::Allreduce(AllreduceAlgo::Mesh);
        assert_ne!(
            descriptor_hash(k, &[1, 2], &[]),
            descriptor_hash(k, &[2, 1], &[])
        );
    }
}
