//! Fixed little-endian wire encodings of [`TaskArgs`] and [`CallConfig`], as carried in
//! task frames (see `docs/mailbox.md` for the byte maps).
//!
//! Decoding validates everything: a frame written by a buggy or hostile peer yields
//! [`TypesError::Malformed`], never a panic or an out-of-bounds view.

use crate::args::{ArgLimits, BufferDesc, BufferLocation, TaskArgs, TensorArg};
use crate::config::{CallConfig, RingOverride, OUTPUT_PREFIX_MAX, RING_COUNT};
use crate::dtype::DataType;
use crate::error::TypesError;
use crate::identity::{BufferIdentity, OwnerNonce};
use crate::tag::ArgTag;
use crate::view::{TensorView, MAX_DIMS};
use std::time::Duration;

/// Bytes of one encoded tensor argument.
pub const TENSOR_WIRE_BYTES: usize = 144;
/// Bytes of the argument-blob header (`u32` tensor count, `u32` scalar count).
pub const ARGS_HEADER_BYTES: usize = 8;
/// Bytes of an encoded [`CallConfig`].
pub const CALL_CONFIG_WIRE_BYTES: usize = 1152;
/// Largest argument blob at host-level limits (256 tensors, 128 scalars): 37 896 bytes.
pub const MAX_ARGS_BLOB_BYTES: usize = ARGS_HEADER_BYTES
    + ArgLimits::HOST.max_tensors * TENSOR_WIRE_BYTES
    + ArgLimits::HOST.max_scalars * 8;

const LOC_HOST_SHARED: u8 = 1;
const LOC_DEVICE: u8 = 2;
const LOC_HOST_LOCAL: u8 = 3;

