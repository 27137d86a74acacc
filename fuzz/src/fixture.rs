//! The live objects the targets decode against, built once per process and the same in
//! every process (so a seed written by `seedgen` names the addresses and regions a fuzz
//! process has): a small initialised chip with a few device allocations, shared memory
//! with a few regions, a sub-worker handler, and a mailbox.

use std::cell::RefCell;
use std::sync::Arc;
use strata_chip::{ChipConfig, ChipWorker, OrchHandle, RingSizing};
use strata_host::{SharedMemory, SubHandler, SubProgram, SubRegistry};
use strata_mailbox::{FrameIdentity, Mailbox};

/// Sizes of the device allocations made at start-up, in order.
pub const DEVICE_ALLOCATIONS: [u64; 3] = [4096, 64, 1 << 16];

/// Sizes of the shared-memory regions (ids 1, 2, 3).
pub const SHARED_REGIONS: [usize; 3] = [4096, 1 << 16, 1];

/// Device memory of the fuzz chip.
pub const DEVICE_MEMORY_BYTES: u64 = 16 << 20;

/// The identity the `mailbox_parent` target publishes (and its seeds carry back).
pub const PARENT_IDENTITY: FrameIdentity = FrameIdentity {
    run_id: 7,
    lease_slot: 0,
    lease_generation: 3,
    dispatch_id: 11,
};

/// A chip and the shared memory its tasks and control commands name.
pub struct ChipFixture {
    /// The chip (initialised; worker id 0).
    pub chip: ChipWorker,
    /// An orchestration that submits nothing: a run of it only stages the arguments in
    /// and out.
    pub noop: OrchHandle,
    /// The shared memory (regions of [`SHARED_REGIONS`]).
    pub shared: Arc<SharedMemory>,
    /// Device addresses of the [`DEVICE_ALLOCATIONS`].
    pub addrs: Vec<u64>,
}

impl ChipFixture {
    /// Builds the fixture.
    pub fn new() -> ChipFixture {
        let config = ChipConfig {
            device_memory_bytes: DEVICE_MEMORY_BYTES,
            rings: [RingSizing {
                task_window: 64,
                heap_bytes: 1 << 20,
                dep_pool: 256,
            }; strata_types::RING_COUNT],
            ..ChipConfig::default()
        };
        let mut chip = ChipWorker::new(config).expect("fuzz chip config");
        let noop = chip
            .register_orchestration_fn("fuzz.noop", |_, _| Ok(()))
            .expect("fuzz orchestration");
        chip.init().expect("fuzz chip init");
        let addrs = DEVICE_ALLOCATIONS
            .iter()
            .map(|&b| chip.malloc(b).expect("fuzz chip allocation").addr())
            .collect();
        let shared = shared_memory();
        ChipFixture {
            chip,
            noop,
            shared,
            addrs,
        }
    }
}

impl Default for ChipFixture {
    fn default() -> Self {
        Self::new()
    }
}

/// Shared memory with the regions of [`SHARED_REGIONS`] (ids 1, 2, 3).
pub fn shared_memory() -> Arc<SharedMemory> {
    let shared = SharedMemory::new();
    for (i, &len) in SHARED_REGIONS.iter().enumerate() {
        let id = shared
            .create_region(len, &format!("fuzz-{i}"))
            .expect("fuzz shared region");
        assert_eq!(id, i as u64 + 1);
    }
    shared
}

/// The name of the one closure the fuzz sub-worker serves.
pub const SUB_CALLABLE_NAME: &str = "fuzz.touch_every_tensor";

/// A sub-worker handler (worker 0) over [`shared_memory`], serving one closure that
/// reads every tensor argument element by element as `u8`, `f32` and `i64`, and
/// increments every byte of each writable one — what a user closure may do with the
/// views the handler built from the parent's argument blob.
pub fn sub_handler() -> SubHandler {
    let mut registry = SubRegistry::new();
    registry.register_fn(SUB_CALLABLE_NAME, |call| {
        let mut sum = 0u64;
        for i in 0..call.num_tensors() {
            if let Ok(mut t) = call.tensor_mut::<u8>(i) {
                t.update(|x| x.wrapping_add(1));
            }
            if let Ok(t) = call.tensor::<u8>(i) {
                sum = t.iter().fold(sum, |s, x| s.wrapping_add(u64::from(x)));
            }
            if let Ok(t) = call.tensor::<f32>(i) {
                sum = t
                    .iter()
                    .fold(sum, |s, x| s.wrapping_add(x.to_bits().into()));
            }
            if let Ok(t) = call.tensor::<i64>(i) {
                sum = t.iter().fold(sum, |s, x| s.wrapping_add(x as u64));
            }
        }
        std::hint::black_box(sum);
        Ok(())
    });
    SubProgram::new(registry).handler(shared_memory(), 0)
}

thread_local! {
    static SUB: RefCell<Option<SubHandler>> = const { RefCell::new(None) };
    static CHIP: RefCell<Option<ChipFixture>> = const { RefCell::new(None) };
    static MAILBOX: RefCell<Option<Mailbox>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's chip fixture (built on first use). `f` returns whether
/// the fixture is still as built; if not, it is rebuilt before the next use.
pub fn with_chip<R>(f: impl FnOnce(&mut ChipFixture) -> (R, bool)) -> R {
    CHIP.with(|c| {
        let mut slot = c.borrow_mut();
        let fixture = slot.get_or_insert_with(ChipFixture::new);
        let (r, intact) = f(fixture);
        if !intact {
            *slot = None;
        }
        r
    })
}

/// Runs `f` with this thread's sub-worker handler (built on first use).
pub fn with_sub<R>(f: impl FnOnce(&mut SubHandler) -> R) -> R {
    SUB.with(|c| f(c.borrow_mut().get_or_insert_with(sub_handler)))
}

/// Runs `f` with this thread's mailbox (created on first use), every frame cleared
/// (descriptors kept) before and after.
pub fn with_mailbox<R>(f: impl FnOnce(Mailbox) -> (R, Mailbox)) -> R {
    MAILBOX.with(|m| {
        let mb = m
            .borrow_mut()
            .take()
            .unwrap_or_else(|| Mailbox::create().expect("fuzz mailbox"));
        clear_all(&mb);
        let (r, mb) = f(mb);
        clear_all(&mb);
        *m.borrow_mut() = Some(mb);
        r
    })
}

/// The address of frame `index` (0 control, 1 and 2 tasks) of `mb`.
pub fn frame_ptr(mb: &Mailbox, index: usize) -> *mut u8 {
    // SAFETY: a mailbox region is at least MAILBOX_BYTES = 3 frames long.
    unsafe {
        mb.region()
            .as_ptr()
            .add(index * strata_mailbox::layout::FRAME_BYTES)
    }
}

fn clear_all(mb: &Mailbox) {
    for i in 0..strata_mailbox::layout::FRAME_COUNT {
        // SAFETY: the frame is mapped; only this thread uses the fuzz mailbox.
        unsafe { crate::image::clear(frame_ptr(mb, i)) };
    }
}
