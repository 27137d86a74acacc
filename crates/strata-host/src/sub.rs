//! Host sub-workers: registered closures, found in children by digest.

use crate::children::{panic_message, ChildEnv, ChildProgram};
use crate::error::HostError;
use crate::shm::SharedMemory;
use std::cell::Cell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use strata_mailbox::{FailureReport, Handler, TaskRequest};
use strata_types::{
    error_chain, ArgTag, BufferLocation, CallConfig, CallableDescriptor, CallableId, CallableKind,
    CallbackResult, DataType, Element, Scalar, TaskArgs, TensorMut, TensorRef, TensorView,
    ViewLender, ViewLoan,
};

/// A host sub-worker callable: a closure that gets the task's arguments.
///
/// It runs inside a child (process or thread). Whatever it captured — a `Vec`, an
/// `Arc<AtomicU64>`, constants — is in the child's copy of memory (inherited by `fork`,
/// shared by a thread); nothing is serialized. In process mode, state the closure
/// changes stays in that child (each sub-worker process has its own copy).
///
/// Its error (any error, boxed) fails the task; it crosses the process boundary as its
/// message and the messages of its `source()` chain ([`strata_types::error_chain`]).
pub type SubFn = Arc<dyn Fn(&mut SubCall<'_>) -> CallbackResult + Send + Sync>;

/// Error codes of sub-worker task failures (positive, as `strata_mailbox::codes`
/// recommends).
pub mod sub_codes {
    /// The closure returned an error.
    pub const FAILED: i32 = 1;
    /// The closure panicked.
    pub const PANICKED: i32 = 2;
    /// No closure is registered under the task's digest.
    pub const NOT_REGISTERED: i32 = 3;
    /// A tensor argument the sub-worker cannot map (not in shared memory, out of its
    /// region).
    pub const BAD_ARGUMENT: i32 = 4;
}

#[derive(Clone)]
struct SubEntry {
    name: String,
    f: SubFn,
}

/// The table of sub-worker callables, keyed by digest.
///
/// Register everything **before** the children start: the registry is captured by
/// [`SubProgram`] and inherited by forked children (shared by thread children); a
/// registration made later is not seen by running children. Cloning is cheap (the
/// closures are shared).
///
/// A callable's id is the SHA-256 digest of the descriptor `(SubWorker, name,
/// version 1, no signature)`, so the same name gives the same id in every process.
///
/// ```
/// use strata_host::SubRegistry;
/// let mut reg = SubRegistry::new();
/// let scale = 3.0f32;
/// let id = reg.register_fn("scale", move |call| {
///     let mut out = call.tensor_mut::<f32>(0)?;
///     out.update(|x| x * scale);
///     Ok(())
/// });
/// assert_eq!(id, SubRegistry::id_of("scale"));
/// assert_eq!(reg.get(&id).map(|(name, _)| name), Some("scale"));
/// assert!(reg.try_register_fn("scale", |_| Ok(())).is_err());
/// ```
#[derive(Clone, Default)]
pub struct SubRegistry {
    entries: HashMap<CallableId, SubEntry>,
}

impl std::fmt::Debug for SubRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&str> = self.entries.values().map(|e| e.name.as_str()).collect();
        names.sort_unstable();
        f.debug_struct("SubRegistry")
            .field("names", &names)
            .finish()
    }
}

