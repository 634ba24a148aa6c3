//! The native CUDA kernels of the four `_unchecked` gather ops: the Python kernels' checks
//! and launch, made on the shim's facts, so that a call costs the dispatch and the launch.
use fetchahead::Error;

use super::args::{self, Checked};
use super::shim::{Owned, Shim};
use super::throw::Prepared;
use super::{Native, native};
use crate::Family;
use crate::device::{self, Launch};

/// Which op: its family and whether it allocates its output.
#[derive(Clone, Copy)]
pub struct Op {
    family: Family,
    allocates: bool,
}

pub const GATHER: Op = Op {
    family: Family::Gather,
    allocates: true,
};
pub const GATHER_OUT: Op = Op {
    family: Family::Gather,
    allocates: false,
};
pub const DEQUANT: Op = Op {
    family: Family::Dequant,
    allocates: true,
};
pub const DEQUANT_OUT: Op = Op {
    family: Family::Dequant,
    allocates: false,
};

/// The boxed kernel of `OP` (0: `gather_unchecked`, 1: `gather_out_unchecked`, 2:
/// `gather_dequant_unchecked`, 3: `gather_dequant_out_unchecked`).
///
/// # Safety
/// Called by the dispatcher with the stack of the op's schema.
pub unsafe extern "C-unwind" fn kernel<const OP: usize>(stack: *mut u64, _args: u64, _rets: u64) {
    let op = [GATHER, GATHER_OUT, DEQUANT, DEQUANT_OUT][OP];
    let n = native();
    // SAFETY: the dispatcher's stack of this op's schema.
    let refusal = unsafe { refusal_of(n, op, stack) };
    if let Some(prepared) = refusal {
        // SAFETY: `refusal_of` returned: everything taken from the stack is freed, and this
        // frame holds nothing to drop (see `Thrower::throw`).
        unsafe { n.thrower.throw(prepared) }
    }
}

/// Runs the op; for a refusal, the exception to throw.
///
/// # Safety
/// `stack` holds the op's arguments.
unsafe fn refusal_of(n: &Native, op: Op, stack: *mut u64) -> Option<Prepared> {
    // SAFETY: the caller's stack.
    unsafe { run(n, op, stack) }
        .err()
        .map(|e| n.thrower.prepare(e))
}

/// The arguments taken from the stack, each owned.
struct Taken<'a> {
    table: Owned<'a>,
    scales: Option<Owned<'a>>,
    ids: Owned<'a>,
    out: Option<Owned<'a>>,
    variant: Option<String>,
}

/// Takes `op`'s arguments: `(table | weights, scales), ids, [out], variant`.
///
/// # Safety
/// `stack` holds the op's arguments, taken once.
unsafe fn take(shim: &Shim, op: Op, stack: *mut u64) -> Taken<'_> {
    let mut at = 0;
    let mut next = || {
        // SAFETY: the schema has this many arguments.
        let v = unsafe { *stack.add(at) };
        at += 1;
        v
    };
    let table = Owned::new(shim, next() as _);
    let scales = (op.family == Family::Dequant).then(|| Owned::new(shim, next() as _));
    let ids = Owned::new(shim, next() as _);
    let out = (!op.allocates).then(|| Owned::new(shim, next() as _));
    // SAFETY: the last argument is the `str? variant`.
    let variant = unsafe { shim.take_optional_str(next()) };
    Taken {
        table,
        scales,
        ids,
        out,
        variant,
    }
}

/// A table tensor's device address on CUDA device `index`: its own, or a pinned host
/// tensor's mapping (read zero-copy).
fn table_address(
    n: &Native,
    device: &device::DeviceKernels,
    f: &Checked,
    what: &'static str,
    index: i32,
) -> Result<u64, Error> {
    if f.device_type == n.shim.codes.cpu {
        if f.sizes[0] == 0 || f.address == 0 {
            return Ok(0);
        }
        let ctx = &device.kernels.gpu().ctx;
        return fetchahead::driver::memory::host_device_address(ctx, f.address)?.ok_or_else(|| {
            Error::invalid(
                what,
                "a CPU tensor that is not pinned (use tensor.pin_memory())",
            )
        });
    }
    args::on_device(&n.shim, f, what, index)?;
    Ok(f.address)
}

