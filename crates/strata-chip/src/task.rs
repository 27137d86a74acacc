//! The payload of a chip task: what the scheduler and the cores need to run it.

use crate::device::arena::Claims;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use strata_types::{ArgTag, TensorView};

/// The subtask lanes of a task: AIC, AIV0, AIV1.
pub(crate) const LANES: usize = 3;

/// The resource shape of a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// No kernel: completed by the scheduler itself.
    Dummy,
    /// One AIC kernel (lane 0).
    Aic,
    /// One AIV kernel (normalised to lane 1), on any AIV core.
    Aiv,
    /// Two or three kernels on one cluster (the reference mask: AIC 1, AIV0 2, AIV1 4).
    Mix(u8),
}

/// What the scheduler needs to place a task, packed into the graph's per-task `route`
/// word, so routing and dispatching never read the task's payload (which lives in another
/// thread's cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    pub(crate) shape: Shape,
    pub(crate) block_num: u32,
    pub(crate) sync_start: bool,
    /// The task creates tensors: it may start only once armed.
    pub(crate) needs_arm: bool,
    pub(crate) funcs: [Option<u32>; LANES],
}

const NO_FUNC: u64 = 0x7ff;

impl Meta {
    pub(crate) fn encode(&self) -> u64 {
        let (kind, mask) = match self.shape {
            Shape::Dummy => (0u64, 0u64),
            Shape::Aic => (1, 0b001),
            Shape::Aiv => (2, 0b010),
            Shape::Mix(m) => (3, m as u64),
        };
        let mut w =
            mask | (kind << 3) | ((self.sync_start as u64) << 5) | ((self.needs_arm as u64) << 6);
        w |= ((self.block_num as u64) & 0x7fff) << 7;
        for (l, f) in self.funcs.iter().enumerate() {
            w |= f.map_or(NO_FUNC, |f| f as u64 & NO_FUNC) << (22 + 11 * l);
        }
        w
    }

    pub(crate) fn decode(w: u64) -> Meta {
        let mask = (w & 0b111) as u8;
        let shape = match (w >> 3) & 0b11 {
            0 => Shape::Dummy,
            1 => Shape::Aic,
            2 => Shape::Aiv,
            _ => Shape::Mix(mask),
        };
        let mut funcs = [None; LANES];
        for (l, f) in funcs.iter_mut().enumerate() {
            let v = (w >> (22 + 11 * l)) & NO_FUNC;
            *f = (v != NO_FUNC).then_some(v as u32);
        }
        Meta {
            shape,
            block_num: ((w >> 7) & 0x7fff) as u32,
            sync_start: (w >> 5) & 1 == 1,
            needs_arm: (w >> 6) & 1 == 1,
            funcs,
        }
    }

    /// Lanes that run a kernel (bit `l` = lane `l`).
    pub(crate) fn mask(&self) -> u8 {
        self.funcs
            .iter()
            .enumerate()
            .fold(0, |m, (i, k)| m | ((k.is_some() as u8) << i))
    }

    /// Kernel invocations: blocks × kernels.
    pub(crate) fn total_subtasks(&self) -> u32 {
        self.block_num * self.mask().count_ones()
    }
}

/// One tensor argument as the kernel sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KTensor {
    /// Device address of the buffer, or (for a runtime-created tensor) its offset in the
    /// task's heap slab.
    pub(crate) addr: u64,
    pub(crate) created: bool,
    pub(crate) size: u64,
    pub(crate) view: TensorView,
    pub(crate) tag: ArgTag,
    /// Whether the graph orders other tasks against this argument.
    pub(crate) tracked: bool,
}

/// A submitted kernel task.
pub(crate) struct TaskDesc {
    /// The `func_id` of each lane's kernel (resolved in the run's registry snapshot).
    pub(crate) kernels: [Option<u32>; LANES],
    pub(crate) shape: Shape,
    pub(crate) block_num: u32,
    pub(crate) sync_start: bool,
    pub(crate) tensors: Vec<KTensor>,
    pub(crate) scalars: Vec<u64>,
    pub(crate) claims: Claims,
    /// Device address of the task's heap slab (set before `armed`).
    pub(crate) slab_base: AtomicU64,
    /// False until the orchestrator has placed and initialised the task's created
    /// tensors; the scheduler does not start (or complete) an unarmed task.
    pub(crate) armed: AtomicBool,
}

impl std::fmt::Debug for TaskDesc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskDesc")
            .field("shape", &self.shape)
            .field("block_num", &self.block_num)
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl TaskDesc {
    /// The device address of argument `t`'s buffer.
    pub(crate) fn addr_of(&self, t: &KTensor) -> u64 {
        if t.created {
            self.slab_base.load(Ordering::Relaxed) + t.addr
        } else {
            t.addr
        }
    }

    pub(crate) fn is_armed(&self) -> bool {
        self.armed.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_round_trips_through_the_route_word() {
        for m in [
            Meta {
                shape: Shape::Dummy,
                block_num: 1,
                sync_start: false,
                needs_arm: true,
                funcs: [None; 3],
            },
            Meta {
                shape: Shape::Aiv,
                block_num: 32767,
                sync_start: true,
                needs_arm: false,
                funcs: [None, Some(1023), None],
            },
            Meta {
                shape: Shape::Mix(0b101),
                block_num: 8,
                sync_start: false,
                needs_arm: false,
                funcs: [Some(0), None, Some(7)],
            },
        ] {
            assert_eq!(Meta::decode(m.encode()), m);
        }
    }
}
