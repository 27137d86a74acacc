//! Level 4 across "hosts": the level-4 vector sum of `l4_vector_sum`, with its two
//! level-3 children on two remote nodes instead of in this process tree. The example
//! starts the two nodes itself, on loopback: two `strata-node serve`-style daemons (this
//! same binary, run with `--node-daemon`, each listening on its own port of 127.0.0.1),
//! sharing a session secret through a 0600 file. Each remote level-3 worker forks its own
//! two chips and one sub-worker on its node; the callables are registered once, here, and
//! found on the nodes because every process runs this same program (same build-id, same
//! registrations — see `docs/net.md`).
//!
//! It also keeps one input resident in a remote chip's device memory
//! (`RemoteWorker::alloc` + `copy_to`) and reads it back at an offset.
//!
//! Run with `cargo run --release --example l4_remote_vector_sum` (or `cargo xtask sim`).
//! Prints a final line starting with `ok:` and exits non-zero if the result differs from
//! the host golden.

#[path = "common/nodes.rs"]
mod nodes;

use nodes::{LocalNodes, Role};
use std::process::ExitCode;
use std::time::Instant;
use strata::chip::{CoreArgs, KernelError};
use strata::host::SharedTensor;
use strata::types::{ArgTag, DataType, TaskArgs};
use strata::Worker;
use strata_net::{add_remote_worker, RemoteSpec, Secret};

const N: u64 = 1 << 14;

