//! The `#[repr(C)]` byte layout of a mailbox (the ABI). See `docs/mailbox.md`.
//!
//! A mailbox is [`MAILBOX_BYTES`] = 3 × 64 KiB of `MAP_SHARED` memory holding three
//! [`Frame`]s: frame 0 is the control frame (startup, control commands, shutdown),
//! frames 1 and 2 are the task frames of pipeline lease slots 0 and 1. Every frame has
//! the same layout; fields that only one kind of frame uses are written 0 in the other.
//!
//! The first cache line of a frame holds everything a task round trip touches besides
//! the digest and a small argument blob: the state word, its waiter count, the error
//! code, the accepted and disposition words, the identity (the reference's "identity
//! trailer", moved forward so the state hand-off carries it) and, in the control frame,
//! the sticky shutdown word. The second line holds the argument length, the digest and
//! the first 24 bytes of the argument blob.
//!
//! Every word is an atomic (so reading one the peer is writing is never a data race);
//! the byte areas are `UnsafeCell`s accessed only by copying, under the protocol's
//! ownership rule (the parent writes a task frame's payload only while the frame is
//! IDLE; the child only while it owns the frame). All fields are little-endian native
//! (the mailbox never crosses hosts).

use crate::state::FrameIdentity;
use crate::wait::WaitWord;
use std::cell::UnsafeCell;
use std::mem::{align_of, offset_of, size_of};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use strata_types::wire::{CALL_CONFIG_WIRE_BYTES, MAX_ARGS_BLOB_BYTES};
use strata_types::WAIT_FOR_MAX_BYTES;

/// Bytes of one frame: 64 KiB.
pub const FRAME_BYTES: usize = 65_536;
/// Frames per mailbox: control, task slot 0, task slot 1.
pub const FRAME_COUNT: usize = 3;
/// Bytes of one mailbox: 196 608.
pub const MAILBOX_BYTES: usize = FRAME_COUNT * FRAME_BYTES;
/// Bytes of a callable digest.
pub const DIGEST_BYTES: usize = 32;
/// Offset of the digest in a frame.
pub const DIGEST_OFFSET: usize = 72;
/// Offset of the argument blob (control frame: the payload area) in a frame.
pub const ARGS_OFFSET: usize = 104;
/// Offset of the control fields (command, arg0, result, reply length) in a frame.
pub const CONTROL_FIELDS_OFFSET: usize = 64_000;
/// Capacity of the argument blob (and of the control payload area): 63 896 bytes.
pub const ARGS_CAPACITY: usize = CONTROL_FIELDS_OFFSET - ARGS_OFFSET;
/// Where a failed task's wait-for state goes in the argument area: its last
/// [`WAIT_FOR_MAX_BYTES`] bytes, past the longest blob the wire encodes (37 896 bytes), so
/// the blob is never touched (a child that finds a longer one sends no state).
pub const WAIT_FOR_OFFSET: usize = ARGS_CAPACITY - WAIT_FOR_MAX_BYTES;

/// Capacity of the control frame's payload area (request and reply).
pub const CONTROL_PAYLOAD_CAPACITY: usize = ARGS_CAPACITY;
/// Offset of the frame descriptor (magic, ABI version, index, creator pid).
pub const DESCRIPTOR_OFFSET: usize = 64_032;
/// Offset of the encoded `CallConfig`.
pub const CONFIG_OFFSET: usize = 64_128;
/// Bytes of the encoded `CallConfig`.
pub const CONFIG_BYTES: usize = CALL_CONFIG_WIRE_BYTES;
/// Offset of the error message.
pub const MESSAGE_OFFSET: usize = 65_280;
/// Bytes of the error-message region (NUL-terminated, so at most 255 bytes of text).
pub const MESSAGE_BYTES: usize = 256;
/// Longest error message, in bytes, before the terminating NUL.
pub const MESSAGE_MAX_LEN: usize = MESSAGE_BYTES - 1;
/// The magic in every frame's descriptor: `"STRATAMB"` little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"STRATAMB");
/// Version of this byte layout; [`crate::Mailbox::from_region`] refuses any other.
pub const ABI_VERSION: u32 = 1;
/// Version of the task protocol, stamped in every published task frame.
pub const PROTOCOL_VERSION: u32 = 1;

