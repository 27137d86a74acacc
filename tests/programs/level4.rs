//! Resident and stacked tensors on a level-4 worker's local level-3 children: the chips
//! are numbered across the children, a shard's task goes to the child holding it, and
//! that child's orchestration finds its chip from the argument itself.

use super::{l3, orchestrate_per_shard, scale_shards_parts, Mode};
use strata::prelude::*;
use strata_testkit::{check, Ctx, Outcome};

/// Chips of the two level-3 children: child 0 has 2, child 1 has 1.
const CHIPS: [usize; 2] = [2, 1];
const CARD: u64 = 1 << 30;

fn target<M: Mode>() -> Target {
    let children = CHIPS
        .iter()
        .map(|&n| l3::<M>(n).configure_chips(|c| c.device_memory_bytes = CARD))
        .collect();
    Target::l4(children).configure(|c| c.exec_mode = M::VALUE)
}

/// `y[i] = k * w[i]` for every shard `i` of a stacked `w`: the level-4 orchestration sends
/// each shard's task to the child holding it, whose orchestration runs it on the chip the
/// shard is on.
fn sharded_scale() -> Program {
    let shards = (CHIPS[0] + CHIPS[1]) as u64;
    let (mut p, on_chip) = scale_shards_parts("sharded_scale", Dim::Fixed(shards));
    // On the level-3 child: the shard arrives as this worker's own chip tensor.
    let on_child = p.worker_orchestration("mul_shard", move |o, a| {
        let [w, y] = a.tensors() else {
            return Err("mul_shard takes w and y".into());
        };
        let chip = w.device_worker().ok_or("the shard is a device tensor")?;
        let k = a.scalar_at::<f32>(0).ok_or("no k")?;
        let t = TaskArgs::new().input(*w).output_existing(*y).scalar(k);
        o.submit_next_level(on_chip, &t, chip)?;
        Ok(())
    });
    orchestrate_per_shard(&mut p, on_child.into());
    p
}

pub fn stacked_tensors_shard_over_the_chips_of_level_3_children<M: Mode>() -> Outcome {
    let compiled = sharded_scale().compile(&target::<M>()).ctx("compile")?;
    let host: Vec<f32> = (0..96).map(|i| i as f32 - 40.0).collect();
    let y = SharedTensor::zeroed(&[3, 4, 8], DataType::F32).ctx("y")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    // Placement: chip -> (child, chip there), counted child by child.
    let owner = |chip: usize| if chip < CHIPS[0] { 0u32 } else { 1 };
    for (round, ids) in [None, Some(vec![2usize, 0, 1])].into_iter().enumerate() {
        let w = rt
            .alloc_stacked_tensor(&[3, 4, 8], &host, ids.as_deref())
            .ctx("alloc stacked")?;
        let want = ids.clone().unwrap_or(vec![0, 1, 2]);
        check!(w.worker_ids() == want, "placement {:?}", w.worker_ids());
        for (s, &chip) in w.shards().iter().zip(&want) {
            check!(
                s.worker() == owner(chip),
                "the shard on chip {chip} belongs to child {}, not {}",
                owner(chip),
                s.worker()
            );
        }
        let k = 2.0 + round as f32;
        rt.call((&w, &y, k)).ctx("call")?;
        let golden: Vec<f32> = host.iter().map(|v| v * k).collect();
        check!(
            y.to_vec::<f32>().ctx("y")? == golden,
            "y = {k} w with placement {want:?}"
        );
        let mut back = vec![0f32; 96];
        rt.copy_stacked_from(&mut back, &[3, 4, 8], &w)
            .ctx("read back")?;
        check!(back == host, "every shard reads back into its place");
        rt.free_stacked_tensor(&w).ctx("free")?;
        let e = rt.free_stacked_tensor(&w).unwrap_err();
        check!(
            matches!(e, Error::Memory(_)),
            "a second free is refused: {e}"
        );
    }
    let e = rt
        .alloc_stacked_tensor(&[3, 4, 8], &host, Some(&[0, 1, 3]))
        .unwrap_err();
    check!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("out of range") && m.contains("3 chips")),
        "a fourth chip does not exist: {e}"
    );
    rt.close().ctx("close")
}