fn put_u64(buf: &mut [u8], off: usize, v: u64) {
    buf[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
fn put_u32(buf: &mut [u8], off: usize, v: u32) {
    buf[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
fn get_u64(buf: &[u8], off: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[off..off + 8]);
    u64::from_le_bytes(b)
}
fn get_u32(buf: &[u8], off: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[off..off + 4]);
    u32::from_le_bytes(b)
}

fn malformed(m: impl Into<String>) -> TypesError {
    TypesError::Malformed(m.into())
}

/// Encodes one tensor argument into exactly [`TENSOR_WIRE_BYTES`] bytes.
pub fn encode_tensor(arg: &TensorArg, out: &mut [u8; TENSOR_WIRE_BYTES]) {
    out.fill(0);
    let id = arg.buffer.identity();
    put_u64(out, 0, id.owner().0);
    put_u64(out, 8, id.buffer_id());
    put_u32(out, 16, id.generation());
    let (kind, a, b) = match arg.buffer.location() {
        BufferLocation::HostShared { region, offset } => (LOC_HOST_SHARED, region, offset),
        BufferLocation::Device { worker, addr } => (LOC_DEVICE, worker as u64, addr),
        BufferLocation::HostLocal { addr } => (LOC_HOST_LOCAL, addr, 0),
    };
    out[20] = kind;
    out[21] = arg.view.dtype().code();
    out[22] = arg.view.ndims() as u8;
    out[23] = arg.tag.code();
    put_u64(out, 24, arg.buffer.nbytes());
    put_u64(out, 32, a);
    put_u64(out, 40, b);
    put_u64(out, 48, arg.view.byte_offset());
    for (k, &s) in arg.view.shape().iter().enumerate() {
        put_u64(out, 56 + 8 * k, s);
    }
    for (k, &s) in arg.view.strides().iter().enumerate() {
        put_u64(out, 96 + 8 * k, s);
    }
}

/// Decodes and validates one tensor argument.
///
/// # Errors
/// [`TypesError::Malformed`] for any field out of range, a zero generation, a view that
/// leaves its buffer, or non-zero reserved bytes.
pub fn decode_tensor(buf: &[u8; TENSOR_WIRE_BYTES]) -> Result<TensorArg, TypesError> {
    let wrap = |e: TypesError| malformed(format!("tensor descriptor: {e}"));
    let identity = BufferIdentity::new(
        OwnerNonce(get_u64(buf, 0)),
        get_u64(buf, 8),
        get_u32(buf, 16),
    )
    .map_err(wrap)?;
    let dtype = DataType::from_code(buf[21]).map_err(wrap)?;
    let ndims = buf[22] as usize;
    let tag = ArgTag::from_code(buf[23]).map_err(wrap)?;
    let nbytes = get_u64(buf, 24);
    let (a, b) = (get_u64(buf, 32), get_u64(buf, 40));
    let location = match buf[20] {
        LOC_HOST_SHARED => BufferLocation::HostShared {
            region: a,
            offset: b,
        },
        LOC_DEVICE => BufferLocation::Device {
            worker: u32::try_from(a)
                .map_err(|_| malformed(format!("device worker id {a} exceeds u32")))?,
            addr: b,
        },
        LOC_HOST_LOCAL if b == 0 => BufferLocation::HostLocal { addr: a },
        k => return Err(malformed(format!("unknown buffer location kind {k}"))),
    };
    if ndims == 0 || ndims > MAX_DIMS {
        return Err(malformed(format!(
            "tensor rank {ndims} outside 1..={MAX_DIMS}"
        )));
    }
    let mut shape = [0u64; MAX_DIMS];
    let mut strides = [0u64; MAX_DIMS];
    for k in 0..MAX_DIMS {
        shape[k] = get_u64(buf, 56 + 8 * k);
        strides[k] = get_u64(buf, 96 + 8 * k);
        if k >= ndims && (shape[k] != 0 || strides[k] != 0) {
            return Err(malformed(format!("unused axis {k} is not zero")));
        }
    }
    if get_u64(buf, 136) != 0 {
        return Err(malformed("reserved tensor bytes 136..144 are not zero"));
    }
    let view = TensorView::new(dtype, &shape[..ndims], &strides[..ndims], get_u64(buf, 48))
        .map_err(wrap)?;
    // SAFETY: decoding builds a *claimed* descriptor: the runtime that admits a task
    // checks every descriptor it names against the buffers it owns (see `BufferDesc`), and
    // a child only receives descriptors its parent admitted.
    let buffer = unsafe { BufferDesc::from_parts(identity, nbytes, location) };
    TensorArg::new(buffer, view, tag).map_err(wrap)
}

/// Bytes [`encode_args`] writes for `args`.
pub fn args_wire_len(args: &TaskArgs) -> usize {
    ARGS_HEADER_BYTES + args.tensors().len() * TENSOR_WIRE_BYTES + args.scalars().len() * 8
}

/// Encodes `args` into the front of `out`, returning the bytes written.
///
/// ```
/// use strata_types::*;
/// use strata_types::wire::{encode_args, decode_args};
/// // SAFETY: a doc example: the descriptor is never given to a task.
/// let buf = unsafe { BufferDesc::from_parts(IdentityMinter::new().mint(), 64,
///     BufferLocation::HostShared { region: 3, offset: 128 }) };
/// let x = BufferView::new(buf, TensorView::contiguous(DataType::F32, &[4, 4])?)?;
/// let args = TaskArgs::new().inout(&x).scalar(2.0f32);
/// let mut blob = vec![0u8; 4096];
/// let n = encode_args(&args, &mut blob)?;
/// assert_eq!(decode_args(&blob[..n], ArgLimits::HOST)?, args);
/// // A recorded invalid argument is reported before anything is written.
/// let bad = TaskArgs::new().inout(x.slice(0, 2, 6));
/// assert!(encode_args(&bad, &mut blob).unwrap_err().to_string().contains("tensor argument 0"));
/// # Ok::<(), TypesError>(())
/// ```
///
/// # Errors
/// [`TypesError::InvalidArgument`] if a chaining method recorded an invalid argument
/// ([`TaskArgs::check`]); [`TypesError::WireTooSmall`] if `out` cannot hold the encoding.
pub fn encode_args(args: &TaskArgs, out: &mut [u8]) -> Result<usize, TypesError> {
    args.check()?;
    let needed = args_wire_len(args);
    if out.len() < needed {
        return Err(TypesError::WireTooSmall {
            needed,
            capacity: out.len(),
        });
    }
    put_u32(out, 0, args.tensors().len() as u32);
    put_u32(out, 4, args.scalars().len() as u32);
    let mut off = ARGS_HEADER_BYTES;
    for t in args.tensors() {
        let slot: &mut [u8; TENSOR_WIRE_BYTES] = (&mut out[off..off + TENSOR_WIRE_BYTES])
            .try_into()
            .map_err(|_| malformed("slot"))?;
        encode_tensor(t, slot);
        off += TENSOR_WIRE_BYTES;
    }
    for &s in args.scalars() {
        put_u64(out, off, s);
        off += 8;
    }
    Ok(off)
}

/// Decodes and validates an argument blob against `limits`.
///
/// # Errors
/// [`TypesError::Malformed`] if the blob is truncated, has trailing bytes, exceeds the
/// limits, or holds an invalid tensor descriptor.
pub fn decode_args(blob: &[u8], limits: ArgLimits) -> Result<TaskArgs, TypesError> {
    if blob.len() < ARGS_HEADER_BYTES {
        return Err(malformed(format!(
            "argument blob of {} bytes is shorter than its 8-byte header",
            blob.len()
        )));
    }
    let nt = get_u32(blob, 0) as usize;
    let ns = get_u32(blob, 4) as usize;
    if nt > limits.max_tensors || ns > limits.max_scalars {
        return Err(malformed(format!(
            "{nt} tensors / {ns} scalars exceed the limits {} / {}",
            limits.max_tensors, limits.max_scalars
        )));
    }
    let expected = ARGS_HEADER_BYTES + nt * TENSOR_WIRE_BYTES + ns * 8;
    if blob.len() != expected {
        return Err(malformed(format!(
            "argument blob is {} bytes but its header announces {expected}",
            blob.len()
        )));
    }
    let mut args = TaskArgs::with_limits(limits);
    let mut off = ARGS_HEADER_BYTES;
    for i in 0..nt {
        let slot: &[u8; TENSOR_WIRE_BYTES] = blob[off..off + TENSOR_WIRE_BYTES]
            .try_into()
            .map_err(|_| malformed("slot"))?;
        let t = decode_tensor(slot).map_err(|e| malformed(format!("tensor {i}: {e}")))?;
        args.push_tensor(t)?;
        off += TENSOR_WIRE_BYTES;
    }
    for _ in 0..ns {
        args.push_scalar_bits(get_u64(blob, off))?;
        off += 8;
    }
    Ok(args)
}

/// Encodes a [`CallConfig`] into [`CALL_CONFIG_WIRE_BYTES`] bytes.
///
/// Layout: `u32 aicpu_threads @0`, `u32 block_dim @4`, `u8 swimlane @8`,
/// `u8 has_prefix @9`, `u16 prefix_len @10`, `u8 trace @12`, 4 × (`u64 task_window, heap_bytes, dep_pool`)
/// `@16..112`, `u64 timeout_ms @112`, reserved `@120..128`, `prefix[1024] @128`. Every
/// optional field is 0 when `None` (the encoding of the C-style configuration the
/// reference uses); the timeout travels in whole milliseconds, rounded up.
///
/// ```
/// use std::time::Duration;
/// use strata_types::{CallConfig, wire};
/// let c = CallConfig::default()
///     .with_output_prefix("/tmp/out")
///     .with_timeout(Duration::from_millis(5));
/// let mut buf = [0u8; wire::CALL_CONFIG_WIRE_BYTES];
/// wire::encode_config(&c, &mut buf)?;
/// assert_eq!(wire::decode_config(&buf)?, c);
/// # Ok::<(), strata_types::TypesError>(())
/// ```
///
/// # Errors
/// The validation error of `c` ([`CallConfig::validate`]): a value out of range, or a
/// timeout the wire cannot carry. Nothing is written then.
pub fn encode_config(
    c: &CallConfig,
    out: &mut [u8; CALL_CONFIG_WIRE_BYTES],
) -> Result<(), TypesError> {
    c.validate()?;
    let timeout_ms = c.timeout_ms()?;
    out.fill(0);
    put_u32(out, 0, c.aicpu_threads.unwrap_or(0));
    put_u32(out, 4, c.block_dim.unwrap_or(0));
    out[8] = u8::from(c.swimlane);
    out[12] = u8::from(c.trace);
    for (i, r) in c.rings.iter().enumerate() {
        put_u64(out, 16 + 24 * i, r.task_window.unwrap_or(0));
        put_u64(out, 24 + 24 * i, r.heap_bytes.unwrap_or(0));
        put_u64(out, 32 + 24 * i, r.dep_pool.unwrap_or(0));
    }
    put_u64(out, 112, timeout_ms);
    if let Some(p) = &c.output_prefix {
        let bytes = &p.as_bytes()[..p.len().min(OUTPUT_PREFIX_MAX)];
        out[9] = 1;
        out[10..12].copy_from_slice(&(bytes.len() as u16).to_le_bytes());
        out[128..128 + bytes.len()].copy_from_slice(bytes);
    }
    Ok(())
}

/// The timeout of an encoded [`CallConfig`] (`None` for the worker's default), read
/// without decoding the rest (a scheduler reads it for every task it dispatches).
pub fn config_timeout(buf: &[u8; CALL_CONFIG_WIRE_BYTES]) -> Option<Duration> {
    nonzero(get_u64(buf, 112)).map(Duration::from_millis)
}

fn nonzero<T: Default + PartialEq>(v: T) -> Option<T> {
    (v != T::default()).then_some(v)
}

/// Decodes and validates a [`CallConfig`].
///
/// # Errors
/// [`TypesError::Malformed`] for a bad prefix encoding, [`TypesError::InvalidConfig`] for a
/// swimlane byte other than 0 or 1, or the validation error of the decoded config.
pub fn decode_config(buf: &[u8; CALL_CONFIG_WIRE_BYTES]) -> Result<CallConfig, TypesError> {
    let mut rings = [RingOverride::default(); RING_COUNT];
    for (i, r) in rings.iter_mut().enumerate() {
        r.task_window = nonzero(get_u64(buf, 16 + 24 * i));
        r.heap_bytes = nonzero(get_u64(buf, 24 + 24 * i));
        r.dep_pool = nonzero(get_u64(buf, 32 + 24 * i));
    }
    let output_prefix = match buf[9] {
        0 => None,
        1 => {
            let len = u16::from_le_bytes([buf[10], buf[11]]) as usize;
            if len > OUTPUT_PREFIX_MAX {
                return Err(malformed(format!(
                    "output prefix length {len} > {OUTPUT_PREFIX_MAX}"
                )));
            }
            Some(
                std::str::from_utf8(&buf[128..128 + len])
                    .map_err(|e| malformed(format!("output prefix is not UTF-8: {e}")))?
                    .to_owned(),
            )
        }
        f => {
            return Err(malformed(format!(
                "output prefix flag {f} is neither 0 nor 1"
            )))
        }
    };
    let swimlane = match buf[8] {
        0 => false,
        1 => true,
        v => {
            return Err(TypesError::InvalidConfig(format!(
                "swimlane = {v} (use 0 or 1)"
            )))
        }
    };
    let trace = match buf[12] {
        0 => false,
        1 => true,
        v => {
            return Err(TypesError::InvalidConfig(format!(
                "trace = {v} (use 0 or 1)"
            )))
        }
    };
    let c = CallConfig {
        aicpu_threads: nonzero(get_u32(buf, 0)),
        block_dim: nonzero(get_u32(buf, 4)),
        swimlane,
        trace,
        rings,
        timeout: config_timeout(buf),
        output_prefix,
    };
    c.validate()?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CallConfig, IdentityMinter, RingOverride};
    use proptest::prelude::*;

    #[test]
    fn max_blob_matches_reference_capacity() {
        assert_eq!(MAX_ARGS_BLOB_BYTES, 37_896);
    }

    fn sample(loc: BufferLocation) -> TensorArg {
        // SAFETY: a unit test's descriptor, never given to a task.
        let buf = unsafe { BufferDesc::from_parts(IdentityMinter::new().mint(), 1 << 20, loc) };
        let v = TensorView::contiguous(DataType::BF16, &[8, 16, 4]).unwrap();
        TensorArg::new(
            buf,
            v.window(&[1, 2, 0], &[3, 4, 4]).unwrap(),
            ArgTag::OutputExisting,
        )
        .unwrap()
    }

    #[test]
    fn decode_rejects_corruption_with_typed_errors() {
        let t = sample(BufferLocation::Device {
            worker: 3,
            addr: 0x4000,
        });
        let mut b = [0u8; TENSOR_WIRE_BYTES];
        encode_tensor(&t, &mut b);
        assert_eq!(decode_tensor(&b).unwrap(), t);
        let corrupt = |f: &dyn Fn(&mut [u8; TENSOR_WIRE_BYTES])| {
            let mut c = b;
            f(&mut c);
            decode_tensor(&c)
        };
        assert!(corrupt(&|c| c[16..20].fill(0)).is_err()); // generation 0
        assert!(corrupt(&|c| c[20] = 9).is_err()); // location kind
        assert!(corrupt(&|c| c[21] = 99).is_err()); // dtype
        assert!(corrupt(&|c| c[22] = 6).is_err()); // rank
        assert!(corrupt(&|c| c[23] = 7).is_err()); // tag
        assert!(corrupt(&|c| c[24..32].copy_from_slice(&16u64.to_le_bytes())).is_err()); // too small
        assert!(corrupt(&|c| c[96..104].fill(0)).is_err()); // zero stride
        assert!(corrupt(&|c| c[80..88].fill(1)).is_err()); // unused axis 3 nonzero
        assert!(corrupt(&|c| c[136] = 1).is_err()); // reserved
        let mut blob = vec![0u8; 64];
        assert!(decode_args(&blob[..4], ArgLimits::HOST).is_err());
        blob[0] = 200; // 200 tensors announced, 64 bytes present
        assert!(decode_args(&blob, ArgLimits::HOST).is_err());
    }

    #[test]
    fn configs_encode_none_as_zero_and_timeouts_in_rounded_up_milliseconds() {
        let mut buf = [0u8; CALL_CONFIG_WIRE_BYTES];
        encode_config(&CallConfig::default(), &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(decode_config(&buf).unwrap(), CallConfig::default());
        let c = CallConfig::default()
            .with_aicpu_threads(3)
            .with_block_dim(2)
            .with_swimlane(true)
            .with_timeout(Duration::from_micros(1))
            .with_ring(2, RingOverride::default().with_dep_pool(64));
        encode_config(&c, &mut buf).unwrap();
        assert_eq!(get_u32(&buf, 0), 3);
        assert_eq!(buf[8], 1);
        assert_eq!(get_u64(&buf, 112), 1); // 1 µs → 1 ms, never "default"
        assert_eq!(config_timeout(&buf), Some(Duration::from_millis(1)));
        assert_eq!(get_u64(&buf, 16 + 48 + 16), 64);
        let back = decode_config(&buf).unwrap();
        assert_eq!(back.timeout, Some(Duration::from_millis(1)));
        assert_eq!(back.rings[2].dep_pool, Some(64));
        assert_eq!(back.rings[2].task_window, None);
        let too_long = CallConfig::default().with_timeout(Duration::MAX);
        let e = encode_config(&too_long, &mut buf).unwrap_err().to_string();
        assert!(e.contains(&u64::MAX.to_string()), "{e}");
        buf[8] = 9;
        let e = decode_config(&buf).unwrap_err().to_string();
        assert!(e.contains("swimlane = 9"), "{e}");
        buf[8] = 0;
        encode_config(&CallConfig::default().with_trace(true), &mut buf).unwrap();
        assert_eq!(buf[12], 1);
        assert!(decode_config(&buf).unwrap().trace);
        buf[12] = 2;
        let e = decode_config(&buf).unwrap_err().to_string();
        assert!(e.contains("trace = 2"), "{e}");
    }

    proptest! {
        #[test]
        fn args_round_trip(n_t in 0usize..8, scalars in proptest::collection::vec(any::<u64>(), 0..8),
                           region in any::<u64>(), off in 0u64..1024) {
            let mut args = TaskArgs::new();
            for i in 0..n_t {
                let loc = match i % 3 {
                    0 => BufferLocation::HostShared { region, offset: off },
                    1 => BufferLocation::Device { worker: i as u32, addr: off },
                    _ => BufferLocation::HostLocal { addr: region },
                };
                args.push_tensor(sample(loc)).unwrap();
            }
            for s in &scalars { args.push_scalar_bits(*s).unwrap(); }
            let mut blob = vec![0u8; args_wire_len(&args)];
            let n = encode_args(&args, &mut blob).unwrap();
            prop_assert_eq!(n, blob.len());
            prop_assert_eq!(decode_args(&blob, ArgLimits::HOST).unwrap(), args);
        }
    }
}