/// One 64 KiB frame. See the module docs and `docs/mailbox.md` for the byte map.
#[repr(C)]
pub struct Frame {
    /// `@0` The state word ([`crate::MailboxState`]). The futex word.
    pub state: AtomicU32,
    /// `@4` Number of processes parked on `state` (see the wait protocol).
    pub waiters: AtomicU32,
    /// `@8` Error code of the last completion (0 = success).
    pub error_code: AtomicI32,
    /// `@12` Sticky launch-accepted word: 1 once the child crossed the launch point.
    pub accepted: AtomicU32,
    /// `@16` Preparation disposition ([`crate::PrepareDisposition`]).
    pub disposition: AtomicU32,
    /// `@20` Protocol version of the published task ([`PROTOCOL_VERSION`]).
    pub protocol: AtomicU32,
    /// `@24` Identity: lease slot id.
    pub lease_slot: AtomicU32,
    /// `@28` Epoch of the `config` bytes (bumped by the parent whenever it rewrites them).
    pub config_epoch: AtomicU32,
    /// `@32` Sticky shutdown word (control frame): 0 → 1, never cleared.
    pub shutdown: AtomicU32,
    /// `@36` Reserved, 0.
    pub reserved0: AtomicU32,
    /// `@40` Identity: run id.
    pub run_id: AtomicU64,
    /// `@48` Identity: lease generation.
    pub lease_generation: AtomicU64,
    /// `@56` Identity: dispatch id.
    pub dispatch_id: AtomicU64,
    /// `@64` Length of the argument blob (control frame: of the request payload).
    pub args_len: AtomicU32,
    /// `@68` Task frame: bytes of a failed completion's wait-for state (0 = none), at
    /// [`WAIT_FOR_OFFSET`] of the argument area, written by the child with the failure;
    /// control frame: 0.
    pub wait_for_len: AtomicU32,
    /// `@72` Callable digest (SHA-256 of the callable descriptor).
    pub digest: UnsafeCell<[u8; DIGEST_BYTES]>,
    /// `@104` Argument blob (`strata_types::wire` encoding); control frame: payload area.
    pub args: UnsafeCell<[u8; ARGS_CAPACITY]>,
    /// `@64000` Control sub-command.
    pub command: AtomicU64,
    /// `@64008` Control argument.
    pub arg0: AtomicU64,
    /// `@64016` Control result (startup: the child's `INIT_READY` info word).
    pub result: AtomicU64,
    /// `@64024` Length of the control reply in the payload area.
    pub reply_len: AtomicU32,
    /// `@64028` Reserved, 0.
    pub reserved2: AtomicU32,
    /// `@64032` [`MAGIC`], written when the mailbox is created.
    pub magic: AtomicU64,
    /// `@64040` [`ABI_VERSION`].
    pub abi_version: AtomicU32,
    /// `@64044` This frame's index (0, 1, 2).
    pub frame_index: AtomicU32,
    /// `@64048` Pid of the process that created the mailbox.
    pub creator_pid: AtomicU32,
    /// `@64052` Reserved, 0.
    pub reserved3: UnsafeCell<[u8; 76]>,
    /// `@64128` Encoded `CallConfig` (`strata_types::wire::encode_config`).
    pub config: UnsafeCell<[u8; CONFIG_BYTES]>,
    /// `@65280` NUL-terminated UTF-8 error message.
    pub message: UnsafeCell<[u8; MESSAGE_BYTES]>,
}

/// The whole mailbox: control frame, task slot 0, task slot 1.
#[repr(C)]
pub struct MailboxLayout {
    /// The frames, in [`crate::FrameId::index`] order.
    pub frames: [Frame; FRAME_COUNT],
}