impl SubRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds every callable of `other` this registry lacks (a parent worker's registrations
    /// cascading into a child's); a name registered in both keeps this registry's closure.
    pub fn absorb(&mut self, other: &SubRegistry) {
        for (id, e) in &other.entries {
            self.entries.entry(*id).or_insert_with(|| e.clone());
        }
    }

    /// The descriptor a name is registered under.
    pub fn descriptor(name: &str) -> CallableDescriptor {
        CallableDescriptor::new(CallableKind::SubWorker, name)
    }

    /// The id a name is registered under.
    pub fn id_of(name: &str) -> CallableId {
        Self::descriptor(name).digest()
    }

    /// Registers `f` under `name` and returns its id. Registering a name again replaces
    /// the closure (same id); use [`SubRegistry::try_register`] to refuse that.
    pub fn register(&mut self, name: &str, f: SubFn) -> CallableId {
        let id = Self::id_of(name);
        self.entries.insert(
            id,
            SubEntry {
                name: name.to_owned(),
                f,
            },
        );
        id
    }

    /// [`SubRegistry::register`] for a plain closure.
    pub fn register_fn<F>(&mut self, name: &str, f: F) -> CallableId
    where
        F: Fn(&mut SubCall<'_>) -> CallbackResult + Send + Sync + 'static,
    {
        self.register(name, Arc::new(f))
    }

    /// Registers `f` under `name` unless the name is taken.
    ///
    /// # Errors
    /// [`HostError::DuplicateCallable`].
    pub fn try_register(&mut self, name: &str, f: SubFn) -> Result<CallableId, HostError> {
        let id = Self::id_of(name);
        if self.entries.contains_key(&id) {
            return Err(HostError::DuplicateCallable {
                name: name.to_owned(),
                id,
            });
        }
        Ok(self.register(name, f))
    }

    /// [`SubRegistry::try_register`] for a plain closure.
    ///
    /// # Errors
    /// [`HostError::DuplicateCallable`].
    pub fn try_register_fn<F>(&mut self, name: &str, f: F) -> Result<CallableId, HostError>
    where
        F: Fn(&mut SubCall<'_>) -> CallbackResult + Send + Sync + 'static,
    {
        self.try_register(name, Arc::new(f))
    }

    /// The name and closure registered under `id`.
    pub fn get(&self, id: &CallableId) -> Option<(&str, &SubFn)> {
        self.entries.get(id).map(|e| (e.name.as_str(), &e.f))
    }

    /// Whether `id` is registered.
    pub fn contains(&self, id: &CallableId) -> bool {
        self.entries.contains_key(id)
    }

    /// The registered ids.
    pub fn ids(&self) -> impl Iterator<Item = CallableId> + '_ {
        self.entries.keys().copied()
    }

    /// How many callables are registered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Whether elements of `tensor` may be accessed as `T` (same type; `u8` also reads
/// `bool` tensors, whose bytes are 0 or 1).
pub(crate) fn dtype_compatible<T: Element>(tensor: DataType) -> bool {
    T::DTYPE == tensor || (tensor == DataType::Bool && T::DTYPE == DataType::U8)
}

/// The borrow state of one argument within a call: 0 free, `n > 0` shared by `n` views,
/// -1 borrowed mutably. A view releases its borrow on drop ([`ViewLender`]).
#[derive(Debug, Default)]
struct ArgBorrow(Cell<i32>);

/// The token of a shared view; an exclusive one releases with [`EXCLUSIVE`].
const SHARED: u64 = 0;
const EXCLUSIVE: u64 = 1;

impl ViewLender for ArgBorrow {
    fn release(&self, token: u64) {
        match token {
            SHARED => self.0.set(self.0.get() - 1),
            _ => self.0.set(0),
        }
    }
}

/// One tensor argument mapped into this process.
#[derive(Debug, Clone, Copy)]
struct Mapped {
    /// Address of the buffer's first byte (a `usize` so the handler stays `Send`).
    base: usize,
    view: TensorView,
    tag: ArgTag,
    region: u64,
    /// Bytes of the region the view may touch, `[start, end)`.
    span: (u64, u64),
}

impl Mapped {
    fn overlaps(&self, other: &Mapped) -> bool {
        self.region == other.region && self.span.0 < other.span.1 && other.span.0 < self.span.1
    }
}

/// What a sub-worker closure sees: the task's arguments, with typed zero-copy access to
/// its tensor arguments in shared memory.
///
/// The views ([`strata_types::TensorRef`], [`strata_types::TensorMut`]) reach bytes in
/// shared memory that other processes of the worker tree can also reach. Two rules keep
/// every access race-free:
///
/// * **Between tasks, the engine orders conflicting accesses.** A task that writes a
///   tensor (OUTPUT, OUTPUT_EXISTING, INOUT) does not run while an earlier task that reads
///   or writes overlapping bytes is still running, and vice versa. Arguments tagged NO_DEP
///   are not tracked, so the safe [`SubCall::tensor`] refuses them; only the `unsafe`
///   [`SubCall::tensor_untracked`] reads one, and ordering it is then the caller's
///   responsibility. The host's own copies ([`crate::SharedTensor::to_vec`], `write`)
///   refuse with [`HostError::Busy`] while a task that names the tensor is in flight.
/// * **Within one task, the call checks borrows.** [`SubCall::tensor_mut`] is refused
///   while any argument whose bytes overlap it is borrowed, [`SubCall::tensor`] while an
///   overlapping argument is borrowed mutably (the check compares byte spans, so two
///   interleaved but disjoint strided views count as overlapping; take them one after the
///   other); a view releases its borrow when it drops. Views of non-overlapping arguments
///   can be held at the same time:
///
/// ```
/// use strata_host::SubRegistry;
/// let mut reg = SubRegistry::new();
/// // out = alpha * a + b, over three tensor arguments and one scalar.
/// reg.register_fn("axpy", |call| {
///     let alpha: f32 = call.scalar(0).ok_or("axpy needs alpha")?;
///     let a = call.tensor::<f32>(0)?;
///     let b = call.tensor::<f32>(1)?;
///     let mut out = call.tensor_mut::<f32>(2)?;
///     let values: Vec<f32> = a.iter().zip(b.iter()).map(|(x, y)| alpha * x + y).collect();
///     out.copy_from_slice(&values)?;
///     Ok(())
/// });
/// ```
pub struct SubCall<'a> {
    args: &'a TaskArgs,
    config: &'a CallConfig,
    tensors: &'a [Mapped],
    borrows: &'a [ArgBorrow],
    worker: usize,
    name: &'a str,
}

impl std::fmt::Debug for SubCall<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubCall")
            .field("callable", &self.name)
            .field("worker", &self.worker)
            .field("args", self.args)
            .finish()
    }
}

