//! [`CommAllocator`]: the parent side — comm domains and window buffers carved from the
//! arena, their per-run lifetime and persistence.

use crate::arena::layout::{DATA_ALIGN, DATA_OFFSET, MAX_RANKS, RANK_ALIGN, TABLE_SLOTS};
use crate::arena::{CommArena, SlotInfo};
use crate::comm::Geom;
use crate::error::CommError;
use crate::tensor::DistributedTensor;
use std::sync::Arc;
use strata_types::{DataType, Element};

/// A comm domain: a set of world ranks with their own dense rank numbering (domain rank
/// `d` is the `d`-th member). Made by [`CommAllocator::domain`] / [`CommAllocator::world`];
/// valid for the run it was made in (or longer, if one of its buffers is persistent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Domain {
    slot: u32,
    generation: u32,
    nranks: u32,
}

impl Domain {
    /// Ranks in the domain.
    pub fn nranks(&self) -> u32 {
        self.nranks
    }

    /// The allocator's domain slot (stored in each of its buffers' table slots).
    pub fn id(&self) -> u32 {
        self.slot
    }
}

/// A window buffer: `bytes()` bytes on every rank of its domain, zero-filled when
/// allocated, followed on each rank by the buffer's **signal area** (its
/// [`signal_area_bytes`](crate::signal_area_bytes)`(nranks)` bytes of i32 cells that the
/// collectives and barriers called on its windows synchronise through — no window can view
/// them). View it with [`CommAllocator::window`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WindowBuffer {
    slot: u32,
    generation: u32,
    domain: Domain,
    bytes: u64,
}

impl WindowBuffer {
    /// Bytes per rank that windows may view (the requested size rounded up to 64; the
    /// signal area comes on top).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The buffer's domain.
    pub fn domain(&self) -> Domain {
        self.domain
    }

    /// The buffer's domain-table slot.
    pub fn table_slot(&self) -> u32 {
        self.slot
    }
}

/// Where a window buffer lies in the arena ([`CommAllocator::placement`]): domain rank
/// `d`'s copy starts `arena_offset + d * rank_stride` bytes from the arena's base; its
/// first `data_bytes` are what windows view, its signal area starts at the next multiple
/// of 128 and fills the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferPlacement {
    /// Offset of domain rank 0's copy from the arena's base.
    pub arena_offset: u64,
    /// Bytes from one rank's copy to the next (the buffer's per-rank size, signal area
    /// included).
    pub rank_stride: u64,
    /// Bytes of each rank's copy that windows view ([`WindowBuffer::bytes`]).
    pub data_bytes: u64,
    /// Ranks in the buffer's domain.
    pub nranks: u32,
}

/// One rank's copy of a window as a chip's run argument in external memory
/// ([`CommAllocator::rank_copy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankCopy {
    /// The window buffer's offset in the arena (= in the chip's external memory).
    pub buffer_offset: u64,
    /// The window buffer's bytes (every rank's copy, signal areas included).
    pub buffer_bytes: u64,
    /// The rank's copy of the window, as a view of the buffer.
    pub view: strata_types::TensorView,
}

/// Counters of what the allocator did (for tests and reports).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommStats {
    /// Domains created.
    pub domains_created: u64,
    /// Window buffers allocated.
    pub buffers_allocated: u64,
    /// Window buffers freed.
    pub buffers_freed: u64,
    /// Zero-fills of persistent buffers at `end_run`.
    pub persistent_zero_fills: u64,
    /// Bytes zero-filled (allocation and persistent resets).
    pub bytes_zeroed: u64,
}

struct DomainRec {
    generation: u32,
    members: Vec<u32>,
    live: bool,
}

struct BufRec {
    generation: u32,
    domain: Domain,
    start: u64,
    total: u64,
    /// Per-rank stride (data and signal area).
    per_rank: u64,
    /// Per-rank bytes windows view.
    data: u64,
    /// `Some(zero_between_runs)` once made persistent.
    persistent: Option<bool>,
}

