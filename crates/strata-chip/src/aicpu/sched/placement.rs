//! Placement: the chip's core layout ([`Topology`]) and where the scheduler puts each
//! block of a ready task — an idle awake core first, then an idle parked one, then the
//! pending slot of a busy core; MIX tasks on one cluster; `require_sync_start` tasks only
//! when all their blocks can start together — and the dispatch descriptors it sends.

use super::{Out, ReadyEntry, Sched};
use crate::aicore::link::{CoreMsg, Dispatch};
use crate::config::CoreType;
use crate::error::{codes, ChipError};
use crate::task::{Meta, Shape, TaskDesc};
use std::collections::VecDeque;
use std::sync::Arc;
use strata_graph::TaskRef;

/// The core layout of a chip.
#[derive(Debug, Clone)]
pub(crate) struct Topology {
    pub(crate) types: Vec<CoreType>,
    /// AIV lane (0/1) of each core (0 for AIC).
    pub(crate) lane: Vec<u32>,
    pub(crate) aic: Vec<u32>,
    pub(crate) aiv: Vec<u32>,
    /// Per cluster: the core of each lane (AIC, AIV0, AIV1), if present.
    pub(crate) clusters: Vec<[Option<u32>; 3]>,
}

impl Topology {
    pub(crate) fn new(aic: u32, aiv: u32) -> Self {
        let mut t = Topology {
            types: Vec::new(),
            lane: Vec::new(),
            aic: Vec::new(),
            aiv: Vec::new(),
            clusters: Vec::new(),
        };
        for i in 0..aic {
            t.types.push(CoreType::Aic);
            t.lane.push(0);
            t.aic.push(i);
            t.clusters.push([Some(i), None, None]);
        }
        for j in 0..aiv {
            let id = aic + j;
            t.types.push(CoreType::Aiv);
            t.lane.push(j % 2);
            t.aiv.push(id);
            if let Some(c) = t.clusters.get_mut((j / 2) as usize) {
                c[1 + (j % 2) as usize] = Some(id);
            }
        }
        t
    }

    /// Cores (or clusters, for MIX) that can run one block of `shape`, counting only those
    /// `healthy` says are in service.
    pub(crate) fn capacity(&self, shape: Shape, mask: u8, healthy: impl Fn(u32) -> bool) -> u32 {
        match shape {
            Shape::Dummy => u32::MAX,
            Shape::Aic => self.aic.iter().filter(|&&c| healthy(c)).count() as u32,
            Shape::Aiv => self.aiv.iter().filter(|&&c| healthy(c)).count() as u32,
            Shape::Mix(_) => self
                .clusters
                .iter()
                .filter(|cl| (0..3).all(|l| mask & (1 << l) == 0 || cl[l].is_some_and(&healthy)))
                .count() as u32,
        }
    }
}

impl Sched {
    /// Picks a core of `ty` with a free slot: idle awake cores first, then idle parked
    /// ones, then the pending slot of a busy core.
    fn pick_core(&self, ty: CoreType, idle_only: bool) -> Option<u32> {
        let list = match ty {
            CoreType::Aic => &self.topo.aic,
            CoreType::Aiv => &self.topo.aiv,
        };
        let mut best: Option<(u8, u32)> = None;
        for &c in list {
            let s = &self.cores[c as usize];
            if s.lost {
                continue;
            }
            let n = s.outstanding.len();
            if n >= 2 || (idle_only && n > 0) {
                continue;
            }
            let asleep = self.links[c as usize].bell.is_sleeping();
            let rank = (n as u8) * 2 + asleep as u8;
            if rank == 0 {
                return Some(c);
            }
            if best.is_none_or(|(r, _)| rank < r) {
                best = Some((rank, c));
            }
        }
        best.map(|(_, c)| c)
    }

