//! Weights sharded over the chips of two hosts, resident across dispatches: four emulated
//! chips, two on each of two remote nodes (two `strata-node`-style daemons on loopback
//! that this example starts).
//!
//! A level-4 program whose children are `Target::remote(..)` level-3 workers, prepared
//! once. Then:
//! 1. `alloc_stacked_tensor` uploads a `[4, N]` weight matrix, one row per chip, placed
//!    in reverse (row 0 on the last chip); a resident accumulator lives on chip 1 (node 0's
//!    second chip);
//! 2. each of three dispatches computes `y[i] = w[i] * x[i]` on the chip holding `w[i]`,
//!    then adds `y[0]` into the accumulator on its chip — a task that depends, across
//!    hosts, on the one that wrote `y[0]`;
//! 3. the weights and the accumulator are read back from the nodes' device memory.
//!
//! The level-4 orchestration sends each shard's task to the node holding it
//! (`shard_worker`); the node's orchestration finds the chip from the argument itself
//! (`TensorArg::device_worker`). Every process of the job runs this same program: a
//! node's process compiles and prepares the same program, and its `prepare` serves
//! instead of returning.
//!
//! Run with `cargo run --release --example l4_remote_stacked_weights` (or `cargo xtask
//! sim`). Prints a final line starting with `ok:`; exits non-zero if a value differs from
//! the host golden.

#[path = "common/nodes.rs"]
mod nodes;

use nodes::{LocalNodes, Role};
use std::process::ExitCode;
use strata::net::{RemoteSpec, Secret};
use strata::prelude::*;

const NODES: usize = 2;
const CHIPS: usize = 2;
const SHARDS: u64 = (NODES * CHIPS) as u64;
const N: u64 = 1024;
const DISPATCHES: u32 = 3;

fn sharded_product() -> Program {
    let rows = [Dim::Fixed(SHARDS), Dim::Fixed(N)];
    let mut p = Program::new(
        "sharded_product",
        Signature::new()
            .input("w", DataType::F32, rows.clone())
            .input("x", DataType::F32, rows.clone())
            .output("y", DataType::F32, rows)
            .inout("acc", DataType::F32, [Dim::Fixed(N)]),
    );
    let product = p.kernel("product", |ctx| {
        let w = ctx.input::<f32>(0)?.to_vec();
        let x = ctx.input::<f32>(1)?.to_vec();
        let mut y = ctx.output::<f32>(2)?;
        for (i, (w, x)) in w.iter().zip(&x).enumerate() {
            y.set_flat(i as u64, w * x)?;
        }
        Ok(())
    });
    let product_chip = p.chip_orchestration("product", move |o, a| {
        o.submit_aiv(
            product,
            CoreArgs::new()
                .input(&a.tensor(0)?)
                .input(&a.tensor(1)?)
                .output(&a.tensor(2)?),
        )?;
        Ok(())
    });
    let accumulate = p.kernel("accumulate", |ctx| {
        let y = ctx.input::<f32>(0)?.to_vec();
        // Read-write: the accumulator is an INOUT argument.
        let mut acc = ctx.output::<f32>(1)?;
        for (a, y) in acc
            .as_mut_slice()
            .ok_or("contiguous acc")?
            .iter_mut()
            .zip(&y)
        {
            *a += y;
        }
        Ok(())
    });
    let accumulate_chip = p.chip_orchestration("accumulate", move |o, a| {
        o.submit_aiv(
            accumulate,
            CoreArgs::new().input(&a.tensor(0)?).inout(&a.tensor(1)?),
        )?;
        Ok(())
    });
    // On a node: [w shard, x row, y row]; the shard is this node's own chip tensor.
    let node_product = p.worker_orchestration("node_product", move |o, args| {
        let [w, x, y] = args.tensors() else {
            return Err("node_product takes w, x and y".into());
        };
        let chip = w.device_worker().ok_or("the shard is a device tensor")?;
        let a = TaskArgs::new().input(*w).input(*x).output_existing(*y);
        o.submit_next_level(product_chip, &a, chip)?;
        Ok(())
    });
    // On a node: [y row, acc].
    let node_accumulate = p.worker_orchestration("node_accumulate", move |o, args| {
        let [y, acc] = args.tensors() else {
            return Err("node_accumulate takes y and acc".into());
        };
        let chip = acc.device_worker().ok_or("acc is a device tensor")?;
        o.submit_next_level(
            accumulate_chip,
            &TaskArgs::new().input(*y).inout(*acc),
            chip,
        )?;
        Ok(())
    });
    p.orchestrate(move |o, args| {
        let (w, x, y, acc) = (
            args.tensor("w")?,
            args.tensor("x")?,
            args.tensor("y")?,
            args.tensor("acc")?,
        );
        for i in 0..w.shards() {
            let a = TaskArgs::new()
                .input(w.shard(i))
                .input(x.row(i))
                .output_existing(y.row(i));
            o.submit_next_level(node_product, &a, w.shard_worker(i)?)?;
        }
        let node = acc.worker().ok_or("acc is resident on a node's chip")?;
        let a = TaskArgs::new().input(y.row(0)).inout(acc);
        o.submit_next_level(node_accumulate, &a, node)?;
        Ok(())
    });
    p
}

