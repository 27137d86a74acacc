//! A global allocator that turns an oversized allocation made while a target runs into
//! an abort, so an allocation sized by a foreign length field is a finding rather than
//! a slow run or an out-of-memory kill (libFuzzer's own malloc limit needs a sanitizer
//! runtime, which a stable build does not have).

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Largest single allocation a target may make: 16 MiB, far above anything a valid
/// frame needs (the largest argument blob is 37 896 bytes, a mailbox 192 KiB).
pub const LIMIT: usize = 16 << 20;

static ARMED: AtomicBool = AtomicBool::new(false);

/// The fuzz binaries' allocator: [`System`], checked against [`LIMIT`] while armed.
pub struct GuardedAlloc;

#[global_allocator]
static GLOBAL: GuardedAlloc = GuardedAlloc;

fn check(size: usize) {
    if size > LIMIT && ARMED.load(Ordering::Relaxed) {
        ARMED.store(false, Ordering::Relaxed);
        // No formatting machinery that could allocate: digits by hand.
        let mut digits = [0u8; 20];
        let mut n = size;
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(b"strata-fuzz: allocation of ");
        let _ = err.write_all(&digits[i..]);
        let _ = err.write_all(b" bytes while decoding foreign bytes (limit 16 MiB)\n");
        std::process::abort();
    }
}

// SAFETY: every call is forwarded unchanged to `System`; the check only reads an atomic
// and may abort, which never returns a bad pointer.
unsafe impl GlobalAlloc for GuardedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        // SAFETY: forwarded from the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        check(layout.size());
        // SAFETY: forwarded from the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        check(new_size);
        // SAFETY: forwarded from the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Arms the check for as long as the returned guard lives.
pub fn armed() -> Armed {
    ARMED.store(true, Ordering::Relaxed);
    Armed(())
}

/// Disarms the check on drop (see [`armed`]).
pub struct Armed(());

impl Drop for Armed {
    fn drop(&mut self) {
        ARMED.store(false, Ordering::Relaxed);
    }
}
