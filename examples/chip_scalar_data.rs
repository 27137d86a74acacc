//! E7: the orchestration reads and writes tensor data itself — `get_tensor_data` /
//! `set_tensor_data` on external and runtime-created tensors, `alloc_tensors` with an
//! initial value, INOUT re-registration — and every access waits for exactly the tasks it
//! must (read-after-write, write-after-read, write-after-write). The values it observes
//! are published into `check`: [2, 102, 77, 77, 79, 42, 12, 88, 55]; `result` = a + b;
//! `b` (INOUT) comes back overwritten with a + 53.
//!
//! Written as a level-2 program (a signature and a chip orchestration), run once with host
//! tensors in shared memory.
//!
//! Run with `cargo run --release --example chip_scalar_data` (or `cargo xtask sim`). Prints
//! a final line starting with `ok:` and exits non-zero if a value differs from the host
//! golden.

use std::process::ExitCode;
use strata::chip::TensorCreateInfo;
use strata::prelude::*;

const N: u64 = 16384;

/// The orchestration that reads and writes tensor data between its tasks; `check`
/// receives the nine values it observed.
fn scalar_data() -> Program {
    let mut p = Program::new(
        "scalar_data",
        Signature::new()
            .input("a", DataType::F32, [N])
            .inout("b", DataType::F32, [N])
            .output("result", DataType::F32, [N])
            .output("check", DataType::F32, [9u64]),
    );
    // out(2) = a(0) + b(1)
    let add = p.kernel("add", |ctx| {
        let a = ctx.input::<f32>(0)?;
        let b = ctx.input::<f32>(1)?;
        let mut out = ctx.output::<f32>(2)?;
        let (Some(a), Some(b), Some(out)) = (a.as_slice(), b.as_slice(), out.as_mut_slice()) else {
            return Err("contiguous tensors expected".into());
        };
        for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
            *o = x + y;
        }
        Ok(())
    });
    // acc(0) += x(1)
    let accumulate = p.kernel("accumulate", |ctx| {
        let x = ctx.input::<f32>(1)?;
        let mut acc = ctx.output::<f32>(0)?;
        let x = x.as_slice().ok_or("x must be contiguous")?;
        for (o, v) in acc
            .as_mut_slice()
            .ok_or("acc must be contiguous")?
            .iter_mut()
            .zip(x)
        {
            *o += v;
        }
        Ok(())
    });
    let noop = p.kernel("noop", |_| Ok(()));
    p.orchestrate_chip(move |o, args| {
        let (a, b, result, check) = (
            args.tensor(0)?,
            args.tensor(1)?,
            args.tensor(2)?,
            args.tensor(3)?,
        );
        let vector = TensorCreateInfo::new(DataType::F32, &[N]);
        let mut seen = [0f32; 9];
        let c = o
            .submit_aiv(add, CoreArgs::new().input(&a).input(&b).output_new(vector))?
            .get(0)?;
        // An external input has no producer: read at once.
        seen[0] = o.get_tensor_data(&a, &[0])?;
        // A kernel output: the read waits for its producer (2 + 100).
        seen[1] = o.get_tensor_data(&c, &[100])?;
        // A tensor allocated with an initial value, before and after an unrelated task.
        let s = o
            .alloc_tensors(&[vector.with_initial_value(77.0f32)])?
            .get(0)?;
        seen[2] = o.get_tensor_data(&s, &[0])?;
        o.submit_aiv(noop, &CoreArgs::new())?;
        seen[3] = o.get_tensor_data(&s, &[10])?;
        // A kernel reads the allocated tensor: 77 + 2.
        let s2 = o
            .submit_aiv(add, CoreArgs::new().input(&s).input(&a).output_new(vector))?
            .get(0)?;
        seen[4] = o.get_tensor_data(&s2, &[0])?;
        // A write to a kernel output waits for its producer and its readers.
        o.set_tensor_data(&c, &[5], 42.0f32)?;
        seen[5] = o.get_tensor_data(&c, &[5])?;
        // INOUT re-registration: v = 10, v += a.
        let v = o
            .alloc_tensors(&[vector.with_initial_value(10.0f32)])?
            .get(0)?;
        o.submit_aiv(accumulate, CoreArgs::new().inout(&v).input(&a))?;
        seen[6] = o.get_tensor_data(&v, &[0])?;
        // Writing v waits for the INOUT task before it (write-after-write).
        o.submit_aiv(accumulate, CoreArgs::new().inout(&v).input(&a))?;
        o.set_tensor_data(&v, &[1], 88.0f32)?;
        seen[7] = o.get_tensor_data(&v, &[1])?;
        // result = a + b reads b; then b is overwritten with a + 53 (write-after-read).
        o.submit_aiv(add, CoreArgs::new().input(&a).input(&b).output(&result))?;
        let w = o
            .alloc_tensors(&[vector.with_initial_value(53.0f32)])?
            .get(0)?;
        o.submit_aiv(add, CoreArgs::new().input(&a).input(&w).output(&b))?;
        seen[8] = o.get_tensor_data(&b, &[0])?;
        for (i, value) in seen.iter().enumerate() {
            o.set_tensor_data(&check, &[i as u64], *value)?;
        }
        Ok(())
    });
    p
}

fn run() -> Result<String, Box<dyn std::error::Error>> {
    let compiled = scalar_data().compile(&Target::chip(ChipConfig::default()))?;

    let a = vec![2.0f32; N as usize];
    let b: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let a_t = SharedTensor::from_data(&[N], &a)?;
    let b_t = SharedTensor::from_data(&[N], &b)?;
    let result_t = SharedTensor::zeroed(&[N], DataType::F32)?;
    let check_t = SharedTensor::zeroed(&[9], DataType::F32)?;
    compiled.run_once((&a_t, &b_t, &result_t, &check_t))?;

    let (result, check) = (result_t.to_vec::<f32>()?, check_t.to_vec::<f32>()?);
    let golden: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    if let Some(i) = (0..N as usize).find(|&i| result[i] != golden[i]) {
        return Err(format!("result[{i}] = {}, expected {}", result[i], golden[i]).into());
    }
    // b is INOUT: the run's overwrite (a + 53) comes back to the host.
    let b_after = b_t.to_vec::<f32>()?;
    if let Some(i) = (0..N as usize).find(|&i| b_after[i] != a[i] + 53.0) {
        return Err(format!(
            "b[{i}] = {} after the run, expected {}",
            b_after[i],
            a[i] + 53.0
        )
        .into());
    }
    let a0 = a[0];
    let golden_check = [
        a0,          // a[0]
        a0 + b[100], // c[100]
        77.0,        // s[0]
        77.0,        // s[10]
        77.0 + a0,   // s2[0]
        42.0,        // c[5] after the write
        10.0 + a0,   // v[0] after one accumulate
        88.0,        // v[1] after the write
        a0 + 53.0,   // b[0] after it was overwritten
    ];
    if check != golden_check {
        return Err(format!("check = {check:?}, expected {golden_check:?}").into());
    }
    Ok("ok: result == a + b, b == a + 53 and check == [2, 102, 77, 77, 79, 42, 12, 88, 55]".into())
}

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chip_scalar_data: {e}");
            ExitCode::FAILURE
        }
    }
}
