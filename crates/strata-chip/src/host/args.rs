//! The arguments of a run as the host gives them ([`RunArgs`]: host slices, resident
//! device tensors, raw host views, scalars) and the small types of the device API
//! ([`CopyOffsets`], [`TensorInit`]).

use crate::device::arena::{as_bytes, as_bytes_mut};
use crate::device::memory::DeviceTensor;
use strata_types::{ArgTag, DataType, Element, Scalar, TensorView};

/// Byte offsets of a host ↔ device copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyOffsets {
    /// Offset added to the device pointer.
    pub device: u64,
    /// Offset into the host slice, in bytes.
    pub host: usize,
}

/// How [`ChipWorker::alloc_tensor`](crate::ChipWorker::alloc_tensor) initialises a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorInit {
    /// Leave the contents undefined.
    Undefined,
    /// Fill with zero bytes.
    Zeros,
    /// Fill with one element value (its raw bits and type).
    Value(DataType, [u8; 8]),
}

impl TensorInit {
    /// Fill with `v` (the tensor's data type must be `T`'s).
    pub fn value<T: Element>(v: T) -> Self {
        let mut b = [0u8; 8];
        b[..std::mem::size_of::<T>()].copy_from_slice(as_bytes(std::slice::from_ref(&v)));
        TensorInit::Value(T::DTYPE, b)
    }
}

pub(super) enum RunArg<'a> {
    HostIn {
        bytes: &'a [u8],
        view: TensorView,
    },
    HostOut {
        bytes: &'a mut [u8],
        view: TensorView,
        inout: bool,
    },
    Device {
        t: DeviceTensor,
        tag: ArgTag,
    },
    /// A host tensor given by a raw pointer and a (possibly strided) view of it: gathered
    /// into staging before the run, scattered back after a successful one.
    HostRaw {
        base: *mut u8,
        view: TensorView,
        tag: ArgTag,
    },
    /// A buffer of the chip's external memory, passed in place.
    External {
        offset: u64,
        size: u64,
        view: TensorView,
        tag: ArgTag,
    },
}

/// The arguments of one run: host tensors (staged into device memory: `IN`/`INOUT` copied
/// in before the run, `OUT`/`INOUT` copied back only if the run succeeded), device
/// tensors and buffers of the chip's external memory (passed in place), then scalars.
///
/// ```
/// use strata_chip::RunArgs;
/// let a = vec![1.0f32; 16];
/// let mut out = vec![0.0f32; 16];
/// let mut args = RunArgs::new();
/// args.input(&a, &[4, 4]).output(&mut out, &[4, 4]).scalar(3u32);
/// assert_eq!(args.len(), 3);
/// ```
#[derive(Default)]
pub struct RunArgs<'a> {
    pub(super) tensors: Vec<RunArg<'a>>,
    pub(super) scalars: Vec<u64>,
    pub(super) error: Option<String>,
}

impl std::fmt::Debug for RunArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunArgs")
            .field("tensors", &self.tensors.len())
            .field("scalars", &self.scalars.len())
            .finish()
    }
}

impl<'a> RunArgs<'a> {
    /// No arguments.
    pub fn new() -> Self {
        RunArgs::default()
    }

    fn fail(&mut self, m: String) {
        if self.error.is_none() {
            self.error = Some(m);
        }
    }

    fn view_for<T: Element>(&mut self, len: usize, shape: &[u64]) -> Option<TensorView> {
        // Zero-size tensors (an axis of length 0) are accepted, as in the reference: they
        // get device address 0 and nothing is copied.
        match TensorView::contiguous_or_empty(T::DTYPE, shape) {
            Ok(v) if v.numel() == len as u64 => Some(v),
            Ok(v) => {
                self.fail(format!(
                    "host tensor {} has {len} elements but shape {shape:?} needs {}",
                    self.tensors.len(),
                    v.numel()
                ));
                None
            }
            Err(e) => {
                self.fail(format!("host tensor {}: {e}", self.tensors.len()));
                None
            }
        }
    }