impl SubCall<'_> {
    /// The task's arguments as sent (tensor descriptors and raw scalars).
    pub fn args(&self) -> &TaskArgs {
        self.args
    }

    /// The call configuration.
    pub fn config(&self) -> &CallConfig {
        self.config
    }

    /// Scalar `i` as `S`, if present.
    pub fn scalar<S: Scalar>(&self, i: usize) -> Option<S> {
        self.args.scalar_at(i)
    }

    /// Number of tensor arguments.
    pub fn num_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// The tag of tensor argument `i`.
    pub fn tag(&self, i: usize) -> Option<ArgTag> {
        self.tensors.get(i).map(|m| m.tag)
    }

    /// The index of the sub-worker running the call.
    pub fn worker_index(&self) -> usize {
        self.worker
    }

    /// The name the callable was registered under.
    pub fn callable_name(&self) -> &str {
        self.name
    }

    fn mapped<T: Element>(&self, i: usize) -> Result<&Mapped, String> {
        let m = self.tensors.get(i).ok_or_else(|| {
            format!(
                "tensor argument {i} does not exist (the task has {} tensor argument(s))",
                self.tensors.len()
            )
        })?;
        if !dtype_compatible::<T>(m.view.dtype()) {
            return Err(format!(
                "tensor argument {i} holds {} elements, not {}",
                m.view.dtype(),
                T::DTYPE
            ));
        }
        let first = m.base as u64 + m.view.byte_offset();
        if first % std::mem::align_of::<T>() as u64 != 0 {
            return Err(format!(
                "tensor argument {i} starts at a byte offset not aligned for {} (buffer offset + view offset must be a multiple of {})",
                T::DTYPE,
                std::mem::align_of::<T>()
            ));
        }
        Ok(m)
    }

    /// A read view of tensor argument `i`, typed as `T`: any tag the engine orders
    /// (INPUT, OUTPUT, INOUT, OUTPUT_EXISTING). A NO_DEP argument is refused: the engine
    /// does not order other tasks against it, so a safe slice over it could race with a
    /// concurrent writer; reach it with the `unsafe` [`SubCall::tensor_untracked`].
    ///
    /// # Errors
    /// A message if the argument does not exist, is NO_DEP, holds another element type,
    /// is misaligned for `T`, or overlaps an argument currently borrowed mutably.
    pub fn tensor<T: Element>(&self, i: usize) -> Result<TensorRef<'_, T>, String> {
        let m = self.mapped::<T>(i)?;
        if m.tag == ArgTag::NoDep {
            return Err(format!(
                "tensor argument {i} is tagged NO_DEP (untracked): the engine does not order other tasks against it; only the unsafe call.tensor_untracked({i}) reaches it"
            ));
        }
        self.shared_view(i, m)
    }

    /// A read view of a NO_DEP (untracked) argument `i`, typed as `T`.
    ///
    /// # Safety
    /// The engine does not order other tasks against a NO_DEP argument. The caller must
    /// guarantee (through other arguments that are tracked, or by construction of the
    /// program) that no other task writes these bytes while the returned view lives.
    /// Within this call the borrow check still applies.
    ///
    /// # Errors
    /// As [`SubCall::tensor`], but the argument must be NO_DEP (a tracked one is reached
    /// with the safe accessors).
    pub unsafe fn tensor_untracked<T: Element>(
        &self,
        i: usize,
    ) -> Result<TensorRef<'_, T>, String> {
        let m = self.mapped::<T>(i)?;
        if m.tag != ArgTag::NoDep {
            return Err(format!(
                "tensor argument {i} is tagged {} (tracked): use call.tensor({i}) or call.tensor_mut({i})",
                m.tag
            ));
        }
        self.shared_view(i, m)
    }

    fn shared_view<T: Element>(&self, i: usize, m: &Mapped) -> Result<TensorRef<'_, T>, String> {
        for (j, other) in self.tensors.iter().enumerate() {
            if self.borrows[j].0.get() < 0 && m.overlaps(other) {
                return Err(format!(
                    "tensor argument {i} overlaps tensor argument {j}, which is borrowed mutably; drop that TensorMut first"
                ));
            }
        }
        let cell = &self.borrows[i];
        cell.0.set(cell.0.get() + 1);
        // SAFETY: the view lies inside the buffer, which lies inside its mapped region
        // (both checked when the call was built); the start is aligned for T and T has
        // the view's element size (checked by `mapped`); no overlapping argument is
        // borrowed mutably, and the shared count now registered keeps it so until the
        // view drops. Other tasks are excluded by the engine's ordering of tracked
        // arguments (`tensor`) or by the caller's promise (`tensor_untracked`).
        Ok(unsafe {
            TensorRef::new(
                m.base as *const u8,
                m.view,
                Some(ViewLoan::new(cell, SHARED)),
            )
        })
    }

    /// A mutable view of tensor argument `i`, typed as `T`. Only OUTPUT, INOUT and
    /// OUTPUT_EXISTING arguments can be written: those are the ones the engine orders
    /// against other tasks as writers.
    ///
    /// Takes `&self` (not `&mut self`) so that views of different, non-overlapping
    /// arguments can be held together; exclusivity is checked at run time.
    ///
    /// # Errors
    /// As [`SubCall::tensor`], plus: the argument is tagged INPUT or NO_DEP, or an
    /// overlapping argument (or this one) is borrowed.
    pub fn tensor_mut<T: Element>(&self, i: usize) -> Result<TensorMut<'_, T>, String> {
        let m = self.mapped::<T>(i)?;
        if !m.tag.writes() {
            return Err(format!(
                "tensor argument {i} is tagged {}; only OUTPUT, INOUT and OUTPUT_EXISTING arguments can be written (tag it so, and the engine orders the write)",
                m.tag
            ));
        }
        for (j, other) in self.tensors.iter().enumerate() {
            if self.borrows[j].0.get() != 0 && m.overlaps(other) {
                return Err(if j == i {
                    format!("tensor argument {i} is borrowed already; drop that view first")
                } else {
                    format!(
                        "tensor argument {i} overlaps tensor argument {j}, which is borrowed; drop that view first"
                    )
                });
            }
        }
        let cell = &self.borrows[i];
        cell.0.set(-1);
        // SAFETY: as in `tensor`; in addition no overlapping argument (including this
        // one) is borrowed at all, and the exclusive mark keeps it so until the view
        // drops.
        Ok(unsafe {
            TensorMut::new(
                m.base as *mut u8,
                m.view,
                Some(ViewLoan::new(cell, EXCLUSIVE)),
            )
        })
    }
}