/// The parent side (the L3 orchestration's thread): creates domains and window buffers in
/// the arena, hands out [`DistributedTensor`] views, and frees everything not persistent at
/// the end of each run.
///
/// Buffers are carved first-fit from the arena's data region (each one `nranks x (bytes +
/// signal area)`, 4 KiB-aligned) and zero-filled before they are returned, so no peer can
/// see stale data or an early notify erased. Each buffer has a domain-table slot (256 in
/// all) with a generation: a view of a freed buffer is refused everywhere
/// ([`CommError::StaleTensor`]).
///
/// ```
/// use std::sync::Arc;
/// use strata_comm::*;
/// use strata_types::DataType;
/// let arena = Arc::new(CommArena::anonymous(4 << 20, 4)?);
/// let mut alloc = CommAllocator::new(arena);
/// let pair = alloc.domain(&[1, 2])?;                       // world ranks 1 and 2
/// let buf = alloc.alloc_window_buffer(&pair, 1000)?;       // 1024 bytes on each
/// assert_eq!(buf.bytes(), 1024);
/// let x = alloc.window(&buf, 0, &[2, 64], DataType::F32)?; // 512 bytes at offset 0
/// let late = alloc.window(&buf, 512, &[129], DataType::F32);
/// assert!(late.is_err());                                  // does not fit: 1024 - 512 bytes
/// let placement = alloc.placement(&buf)?;                  // + the signal area per rank
/// assert_eq!(placement.rank_stride, 1024 + signal_area_bytes(2)); // 1024: a multiple of 128
/// alloc.end_run();
/// assert!(alloc.window(&buf, 0, &[4], DataType::F32).is_err()); // stale
/// # let _ = x;
/// # Ok::<(), CommError>(())
/// ```
pub struct CommAllocator {
    arena: Arc<CommArena>,
    domains: Vec<DomainRec>,
    bufs: Vec<Option<BufRec>>,
    /// Free ranges `(start, len)` of the data region, sorted, coalesced.
    free: Vec<(u64, u64)>,
    /// Bytes at or above this offset were never handed out (still zero).
    dirty_end: u64,
    next_generation: u32,
    world: Option<Domain>,
    in_use: u64,
    stats: CommStats,
}

impl std::fmt::Debug for CommAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommAllocator")
            .field("arena", &self.arena)
            .field("bytes_in_use", &self.in_use)
            .field("stats", &self.stats)
            .finish()
    }
}

fn round_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

impl CommAllocator {
    /// An allocator over `arena`. One at a time per arena: a new one clears the domain
    /// table (every earlier tensor is then stale) and takes over the high-water mark and
    /// generation counter kept in the arena header, so it still zero-fills reused memory.
    pub fn new(arena: Arc<CommArena>) -> Self {
        for slot in 0..TABLE_SLOTS as u32 {
            arena.clear_slot(slot);
        }
        let start = DATA_OFFSET as u64;
        let cap = arena.data_capacity();
        let (dirty_end, next_generation) = arena.alloc_marks();
        CommAllocator {
            free: vec![(start, cap)],
            dirty_end: dirty_end.clamp(start, start + cap),
            arena,
            domains: Vec::new(),
            bufs: (0..TABLE_SLOTS).map(|_| None).collect(),
            next_generation: next_generation.max(1),
            world: None,
            in_use: 0,
            stats: CommStats::default(),
        }
    }

    /// The arena.
    pub fn arena(&self) -> &Arc<CommArena> {
        &self.arena
    }

    fn fresh_generation(&mut self) -> u32 {
        let g = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        self.arena
            .set_alloc_marks(self.dirty_end, self.next_generation);
        g
    }

    /// A domain over world ranks `members` (order = domain rank).
    ///
    /// # Errors
    /// [`CommError::BadMembers`] unless there are 1..=64 distinct members, each below the
    /// world size.
    pub fn domain(&mut self, members: &[u32]) -> Result<Domain, CommError> {
        let bad = |reason: String| CommError::BadMembers {
            members: members.to_vec(),
            reason,
        };
        let world = self.arena.world_size();
        if members.is_empty() || members.len() > MAX_RANKS {
            return Err(bad(format!(
                "a domain has 1..={MAX_RANKS} members, not {}",
                members.len()
            )));
        }
        if let Some(m) = members.iter().find(|&&m| m >= world) {
            return Err(bad(format!(
                "world rank {m} does not exist (the world has {world} ranks)"
            )));
        }
        let mut seen = 0u64;
        for &m in members {
            if seen & (1 << m) != 0 {
                return Err(bad(format!("world rank {m} is listed twice")));
            }
            seen |= 1 << m;
        }
        let generation = self.fresh_generation();
        let rec = DomainRec {
            generation,
            members: members.to_vec(),
            live: true,
        };
        let slot = match self.domains.iter().position(|d| !d.live) {
            Some(i) => {
                self.domains[i] = rec;
                i
            }
            None => {
                self.domains.push(rec);
                self.domains.len() - 1
            }
        };
        self.stats.domains_created += 1;
        Ok(Domain {
            slot: slot as u32,
            generation,
            nranks: members.len() as u32,
        })
    }

