//! The compact form in which a fuzz input carries one mailbox frame: every field a peer
//! can write, in frame order, without the unused tail of the 63 896-byte payload area.
//!
//! | image bytes | frame bytes | fields |
//! |---|---|---|
//! | `0..104` | `0..104` | state … dispatch id, `args_len`, digest |
//! | `104..136` | `64000..64032` | `command`, `arg0`, `result`, `reply_len`, reserved |
//! | `136..1288` | `64128..65280` | encoded `CallConfig` |
//! | `1288..1544` | `65280..65536` | error message |
//! | `1544..` | `104..` | argument blob / control payload (at most 63 896 bytes) |
//!
//! Image bytes past the end of the input are zero. The frame descriptor (magic, ABI
//! version, index, creator pid) is never written: it is validated once, when a process
//! attaches to a mailbox, and not read afterwards.

use strata_mailbox::layout::{
    ARGS_CAPACITY, ARGS_OFFSET, CONFIG_BYTES, CONFIG_OFFSET, CONTROL_FIELDS_OFFSET,
    DESCRIPTOR_OFFSET, FRAME_BYTES, MESSAGE_BYTES, MESSAGE_OFFSET,
};

/// `(image offset, frame offset, length)` of each fixed-size piece.
const PIECES: [(usize, usize, usize); 4] = [
    (0, 0, ARGS_OFFSET),
    (
        ARGS_OFFSET,
        CONTROL_FIELDS_OFFSET,
        DESCRIPTOR_OFFSET - CONTROL_FIELDS_OFFSET,
    ),
    (
        ARGS_OFFSET + DESCRIPTOR_OFFSET - CONTROL_FIELDS_OFFSET,
        CONFIG_OFFSET,
        CONFIG_BYTES,
    ),
    (
        ARGS_OFFSET + DESCRIPTOR_OFFSET - CONTROL_FIELDS_OFFSET + CONFIG_BYTES,
        MESSAGE_OFFSET,
        MESSAGE_BYTES,
    ),
];

/// Bytes of the fixed part of an image (everything before the payload): 1544.
pub const FIXED_BYTES: usize =
    ARGS_OFFSET + (DESCRIPTOR_OFFSET - CONTROL_FIELDS_OFFSET) + CONFIG_BYTES + MESSAGE_BYTES;

const _: () = assert!(FIXED_BYTES == 1544);

/// Offset of the state word in an image (and in a frame).
pub const STATE: usize = 0;

/// Writes `image` over the frame at `frame`: every piece from the image (zero past its
/// end), the payload area's first `image.len() - FIXED_BYTES` bytes.
///
/// # Safety
/// `frame` must point to a mapped frame of [`FRAME_BYTES`] bytes that no other thread
/// accesses during the call.
pub unsafe fn apply(frame: *mut u8, image: &[u8]) {
    for (img, frm, len) in PIECES {
        let mut piece = [0u8; CONFIG_BYTES];
        if let Some(src) = image.get(img..) {
            let have = src.len().min(len);
            piece[..have].copy_from_slice(&src[..have]);
        }
        // SAFETY: `frm + len <= FRAME_BYTES` (the layout constants), the caller owns the
        // frame.
        unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), frame.add(frm), len) };
    }
    let payload = &image[image.len().min(FIXED_BYTES)..];
    let n = payload.len().min(ARGS_CAPACITY);
    // SAFETY: `ARGS_OFFSET + n <= CONTROL_FIELDS_OFFSET < FRAME_BYTES`.
    unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), frame.add(ARGS_OFFSET), n) };
}

/// The image of the frame at `frame`, with `payload_len` bytes of payload.
///
/// # Safety
/// `frame` must point to a mapped frame of [`FRAME_BYTES`] bytes that no other thread
/// writes during the call.
pub unsafe fn capture(frame: *const u8, payload_len: usize) -> Vec<u8> {
    let n = payload_len.min(ARGS_CAPACITY);
    let mut out = vec![0u8; FIXED_BYTES + n];
    for (img, frm, len) in PIECES {
        // SAFETY: as in `apply`.
        unsafe { std::ptr::copy_nonoverlapping(frame.add(frm), out[img..].as_mut_ptr(), len) };
    }
    // SAFETY: as in `apply`.
    unsafe {
        std::ptr::copy_nonoverlapping(frame.add(ARGS_OFFSET), out[FIXED_BYTES..].as_mut_ptr(), n)
    };
    out
}

/// Zeroes everything in the frame at `frame` but its descriptor.
///
/// # Safety
/// As [`apply`].
pub unsafe fn clear(frame: *mut u8) {
    // SAFETY: both ranges lie inside the frame; the caller owns it.
    unsafe {
        std::ptr::write_bytes(frame, 0, DESCRIPTOR_OFFSET);
        std::ptr::write_bytes(frame.add(CONFIG_OFFSET), 0, FRAME_BYTES - CONFIG_OFFSET);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_survives_apply_then_capture_and_short_images_read_as_zero() {
        let mut frame = vec![0xeeu8; FRAME_BYTES];
        let image: Vec<u8> = (0..FIXED_BYTES + 40).map(|i| (i % 251) as u8).collect();
        // SAFETY: `frame` is a private buffer of FRAME_BYTES bytes.
        unsafe { apply(frame.as_mut_ptr(), &image) };
        // SAFETY: as above.
        assert_eq!(unsafe { capture(frame.as_ptr(), 40) }, image);
        // The descriptor is never written.
        assert!(frame[DESCRIPTOR_OFFSET..CONFIG_OFFSET]
            .iter()
            .all(|&b| b == 0xee));
        // An image of 3 bytes sets those 3 and zeroes the rest of every piece.
        // SAFETY: as above.
        unsafe { apply(frame.as_mut_ptr(), &[1, 2, 3]) };
        assert_eq!(&frame[..4], &[1, 2, 3, 0]);
        assert!(frame[MESSAGE_OFFSET..].iter().all(|&b| b == 0));
        assert!(frame[CONTROL_FIELDS_OFFSET..DESCRIPTOR_OFFSET]
            .iter()
            .all(|&b| b == 0));
        // SAFETY: as above.
        unsafe { clear(frame.as_mut_ptr()) };
        assert!(frame[..DESCRIPTOR_OFFSET].iter().all(|&b| b == 0));
        assert!(frame[DESCRIPTOR_OFFSET..CONFIG_OFFSET]
            .iter()
            .all(|&b| b == 0xee));
    }
}