/// The sub-worker child program: serves a [`SubRegistry`].
///
/// For each task it resolves the digest (unknown → failure `"sub_worker N: callable
/// sha256:… not registered"`), maps every tensor argument through the worker's
/// [`SharedMemory`] (a host-local or device buffer is a failure that says to use a
/// `SharedTensor`), and runs the closure under `catch_unwind`: an error becomes the
/// failure `"sub_worker N: name: message"` ([`sub_codes::FAILED`], the message with its
/// source chain, [`strata_types::error_chain`]), a panic `"sub_worker N: name: panicked:
/// msg"` ([`sub_codes::PANICKED`]); the child keeps serving either way.
#[derive(Debug, Clone)]
pub struct SubProgram {
    registry: SubRegistry,
    index: Option<usize>,
}

impl SubProgram {
    /// A sub-worker serving `registry`. Its number `N` (in its label and messages) is
    /// its lane index unless set with [`SubProgram::with_index`].
    pub fn new(registry: SubRegistry) -> Self {
        SubProgram {
            registry,
            index: None,
        }
    }

    /// Sets the sub-worker's number (its label becomes `"sub_worker N"`).
    pub fn with_index(mut self, index: usize) -> Self {
        self.index = Some(index);
        self
    }

    /// The registry it serves.
    pub fn registry(&self) -> &SubRegistry {
        &self.registry
    }