    /// The domain of all world ranks (rank `r` = world rank `r`), made once per run.
    ///
    /// # Errors
    /// None in practice (the world is always a valid member list).
    pub fn world(&mut self) -> Result<Domain, CommError> {
        if let Some(w) = self.world {
            if self.live_domain(&w).is_ok() {
                return Ok(w);
            }
        }
        let all: Vec<u32> = (0..self.arena.world_size()).collect();
        let w = self.domain(&all)?;
        self.world = Some(w);
        Ok(w)
    }

    fn live_domain(&self, d: &Domain) -> Result<&DomainRec, CommError> {
        match self.domains.get(d.slot as usize) {
            Some(r) if r.live && r.generation == d.generation => Ok(r),
            _ => Err(CommError::StaleDomain {
                slot: d.slot,
                generation: d.generation,
            }),
        }
    }

    /// The members (world ranks in domain-rank order) of a live domain.
    ///
    /// # Errors
    /// [`CommError::StaleDomain`] if the domain was freed.
    pub fn members(&self, domain: &Domain) -> Result<&[u32], CommError> {
        Ok(&self.live_domain(domain)?.members)
    }

    fn live_buf(&self, buf: &WindowBuffer) -> Result<&BufRec, CommError> {
        match self.bufs.get(buf.slot as usize) {
            Some(Some(r)) if r.generation == buf.generation => Ok(r),
            Some(Some(r)) => Err(CommError::StaleTensor {
                slot: buf.slot,
                generation: buf.generation,
                current: r.generation,
            }),
            _ => Err(CommError::StaleTensor {
                slot: buf.slot,
                generation: buf.generation,
                current: 0,
            }),
        }
    }

    /// A window buffer of `bytes` per rank (rounded up to 64) on every rank of `domain`,
    /// plus the buffer's signal area on each rank
    /// ([`signal_area_bytes`](crate::signal_area_bytes)), zero-filled before it is
    /// returned (a window must be zero before any peer can reach it).
    ///
    /// # Errors
    /// [`CommError::StaleDomain`], [`CommError::BadArgument`] for 0 bytes,
    /// [`CommError::TableFull`] when 256 buffers are live, [`CommError::ArenaFull`].
    pub fn alloc_window_buffer(
        &mut self,
        domain: &Domain,
        bytes: u64,
    ) -> Result<WindowBuffer, CommError> {
        let members = self.live_domain(domain)?.members.clone();
        if bytes == 0 {
            return Err(CommError::BadArgument {
                what: "alloc_window_buffer: 0 bytes requested; a window buffer has at least one byte per rank (sizes are in bytes, not elements)".into(),
            });
        }
        let nranks = members.len() as u64;
        let too_big = || CommError::ArenaFull {
            requested: u64::MAX,
            per_rank: bytes,
            nranks: nranks as u32,
            in_use: 0,
            capacity: 0,
            largest_free: 0,
        };
        let data = round_up(bytes, RANK_ALIGN).ok_or_else(too_big)?;
        let per_rank = crate::collective::signal_offset(data)
            .checked_add(crate::collective::signal_area_bytes(nranks as u32))
            .ok_or_else(too_big)?;
        let total = per_rank
            .checked_mul(nranks)
            .and_then(|t| round_up(t, DATA_ALIGN))
            .ok_or_else(too_big)?;
        let slot = self
            .bufs
            .iter()
            .position(|b| b.is_none())
            .ok_or(CommError::TableFull { slots: TABLE_SLOTS })?;
        let Some(i) = self.free.iter().position(|&(_, len)| len >= total) else {
            return Err(CommError::ArenaFull {
                requested: total,
                per_rank,
                nranks: nranks as u32,
                in_use: self.in_use,
                capacity: self.arena.data_capacity(),
                largest_free: self.free.iter().map(|f| f.1).max().unwrap_or(0),
            });
        };
        let start = self.free[i].0;
        if self.free[i].1 == total {
            self.free.remove(i);
        } else {
            self.free[i].0 += total;
            self.free[i].1 -= total;
        }
        // Zero what was used before; bytes above the high-water mark are still zero.
        let dirty = self.dirty_end.min(start + total).saturating_sub(start);
        if dirty > 0 {
            // SAFETY: `[start, start + dirty)` lies in the data region of the arena
            // (free ranges never leave it) and belongs to no live buffer, so no kernel may
            // access it.
            unsafe { std::ptr::write_bytes(self.arena.ptr(start), 0, dirty as usize) };
            self.stats.bytes_zeroed += dirty;
        }
        self.dirty_end = self.dirty_end.max(start + total);
        let generation = self.fresh_generation(); // also records dirty_end in the header
        let mut m = [0u8; MAX_RANKS];
        for (d, &w) in members.iter().enumerate() {
            m[d] = w as u8;
        }
        self.arena.write_slot(
            slot as u32,
            generation,
            &SlotInfo {
                nranks: nranks as u32,
                window_bytes: per_rank,
                data_bytes: data,
                base: start,
                domain: (domain.slot, domain.generation),
                members: m,
            },
        );
        self.bufs[slot] = Some(BufRec {
            generation,
            domain: *domain,
            start,
            total,
            per_rank,
            data,
            persistent: None,
        });
        self.in_use += total;
        self.stats.buffers_allocated += 1;
        Ok(WindowBuffer {
            slot: slot as u32,
            generation,
            domain: *domain,
            bytes: data,
        })
    }

