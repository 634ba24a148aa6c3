//! The device-side record of ids outside `0..rows` that every gather launch updates, and its
//! reading on the host.
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use fetchahead_gpu::params::IdStatus;

use crate::error::CudaCall;
use crate::{Error, Result};

/// One `IdStatus` in device memory, clean until a launch sees a bad id.
#[derive(Debug)]
pub struct IdCheck {
    /// The `IdStatus` as two u64 words: `bad` in the low half of word 0, `first_index` in word 1.
    status: CudaSlice<u64>,
    address: u64,
}

const CLEAN: [u64; 2] = [IdStatus::CLEAN.bad as u64, IdStatus::CLEAN.first_index];

impl IdCheck {
    pub fn new(stream: &Arc<CudaStream>) -> Result<IdCheck> {
        let status = stream.clone_htod(&CLEAN).call("cuMemcpyHtoD")?;
        let address = status.device_ptr(stream).0;
        Ok(IdCheck { address, status })
    }

    /// The device address launches record into (`GatherParams::status`).
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Waits for `stream`, then returns how many positions the launches since the last call
    /// recorded and the smallest of them (`u64::MAX` for none), and resets the record.
    pub fn take_count(&mut self, stream: &Arc<CudaStream>) -> Result<(u32, u64)> {
        let mut words = [0u64; 2];
        stream
            .memcpy_dtoh(&self.status, &mut words)
            .call("cuMemcpyDtoH")?;
        stream.synchronize().call("cuStreamSynchronize")?;
        if words[0] as u32 != 0 {
            stream
                .memcpy_htod(&CLEAN, &mut self.status)
                .call("cuMemcpyHtoD")?;
            stream.synchronize().call("cuStreamSynchronize")?;
        }
        Ok((words[0] as u32, words[1]))
    }

    /// Waits for `stream`, then returns the launches' bad ids since the last call as an error
    /// and resets the record. `ids` is the address of the `n` ids of the launch being checked
    /// (read only when there was a bad id, to name it).
    pub fn take(&mut self, stream: &Arc<CudaStream>, ids: u64, n: u64, rows: u64) -> Result<()> {
        let mut words = [0u64; 2];
        stream
            .memcpy_dtoh(&self.status, &mut words)
            .call("cuMemcpyDtoH")?;
        stream.synchronize().call("cuStreamSynchronize")?;
        let count = words[0] as u32;
        if count == 0 {
            return Ok(());
        }
        stream
            .memcpy_htod(&CLEAN, &mut self.status)
            .call("cuMemcpyHtoD")?;
        let first_index = words[1];
        let mut first_id = [0i64; 1];
        if first_index < n {
            // SAFETY: the caller passes the ids the launch read, which hold n >= first_index + 1
            // values; the read is one 8-byte copy from that array.
            unsafe {
                crate::driver::memory::memcpy_dtoh_async(
                    &mut first_id,
                    ids + 8 * first_index,
                    stream.cu_stream(),
                )
            }?;
        }
        stream.synchronize().call("cuStreamSynchronize")?;
        Err(Error::IdsOutOfRange {
            count,
            n,
            rows,
            first_index,
            first_id: first_id[0],
        })
    }
}
