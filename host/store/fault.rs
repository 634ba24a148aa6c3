//! A seam for tests: make the reads of chosen rows fail the way a disk or the kernel can, so that
//! the real error path (retries, row ids in the error) runs.
use std::sync::atomic::{AtomicU32, Ordering};

/// How reads misbehave. Applied to what the OS returned, on every read path.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub enum ReadFault {
    /// Every read covering `row` fails with `errno`.
    Fail { row: u64, errno: i32 },
    /// The first `times` reads covering `row` return half of their bytes (512-byte multiples;
    /// a read of one 512-byte block returns 256 bytes, as no O_DIRECT read can).
    Short { row: u64, times: u32 },
    /// Reads covering `row` find the end of the file (return 0 bytes).
    Eof { row: u64 },
    /// The first `times` reads of any row fail with EINTR.
    Interrupt { times: u32 },
    /// Once a lookup's reads have all landed, the caller's outputs are overwritten with this
    /// byte before the cache takes the rows: what reading them back would see if they were
    /// memory the store cannot read (write-combined pinned staging, read uncached and slow).
    ScribbleOutput { byte: u8 },
}

#[derive(Debug)]
pub(crate) struct FaultState {
    fault: ReadFault,
    fired: AtomicU32,
}

impl FaultState {
    pub fn new(fault: ReadFault) -> Self {
        FaultState {
            fault,
            fired: AtomicU32::new(0),
        }
    }

    fn take(&self, times: u32) -> bool {
        times == u32::MAX || self.fired.fetch_add(1, Ordering::Relaxed) < times
    }

    /// The byte a lookup overwrites its outputs with after its reads, under `ScribbleOutput`.
    pub fn scribble(&self) -> Option<u8> {
        match self.fault {
            ReadFault::ScribbleOutput { byte } => Some(byte),
            _ => None,
        }
    }

    /// What the read returns under the fault: `res` is bytes read or a negative errno.
    pub fn apply(&self, covers: impl Fn(u64) -> bool, res: i64) -> i64 {
        match self.fault {
            ReadFault::Fail { row, errno } if covers(row) => -i64::from(errno),
            ReadFault::Short { row, times } if res > 0 && covers(row) && self.take(times) => {
                match (res / 2) & !511 {
                    0 => res / 2,
                    short => short,
                }
            }
            ReadFault::Eof { row } if res > 0 && covers(row) => 0,
            ReadFault::Interrupt { times } if self.take(times) => -i64::from(libc::EINTR),
            _ => res,
        }
    }
}