pub fn resident_tensors_on_a_level_3_childs_chip_round_trip<M: Mode>() -> Outcome {
    let compiled = sharded_scale().compile(&target::<M>()).ctx("compile")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    // Chip 2 is child 1's chip 0.
    let (free0, total) = rt.device_memory_info(2).ctx("info")?;
    check!(total == CARD, "the card holds {total} bytes, not {CARD}");
    let held0 = rt.committed_device_memory(2).ctx("committed")?;
    let other0 = rt.committed_device_memory(0).ctx("committed 0")?;
    let n = 100_000usize;
    let t = rt
        .alloc_tensor(&[n as u64], DataType::F32, 2)
        .ctx("alloc")?;
    check!(t.worker() == 1, "held by child 1, not {}", t.worker());
    let (free1, _) = rt.device_memory_info(2).ctx("info")?;
    check!(
        free1 + 4 * n as u64 <= free0,
        "the allocation used the card: {free0} -> {free1}"
    );
    check!(
        rt.committed_device_memory(2).ctx("committed")? > held0,
        "the chip's allocator holds more"
    );
    check!(
        rt.committed_device_memory(0).ctx("committed 0")? == other0,
        "child 0's chip 0 is untouched"
    );
    // An unaligned write and read at offsets, against a host model.
    let mut model = vec![0u8; 4 * n];
    let patch: Vec<u8> = (0..9_999u32).map(|i| (i * 31 % 251) as u8).collect();
    rt.copy_to(&t, &patch, CopyRange::new(9_990, 4_003, 5))
        .ctx("copy_to")?;
    model[4_003..4_003 + 9_990].copy_from_slice(&patch[5..5 + 9_990]);
    let mut back = vec![0u8; 20_000];
    rt.copy_from(&mut back, &t, CopyRange::new(19_000, 1_001, 1_000))
        .ctx("copy_from")?;
    check!(
        back[1_000..] == model[1_001..20_001],
        "the read-back matches the host model"
    );
    let e = rt
        .copy_to(&t, &[0u8; 8], CopyRange::new(8, 4 * n as u64 - 4, 0))
        .unwrap_err();
    check!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("leaves")),
        "a copy past the end: {e}"
    );
    let e = rt.alloc_tensor(&[4], DataType::F32, 3).unwrap_err();
    check!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("out of range")),
        "no chip 3: {e}"
    );
    rt.free_tensor(&t).ctx("free")?;
    check!(
        rt.committed_device_memory(2).ctx("committed")? == held0,
        "the free released the chip's memory"
    );
    // Chip 1 is child 0's second chip: the child allocates there, not on its chip 0.
    let (c0, c1) = (
        rt.committed_device_memory(0).ctx("committed 0")?,
        rt.committed_device_memory(1).ctx("committed 1")?,
    );
    let u = rt
        .alloc_tensor(&[1 << 20], DataType::U8, 1)
        .ctx("alloc on 1")?;
    check!(
        rt.committed_device_memory(1).ctx("committed 1")? >= c1 + (1 << 20)
            && rt.committed_device_memory(0).ctx("committed 0")? == c0,
        "1 MiB on chip 1 ({c1} -> {}), none on chip 0 ({c0} -> {})",
        rt.committed_device_memory(1).ctx("committed 1")?,
        rt.committed_device_memory(0).ctx("committed 0")?
    );
    rt.free_tensor(&u).ctx("free on 1")?;
    rt.close().ctx("close")
}

/// A resident tensor goes only to tasks of the child that holds it, and a freed one to
/// none: the level-4 engine refuses the others before anything runs on a child.
pub fn a_resident_tensor_goes_only_to_the_child_that_holds_it<M: Mode>() -> Outcome {
    let mut p = Program::new(
        "route",
        Signature::new()
            .inout("t", DataType::F32, [Dim::Fixed(8)])
            .scalar("to", DataType::U64),
    );
    let bump = p.kernel("bump", |ctx| {
        ctx.output::<f32>(0)?.update(|v| v + 1.0);
        Ok(())
    });
    let on_chip = p.chip_orchestration("bump", move |o, a| {
        o.submit_aiv(bump, CoreArgs::new().inout(&a.tensor(0)?))?;
        Ok(())
    });
    let on_child = p.worker_orchestration("bump_on_child", move |o, a| {
        let [t] = a.tensors() else {
            return Err("bump_on_child takes t".into());
        };
        let chip = t.device_worker().ok_or("t is a device tensor")?;
        o.submit_next_level(on_chip, &TaskArgs::new().inout(*t), chip)?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let to = args.scalar::<u64>("to")? as usize;
        o.submit_next_level(on_child, &TaskArgs::new().inout(args.tensor("t")?), to)?;
        Ok(())
    });
    let compiled = p.compile(&target::<M>()).ctx("compile")?;
    let rt = compiled.prepare(Prepare::new()).ctx("prepare")?;
    // Chip 1: child 0's second chip.
    let t = rt.alloc_tensor_from(&[8], &[1f32; 8], 1).ctx("alloc")?;
    rt.call((&t, 0u64)).ctx("to the child holding it")?;
    let e = rt.call((&t, 1u64)).unwrap_err();
    check!(
        e.to_string().contains("device memory of worker 0"),
        "to the other child: {e}"
    );
    let mut back = [0f32; 8];
    rt.copy_from(&mut back, &t, CopyRange::bytes(32))
        .ctx("read")?;
    check!(
        back == [2f32; 8],
        "one bump, from the call routed to its child: {back:?}"
    );
    rt.free_tensor(&t).ctx("free")?;
    let e = rt.call((&t, 0u64)).unwrap_err();
    check!(
        matches!(&e, Error::Argument { param, .. } if param == "t"),
        "a freed tensor: {e}"
    );
    rt.close().ctx("close")
}