    fn check_order(&mut self) -> bool {
        if !self.scalars.is_empty() {
            self.fail("tensor arguments must come before scalars".into());
            return false;
        }
        true
    }

    /// A host tensor the orchestration reads (copied to the device before the run).
    pub fn input<T: Element>(&mut self, data: &'a [T], shape: &[u64]) -> &mut Self {
        if self.check_order() {
            if let Some(view) = self.view_for::<T>(data.len(), shape) {
                self.tensors.push(RunArg::HostIn {
                    bytes: as_bytes(data),
                    view,
                });
            }
        }
        self
    }

    /// A host tensor the run writes (copied back after a successful run; its device copy
    /// starts undefined).
    pub fn output<T: Element>(&mut self, data: &'a mut [T], shape: &[u64]) -> &mut Self {
        if self.check_order() {
            if let Some(view) = self.view_for::<T>(data.len(), shape) {
                self.tensors.push(RunArg::HostOut {
                    bytes: as_bytes_mut(data),
                    view,
                    inout: false,
                });
            }
        }
        self
    }

    /// A host tensor the run reads and writes (copied in, and back after success).
    pub fn inout<T: Element>(&mut self, data: &'a mut [T], shape: &[u64]) -> &mut Self {
        if self.check_order() {
            if let Some(view) = self.view_for::<T>(data.len(), shape) {
                self.tensors.push(RunArg::HostOut {
                    bytes: as_bytes_mut(data),
                    view,
                    inout: true,
                });
            }
        }
        self
    }

    /// A tensor resident in device memory, passed in place (never copied). `tag` is its
    /// direction for the signature check (`Input`, `OutputExisting`/`Output`, `InOut`).
    pub fn device(&mut self, t: &DeviceTensor, tag: ArgTag) -> &mut Self {
        if self.check_order() {
            self.tensors.push(RunArg::Device { t: *t, tag });
        }
        self
    }

    /// A host tensor given by the base address of its buffer and a view of that buffer
    /// (strides and byte offset honoured): the view's elements are gathered into device
    /// memory before the run if `tag` reads, and scattered back after a successful run if
    /// `tag` writes. No Rust reference to the buffer is ever formed, so it may be memory
    /// another process maps too (a worker's shared memory).
    ///
    /// # Safety
    /// `base .. base + view.byte_span().1` must stay valid for reads (and, for a writing
    /// tag, for writes) until `run` returns, and nothing else may write the view's bytes
    /// meanwhile.
    pub unsafe fn host_raw(&mut self, base: *mut u8, view: TensorView, tag: ArgTag) -> &mut Self {
        if self.check_order() {
            self.tensors.push(RunArg::HostRaw { base, view, tag });
        }
        self
    }

    /// A buffer of the chip's external memory ([`crate::ExternalMemory`], e.g. a window
    /// buffer of distributed memory): `nbytes` bytes at byte `offset` of it, seen through
    /// `view` (relative to the buffer), passed in place — never staged or copied, since
    /// peers may write it while the run goes on. Its device address is
    /// [`crate::EXTERNAL_BASE`]` + offset`; the run checks that the chip has external memory
    /// and that the buffer lies in it.
    ///
    /// A kernel reaches it through `ctx.shared(i)` (element-wise atomics) or strata-comm's
    /// `ctx.window(i)`, never as a slice (`ctx.input` / `ctx.output` refuse it). Tasks of
    /// the run that name the same external buffer run one at a time, in submit order
    /// (each counts as writing all of it: a kernel may signal through any part of it).
    pub fn external(
        &mut self,
        offset: u64,
        nbytes: u64,
        view: TensorView,
        tag: ArgTag,
    ) -> &mut Self {
        if self.check_order() {
            self.tensors.push(RunArg::External {
                offset,
                size: nbytes,
                view,
                tag,
            });
        }
        self
    }

    /// A scalar.
    pub fn scalar<S: Scalar>(&mut self, v: S) -> &mut Self {
        self.scalars.push(v.to_bits());
        self
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.tensors.len() + self.scalars.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