    /// The handler, for running a sub-worker on a mailbox outside
    /// `Children::spawn`.
    pub fn handler(self, shared: Arc<SharedMemory>, worker: usize) -> SubHandler {
        SubHandler {
            registry: self.registry,
            shared,
            worker: self.index.unwrap_or(worker),
            mapped: Vec::new(),
            borrows: Vec::new(),
        }
    }
}

impl ChildProgram for SubProgram {
    fn label(&self) -> String {
        match self.index {
            Some(i) => format!("sub_worker {i}"),
            None => "sub_worker".to_owned(),
        }
    }

    fn start(self: Box<Self>, env: &ChildEnv) -> Result<Box<dyn Handler + Send>, String> {
        Ok(Box::new(self.handler(env.shared.clone(), env.index)))
    }
}

/// The mailbox handler of a sub-worker (see [`SubProgram`]).
pub struct SubHandler {
    registry: SubRegistry,
    shared: Arc<SharedMemory>,
    worker: usize,
    mapped: Vec<Mapped>,
    borrows: Vec<ArgBorrow>,
}

impl std::fmt::Debug for SubHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubHandler")
            .field("worker", &self.worker)
            .field("registry", &self.registry)
            .finish()
    }
}

impl SubHandler {
    fn fail(&self, code: i32, message: impl std::fmt::Display) -> FailureReport {
        FailureReport::new(code, format!("sub_worker {}: {message}", self.worker))
    }
}