/// Checks `op`'s arguments and launches it on the current stream; an allocating op's output
/// goes to the stack.
///
/// # Safety
/// `stack` holds the op's arguments.
unsafe fn run(n: &Native, op: Op, stack: *mut u64) -> Result<(), Error> {
    let shim = &n.shim;
    // SAFETY: the caller's stack.
    let taken = unsafe { take(shim, op, stack) };
    let ids = args::ids(shim, &taken.ids)?;
    let index = ids.device_index;
    let c = &shim.codes;
    let (table, scales, width, out_dtype, out_width) = match op.family {
        Family::Gather => {
            let table = args::table(shim, &taken.table, "table", &[])?;
            // SAFETY: a pure function of the dtype code.
            let row_bytes =
                table.sizes[1] as u64 * unsafe { (shim.element_size)(table.dtype) } as u64;
            if row_bytes == 0 || !row_bytes.is_multiple_of(16) {
                let why = format!("rows of {row_bytes} bytes; want a positive multiple of 16");
                return Err(Error::invalid("table", why));
            }
            (table, None, row_bytes as u32, None, None)
        }
        Family::Dequant => {
            let weights = args::table(shim, &taken.table, "weights", &[c.float8_e4m3fn, c.uint8])?;
            let scales_t = taken.scales.as_ref().expect("a dequant op takes scales");
            let scales = args::table(shim, scales_t, "scales", &[c.float8_e8m0fnu, c.uint8])?;
            let [rows, dim] = weights.sizes;
            if dim == 0 || dim % 32 != 0 {
                let why = format!("dim {dim} is not a positive multiple of 32");
                return Err(Error::invalid("weights", why));
            }
            if scales.sizes != [rows, dim / 32] {
                let why = format!("shape {:?}; want [{rows}, {}]", scales.sizes, dim / 32);
                return Err(Error::invalid("scales", why));
            }
            (
                weights,
                Some(scales),
                dim as u32,
                Some(c.bfloat16),
                Some(dim),
            )
        }
    };
    let out_dtype = out_dtype.unwrap_or(table.dtype);
    let out_shape = [ids.sizes[0], out_width.unwrap_or(table.sizes[1])];
    let device = device::on_device(index as usize)?;
    let variant = device.variant(op.family, taken.variant.as_deref())?;
    let table_at = table_address(n, &device, &table, op.family.table_name(), index)?;
    args::aligned(&table, op.family.table_name(), 16)?;
    let scales_at = match &scales {
        Some(s) => table_address(n, &device, s, "scales", index)?,
        None => 0,
    };
    let (out_handle, out) = match taken.out {
        Some(given) => {
            let f = args::out(shim, &given, out_shape, out_dtype, index)?;
            (None, f)
        }
        None => {
            let made = shim
                .empty_2d(out_shape, out_dtype, index)
                .ok_or(Error::invalid("out", "torch could not allocate the output"))?;
            let f = args::facts_of(&made, "out")?;
            (Some(made), f)
        }
    };
    if ids.sizes[0] > 0 {
        let stream = shim
            .stream(index)
            .map_err(|why| Error::invalid("stream", why))?;
        let at = Launch {
            table: table_at,
            scales: scales_at,
            rows: table.sizes[0] as u64,
            width,
            ids: ids.address,
            n: ids.sizes[0] as u64,
            out: out.address,
            status: 0,
        };
        // SAFETY: every tensor was checked above against the shape, dtype, device and
        // alignment the kernel reads and writes; the caller's tensors outlive the launch in
        // the stream's order (torch's allocator orders reuse by stream).
        unsafe { device.launch(variant, &at, stream as _)? };
    }
    if let Some(made) = out_handle {
        // SAFETY: an allocating op has one return, at the stack's start.
        unsafe { *stack = made.release() as u64 };
    }
    Ok(())
}