// ---- The ABI, checked at compile time. Keep in sync with docs/mailbox.md. ----
const _: () = assert!(offset_of!(Frame, state) == 0);
const _: () = assert!(offset_of!(Frame, waiters) == 4);
const _: () = assert!(offset_of!(Frame, error_code) == 8);
const _: () = assert!(offset_of!(Frame, accepted) == 12);
const _: () = assert!(offset_of!(Frame, disposition) == 16);
const _: () = assert!(offset_of!(Frame, protocol) == 20);
const _: () = assert!(offset_of!(Frame, lease_slot) == 24);
const _: () = assert!(offset_of!(Frame, config_epoch) == 28);
const _: () = assert!(offset_of!(Frame, shutdown) == 32);
const _: () = assert!(offset_of!(Frame, reserved0) == 36);
const _: () = assert!(offset_of!(Frame, run_id) == 40);
const _: () = assert!(offset_of!(Frame, lease_generation) == 48);
const _: () = assert!(offset_of!(Frame, dispatch_id) == 56);
const _: () = assert!(offset_of!(Frame, args_len) == 64);
const _: () = assert!(offset_of!(Frame, wait_for_len) == 68);
const _: () = assert!(offset_of!(Frame, digest) == DIGEST_OFFSET && DIGEST_OFFSET == 72);
const _: () = assert!(offset_of!(Frame, args) == ARGS_OFFSET && ARGS_OFFSET == 104);
const _: () = assert!(offset_of!(Frame, command) == CONTROL_FIELDS_OFFSET);
const _: () = assert!(offset_of!(Frame, command) == 64_000);
const _: () = assert!(offset_of!(Frame, arg0) == 64_008);
const _: () = assert!(offset_of!(Frame, result) == 64_016);
const _: () = assert!(offset_of!(Frame, reply_len) == 64_024);
const _: () = assert!(offset_of!(Frame, reserved2) == 64_028);
const _: () = assert!(offset_of!(Frame, magic) == DESCRIPTOR_OFFSET && DESCRIPTOR_OFFSET == 64_032);
const _: () = assert!(offset_of!(Frame, abi_version) == 64_040);
const _: () = assert!(offset_of!(Frame, frame_index) == 64_044);
const _: () = assert!(offset_of!(Frame, creator_pid) == 64_048);
const _: () = assert!(offset_of!(Frame, reserved3) == 64_052);
const _: () = assert!(offset_of!(Frame, config) == CONFIG_OFFSET && CONFIG_OFFSET == 64_128);
const _: () = assert!(offset_of!(Frame, message) == MESSAGE_OFFSET && MESSAGE_OFFSET == 65_280);
const _: () = assert!(MESSAGE_OFFSET + MESSAGE_BYTES == FRAME_BYTES);
const _: () = assert!(MAX_ARGS_BLOB_BYTES <= WAIT_FOR_OFFSET);
const _: () = assert!(CONFIG_OFFSET + CONFIG_BYTES == MESSAGE_OFFSET);
const _: () = assert!(size_of::<Frame>() == FRAME_BYTES);
const _: () = assert!(align_of::<Frame>() == 8);
const _: () = assert!(offset_of!(MailboxLayout, frames) == 0);
const _: () = assert!(size_of::<MailboxLayout>() == MAILBOX_BYTES && MAILBOX_BYTES == 196_608);
const _: () = assert!(ARGS_CAPACITY == 63_896);
const _: () = assert!(ARGS_CAPACITY >= MAX_ARGS_BLOB_BYTES);
const _: () = assert!(CONFIG_BYTES == 1152);
// The hot header fills exactly the first cache line.
const _: () = assert!(offset_of!(Frame, args_len) == 64);

/// Copies `src` into the byte area `cell` at `offset`, clamped to the area.
///
/// Callers validate lengths first; the clamp only makes an internal bug harmless.
#[inline(always)]
fn copy_in<const N: usize>(cell: &UnsafeCell<[u8; N]>, offset: usize, src: &[u8]) {
    let offset = offset.min(N);
    let n = src.len().min(N - offset);
    // SAFETY: `cell` is a live byte area of N bytes inside the mapping; `offset + n <= N`.
    // We write through a raw pointer (no reference to the shared bytes is formed); the
    // protocol gives this process ownership of the area while it writes.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), cell.get().cast::<u8>().add(offset), n);
    }
}