impl Handler for SubHandler {
    fn task(&mut self, req: &TaskRequest<'_>) -> Result<(), FailureReport> {
        let Some((name, f)) = self.registry.get(&req.callable) else {
            return Err(self.fail(
                sub_codes::NOT_REGISTERED,
                format!("callable {} not registered", req.callable),
            ));
        };
        self.mapped.clear();
        for (i, t) in req.args.tensors().iter().enumerate() {
            let (region, offset) = match t.buffer.location() {
                BufferLocation::HostShared { region, offset } => (region, offset),
                other => {
                    return Err(FailureReport::new(
                        sub_codes::BAD_ARGUMENT,
                        format!(
                            "sub_worker {}: {name}: tensor argument {i} is a {} buffer, which a sub worker cannot see; pass a SharedTensor (allocated before init) instead",
                            self.worker,
                            other.kind_name()
                        ),
                    ))
                }
            };
            let bad = |e: &dyn std::fmt::Display| {
                FailureReport::new(
                    sub_codes::BAD_ARGUMENT,
                    format!(
                        "sub_worker {}: {name}: tensor argument {i}: {e}",
                        self.worker
                    ),
                )
            };
            let base = self
                .shared
                .ptr(region, offset, t.buffer.nbytes())
                .map_err(|e| bad(&e))?;
            t.view.check_fits(t.buffer.nbytes()).map_err(|e| bad(&e))?;
            let (start, end) = t.view.byte_span();
            self.mapped.push(Mapped {
                base: base as usize,
                view: t.view,
                tag: t.tag,
                region,
                span: (offset + start, offset + end),
            });
        }
        self.borrows.clear();
        self.borrows
            .resize_with(self.mapped.len(), ArgBorrow::default);
        let mut call = SubCall {
            args: req.args,
            config: req.config,
            tensors: &self.mapped,
            borrows: &self.borrows,
            worker: self.worker,
            name,
        };
        match catch_unwind(AssertUnwindSafe(|| f(&mut call))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => {
                Err(self.fail(sub_codes::FAILED, format!("{name}: {}", error_chain(&*e))))
            }
            Err(payload) => Err(self.fail(
                sub_codes::PANICKED,
                format!("{name}: panicked: {}", panic_message(&*payload)),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_ids_are_stable_and_duplicates_are_explicit() {
        let mut reg = SubRegistry::new();
        assert!(reg.is_empty());
        let a = reg.register_fn("a", |_| Ok(()));
        assert_eq!(a, SubRegistry::id_of("a"));
        assert_eq!(SubRegistry::descriptor("a").kind(), CallableKind::SubWorker);
        assert_ne!(a, SubRegistry::id_of("b"));
        // Replacing keeps the id; try_register refuses.
        assert_eq!(reg.register_fn("a", |_| Err("second".into())), a);
        assert_eq!(reg.len(), 1);
        match reg.try_register_fn("a", |_| Ok(())) {
            Err(HostError::DuplicateCallable { name, id }) => {
                assert_eq!((name.as_str(), id), ("a", a));
            }
            other => panic!("expected DuplicateCallable, got {other:?}"),
        }
        let b = reg.try_register_fn("b", |_| Ok(())).unwrap();
        assert!(reg.contains(&b) && reg.ids().count() == 2);
        assert_eq!(format!("{reg:?}"), r#"SubRegistry { names: ["a", "b"] }"#);
        assert!(dtype_compatible::<u8>(DataType::Bool));
        assert!(!dtype_compatible::<i8>(DataType::Bool));
        let program = SubProgram::new(reg.clone());
        assert_eq!(program.label(), "sub_worker");
        assert_eq!(program.clone().with_index(3).label(), "sub_worker 3");
        assert_eq!(program.registry().len(), 2);
    }
}