    /// A typed, row-major contiguous view at byte `offset` of the buffer
    /// (`offset + nbytes <= buf.bytes()`, `offset` a multiple of the element size).
    ///
    /// # Errors
    /// [`CommError::StaleTensor`] for a freed buffer; [`CommError::BadTensor`] for an
    /// invalid shape or offset, or a view that does not fit.
    pub fn window(
        &self,
        buf: &WindowBuffer,
        offset: u64,
        shape: &[u64],
        dtype: DataType,
    ) -> Result<DistributedTensor, CommError> {
        let rec = self.live_buf(buf)?;
        let t = DistributedTensor::new(buf.slot, buf.generation, offset, shape, dtype)?;
        let end = offset.checked_add(t.nbytes());
        if end.is_none_or(|e| e > rec.data) {
            return Err(CommError::BadTensor {
                reason: format!(
                    "a {shape:?} {dtype} view ({} bytes) at byte offset {offset} does not fit the window buffer's {} bytes per rank",
                    t.nbytes(),
                    rec.data
                ),
            });
        }
        Ok(t)
    }

    fn free_slot(&mut self, slot: usize) {
        let Some(rec) = self.bufs[slot].take() else {
            return;
        };
        self.arena.clear_slot(slot as u32);
        self.in_use -= rec.total;
        self.stats.buffers_freed += 1;
        // Insert and coalesce.
        let pos = self.free.partition_point(|&(s, _)| s < rec.start);
        self.free.insert(pos, (rec.start, rec.total));
        if pos + 1 < self.free.len() && self.free[pos].0 + self.free[pos].1 == self.free[pos + 1].0
        {
            self.free[pos].1 += self.free[pos + 1].1;
            self.free.remove(pos + 1);
        }
        if pos > 0 && self.free[pos - 1].0 + self.free[pos - 1].1 == self.free[pos].0 {
            self.free[pos - 1].1 += self.free[pos].1;
            self.free.remove(pos);
        }
    }

    /// Keeps the domains that still have live buffers; frees the others.
    fn sweep_domains(&mut self) {
        let mut keep = vec![false; self.domains.len()];
        for r in self.bufs.iter().flatten() {
            keep[r.domain.slot as usize] = true;
        }
        for (d, k) in self.domains.iter_mut().zip(keep) {
            if !k {
                d.live = false;
            }
        }
        if let Some(w) = self.world {
            if self.live_domain(&w).is_err() {
                self.world = None;
            }
        }
    }

    /// Ends a run: frees every buffer not marked persistent (its table slot is cleared, so
    /// stale views are refused), zero-fills persistent buffers made with
    /// `zero_between_runs`, and frees every domain without a persistent buffer.
    ///
    /// Call it only when no kernel of the run can still touch a window.
    pub fn end_run(&mut self) {
        for slot in 0..self.bufs.len() {
            match self.bufs[slot].as_ref().map(|r| r.persistent) {
                Some(None) => self.free_slot(slot),
                Some(Some(true)) => {
                    let r = self.bufs[slot].as_ref().expect("live");
                    let (start, len) = (r.start, r.total);
                    // SAFETY: the buffer's own range in the data region; no kernel runs
                    // between runs.
                    unsafe { std::ptr::write_bytes(self.arena.ptr(start), 0, len as usize) };
                    self.stats.persistent_zero_fills += 1;
                    self.stats.bytes_zeroed += len;
                }
                _ => {}
            }
        }
        self.sweep_domains();
    }

