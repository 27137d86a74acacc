//! The quickstart allreduce across two hosts: four emulated chips, two on each of two
//! remote nodes (two `strata-node`-style daemons on loopback that this example starts),
//! every chip ending with the sum of all four chips' inputs.
//!
//! A level-4 program whose children are `Target::remote(..)` level-3 workers, prepared
//! once and dispatched twice. Each dispatch is a hierarchical allreduce:
//! 1. on each node, the node's two chips allreduce their rows through a window buffer
//!    (the quickstart's kernel, per-rank loop, window as an ordinary argument);
//! 2. a sub-worker of the level-4 host adds the two nodes' sums;
//! 3. each node copies the total into its chips' output rows.
//!
//! Dependencies between the stages are inferred from the tensors, across hosts: stage 2
//! reads rows stage 1 wrote, stage 3 reads what stage 2 wrote and overwrites rows stage 2
//! read. Every process of the job runs this same program: a node's process compiles and
//! prepares the same program, and its `prepare` serves instead of returning.
//!
//! Run with `cargo run --release --example l4_remote_allreduce` (or `cargo xtask sim`).
//! Prints a final line starting with `ok:`; exits non-zero if a chip's row differs from
//! the host golden.

#[path = "common/nodes.rs"]
mod nodes;

use nodes::{LocalNodes, Role};
use std::process::ExitCode;
use strata::comm::prelude::*;
use strata::net::{RemoteSpec, Secret};
use strata::prelude::*;

const NODES: u64 = 2;
const CHIPS: u64 = 2;
const N: u64 = 4096;

fn hierarchical_allreduce() -> Program {
    let rows = [Dim::World, Dim::Fixed(CHIPS), Dim::Fixed(N)];
    let mut p = Program::new(
        "remote_allreduce",
        Signature::new()
            .input("x", DataType::F32, rows.clone())
            .output("y", DataType::F32, rows),
    );
    // Stage 1, on a chip: tensor 0 its input row, 1 its output row, 2 its window copy.
    let allreduce = p.kernel("allreduce", |ctx| {
        let data = ctx.window(2)?;
        data.write(data.rank(), 0, &ctx.input::<f32>(0)?.to_vec())?;
        data.allreduce(ReduceOp::Sum, AllreduceAlgo::Auto)?;
        let mut out = ctx.output::<f32>(1)?;
        data.read(
            data.rank(),
            0,
            out.as_mut_slice().ok_or("contiguous output")?,
        )?;
        Ok(())
    });
    let allreduce_chip = p.chip_orchestration("allreduce", move |o, a| {
        o.submit_aiv(
            allreduce,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .output(&a.tensor(1)?)
                .inout(&a.tensor(2)?),
        )?;
        Ok(())
    });
    // Stage 3, on a chip: its output row = the total.
    let copy = p.kernel("copy", |ctx| {
        ctx.output::<f32>(1)?
            .copy_from_slice(&ctx.input::<f32>(0)?.to_vec())?;
        Ok(())
    });
    let copy_chip = p.chip_orchestration("copy", move |o, a| {
        o.submit_aiv(
            copy,
            CoreArgs::new().input(&a.tensor(0)?).output(&a.tensor(1)?),
        )?;
        Ok(())
    });
    // Stage 1 on a node: [x_node, y_node], one task per chip.
    let node_allreduce = p.worker_orchestration("node_allreduce", move |o, args| {
        let [x, y] = args.tensors() else {
            return Err("node_allreduce takes x and y".into());
        };
        let buf = o.alloc_window_buffer(4 * N)?;
        let data = o.window(&buf, 0, &[1, N], DataType::F32)?;
        for r in 0..o.world_size() {
            let a = TaskArgs::new()
                .input(x.slice(1, r as u64, r as u64 + 1))
                .output_existing(y.slice(1, r as u64, r as u64 + 1))
                .inout(&data);
            o.submit_next_level(allreduce_chip, &a, r)?;
        }
        Ok(())
    });
    // Stage 3 on a node: [total, y_node].
    let node_broadcast = p.worker_orchestration("node_broadcast", move |o, args| {
        let [total, y] = args.tensors() else {
            return Err("node_broadcast takes total and y".into());
        };
        for r in 0..o.world_size() {
            let a =
                TaskArgs::new()
                    .input(*total)
                    .output_existing(y.slice(1, r as u64, r as u64 + 1));
            o.submit_next_level(copy_chip, &a, r)?;
        }
        Ok(())
    });
    // Stage 2 on the level-4 host: total = node 0's sum + node 1's sum.
    let add = p.sub("add", |call| {
        let a = call.tensor::<f32>(0)?.to_vec();
        let b = call.tensor::<f32>(1)?.to_vec();
        let sum: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + b).collect();
        call.tensor_mut::<f32>(2)?.copy_from_slice(&sum)?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let (x, y) = (args.tensor("x")?, args.tensor("y")?);
        for node in 0..o.world_size() {
            let a = TaskArgs::new()
                .input(x.row(node))
                .output_existing(y.row(node));
            o.submit_next_level(node_allreduce, &a, node)?;
        }
        let total = o.alloc(&[N], DataType::F32)?;
        let mut sum = TaskArgs::new();
        for node in 0..o.world_size() {
            // y[node][0]: chip 0 of the node, which holds the node's sum.
            sum = sum.input(y.row(node)?.slice(1, 0, 1));
        }
        o.submit_sub(&add, &sum.output(&total))?;
        for node in 0..o.world_size() {
            let a = TaskArgs::new().input(&total).output_existing(y.row(node));
            o.submit_next_level(node_broadcast, &a, node)?;
        }
        Ok(())
    });
    p
}