/// Copies `dst.len()` bytes out of the byte area `cell` at `offset`, clamped to the area.
#[inline(always)]
fn copy_out<const N: usize>(cell: &UnsafeCell<[u8; N]>, offset: usize, dst: &mut [u8]) {
    let offset = offset.min(N);
    let n = dst.len().min(N - offset);
    // SAFETY: as in `copy_in`; the bytes are copied out through a raw pointer and every
    // bit pattern is a valid `u8`.
    unsafe {
        std::ptr::copy_nonoverlapping(cell.get().cast::<u8>().add(offset), dst.as_mut_ptr(), n);
    }
}

/// Truncates `s` to at most `max` bytes on a UTF-8 character boundary.
pub(crate) fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Frame {
    #[inline(always)]
    pub(crate) fn word(&self) -> WaitWord<'_> {
        WaitWord {
            state: &self.state,
            waiters: &self.waiters,
        }
    }

    /// Writes the identity and the protocol version.
    #[inline(always)]
    pub(crate) fn write_identity(&self, id: &FrameIdentity) {
        self.protocol.store(PROTOCOL_VERSION, Ordering::Relaxed);
        self.lease_slot.store(id.lease_slot, Ordering::Relaxed);
        self.run_id.store(id.run_id, Ordering::Relaxed);
        self.lease_generation
            .store(id.lease_generation, Ordering::Relaxed);
        self.dispatch_id.store(id.dispatch_id, Ordering::Relaxed);
    }

    /// Reads the protocol version and the identity.
    #[inline(always)]
    pub(crate) fn read_identity(&self) -> (u32, FrameIdentity) {
        (
            self.protocol.load(Ordering::Relaxed),
            FrameIdentity {
                run_id: self.run_id.load(Ordering::Relaxed),
                lease_slot: self.lease_slot.load(Ordering::Relaxed),
                lease_generation: self.lease_generation.load(Ordering::Relaxed),
                dispatch_id: self.dispatch_id.load(Ordering::Relaxed),
            },
        )
    }

    #[inline(always)]
    pub(crate) fn write_digest(&self, d: &[u8; DIGEST_BYTES]) {
        copy_in(&self.digest, 0, d);
    }

    #[inline(always)]
    pub(crate) fn read_digest(&self) -> [u8; DIGEST_BYTES] {
        let mut d = [0u8; DIGEST_BYTES];
        copy_out(&self.digest, 0, &mut d);
        d
    }

    /// Writes the argument blob / payload bytes (the caller checked the capacity).
    #[inline(always)]
    pub(crate) fn write_args(&self, blob: &[u8]) {
        copy_in(&self.args, 0, blob);
    }

    /// Reads `len` (≤ capacity, checked by the caller) blob bytes into `out`.
    #[inline(always)]
    pub(crate) fn read_args(&self, len: usize, out: &mut Vec<u8>) {
        out.clear();
        out.resize(len.min(ARGS_CAPACITY), 0);
        copy_out(&self.args, 0, out);
    }

    pub(crate) fn write_config(&self, bytes: &[u8; CONFIG_BYTES]) {
        copy_in(&self.config, 0, bytes);
    }

    pub(crate) fn read_config(&self) -> Box<[u8; CONFIG_BYTES]> {
        let mut b = Box::new([0u8; CONFIG_BYTES]);
        copy_out(&self.config, 0, &mut b[..]);
        b
    }

    /// Empties the message (writes its first byte only; readers stop at the first NUL).
    #[inline(always)]
    pub(crate) fn clear_message(&self) {
        copy_in(&self.message, 0, &[0]);
    }

    /// Writes `msg`, truncated to [`MESSAGE_MAX_LEN`] bytes on a UTF-8 boundary, plus NUL.
    pub(crate) fn write_message(&self, msg: &str) {
        let t = truncate_utf8(msg, MESSAGE_MAX_LEN);
        copy_in(&self.message, 0, t.as_bytes());
        copy_in(&self.message, t.len(), &[0]);
    }

    /// Writes a failure's encoded wait-for state at [`WAIT_FOR_OFFSET`] of the argument
    /// area (the caller checked that the blob ends before it and the bytes fit).
    pub(crate) fn write_wait_for(&self, bytes: &[u8]) {
        copy_in(&self.args, WAIT_FOR_OFFSET, bytes);
    }

    /// Reads `len` (≤ [`WAIT_FOR_MAX_BYTES`], checked by the caller) bytes of a failure's
    /// wait-for state.
    pub(crate) fn read_wait_for(&self, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len.min(WAIT_FOR_MAX_BYTES)];
        copy_out(&self.args, WAIT_FOR_OFFSET, &mut b);
        b
    }

    /// Reads the message up to its first NUL (or all 256 bytes if the peer wrote none);
    /// invalid UTF-8 is replaced, never trusted.
    pub(crate) fn read_message(&self) -> String {
        let mut b = [0u8; MESSAGE_BYTES];
        copy_out(&self.message, 0, &mut b);
        let end = b.iter().position(|&c| c == 0).unwrap_or(MESSAGE_BYTES);
        String::from_utf8_lossy(&b[..end]).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_utf8("abc", 255), "abc");
        let e = "é".repeat(200); // 400 bytes, 2 per char
        assert_eq!(truncate_utf8(&e, 255).len(), 254);
        let mixed = format!("{}€", "a".repeat(254)); // € is 3 bytes, starts at 254
        assert_eq!(truncate_utf8(&mixed, 255), "a".repeat(254));
        assert_eq!(truncate_utf8("", 0), "");
    }

    /// The byte map in docs/mailbox.md must agree with the compiled layout.
    #[test]
    fn docs_byte_map_matches_the_layout() {
        let doc = include_str!("../../../docs/mailbox.md");
        let expect = [
            ("state", offset_of!(Frame, state)),
            ("waiters", offset_of!(Frame, waiters)),
            ("error_code", offset_of!(Frame, error_code)),
            ("accepted", offset_of!(Frame, accepted)),
            ("disposition", offset_of!(Frame, disposition)),
            ("protocol", offset_of!(Frame, protocol)),
            ("lease_slot", offset_of!(Frame, lease_slot)),
            ("config_epoch", offset_of!(Frame, config_epoch)),
            ("shutdown", offset_of!(Frame, shutdown)),
            ("run_id", offset_of!(Frame, run_id)),
            ("lease_generation", offset_of!(Frame, lease_generation)),
            ("dispatch_id", offset_of!(Frame, dispatch_id)),
            ("args_len", offset_of!(Frame, args_len)),
            ("wait_for_len", offset_of!(Frame, wait_for_len)),
            ("digest", offset_of!(Frame, digest)),
            ("args", offset_of!(Frame, args)),
            ("command", offset_of!(Frame, command)),
            ("arg0", offset_of!(Frame, arg0)),
            ("result", offset_of!(Frame, result)),
            ("reply_len", offset_of!(Frame, reply_len)),
            ("magic", offset_of!(Frame, magic)),
            ("abi_version", offset_of!(Frame, abi_version)),
            ("frame_index", offset_of!(Frame, frame_index)),
            ("creator_pid", offset_of!(Frame, creator_pid)),
            ("config", offset_of!(Frame, config)),
            ("message", offset_of!(Frame, message)),
        ];
        for (field, off) in expect {
            // Table rows look like: | 64 | 4 | `args_len` | ...
            let found = doc.lines().any(|l| {
                let cells: Vec<_> = l.split('|').map(str::trim).collect();
                cells.len() > 3
                    && cells[1].replace(' ', "") == off.to_string()
                    && cells[3].contains(&format!("`{field}`"))
            });
            assert!(
                found,
                "docs/mailbox.md has no byte-map row for `{field}` at offset {off}"
            );
        }
    }
}