    /// Keeps `buf` (and its domain) across runs; with `zero_between_runs` it is zero-filled
    /// at each [`CommAllocator::end_run`], otherwise it keeps its contents (including its
    /// signal cells).
    ///
    /// # Errors
    /// [`CommError::StaleTensor`] if the buffer was already freed.
    pub fn make_persistent(
        &mut self,
        buf: &WindowBuffer,
        zero_between_runs: bool,
    ) -> Result<(), CommError> {
        self.live_buf(buf)?;
        if let Some(r) = self.bufs[buf.slot as usize].as_mut() {
            r.persistent = Some(zero_between_runs);
        }
        Ok(())
    }

    /// Zero-fills `buf` on every rank now (e.g. a persistent buffer whose signal cells a
    /// failed run left inconsistent). Only while no kernel uses it.
    ///
    /// # Errors
    /// [`CommError::StaleTensor`] if the buffer was freed.
    pub fn zero(&mut self, buf: &WindowBuffer) -> Result<(), CommError> {
        let r = self.live_buf(buf)?;
        let (start, len) = (r.start, r.total);
        // SAFETY: the buffer's own range in the data region; the caller guarantees that no
        // kernel uses it.
        unsafe { std::ptr::write_bytes(self.arena.ptr(start), 0, len as usize) };
        self.stats.bytes_zeroed += len;
        Ok(())
    }

    /// Whether `buf` is live and persistent.
    pub fn is_persistent(&self, buf: &WindowBuffer) -> bool {
        self.live_buf(buf).is_ok_and(|r| r.persistent.is_some())
    }

    /// Frees every persistent buffer (at close), and those buffers' domains unless they
    /// have other live buffers. Buffers and domains of the current run stay until
    /// [`CommAllocator::end_run`].
    pub fn release_persistent(&mut self) {
        let mut touched = Vec::new();
        for slot in 0..self.bufs.len() {
            if let Some(r) = self.bufs[slot].as_ref() {
                if r.persistent.is_some() {
                    touched.push(r.domain.slot as usize);
                    self.free_slot(slot);
                }
            }
        }
        for d in touched {
            let used = self
                .bufs
                .iter()
                .flatten()
                .any(|r| r.domain.slot as usize == d);
            if !used {
                self.domains[d].live = false;
            }
        }
        if let Some(w) = self.world {
            if self.live_domain(&w).is_err() {
                self.world = None;
            }
        }
    }

    /// Bytes of the arena held by live buffers (each `nranks x bytes`, 4 KiB-rounded).
    pub fn bytes_in_use(&self) -> u64 {
        self.in_use
    }

    /// Number of live window buffers.
    pub fn live_buffers(&self) -> usize {
        self.bufs.iter().flatten().count()
    }

    /// Where a live buffer lies in the arena: the byte offset (from the arena's base) of
    /// domain rank 0's copy, and the bytes between consecutive ranks' copies. An engine
    /// uses it to name a window's bytes as an ordinary shared-memory tensor (e.g. to order
    /// tasks that touch it).
    ///
    /// # Errors
    /// [`CommError::StaleTensor`] for a freed buffer.
    pub fn placement(&self, buf: &WindowBuffer) -> Result<BufferPlacement, CommError> {
        let rec = self.live_buf(buf)?;
        Ok(BufferPlacement {
            arena_offset: rec.start,
            rank_stride: rec.per_rank,
            data_bytes: rec.data,
            nranks: rec.domain.nranks,
        })
    }

