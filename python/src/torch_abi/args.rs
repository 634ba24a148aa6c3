//! The checks of the native kernels' tensor arguments: what the Python kernels check, made
//! on the facts the shim reads, each refusal naming its argument as theirs do.
use fetchahead::Error;

use super::shim::{Facts, Owned, Shim};

/// A checked tensor argument: its facts.
pub type Checked = Facts;

fn dtype_name(shim: &Shim, code: i32) -> String {
    let c = &shim.codes;
    let known = [
        (c.uint8, "torch.uint8"),
        (c.int64, "torch.int64"),
        (c.bfloat16, "torch.bfloat16"),
        (c.float8_e4m3fn, "torch.float8_e4m3fn"),
        (c.float8_e8m0fnu, "torch.float8_e8m0fnu"),
    ];
    known
        .iter()
        .find(|(k, _)| *k == code)
        .map(|(_, name)| name.to_string())
        .unwrap_or_else(|| format!("of ScalarType code {code}"))
}

/// The facts of `t`, or a refusal naming `what`.
pub fn facts_of(t: &Owned<'_>, what: &'static str) -> Result<Facts, Error> {
    t.facts()
        .ok_or_else(|| Error::invalid(what, "a tensor the stable ABI cannot describe"))
}

/// The ids: int64, one dimension, contiguous, 8-byte aligned, on a CUDA device.
pub fn ids(shim: &Shim, t: &Owned<'_>) -> Result<Checked, Error> {
    let f = facts_of(t, "ids")?;
    if f.dtype != shim.codes.int64 {
        let got = dtype_name(shim, f.dtype);
        return Err(Error::invalid(
            "ids",
            format!("dtype {got}; want torch.int64"),
        ));
    }
    if f.dim != 1 {
        return Err(Error::invalid(
            "ids",
            format!("{} dimensions; want one", f.dim),
        ));
    }
    if !f.contiguous {
        return Err(Error::invalid("ids", "not contiguous"));
    }
    if f.device_type != shim.codes.cuda {
        return Err(Error::invalid("ids", "not on a CUDA device"));
    }
    aligned(&f, "ids", 8)?;
    Ok(f)
}

/// A two-dimensional contiguous table tensor of one of `dtypes`.
pub fn table(
    shim: &Shim,
    t: &Owned<'_>,
    what: &'static str,
    dtypes: &[i32],
) -> Result<Checked, Error> {
    let f = facts_of(t, what)?;
    if f.dim != 2 {
        return Err(Error::invalid(
            what,
            format!("{} dimensions; want two", f.dim),
        ));
    }
    if !f.contiguous {
        return Err(Error::invalid(what, "not contiguous"));
    }
    if !dtypes.is_empty() && !dtypes.contains(&f.dtype) {
        let want: Vec<String> = dtypes.iter().map(|d| dtype_name(shim, *d)).collect();
        let got = dtype_name(shim, f.dtype);
        return Err(Error::invalid(
            what,
            format!("dtype {got}; want {}", want.join(" or ")),
        ));
    }
    Ok(f)
}

/// The output: `shape`, `dtype`, contiguous, 16-byte aligned, on CUDA device `index`.
pub fn out(
    shim: &Shim,
    t: &Owned<'_>,
    shape: [i64; 2],
    dtype: i32,
    index: i32,
) -> Result<Checked, Error> {
    let f = facts_of(t, "out")?;
    if f.dim != 2 || f.sizes != shape {
        return Err(Error::invalid("out", format!("not of shape {shape:?}")));
    }
    if f.dtype != dtype {
        let (got, want) = (dtype_name(shim, f.dtype), dtype_name(shim, dtype));
        return Err(Error::invalid("out", format!("dtype {got}; want {want}")));
    }
    if !f.contiguous {
        return Err(Error::invalid("out", "not contiguous"));
    }
    on_device(shim, &f, "out", index)?;
    aligned(&f, "out", 16)?;
    Ok(f)
}

/// Refuses `f` unless it is on CUDA device `index`.
pub fn on_device(shim: &Shim, f: &Facts, what: &'static str, index: i32) -> Result<(), Error> {
    if f.device_type == shim.codes.cuda && f.device_index == index {
        return Ok(());
    }
    Err(Error::invalid(what, format!("not on cuda:{index}")))
}

/// Refuses a non-empty `f` whose address is not a multiple of `align`.
pub fn aligned(f: &Facts, what: &'static str, align: u64) -> Result<(), Error> {
    if !f.address.is_multiple_of(align) && f.sizes[0] != 0 {
        return Err(Error::invalid(
            what,
            format!("address {:#x} is not {align}-byte aligned", f.address),
        ));
    }
    Ok(())
}