fn run(addrs: &[String], secret: Option<Secret>) -> Result<String, Error> {
    let node = |addr: &String| {
        let spec = RemoteSpec::new(addr.clone()).chips(CHIPS);
        Target::remote(match &secret {
            Some(s) => spec.secret(s.clone()),
            None => spec,
        })
    };
    let compiled = sharded_product().compile(&Target::l4(addrs.iter().map(node).collect()))?;
    let shape = [SHARDS, N];
    let x = SharedTensor::zeroed(&shape, DataType::F32)?;
    let y = SharedTensor::zeroed(&shape, DataType::F32)?;
    // The root connects to both nodes here; a node's process serves from this call.
    let rt = compiled.prepare(Prepare::new())?;

    let n = N as usize;
    let weights: Vec<f32> = (0..SHARDS as usize * n)
        .map(|i| ((i * 7) % 13) as f32 - 6.0)
        .collect();
    // Row i on chip 3 - i: row 0 on node 1's second chip, row 3 on node 0's first.
    let placement: Vec<usize> = (0..SHARDS as usize).rev().collect();
    let free = |rt: &PreparedWorker| -> Result<Vec<u64>, Error> {
        (0..SHARDS as usize)
            .map(|c| Ok(rt.device_memory_info(c)?.0))
            .collect()
    };
    let before = free(&rt)?;
    let w = rt.alloc_stacked_tensor(&shape, &weights, Some(&placement))?;
    // Every chip's card gave one shard's bytes.
    for (c, (b, a)) in before.iter().zip(free(&rt)?).enumerate() {
        if b.saturating_sub(a) < 4 * N {
            return Err(Error::InvalidArgument(format!(
                "chip {c}: its card went from {b} to {a} free bytes; a shard of {} bytes should be there",
                4 * N
            )));
        }
    }
    let acc = rt.alloc_tensor(&[N], DataType::F32, 1)?;
    let mut acc_golden = vec![0f32; n];
    for dispatch in 1..=DISPATCHES {
        let xs: Vec<f32> = (0..SHARDS as usize * n)
            .map(|i| ((i % 29) as f32 + 1.0) * dispatch as f32)
            .collect();
        x.write(&xs)?;
        y.write(&vec![0f32; xs.len()])?;
        rt.call((&w, &x, &y, &acc))?;
        let golden: Vec<f32> = weights.iter().zip(&xs).map(|(w, x)| w * x).collect();
        let got = y.to_vec::<f32>()?;
        if got != golden {
            let row = (0..SHARDS as usize)
                .find(|&r| got[r * n..(r + 1) * n] != golden[r * n..(r + 1) * n])
                .unwrap_or(0);
            return Err(Error::InvalidArgument(format!(
                "dispatch {dispatch}: y row {row} (chip {}) is {:?}..., the host golden {:?}...",
                placement[row],
                &got[row * n..row * n + 3],
                &golden[row * n..row * n + 3]
            )));
        }
        for (a, y) in acc_golden.iter_mut().zip(&golden[..n]) {
            *a += y;
        }
    }
    let mut back = vec![0f32; weights.len()];
    rt.copy_stacked_from(&mut back, &shape, &w)?;
    if back != weights {
        return Err(Error::InvalidArgument(
            "the weights read back from the nodes differ from the ones uploaded".into(),
        ));
    }
    let mut acc_back = vec![0f32; n];
    rt.copy_from(&mut acc_back, &acc, CopyRange::bytes(4 * N))?;
    if acc_back != acc_golden {
        return Err(Error::InvalidArgument(format!(
            "the accumulator holds {:?}..., the host golden {:?}...",
            &acc_back[..3],
            &acc_golden[..3]
        )));
    }
    let (free, total) = rt.device_memory_info(3)?;
    refusals(&rt, &w, &acc, &x, &y)?;
    rt.free_stacked_tensor(&w)?;
    rt.close()?;
    Ok(format!(
        "ok: l4_remote_stacked_weights: {NODES} remote nodes (loopback) x {CHIPS} chips hold a [{SHARDS}, {N}] f32 weight matrix (placed {placement:?}) and an accumulator across {DISPATCHES} dispatches; products, accumulator and weights match the host golden (chip 3: {} of {} MiB free)",
        free >> 20,
        total >> 20
    ))
}