    /// Domain rank `domain_rank`'s copy of `t` as a chip's run argument in external
    /// memory (the arena attached as the chip's `strata_chip::ExternalMemory`, arena
    /// offset = external offset): the window buffer's offset and size in the arena, and
    /// the copy's view of it — what `strata_chip::RunArgs::external` takes, and what a
    /// kernel on that rank opens with `ctx.window(i)`. (The engine builds the same argument
    /// when it narrows a window to the rank a task runs on.)
    ///
    /// # Errors
    /// [`CommError::StaleTensor`], [`CommError::BadPeer`].
    pub fn rank_copy(
        &self,
        t: &DistributedTensor,
        domain_rank: u32,
    ) -> Result<RankCopy, CommError> {
        let g = self.host_geom(t, domain_rank)?;
        let rec = self
            .bufs
            .get(t.slot as usize)
            .and_then(Option::as_ref)
            .filter(|r| r.generation == t.generation)
            .ok_or(CommError::StaleTensor {
                slot: t.slot,
                generation: t.generation,
                current: 0,
            })?;
        let view = strata_types::TensorView::contiguous(t.dtype, t.shape())
            .and_then(|v| {
                let off = u64::from(domain_rank) * g.stride + t.offset;
                strata_types::TensorView::new(t.dtype, v.shape(), v.strides(), off)
            })
            .map_err(|e| CommError::BadTensor {
                reason: e.to_string(),
            })?;
        Ok(RankCopy {
            buffer_offset: rec.start,
            buffer_bytes: g.stride * u64::from(g.nranks),
            view,
        })
    }

    /// The live window buffer `t` views.
    ///
    /// # Errors
    /// [`CommError::StaleTensor`] if it was freed.
    pub fn live_buffer(&self, t: &DistributedTensor) -> Result<WindowBuffer, CommError> {
        let buf = WindowBuffer {
            slot: t.slot,
            generation: t.generation,
            domain: Domain {
                slot: 0,
                generation: 0,
                nranks: 0,
            },
            bytes: 0,
        };
        let rec = self.live_buf(&buf)?;
        Ok(WindowBuffer {
            domain: rec.domain,
            bytes: rec.data,
            ..buf
        })
    }

    /// Domain rank `domain_rank`'s copy of `buf`'s signal area, as the host sees it now
    /// (diagnostics: the first `nranks` cells are the barrier rows, zero between
    /// collectives; then the collectives' sequence number and arrival slots,
    /// `docs/comm.md`). Only while no kernel uses the buffer.
    ///
    /// # Errors
    /// [`CommError::StaleTensor`], [`CommError::BadPeer`].
    pub fn signal_area(&self, buf: &WindowBuffer, domain_rank: u32) -> Result<Vec<i32>, CommError> {
        let rec = self.live_buf(buf)?;
        if domain_rank >= rec.domain.nranks {
            return Err(CommError::BadPeer {
                peer: domain_rank,
                nranks: rec.domain.nranks,
            });
        }
        let sig = crate::collective::signal_offset(rec.data);
        let cells = ((rec.per_rank - sig) / 4) as usize;
        let at = rec.start + u64::from(domain_rank) * rec.per_rank + sig;
        let mut out = vec![0i32; cells];
        // SAFETY: the signal area of a live buffer's rank copy lies in the data region
        // (`at + cells * 4 <= start + total`), 64-aligned; the caller guarantees that no
        // kernel writes it now; `out` is a distinct local buffer of `cells` i32.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.arena.ptr(at),
                out.as_mut_ptr().cast::<u8>(),
                cells * 4,
            )
        };
        Ok(out)
    }

    /// What the allocator did so far.
    pub fn stats(&self) -> CommStats {
        self.stats
    }

    fn host_geom(&self, t: &DistributedTensor, domain_rank: u32) -> Result<Geom, CommError> {
        let g = Geom::open(&self.arena, t)?;
        g.check_peer(domain_rank)?;
        Ok(g)
    }

    /// Host staging: copies `data` into domain rank `domain_rank`'s copy of `t`, starting at
    /// element `elem_offset`. Only while no kernel uses the window (between dispatches).
    ///
    /// # Errors
    /// Stale or invalid tensor, a dtype other than `T`'s, a peer or range out of bounds.
    pub fn host_write<T: Element>(
        &self,
        t: &DistributedTensor,
        domain_rank: u32,
        elem_offset: u64,
        data: &[T],
    ) -> Result<(), CommError> {
        let g = self.host_geom(t, domain_rank)?;
        g.copy_in(domain_rank, elem_offset, data, "host_write")
    }

    /// Host read-back: copies domain rank `domain_rank`'s copy of `t` from element
    /// `elem_offset` into `out`. Only while no kernel writes the window.
    ///
    /// # Errors
    /// As [`CommAllocator::host_write`].
    pub fn host_read<T: Element>(
        &self,
        t: &DistributedTensor,
        domain_rank: u32,
        elem_offset: u64,
        out: &mut [T],
    ) -> Result<(), CommError> {
        let g = self.host_geom(t, domain_rank)?;
        g.copy_out(domain_rank, elem_offset, out, "host_read")
    }
}
