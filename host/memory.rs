//! Allocations whose size comes from a file or an argument: checked against the memory this
//! machine has, then made fallibly, so that an absurd size is an [`Error`], never an abort of
//! the host process ("memory allocation of N bytes failed").
use crate::{Error, Result};

/// Bytes the kernel says can be allocated without swapping (`MemAvailable` in /proc/meminfo;
/// `None` where it is not known).
pub fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// Fails unless `bytes` fit the memory available now.
pub fn check_fits(bytes: u64, what: &str) -> Result<()> {
    let available = available_bytes();
    let too_large = match available {
        Some(a) => bytes > a,
        None => bytes > isize::MAX as u64,
    };
    if too_large || usize::try_from(bytes).is_err() {
        return Err(Error::OutOfMemory {
            what: what.to_string(),
            bytes,
            available,
        });
    }
    Ok(())
}

/// An empty vector with room for `len` bytes, or an error naming `what`.
pub fn bytes_with_capacity(len: usize, what: &str) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::OutOfMemory {
        what: what.to_string(),
        bytes: len as u64,
        available: None,
    })?;
    Ok(v)
}

/// `len` zero bytes, after checking that they fit the available memory.
pub fn zeroed(len: u64, what: &str) -> Result<Vec<u8>> {
    check_fits(len, what)?;
    let mut v = bytes_with_capacity(len as usize, what)?;
    v.resize(len as usize, 0);
    Ok(v)
}

/// `a * b` for a size, or an error naming `what` when it overflows.
pub fn product(a: u64, b: u64, what: &str) -> Result<u64> {
    a.checked_mul(b).ok_or_else(|| Error::OutOfMemory {
        what: what.to_string(),
        bytes: u64::MAX,
        available: available_bytes(),
    })
}
