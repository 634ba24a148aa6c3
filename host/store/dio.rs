//! The block O_DIRECT reads of a file are aligned to: what `statx(STATX_DIOALIGN)` says (often
//! 512 bytes, so that a 256-byte row costs a 512-byte read, not a 4 KiB page), else a page.
use std::fs::File;
use std::os::fd::AsRawFd;

use super::layout::PAGE;

/// The smallest block a read plan uses, even where the file allows less.
pub(crate) const MIN_BLOCK: u64 = 512;

/// The file's O_DIRECT file-offset alignment, as `statx` reports it; Err says why not.
pub(crate) fn dio_offset_align(file: &File) -> Result<u32, String> {
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open, the path is an empty C string (AT_EMPTY_PATH: the
    // descriptor itself), and `stx` is a valid, writable statx buffer.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 {
        return Err(format!("statx: {}", std::io::Error::last_os_error()));
    }
    if stx.stx_mask & libc::STATX_DIOALIGN == 0 {
        return Err("statx does not report STATX_DIOALIGN here (kernel or filesystem)".into());
    }
    Ok(stx.stx_dio_offset_align)
}

/// The read block for a file whose alignment query answered `answer`, and why it is a page
/// when the answer could not be used.
pub(crate) fn read_block(answer: Result<u32, String>) -> (u64, Option<String>) {
    match answer {
        Ok(0) => (
            PAGE,
            Some("statx reports no O_DIRECT support (alignment 0)".into()),
        ),
        Ok(a) if a.is_power_of_two() && u64::from(a) <= PAGE => (u64::from(a).max(MIN_BLOCK), None),
        Ok(a) => (
            PAGE,
            Some(format!("statx reports an O_DIRECT alignment of {a} bytes")),
        ),
        Err(why) => (PAGE, Some(why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_falls_back_to_a_page() {
        assert_eq!(read_block(Ok(512)), (512, None));
        assert_eq!(read_block(Ok(4096)), (4096, None));
        assert_eq!(read_block(Ok(1)).0, 512);
        for bad in [Ok(0), Ok(3000), Ok(65536), Err("old kernel".to_string())] {
            let (block, why) = read_block(bad);
            assert_eq!(block, PAGE);
            assert!(why.is_some());
        }
    }

    #[test]
    fn statx_answers_or_says_why_not() {
        let f = tempfile::tempfile().unwrap();
        match dio_offset_align(&f) {
            Ok(a) => assert!(a == 0 || a.is_power_of_two()),
            Err(why) => assert!(!why.is_empty()),
        }
    }
}
