//! MXFP8 (OCP Microscaling) element decoding done with integer operations only: the scalar format
//! definition, and the NaN and scale codes every dequant variant shares. (The variant that ran
//! it on the GPU branched per element and ran 2.1 x slower on random bytes than on quantized
//! weights, so it was removed.) Host code never uses it as a reference; the tests check it
//! against the `half` and `float8` crates.

/// E8M0 code that means NaN.
pub const E8M0_NAN: u8 = 0xFF;
/// The bf16 NaN every dequant variant writes (the one `cvt.rn.bf16x2.f32` produces).
pub const BF16_NAN: u16 = 0x7FFF;

/// bf16 bits of `e4m3(x) * 2^(scale - 127)`, rounded once to nearest even, with bf16 subnormals,
/// overflow to infinity and NaN for E4M3 0x7F/0xFF or E8M0 0xFF.
#[inline(always)]
pub fn e4m3_scaled_to_bf16(x: u8, scale: u8) -> u16 {
    let sign = ((x as u16) & 0x80) << 8;
    if x & 0x7F == 0x7F || scale == E8M0_NAN {
        return BF16_NAN;
    }
    let e = ((x >> 3) & 0xF) as i32;
    let m = (x & 0x7) as u32;
    // x = mag * 2^exp with an integer magnitude of at most 4 bits.
    let (mag, exp) = if e == 0 { (m, -9) } else { (8 | m, e - 10) };
    if mag == 0 {
        return sign;
    }
    let exp = exp + scale as i32 - 127;
    let top = 31 - mag.leading_zeros() as i32; // 0..=3
    let biased = exp + top + 127;
    if biased >= 0xFF {
        return sign | 0x7F80;
    }
    if biased >= 1 {
        let frac = (mag ^ (1 << top)) << (7 - top);
        return sign | ((biased as u16) << 7) | frac as u16;
    }
    // Subnormal: the result is mag * 2^(exp + 133) units of 2^-133, rounded to nearest even.
    let units_exp = exp + 133;
    if units_exp >= 0 {
        return sign | (mag << units_exp) as u16; // exact, and < 128 since biased <= 0
    }
    let shift = -units_exp;
    if shift > 4 {
        return sign; // mag < 2^4 <= half an ulp
    }
    let shift = shift as u32;
    let q = mag >> shift;
    let rem = mag & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let up = rem > half || (rem == half && q & 1 == 1);
    sign | (q + up as u32) as u16
}