    /// Picks a cluster where every lane of `mask` has a free slot (all idle preferred).
    fn pick_cluster(&self, mask: u8, idle_only: bool, exclude: &[usize]) -> Option<usize> {
        let mut best: Option<(usize, usize)> = None;
        for (i, cl) in self.topo.clusters.iter().enumerate() {
            if exclude.contains(&i) {
                continue;
            }
            let mut load = 0;
            let mut ok = true;
            for (l, core) in cl.iter().enumerate() {
                if mask & (1 << l) == 0 {
                    continue;
                }
                match core {
                    Some(c) if !self.cores[*c as usize].lost => {
                        let n = self.cores[*c as usize].outstanding.len();
                        if n >= 2 || (idle_only && n > 0) {
                            ok = false;
                        }
                        load += n;
                    }
                    _ => ok = false,
                }
            }
            if !ok {
                continue;
            }
            if load == 0 {
                return Some(i);
            }
            if best.is_none_or(|(b, _)| load < b) {
                best = Some((load, i));
            }
        }
        best.map(|(_, i)| i)
    }

    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        core: u32,
        task: TaskRef,
        desc: Arc<TaskDesc>,
        meta: &Meta,
        block: u32,
        lane: u8,
        sub_block_id: u32,
    ) {
        let c = core as usize;
        let s = &mut self.cores[c];
        let seq = s.next_seq;
        s.next_seq += 1;
        if s.outstanding.is_empty() {
            self.busy.push(core);
        }
        s.outstanding.push_back(Out {
            seq,
            desc: super::DescPtr::of(&desc),
            task,
            block,
            lane,
            meta: *meta,
            abandoned: false,
        });
        let d = Dispatch {
            seq,
            task_id: task.id().0,
            epoch: self.ctl.env.epoch,
            desc,
            block,
            lane,
            func: meta.funcs[lane as usize].unwrap_or(u32::MAX),
            sub_block_id,
            timing: self.ctl.timing,
        };
        if self.report.dispatches == 0 {
            self.report.first_ns = self.now_ns();
        }
        self.report.dispatches += 1;
        if self.links[c].dispatch.push(CoreMsg::Run(d)).is_err() {
            // Cannot happen: at most two dispatches are outstanding per core.
            self.report
                .notes
                .push(format!("internal: dispatch ring of core {c} full"));
        }
        self.links[c].bell.ring();
    }

    /// Sends block `block` of `e` to cluster `cl` (MIX) or core `core` (AIC/AIV).
    fn send_block(
        &mut self,
        task: TaskRef,
        desc: &Arc<TaskDesc>,
        meta: &Meta,
        block: u32,
        place: Place,
    ) {
        match place {
            Place::Core(core) => {
                let (lane, sub) = match meta.shape {
                    Shape::Aic => (0, 0),
                    _ => (1, self.topo.lane[core as usize]),
                };
                self.send(core, task, desc.clone(), meta, block, lane, sub);
            }
            Place::Cluster(cl) => {
                let mask = meta.mask();
                for l in 0..3u8 {
                    if mask & (1 << l) == 0 {
                        continue;
                    }
                    let core =
                        self.topo.clusters[cl][l as usize].expect("picked cluster has the lane");
                    let sub = if l == 0 { 0 } else { (l - 1) as u32 };
                    self.send(core, task, desc.clone(), meta, block, l, sub);
                }
            }
        }
    }

    /// Like [`Sched::send_block`], moving the payload into the last dispatch.
    fn send_last(
        &mut self,
        task: TaskRef,
        desc: Arc<TaskDesc>,
        meta: &Meta,
        block: u32,
        place: Place,
    ) {
        match (place, meta.shape) {
            (Place::Core(core), Shape::Aic) => self.send(core, task, desc, meta, block, 0, 0),
            (Place::Core(core), _) => {
                let sub = self.topo.lane[core as usize];
                self.send(core, task, desc, meta, block, 1, sub)
            }
            (Place::Cluster(_), _) => self.send_block(task, &desc, meta, block, place),
        }
    }

    fn place_for(&self, shape: Shape, mask: u8, idle_only: bool, taken: &[usize]) -> Option<Place> {
        match shape {
            Shape::Aic => self.pick_core(CoreType::Aic, idle_only).map(Place::Core),
            Shape::Aiv => self.pick_core(CoreType::Aiv, idle_only).map(Place::Core),
            Shape::Mix(_) => self
                .pick_cluster(mask, idle_only, taken)
                .map(Place::Cluster),
            Shape::Dummy => None,
        }
    }

    pub(super) fn dispatch(&mut self) -> bool {
        let mut did = false;
        while let Some(r) = self.retry.front() {
            let ty = if r.lane == 0 {
                CoreType::Aic
            } else {
                CoreType::Aiv
            };
            let Some(core) = self.pick_core(ty, false) else {
                break;
            };
            let r = self.retry.pop_front().expect("front exists");
            self.send(
                core,
                r.task,
                r.desc,
                &r.meta,
                r.block,
                r.lane,
                r.sub_block_id,
            );
            did = true;
        }
        for which in [Shape::Mix(0), Shape::Aic, Shape::Aiv] {
            did |= self.dispatch_queue(which);
        }
        did
    }

    fn queue(&mut self, which: Shape) -> &mut VecDeque<ReadyEntry> {
        match which {
            Shape::Aic => &mut self.q_aic,
            Shape::Aiv => &mut self.q_aiv,
            _ => &mut self.q_mix,
        }
    }

    fn dispatch_queue(&mut self, which: Shape) -> bool {
        let mut did = false;
        loop {
            let Some(e) = self.queue(which).front() else {
                return did;
            };
            let (task, meta, next) = (e.task, e.meta, e.next_block);
            let mask = meta.mask();
            let healthy_capacity = self.topo.capacity(meta.shape, mask, |c| self.healthy(c));
            if healthy_capacity == 0 || (meta.sync_start && meta.block_num > healthy_capacity) {
                let e = self.queue(which).pop_front().expect("front exists");
                self.graveyard.push(e.desc);
                self.fail_unplaceable(task, &meta, next, healthy_capacity);
                did = true;
                continue;
            }
            if next > 0 && self.failed_already(task) {
                // A block failed: the remaining ones are not started.
                let left = (meta.block_num - next) * mask.count_ones();
                let e = self.queue(which).pop_front().expect("front exists");
                self.graveyard.push(e.desc);
                self.subtask_done(task, meta.total_subtasks(), None, left);
                did = true;
                continue;
            }
            if meta.sync_start && next == 0 {
                // All blocks at once, each on idle cores.
                let mut places = Vec::with_capacity(meta.block_num as usize);
                let mut taken_cores: Vec<u32> = Vec::new();
                let mut taken_clusters: Vec<usize> = Vec::new();
                for _ in 0..meta.block_num {
                    let p = match meta.shape {
                        Shape::Mix(_) => self
                            .pick_cluster(mask, true, &taken_clusters)
                            .map(Place::Cluster),
                        Shape::Aic | Shape::Aiv => {
                            let ty = if meta.shape == Shape::Aic {
                                CoreType::Aic
                            } else {
                                CoreType::Aiv
                            };
                            let list = if ty == CoreType::Aic {
                                &self.topo.aic
                            } else {
                                &self.topo.aiv
                            };
                            list.iter()
                                .copied()
                                .find(|&c| {
                                    !self.cores[c as usize].lost
                                        && self.cores[c as usize].outstanding.is_empty()
                                        && !taken_cores.contains(&c)
                                })
                                .map(Place::Core)
                        }
                        Shape::Dummy => None,
                    };
                    match p {
                        Some(Place::Core(c)) => taken_cores.push(c),
                        Some(Place::Cluster(cl)) => taken_clusters.push(cl),
                        None => break,
                    }
                    places.push(p.expect("matched Some"));
                }
                if places.len() < meta.block_num as usize {
                    return did; // wait until enough cores are idle together
                }
                let e = self.queue(which).pop_front().expect("front exists");
                for (b, p) in places.into_iter().enumerate() {
                    self.send_block(task, &e.desc, &meta, b as u32, p);
                }
                did = true;
                continue;
            }
            let Some(place) = self.place_for(meta.shape, mask, false, &[]) else {
                return did;
            };
            did = true;
            if next + 1 >= meta.block_num {
                // The last block takes the queue's reference (no reference-count traffic).
                let e = self.queue(which).pop_front().expect("front exists");
                self.send_last(task, e.desc, &meta, next, place);
            } else {
                let desc = self
                    .queue(which)
                    .front()
                    .expect("front exists")
                    .desc
                    .clone();
                self.send_block(task, &desc, &meta, next, place);
                self.queue(which)
                    .front_mut()
                    .expect("front exists")
                    .next_block += 1;
            }
        }
    }

    fn fail_unplaceable(&mut self, task: TaskRef, meta: &Meta, next: u32, capacity: u32) {
        let what = match meta.shape {
            Shape::Aic => "AIC cores",
            Shape::Aiv => "AIV cores",
            _ => "clusters with the task's lanes",
        };
        let (code, err) = if meta.sync_start && capacity > 0 {
            (
                codes::REQUIRE_SYNC_START_INVALID,
                ChipError::fatal(
                    codes::REQUIRE_SYNC_START_INVALID,
                    format!(
                        "task {} needs {} blocks started together but only {capacity} {what} are in service (others were lost to kernel timeouts)",
                        task.id().0,
                        meta.block_num
                    ),
                ),
            )
        } else {
            (
                codes::SCHEDULER_TIMEOUT,
                ChipError::fatal(
                    codes::SCHEDULER_TIMEOUT,
                    format!(
                        "task {} cannot be placed: no {what} are in service (they were lost to kernel timeouts); close the chip and create a new one",
                        task.id().0
                    ),
                ),
            )
        };
        let f = self.record_error(code, err);
        let left = (meta.block_num - next) * meta.mask().count_ones().max(1);
        self.subtask_done(task, meta.total_subtasks(), Some(f), left);
    }
}

#[derive(Debug, Clone, Copy)]
enum Place {
    Core(u32),
    Cluster(usize),
}