fn run(addrs: &[String], secret: Option<Secret>) -> Result<String, Error> {
    let node = |addr: &String| {
        let spec = RemoteSpec::new(addr.clone()).chips(CHIPS as usize);
        Target::remote(match &secret {
            Some(s) => spec.secret(s.clone()),
            None => spec,
        })
    };
    let target = Target::l4(addrs.iter().map(node).collect()).sub_workers(1);
    let compiled = hierarchical_allreduce().compile(&target)?;

    let shape = [NODES, CHIPS, N];
    let x = SharedTensor::zeroed(&shape, DataType::F32)?;
    let y = SharedTensor::zeroed(&shape, DataType::F32)?;
    // The root connects to both nodes here; a node's process serves from this call.
    let rt = compiled.prepare(Prepare::new())?;

    let mut checked = 0;
    for dispatch in 1..=2u32 {
        // Chip k (node k / 2, chip k % 2) holds (k + 1) · dispatch · (i % 97 + 1).
        let xs: Vec<f32> = (0..NODES * CHIPS)
            .flat_map(|k| (0..N).map(move |i| ((k + 1) * (i % 97 + 1)) as f32 * dispatch as f32))
            .collect();
        x.write(&xs)?;
        y.write(&vec![0f32; xs.len()])?;
        rt.call((&x, &y))?;
        let got = y.to_vec::<f32>()?;
        let n = N as usize;
        let golden: Vec<f32> = (0..n)
            .map(|i| (0..(NODES * CHIPS) as usize).map(|k| xs[k * n + i]).sum())
            .collect();
        for (k, row) in got.chunks(n).enumerate() {
            if row != golden.as_slice() {
                return Err(Error::InvalidArgument(format!(
                    "dispatch {dispatch}: chip {} of node {} holds {:?}..., the host golden is {:?}...",
                    k % CHIPS as usize,
                    k / CHIPS as usize,
                    &row[..3],
                    &golden[..3]
                )));
            }
        }
        checked += 1;
    }
    rt.close()?;
    Ok(format!(
        "ok: l4_remote_allreduce: {NODES} remote nodes (loopback) x {CHIPS} chips, {checked} dispatches of a hierarchical allreduce of {N} f32: every chip holds the sum of all {} chips' inputs (match the host golden)",
        NODES * CHIPS
    ))
}

fn main() -> ExitCode {
    let result = match nodes::role() {
        Role::Daemon(r) => r.map(|()| String::new()),
        // A node's process: the same program up to `prepare`, which serves and exits.
        Role::Node => run(&[String::new(), String::new()], None)
            .map(|_| String::new())
            .map_err(|e| e.to_string()),
        Role::Root => LocalNodes::start(NODES as usize).and_then(|nodes| {
            let line = run(&nodes.addrs(), Some(nodes.secret())).map_err(|e| e.to_string());
            let stopped = nodes.stop();
            let line = line?;
            stopped?;
            Ok(line)
        }),
    };
    match result {
        Ok(line) if line.is_empty() => ExitCode::SUCCESS,
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("l4_remote_allreduce: {e}");
            ExitCode::FAILURE
        }
    }
}