/// What the worker refuses with remote tensors, each a typed error (the session stays
/// usable after each): a copy past a tensor's end, a chip that does not exist, a second
/// free, and a dispatch naming a freed tensor. Frees `acc`.
fn refusals(
    rt: &PreparedWorker,
    w: &StackedDeviceTensor,
    acc: &DeviceTensor,
    x: &SharedTensor,
    y: &SharedTensor,
) -> Result<(), Error> {
    let refused = |what: &str, e: Error| Error::InvalidArgument(format!("{what}: {e}"));
    match rt.copy_to(acc, &[0u8; 8], CopyRange::new(8, 4 * N - 4, 0)) {
        Err(Error::InvalidArgument(_)) => {}
        other => {
            return Err(refused(
                "a copy past the end",
                other.err().unwrap_or(Error::Closed("ok")),
            ))
        }
    }
    match rt.alloc_tensor(&[N], DataType::F32, SHARDS as usize) {
        Err(Error::InvalidArgument(_)) => {}
        other => {
            return Err(refused(
                "a fifth chip",
                other.err().unwrap_or(Error::Closed("ok")),
            ))
        }
    }
    rt.free_tensor(acc)?;
    match rt.free_tensor(acc) {
        Err(Error::Memory(_)) => {}
        other => {
            return Err(refused(
                "a second free",
                other.err().unwrap_or(Error::Closed("ok")),
            ))
        }
    }
    match rt.call((w, x, y, acc)) {
        Err(Error::Argument { param, .. }) if param == "acc" => {}
        other => {
            return Err(refused(
                "a freed accumulator",
                other.err().unwrap_or(Error::Closed("ok")),
            ))
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let result = match nodes::role() {
        Role::Daemon(r) => r.map(|()| String::new()),
        // A node's process: the same program up to `prepare`, which serves and exits.
        Role::Node => run(&[String::new(), String::new()], None)
            .map(|_| String::new())
            .map_err(|e| e.to_string()),
        Role::Root => LocalNodes::start(NODES).and_then(|nodes| {
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
            eprintln!("l4_remote_stacked_weights: {e}");
            ExitCode::FAILURE
        }
    }
}
