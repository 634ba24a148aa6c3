//! A stand-in for the model's compute: every thread of the grid waits on the device clock for a
//! given time, so that the SMs are busy and the stream is occupied as by a real layer.

/// The spin kernel's entry.
pub const KERNEL: &str = "spin";
/// Its twin that records the device timeline.
pub const KERNEL_TIMED: &str = "spin_timed";

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use crate::device::global_timer_ns;
    use crate::params::SpinParams;

    /// Per thread: reads the clock until `nanos` have passed; touches no memory.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn spin(p: SpinParams) {
        wait(&p)
    }

    /// As `spin`, recording its blocks on the device timeline.
    #[unsafe(no_mangle)]
    pub unsafe extern "gpu-kernel" fn spin_timed(p: SpinParams) {
        timed!(p, wait(&p))
    }

    #[inline(always)]
    fn wait(p: &SpinParams) {
        let begin = global_timer_ns();
        while global_timer_ns().wrapping_sub(begin) < p.nanos {}
    }
}
