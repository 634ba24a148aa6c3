//! The integer MXFP8 decoding (the scalar format definition), checked on the CPU for
//! every E4M3 byte and every E8M0 scale against the independent reference (`half` + `float8`).
// The self-check's CPU reference (`fetchahead::selfcheck::reference`), one source; each test
// file uses part of it.
#[allow(dead_code)]
#[path = "../host/selfcheck/reference.rs"]
mod reference;
use fetchahead::device_abi::mxfp8::{BF16_NAN, e4m3_scaled_to_bf16};

#[test]
fn integer_decoding_matches_the_reference_for_every_byte_and_scale() {
    let mut nans = 0;
    for scale in 0..=255u8 {
        for x in 0..=255u8 {
            let got = e4m3_scaled_to_bf16(x, scale);
            let want = reference::dequant(x, scale);
            if want.is_nan() {
                assert_eq!(got, BF16_NAN, "x={x:#04x} scale={scale}");
                nans += 1;
            } else {
                assert_eq!(
                    got,
                    want.to_bits(),
                    "x={x:#04x} scale={scale}: got {got:#06x}, want {:#06x} ({want})",
                    want.to_bits()
                );
            }
        }
    }
    // E4M3 NaN is 0x7F and 0xFF for every scale, and every byte is NaN at scale 0xFF.
    assert_eq!(nans, 2 * 255 + 256);
}

#[test]
fn reference_follows_the_ocp_mx_rules_at_the_edges() {
    use half::bf16;
    // 1.0 (0x38) at scale 2^0.
    assert_eq!(reference::dequant(0x38, 127), bf16::ONE);
    // Max E4M3 448 (0x7E) at 2^127 overflows to infinity, with its sign.
    assert_eq!(reference::dequant(0x7E, 254), bf16::INFINITY);
    assert_eq!(reference::dequant(0xFE, 254), bf16::NEG_INFINITY);
    // The smallest E4M3 subnormal 2^-9 at 2^-127 is 2^-136: below half of bf16's smallest
    // subnormal 2^-133, so it rounds to zero, keeping its sign.
    assert_eq!(reference::dequant(0x01, 0).to_bits(), 0x0000);
    assert_eq!(reference::dequant(0x81, 0).to_bits(), 0x8000);
    // 0x06 (6 * 2^-9) at 2^-127 is 6 * 2^-136 = 0.75 * 2^-133: rounds to the smallest subnormal.
    assert_eq!(reference::dequant(0x06, 0).to_bits(), 0x0001);
    // E4M3 NaN and E8M0 NaN.
    assert!(reference::dequant(0x7F, 127).is_nan());
    assert!(reference::dequant(0x38, 255).is_nan());
    // Negative zero survives scaling.
    assert_eq!(reference::dequant(0x80, 200).to_bits(), 0x8000);
}