/// Builds the level-4 worker and runs the sum. In a node's process (started by its
/// daemon, with this program's arguments), `init` serves instead of returning.
fn run(addrs: [String; 2], secret: Option<Secret>) -> Result<String, String> {
    let e = |e: strata::Error| e.to_string();
    let mut top = Worker::l4(1).map_err(e)?;
    let add = top
        .register_kernel("vadd", |ctx| {
            let a = ctx.input::<f32>(0)?.to_vec();
            let b = ctx.input::<f32>(1)?.to_vec();
            let mut o = ctx.output::<f32>(2)?;
            let out = o
                .as_mut_slice()
                .ok_or_else(|| KernelError::new("vadd needs a contiguous output"))?;
            for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(&b)) {
                *o = x + y;
            }
            Ok(())
        })
        .map_err(e)?;
    let vadd = top
        .register_chip_orchestration("vadd", move |o, a| {
            o.submit_aiv(
                add,
                CoreArgs::new()
                    .input(&a.tensor(0)?)
                    .input(&a.tensor(1)?)
                    .output(&a.tensor(2)?),
            )?;
            Ok(())
        })
        .map_err(e)?;
    let sum = top
        .register_sub("sum", |call| {
            let x = call.tensor::<f32>(0)?.to_vec();
            let y = call.tensor::<f32>(1)?.to_vec();
            let mut o = call.tensor_mut::<f32>(2)?;
            for (i, (x, y)) in x.iter().zip(&y).enumerate() {
                o.set(&[i as u64], x + y)?;
            }
            Ok(())
        })
        .map_err(e)?;
    // The level-3 program each remote worker runs: args = [a, b, c, d (inputs), out].
    let l3_sum = top
        .register_orchestration("l3_vector_sum", move |o, args| {
            let t = args.tensors();
            if t.len() != 5 {
                return Err(format!("l3_vector_sum takes 5 tensors, got {}", t.len()).into());
            }
            let r0 = o.alloc(&[N], DataType::F32)?;
            let r1 = o.alloc(&[N], DataType::F32)?;
            for (chip, (x, y, r)) in [(t[0], t[1], &r0), (t[2], t[3], &r1)]
                .into_iter()
                .enumerate()
            {
                let mut a = TaskArgs::new();
                a.push_tensor(x.with_tag(ArgTag::Input))?
                    .push_tensor(y.with_tag(ArgTag::Input))?
                    .push_tensor(r.arg(ArgTag::Output))?;
                o.submit_next_level(vadd, &a, chip)?;
            }
            let mut a = TaskArgs::new();
            a.push_tensor(r0.arg(ArgTag::Input))?
                .push_tensor(r1.arg(ArgTag::Input))?
                .push_tensor(t[4].with_tag(ArgTag::OutputExisting))?;
            o.submit_sub(&sum, &a)?;
            Ok(())
        })
        .map_err(e)?;
    let dist = top
        .dist_worker()
        .ok_or("a level-4 worker is a DistWorker")?;
    let mut remotes = Vec::new();
    for addr in &addrs {
        let mut spec = RemoteSpec::new(addr.clone()).chips(2).sub_workers(1);
        if let Some(s) = &secret {
            spec = spec.secret(s.clone());
        }
        remotes.push(add_remote_worker(dist, spec).map_err(|e| e.to_string())?);
    }
    let children = [remotes[0].id(), remotes[1].id()];

    let mut golden = vec![0.0f32; N as usize];
    let mut child_args = Vec::new();
    let mut child_outs: Vec<SharedTensor> = Vec::new();
    let mut inputs: Vec<SharedTensor> = Vec::new();
    for c in 0..2 {
        let mut a = TaskArgs::new();
        for k in 0..4 {
            let v: Vec<f32> = (0..N)
                .map(|i| (i % 512) as f32 * 0.25 + (4 * c + k) as f32)
                .collect();
            for (g, x) in golden.iter_mut().zip(&v) {
                *g += x;
            }
            let t = top.shared_tensor_from(&[N], &v).map_err(e)?;
            a.push_tensor(t.arg(ArgTag::Input))
                .map_err(|e| e.to_string())?;
            inputs.push(t);
        }
        let out = top.shared_tensor(&[N], DataType::F32).map_err(e)?;
        a.push_tensor(out.arg(ArgTag::OutputExisting))
            .map_err(|e| e.to_string())?;
        child_args.push(a);
        child_outs.push(out);
    }
    let total = top.shared_tensor(&[N], DataType::F32).map_err(e)?;
    let (outs, tot) = (child_outs.clone(), total.clone());
    let first_input = inputs[0].clone();
    let l4_sum = top
        .register_orchestration("l4_vector_sum", move |o, _| {
            let _alive = &inputs;
            for (a, &worker) in child_args.iter().zip(&children) {
                o.submit_next_level(l3_sum, a, worker)?;
            }
            let mut a = TaskArgs::new();
            a.push_tensor(outs[0].arg(ArgTag::Input))?
                .push_tensor(outs[1].arg(ArgTag::Input))?
                .push_tensor(tot.arg(ArgTag::OutputExisting))?;
            o.submit_sub(&sum, &a)?;
            Ok(())
        })
        .map_err(e)?;

    // The root connects to both nodes here; a node's process serves from this call.
    top.init().map_err(e)?;
    let start = Instant::now();
    top.run(l4_sum, &TaskArgs::new()).map_err(e)?;
    let elapsed = start.elapsed();
    let got = total.to_vec::<f32>().map_err(|e| e.to_string())?;

    // Remote device memory: the first input, resident on chip 1 of node B, read back from
    // element 100 on.
    let dist = top
        .dist_worker()
        .ok_or("a level-4 worker is a DistWorker")?;
    let x = first_input.to_vec::<f32>().map_err(|e| e.to_string())?;
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let ne = |e: strata_net::NetError| e.to_string();
    let dev = remotes[1].alloc(dist, 1, &[N], DataType::F32).map_err(ne)?;
    remotes[1].copy_to(dist, &dev, 0, &bytes).map_err(ne)?;
    let mut back = vec![0u8; bytes.len() - 400];
    remotes[1]
        .copy_from(dist, &dev, 400, &mut back)
        .map_err(ne)?;
    remotes[1].free(dist, dev).map_err(ne)?;
    top.close().map_err(e)?;

    if back != bytes[400..] {
        return Err("the remote device copy did not read back byte for byte".into());
    }
    if let Some(i) = (0..N as usize).find(|&i| got[i] != golden[i]) {
        return Err(format!(
            "total[{i}] = {}, the host golden is {}",
            got[i], golden[i]
        ));
    }
    Ok(format!(
        "ok: l4_remote_vector_sum: 2 remote level-3 workers (2 nodes on loopback) x (2 chips + 1 sub-worker), {N} f32 match the host golden (run {elapsed:.2?}); a {} KiB remote device copy read back",
        bytes.len() / 1024
    ))
}

fn root() -> Result<String, String> {
    let nodes = LocalNodes::start(2)?;
    let addrs = nodes.addrs();
    let line = run([addrs[0].clone(), addrs[1].clone()], Some(nodes.secret()));
    let stopped = nodes.stop();
    let line = line?;
    stopped?;
    Ok(line)
}

fn main() -> ExitCode {
    let result = match nodes::role() {
        Role::Daemon(r) => r.map(|()| String::new()),
        // A node's process (its daemon started it with this program's arguments): the
        // same registrations and shape; `init` serves the connection the daemon handed it
        // and exits the process, so the addresses are not needed here.
        Role::Node => run([String::new(), String::new()], None),
        Role::Root => root(),
    };
    match result {
        Ok(line) if line.is_empty() => ExitCode::SUCCESS,
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("l4_remote_vector_sum: {e}");
            ExitCode::FAILURE
        }
    }
}
