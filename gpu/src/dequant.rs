//! Fused gather + MXFP8 dequant: row `ids[i]` of FP8-E4M3 weights with its E8M0 scales (one per
//! 32 elements) comes out as bf16, `e4m3(x) * 2^(s - 127)` rounded once to nearest even.
//!
//! Per thread: 16 elements (one 16-byte weight load, one scale byte, two 16-byte stores), so a
//! 256-element row is 16 threads and a warp covers two rows. An id outside `0..rows` writes a zero
//! row and is recorded in the launch's `IdStatus`.

/// How a variant turns FP8 bytes into bf16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conversion {
    /// `cvt.rn.f16x2.e4m3x2` (sm_89+), an f32 multiply by the scale, `cvt.rn.bf16x2.f32`.
    Hardware,
    /// No conversion instructions: the E4M3 bits placed in a bf16 (exact, 2^-120 times the
    /// value), then two packed bf16 multiplies, by 2^120 (exact) and by the scale (the one
    /// rounding). NaN codes are patched in by a mask, so every byte costs the same.
    Packed,
}

/// How a variant maps elements to threads; the host sizes the grid from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A thread per 16 elements (one 16-byte weight load, two 16-byte stores 16 bytes apart),
    /// over a grid-stride loop.
    Chunk16,
    /// A thread per 8 elements `unroll` times over: a warp takes `32 * unroll` consecutive
    /// 8-element units of output, lane `l` units `l, l + 32, ...`, all loaded before any is
    /// stored, so that each store instruction of the warp writes 512 contiguous bytes. With
    /// `one_pass` the grid has a warp per tile (each warp one pass of its loop); otherwise it
    /// is capped at what fits on the device at once and strides over the tiles.
    Units8 {
        unroll: u32,
        one_pass: bool,
        block_threads: u32,
    },
    /// A thread per 16 elements in one pass (a thread per chunk of the grid, no loop): the
    /// chunk's id, 16 weight bytes and scale byte loaded under predicates, two predicated
    /// 16-byte stores. The Triton peer's shape at 1M-4M rows (ROWS = 4 on 2 warps).
    ChunkPass { block_threads: u32 },
    /// A thread per 4 elements in one pass: the id, 4 weight bytes and the scale byte loaded
    /// under predicates, one predicated 8-byte store. For decode-size calls, where a thread's
    /// conversion after its loads lies on the call's critical path: half a unit's work a
    /// thread, twice the threads (the Triton peer's tile at 72 rows, ROWS = 4 on 8 warps).
    QuadPass { block_threads: u32 },
    /// `rows` rows a warp in one pass, `warps` warps a block, lane `l` taking unit `l` (8
    /// elements; `l + 32 j` too for rows wider than 256) of each of its warp's rows, as the
    /// Triton peer's tile takes its rows: the warp's ids in one load shared by shuffles, with
    /// no arithmetic on the row's width before it; then each row's weights and scale under
    /// predicates, `rows` rows in flight a thread, one predicated 16-byte store a unit. For
    /// decode-size calls, where a call's time is its chain of dependent loads.
    RowsTile { rows: u32, warps: u32 },
}

impl Shape {
    /// Elements one thread converts per pass of its loop.
    pub const fn elems_per_thread(self) -> u32 {
        match self {
            Shape::Chunk16 | Shape::ChunkPass { .. } => 16,
            Shape::QuadPass { .. } => 4,
            Shape::Units8 { unroll, .. } => 8 * unroll,
            Shape::RowsTile { rows, .. } => 8 * rows,
        }
    }

    /// Threads a block of a launch of this shape: 256 unless the variant declares `block: N`
    /// (small blocks spread a small call over more multiprocessors).
    pub const fn block_threads(self) -> u32 {
        match self {
            Shape::Chunk16 => crate::gather::BLOCK_THREADS,
            Shape::Units8 { block_threads, .. }
            | Shape::ChunkPass { block_threads }
            | Shape::QuadPass { block_threads } => block_threads,
            Shape::RowsTile { warps, .. } => 32 * warps,
        }
    }

    /// Whether the grid covers the call once (a block per tile), rather than being capped at
    /// what fits on the device and striding.
    pub const fn one_pass(self) -> bool {
        matches!(
            self,
            Shape::Units8 { one_pass: true, .. }
                | Shape::ChunkPass { .. }
                | Shape::QuadPass { .. }
                | Shape::RowsTile { .. }
        )
    }

    /// Threads a launch over `n` rows of `dim` elements needs (before the grid cap).
    pub const fn threads(self, n: u64, dim: u32) -> u64 {
        match self {
            Shape::Chunk16 => n * (dim / 16) as u64,
            // Whole warps: the kernel predicates the threads past the last chunk.
            Shape::ChunkPass { .. } => (n * (dim / 16) as u64).div_ceil(32) * 32,
            Shape::QuadPass { .. } => (n * (dim / 4) as u64).div_ceil(32) * 32,
            Shape::Units8 { unroll, .. } => {
                let units = n * (dim / 8) as u64;
                units.div_ceil(32 * unroll as u64) * 32
            }
            Shape::RowsTile { rows, warps } => crate::warp_rows::threads(n, rows, warps),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub name: &'static str,
    pub conversion: Conversion,
    pub shape: Shape,
    pub about: &'static str,
}

/// Elements each thread of a [`Shape::Chunk16`] variant converts.
pub const ELEMS_PER_THREAD: u32 = 16;

/// The row of a variant. `chunk16`: [`Shape::Chunk16`]; `units8`: [`Shape::Units8`] with the
/// declaration's `unroll` and `one_pass`; `unit_pass`: [`Shape::Units8`], a unit a thread in
/// one pass (its body is straight-line, every load and store predicated); `chunk_pass`:
/// [`Shape::ChunkPass`], the same with a chunk of 16 elements a thread; `rows_tile`:
/// [`Shape::RowsTile`].
macro_rules! dequant_row {
    ($name:expr, $about:expr, chunk16 { conversion: $c:ident, $($rest:tt)* }) => {
        Variant {
            name: $name,
            conversion: Conversion::$c,
            shape: Shape::Chunk16,
            about: $about,
        }
    };
    ($name:expr, $about:expr, unit_pass { conversion: $c:ident, block: $b:literal }) => {
        Variant {
            name: $name,
            conversion: Conversion::$c,
            shape: Shape::Units8 {
                unroll: 1,
                one_pass: true,
                block_threads: $b,
            },
            about: $about,
        }
    };
    ($name:expr, $about:expr, chunk_pass { conversion: $c:ident, block: $b:literal }) => {
        Variant {
            name: $name,
            conversion: Conversion::$c,
            shape: Shape::ChunkPass { block_threads: $b },
            about: $about,
        }
    };
    ($name:expr, $about:expr, quad_pass { conversion: $c:ident, block: $b:literal }) => {
        Variant {
            name: $name,
            conversion: Conversion::$c,
            shape: Shape::QuadPass { block_threads: $b },
            about: $about,
        }
    };
    ($name:expr, $about:expr, rows_tile { conversion: $c:ident, rows: $r:literal, warps: $w:literal }) => {
        Variant {
            name: $name,
            conversion: Conversion::$c,
            shape: Shape::RowsTile { rows: $r, warps: $w },
            about: $about,
        }
    };
    (
        $name:expr, $about:expr,
        units8 { unroll: $u:literal, one_pass: $one:literal, conversion: $c:ident, $($rest:tt)* }
    ) => {
        Variant {
            name: $name,
            conversion: Conversion::$c,
            shape: Shape::Units8 {
                unroll: $u,
                one_pass: $one,
                block_threads: block_of!($($rest)*),
            },
            about: $about,
        }
    };
}

/// The body of a variant, from the same tokens as its row: the conversion, the unroll, the
/// weight loads' cache hint, the next row fetched ahead (`chunk16`) and streaming stores
/// (`units8`). `one_pass` only sizes the grid.
#[cfg(target_arch = "nvptx64")]
macro_rules! dequant_body {
    ($p:ident, chunk16 { conversion: $c:ident, ahead: $ahead:literal, hint: $h:ident }) => {
        super::kernels::gather_dequant::<
            { super::Conversion::$c as u8 },
            $ahead,
            { crate::device::hint::$h },
        >(&$p)
    };
    ($p:ident, unit_pass { conversion: $c:ident, block: $b:literal }) => {
        super::kernels::gather_dequant_pass::<{ super::Conversion::$c as u8 }, $b, 0, 8>(&$p)
    };
    ($p:ident, chunk_pass { conversion: $c:ident, block: $b:literal }) => {
        super::kernels::gather_dequant_chunk_pass::<{ super::Conversion::$c as u8 }, $b>(&$p)
    };
    ($p:ident, quad_pass { conversion: $c:ident, block: $b:literal }) => {
        super::kernels::gather_dequant_pass::<{ super::Conversion::$c as u8 }, $b, 0, 4>(&$p)
    };
    ($p:ident, rows_tile { conversion: $c:ident, rows: $r:literal, warps: $w:literal }) => {
        super::kernels::gather_dequant_rows_tile::<$r, $w, { super::Conversion::$c as u8 }>(&$p)
    };
    (
        $p:ident,
        units8 {
            unroll: $u:literal, one_pass: $one:literal, conversion: $c:ident, hint: $h:ident,
            streaming: $cs:literal $(, block: $b:literal)?
        }
    ) => {
        super::kernels::gather_dequant_units::<
            $u,
            { super::Conversion::$c as u8 },
            { crate::device::hint::$h },
            $cs,
        >(&$p)
    };
}

/// The arch tier a variant's instructions need, from the same tokens as its row: the hardware
/// conversion (`cvt.rn.f16x2.e4m3x2`) needs sm_89, the next row's L2 bulk prefetch (`ahead`)
/// sm_90; the packed conversion sm_80.
macro_rules! dequant_needs {
    ($then:ident!($($pre:tt)*) chunk16 { conversion: Hardware, $($rest:tt)* }) => {
        $then! { $($pre)* sm_89 }
    };
    (
        $then:ident!($($pre:tt)*)
        units8 { unroll: $u:literal, one_pass: $one:literal, conversion: Hardware, $($rest:tt)* }
    ) => {
        $then! { $($pre)* sm_89 }
    };
    ($then:ident!($($pre:tt)*) unit_pass { conversion: Hardware, $($rest:tt)* }) => {
        $then! { $($pre)* sm_89 }
    };
    ($then:ident!($($pre:tt)*) chunk_pass { conversion: Hardware, $($rest:tt)* }) => {
        $then! { $($pre)* sm_89 }
    };
    ($then:ident!($($pre:tt)*) quad_pass { conversion: Hardware, $($rest:tt)* }) => {
        $then! { $($pre)* sm_89 }
    };
    ($then:ident!($($pre:tt)*) rows_tile { conversion: Hardware, $($rest:tt)* }) => {
        $then! { $($pre)* sm_89 }
    };
    ($then:ident!($($pre:tt)*) chunk16 { conversion: $c:ident, ahead: true, $($rest:tt)* }) => {
        $then! { $($pre)* sm_90 }
    };
    ($then:ident!($($pre:tt)*) $($kind:tt)*) => {
        $then! { $($pre)* sm_80 }
    };
}

variants! {
    params: DequantParams, row: dequant_row, body: dequant_body, needs: dequant_needs;
    gather_dequant_cvt: chunk16 { conversion: Hardware, ahead: false, hint: STREAM }
        => "hardware e4m3x2 -> f16x2 conversion, f32 scale multiply";
    gather_dequant_packed: chunk16 { conversion: Packed, ahead: false, hint: STREAM }
        => "E4M3 bits placed in bf16, two packed bf16x2 multiplies";
    gather_dequant_packed_nohint: chunk16 { conversion: Packed, ahead: false, hint: PLAIN }
        => "packed, weight loads without cache hints";
    gather_dequant_cvt_nohint: chunk16 { conversion: Hardware, ahead: false, hint: PLAIN }
        => "hardware conversion, weight loads without cache hints";
    gather_dequant_packed_ahead: chunk16 { conversion: Packed, ahead: true, hint: STREAM }
        => "packed, the next id loaded and the next row prefetched into L2 one step ahead";
    gather_dequant_u8_packed: units8 {
        unroll: 1, one_pass: false, conversion: Packed, hint: PLAIN, streaming: false
    } => "packed, a thread per 8 elements, each warp store 512 contiguous bytes";
    gather_dequant_u8_packed_x2: units8 {
        unroll: 2, one_pass: false, conversion: Packed, hint: PLAIN, streaming: false
    } => "packed, 2 units of 8 elements a thread loaded before any is stored";
    gather_dequant_u8_packed_x2_pass: units8 {
        unroll: 2, one_pass: true, conversion: Packed, hint: PLAIN, streaming: false
    } => "packed, 2 units a thread, a warp per tile (no grid-stride loop)";
    gather_dequant_u8_packed_pass: units8 {
        unroll: 1, one_pass: true, conversion: Packed, hint: PLAIN, streaming: false
    } => "packed, 1 unit a thread, a warp per tile (no grid-stride loop)";
    gather_dequant_u8_packed_x4: units8 {
        unroll: 4, one_pass: false, conversion: Packed, hint: PLAIN, streaming: false
    } => "packed, 4 units of 8 elements a thread loaded before any is stored";
    gather_dequant_u8_packed_x4_cs: units8 {
        unroll: 4, one_pass: false, conversion: Packed, hint: PLAIN, streaming: true
    } => "packed, 4 units a thread, streaming (evict-first) stores";
    gather_dequant_u8_packed_x4_stream: units8 {
        unroll: 4, one_pass: false, conversion: Packed, hint: STREAM, streaming: false
    } => "packed, 4 units a thread, weight loads skip L1 with 256-byte L2 fetches";
    gather_dequant_u8_cvt_x4: units8 {
        unroll: 4, one_pass: false, conversion: Hardware, hint: PLAIN, streaming: false
    } => "hardware conversion, 4 units of 8 elements a thread";
    gather_dequant_u8_packed_b64: units8 {
        unroll: 1, one_pass: false, conversion: Packed, hint: PLAIN, streaming: false, block: 64
    } => "packed, 1 unit a thread, blocks of 64 threads (a small call over more SMs)";
    gather_dequant_u8_packed_x2_b64: units8 {
        unroll: 2, one_pass: false, conversion: Packed, hint: PLAIN, streaming: false, block: 64
    } => "packed, 2 units a thread, blocks of 64 threads";
    gather_dequant_u8_packed_x2_pass_b64: units8 {
        unroll: 2, one_pass: true, conversion: Packed, hint: PLAIN, streaming: false, block: 64
    } => "packed, 2 units a thread, a warp per tile, blocks of 64 threads";
    gather_dequant_u8_packed_x8: units8 {
        unroll: 8, one_pass: false, conversion: Packed, hint: PLAIN, streaming: false
    } => "packed, 8 units of 8 elements a thread loaded before any is stored";
    gather_dequant_u8_packed_b128: units8 {
        unroll: 1, one_pass: false, conversion: Packed, hint: PLAIN, streaming: false, block: 128
    } => "packed, 1 unit a thread, blocks of 128 threads";
    gather_dequant_u8_packed_pass_b128: units8 {
        unroll: 1, one_pass: true, conversion: Packed, hint: PLAIN, streaming: false, block: 128
    } => "packed, 1 unit a thread, a warp per tile, blocks of 128 threads";
    gather_dequant_u8_packed_x2_pass_b128: units8 {
        unroll: 2, one_pass: true, conversion: Packed, hint: PLAIN, streaming: false, block: 128
    } => "packed, 2 units a thread, a warp per tile, blocks of 128 threads";
    gather_dequant_unit_pass_b64: unit_pass { conversion: Packed, block: 64 }
        => "packed, a thread per unit in one pass, loads and stores predicated, blocks of 64";
    gather_dequant_unit_pass_b128: unit_pass { conversion: Packed, block: 128 }
        => "packed, a thread per unit in one pass, loads and stores predicated, blocks of 128";
    gather_dequant_unit_pass_b256: unit_pass { conversion: Packed, block: 256 }
        => "packed, a thread per unit in one pass, loads and stores predicated, blocks of 256";
    gather_dequant_unit_pass_cvt_b128: unit_pass { conversion: Hardware, block: 128 }
        => "hardware conversion, a thread per unit in one pass, predicated, blocks of 128";
    gather_dequant_chunk_pass_b64: chunk_pass { conversion: Packed, block: 64 }
        => "packed, a thread per 16 elements in one pass, predicated, blocks of 64";
    gather_dequant_chunk_pass_b128: chunk_pass { conversion: Packed, block: 128 }
        => "packed, a thread per 16 elements in one pass, predicated, blocks of 128";
    gather_dequant_chunk_pass_cvt_b64: chunk_pass { conversion: Hardware, block: 64 }
        => "hardware conversion, a thread per 16 elements in one pass, blocks of 64";
    gather_dequant_quad_pass_b128: quad_pass { conversion: Packed, block: 128 }
        => "packed, a thread per 4 elements in one pass, predicated, blocks of 128";
    gather_dequant_quad_pass_b256: quad_pass { conversion: Packed, block: 256 }
        => "packed, a thread per 4 elements in one pass, predicated, blocks of 256";
    gather_dequant_quad_pass_cvt_b256: quad_pass { conversion: Hardware, block: 256 }
        => "hardware conversion, a thread per 4 elements in one pass, blocks of 256";
    gather_dequant_rows2_w2: rows_tile { conversion: Packed, rows: 2, warps: 2 }
        => "packed, 2 rows a warp in one pass, the warp's ids in one load, blocks of 64";
    gather_dequant_rows4_w1: rows_tile { conversion: Packed, rows: 4, warps: 1 }
        => "packed, 4 rows a warp in one pass, the warp's ids in one load, blocks of 32";
    gather_dequant_rows4_w2: rows_tile { conversion: Packed, rows: 4, warps: 2 }
        => "packed, 4 rows a warp in one pass, the warp's ids in one load, blocks of 64";
}

// The decode-size one-pass variants built for rows of 256 elements (the product's MXFP8 rows):
// the split of a thread's index into row and unit, and every row offset, fold to shifts. (The
// large calls' `chunk_pass` variants keep one build: their time is the bytes they move.)
width_builds! {
    params: DequantParams, width: 256;
    gather_dequant_unit_pass_b64: sm_80
        => kernels::gather_dequant_pass::<{ kernels::PACKED }, 64, 256, 8>;
    gather_dequant_unit_pass_b128: sm_80
        => kernels::gather_dequant_pass::<{ kernels::PACKED }, 128, 256, 8>;
    gather_dequant_unit_pass_b256: sm_80
        => kernels::gather_dequant_pass::<{ kernels::PACKED }, 256, 256, 8>;
    gather_dequant_quad_pass_b128: sm_80
        => kernels::gather_dequant_pass::<{ kernels::PACKED }, 128, 256, 4>;
    gather_dequant_quad_pass_b256: sm_80
        => kernels::gather_dequant_pass::<{ kernels::PACKED }, 256, 256, 4>;
    // The Triton peer's conversion (e4m3x2 to f16x2 in hardware, an f32 scale multiply) in the
    // peer's decode tiles: 8 elements a thread in blocks of 128 (its ROWS = 4 on 4 warps), 4
    // in blocks of 256.
    gather_dequant_unit_pass_cvt_b128: sm_89
        => kernels::gather_dequant_pass::<{ kernels::HARDWARE }, 128, 256, 8>;
    gather_dequant_quad_pass_cvt_b256: sm_89
        => kernels::gather_dequant_pass::<{ kernels::HARDWARE }, 256, 256, 4>;
}

variant_handle!(DequantVariant, "gather + dequant");

#[cfg(target_arch = "nvptx64")]
pub(crate) mod kernels {
    use super::{Conversion, ELEMS_PER_THREAD};
    use crate::device::{
        block, e4m3x2_to_f16x2, f16_to_f32, f32x2_to_bf16x2, global_thread, grid_threads,
        load_4_if, load_8_if, load_16_if, load_hinted_8, load_hinted_16, load_i64, load_i64_early,
        load_i64_if, load_u8, load_u8_if, mul_bf16x2, permute_bytes, prefetch_l2, prefetch_line_l2,
        record_bad_id, store_8_if, store_16, store_16_if, store_16_streaming, thread_in_block,
    };
    use crate::mxfp8::{BF16_NAN, E8M0_NAN};
    use crate::params::{DequantParams, MX_BLOCK};
    use crate::warp_rows::WarpRows;
    use core::num::NonZeroU32;

    // `Conversion` as const-generic values.
    pub(super) const PACKED: u8 = Conversion::Packed as u8;
    pub(super) const HARDWARE: u8 = Conversion::Hardware as u8;

    /// E8M0 for 2^0.
    pub(crate) const UNIT_SCALE: u8 = 127;

    /// The E8M0 scale as an f32 power of two (2^-127 is an f32 subnormal, still exact), the
    /// E8M0 NaN as f32's quiet NaN. Without a branch: `s << 23` is the exponent field, and bit 22
    /// set on it makes both ends, 2^-127 (`0x0040_0000`) from 0 and the NaN (`0x7fc0_0000`)
    /// from 255's infinity.
    #[inline(always)]
    fn scale_f32(s: u8) -> f32 {
        let end = ((s == 0) | (s == E8M0_NAN)) as u32;
        f32::from_bits(((s as u32) << 23) | (end << 22))
    }

    /// Output word `k` (elements 2k and 2k+1) of a 16-element chunk, hardware conversion.
    #[inline(always)]
    fn word_hardware(w: [u32; 4], k: usize, scale: f32) -> u32 {
        let h = e4m3x2_to_f16x2((w[k / 2] >> (16 * (k % 2))) as u16);
        let lo = f16_to_f32(h as u16) * scale;
        let hi = f16_to_f32((h >> 16) as u16) * scale;
        f32x2_to_bf16x2(lo, hi)
    }

    /// bf16 2^120, twice: undoes the bias difference between E4M3 (7) and bf16 (127).
    const BF16X2_2_POW_120: u32 = 0x7B80_7B80;

    /// Output words `2q` and `2q + 1` (elements 4q..4q+4) of a chunk, packed path: each byte
    /// moved to the top of a 16-bit lane, its sign to bit 15 and the rest below it, is a bf16 of
    /// 2^-120 times the E4M3 value (normal or subnormal alike). `nan_scale` is `0x8080_8080` for
    /// the E8M0 NaN scale and 0 otherwise. Every code takes the same instructions: a NaN byte
    /// (low 7 bits all ones) or scale is patched in by a mask, never by a branch.
    #[inline(always)]
    fn words_packed(word: u32, scale2: u32, nan_scale: u32) -> (u32, u32) {
        let place = |lanes: u32| (lanes & 0x8000_8000) | ((lanes & 0x7F00_7F00) >> 4);
        let lo = place(permute_bytes(word, 0, 0x1404));
        let hi = place(permute_bytes(word, 0, 0x3424));
        let scaled = |v: u32| mul_bf16x2(mul_bf16x2(v, BF16X2_2_POW_120), scale2);
        // Bit 7 of a byte set where its low 7 bits are all ones: adding 1 carries into it there
        // and nowhere else (no carry leaves a byte).
        let nan = (((word & 0x7F7F_7F7F) + 0x0101_0101) & 0x8080_8080) | nan_scale;
        // Each 16-bit lane all ones where its byte is NaN (`prmt` replicating the byte's bit 7).
        let nan_lo = permute_bytes(nan, 0, 0x9988);
        let nan_hi = permute_bytes(nan, 0, 0xBBAA);
        let patch = |v: u32, mask: u32| (v & !mask) | (BF16X2_NAN & mask);
        (patch(scaled(lo), nan_lo), patch(scaled(hi), nan_hi))
    }

    /// bf16 NaN, twice.
    const BF16X2_NAN: u32 = (BF16_NAN as u32) << 16 | BF16_NAN as u32;

    /// The scale as a bf16 pair (2^-127 is a bf16 subnormal, still exact) and the NaN mask
    /// [`words_packed`] takes.
    #[inline(always)]
    fn scale_bf16x2(s: u8) -> (u32, u32) {
        let one = if s == 0 { 0x0040 } else { (s as u32) << 7 };
        let nan = if s == E8M0_NAN { 0x8080_8080 } else { 0 };
        (one | one << 16, nan)
    }

    /// The eight output words of a chunk, hardware conversion, each call spelled out so that
    /// `k` is a constant and the array stays in registers.
    #[inline(always)]
    fn convert_hardware(w: [u32; 4], s: u8) -> [u32; 8] {
        let scale = scale_f32(s);
        let word = |k: usize| word_hardware(w, k, scale);
        [
            word(0),
            word(1),
            word(2),
            word(3),
            word(4),
            word(5),
            word(6),
            word(7),
        ]
    }

    #[inline(always)]
    fn convert_packed(w: [u32; 4], s: u8) -> [u32; 8] {
        let (scale2, nan) = scale_bf16x2(s);
        let (a, b) = words_packed(w[0], scale2, nan);
        let (c, d) = words_packed(w[1], scale2, nan);
        let (e, f) = words_packed(w[2], scale2, nan);
        let (g, h) = words_packed(w[3], scale2, nan);
        [a, b, c, d, e, f, g, h]
    }

    /// The four output words of an 8-element unit.
    #[inline(always)]
    pub(crate) fn convert_unit<const CONVERSION: u8>(w: [u32; 2], s: u8) -> [u32; 4] {
        if CONVERSION == PACKED {
            let (scale2, nan) = scale_bf16x2(s);
            let (a, b) = words_packed(w[0], scale2, nan);
            let (c, d) = words_packed(w[1], scale2, nan);
            [a, b, c, d]
        } else {
            let scale = scale_f32(s);
            let w = [w[0], w[1], 0, 0];
            [
                word_hardware(w, 0, scale),
                word_hardware(w, 1, scale),
                word_hardware(w, 2, scale),
                word_hardware(w, 3, scale),
            ]
        }
    }

    /// The two output words of 4 elements (one weight word).
    #[inline(always)]
    fn convert_quad<const CONVERSION: u8>(w: u32, s: u8) -> [u32; 2] {
        if CONVERSION == PACKED {
            let (scale2, nan) = scale_bf16x2(s);
            let (a, b) = words_packed(w, scale2, nan);
            [a, b]
        } else {
            let scale = scale_f32(s);
            let w = [w, 0, 0, 0];
            [word_hardware(w, 0, scale), word_hardware(w, 1, scale)]
        }
    }

    /// Rows of `dim` elements as units of 8: unit `u` is unit `u % per_row` of row `u / per_row`.
    #[derive(Clone, Copy)]
    pub(crate) struct Units {
        pub per_row: u32,
        pow2: bool,
        shift: u32,
    }

    impl Units {
        #[inline(always)]
        pub(crate) fn new(dim: u32) -> Units {
            // At least 4 (the host refuses narrower rows), so the divisions cannot trap.
            Units::with_per_row((dim / 8).max(1))
        }

        /// Rows of `per_row` (at least 1) units of any width.
        #[inline(always)]
        pub(crate) fn with_per_row(per_row: u32) -> Units {
            Units {
                per_row,
                // Rows of a power-of-two number of units (dim 256: 32) split by shift and mask.
                pow2: per_row.is_power_of_two(),
                shift: per_row.trailing_zeros(),
            }
        }

        /// Unit `u`'s row and its unit within the row; u < n * per_row < 2^32, checked on the
        /// host.
        #[inline(always)]
        pub(crate) fn split(self, u: u64) -> (u64, u32) {
            let u = u as u32;
            if self.pow2 {
                ((u >> self.shift) as u64, u & (self.per_row - 1))
            } else {
                ((u / self.per_row) as u64, u % self.per_row)
            }
        }
    }

    /// The tile loop of [`Shape::Units8`](super::Shape::Units8), shared by its variants and the
    /// prefetcher's tagged gather (`crate::staged`): a warp per `32 * UNROLL` consecutive units
    /// of 8 elements (16 output bytes) of `n` rows of `dim`, lane `l` taking units `l + 32 j`.
    /// Each lane first computes `keys[j]` (`key`: what unit `u`'s row needs before its bytes
    /// are read, its id; `none` past the last unit), then runs `load` for each unit (unit `c` of
    /// row `i`'s 8 weight bytes into `w[j]` and its scale into `s[j]`, left as zero bytes at
    /// scale 2^0, a row of +0.0, for a bad row; `u < total` for a unit that exists; a row has
    /// `scales_per_row` scale bytes), and only then converts and runs `store` (unit `u`'s
    /// words `out`), so that `UNROLL` rows' bytes are in flight a lane and each store
    /// instruction of the warp writes 512 contiguous bytes of output.
    ///
    /// A macro, not a function taking closures: the kernels' bodies stay the loop itself, so
    /// that sharing it changed no dequant variant's PTX (a closure boundary reorders its
    /// blocks). The caller names the loop's bindings its blocks use.
    macro_rules! unit_tiles {
        (
            unroll: $unroll:expr, conversion: $conversion:expr, dim: $dim:expr, n: $n:expr,
            names: [
                $split:ident, $scales_per_row:ident, $total:ident, $u:ident, $j:ident, $i:ident,
                $c:ident, $w:ident, $s:ident
            ],
            keys: $keys:ident = [$none:expr] $key:block
            load: $load:block
            store: |$out:ident| $store:block
        ) => {{
            let units = $crate::dequant::kernels::Units::new($dim);
            let $split = |u: u64| units.split(u);
            let $scales_per_row = ($dim / $crate::params::MX_BLOCK) as u64;
            let $total = $n * units.per_row as u64;
            let lane = $crate::device::thread_in_block() % 32;
            let warps = $crate::device::grid_threads() / 32;
            let tile_units = 32 * $unroll as u64;
            let mut tile = $crate::device::global_thread() / 32;
            while tile * tile_units < $total {
                let base = tile * tile_units + lane as u64;
                let mut $keys = [$none; $unroll];
                let mut $w = [[0u32; 2]; $unroll];
                let mut $s = [$crate::dequant::kernels::UNIT_SCALE; $unroll];
                for $j in 0..$unroll {
                    let $u = base + 32 * $j as u64;
                    if $u < $total {
                        $keys[$j] = $key;
                    }
                }
                for $j in 0..$unroll {
                    let $u = base + 32 * $j as u64;
                    let ($i, $c) = $split($u);
                    $load
                }
                for $j in 0..$unroll {
                    let $u = base + 32 * $j as u64;
                    if $u < $total {
                        // A bad row converts zero bytes at scale 2^0: a row of +0.0.
                        let $out = $crate::dequant::kernels::convert_unit::<{ $conversion }>(
                            $w[$j], $s[$j],
                        );
                        $store
                    }
                }
                tile += warps;
            }
        }};
    }
    pub(crate) use unit_tiles;

    /// [`Shape::Units8`](super::Shape::Units8) ([`unit_tiles`]): each lane loads its units'
    /// ids, then their weights (8 bytes, with the variant's hint) and scales, then converts and
    /// stores.
    #[inline(always)]
    pub(super) unsafe fn gather_dequant_units<
        const UNROLL: usize,
        const CONVERSION: u8,
        const HINT: u8,
        const STREAM_STORE: bool,
    >(
        p: &DequantParams,
    ) {
        let valid = |id: i64| id >= 0 && (id as u64) < p.rows;
        unit_tiles! {
            unroll: UNROLL, conversion: CONVERSION, dim: p.dim, n: p.n as u64,
            names: [split, scales_per_row, total, u, j, i, c, w, s],
            keys: ids = [-1i64] {
                // SAFETY: u < total, so its row is below n and inside the ids array.
                unsafe { load_i64(p.ids + 8 * split(u).0) }
            }
            load: {
                if u < total && valid(ids[j]) {
                    let row = ids[j] as u64;
                    // SAFETY: row < rows and c < dim / 8: 8 bytes inside row `row` (8-byte
                    // aligned: rows are 16-byte aligned), and its scale byte.
                    unsafe {
                        w[j] = load_hinted_8::<HINT>(p.weights + row * p.dim as u64 + 8 * c as u64);
                        s[j] = load_u8(p.scales + row * scales_per_row + (c / 4) as u64);
                    }
                } else if u < total && c == 0 {
                    // SAFETY: the host passes the address of a live IdStatus.
                    unsafe { record_bad_id(p.status, i) };
                }
            }
            store: |out| {
                // SAFETY: unit u's 16 bytes of output, inside the n rows, owned by this
                // thread.
                unsafe {
                    if STREAM_STORE {
                        store_16_streaming(p.out + 16 * u, out)
                    } else {
                        store_16(p.out + 16 * u, out)
                    }
                }
            }
        }
    }

    /// The one-pass body of `ELEMS` elements a thread: a `unit_pass` variant (8: thread `t`
    /// converts unit `t`, 8 elements of output row `t / (dim / 8)`) or a `quad_pass` one (4: a
    /// quad of output row `t / (dim / 4)`), in straight-line code: its row's id, `ELEMS` weight
    /// bytes and its block's scale byte loaded under predicates (a bad or absent row reads
    /// nothing and converts zero bytes at scale 2^0, a row of +0.0), one predicated store of
    /// `2 * ELEMS` bytes, the bad-id record last. The host launches whole warps over
    /// `n * dim / ELEMS < 2^32` threads, in blocks of `BLOCK`. `DIM`: the row's elements as a
    /// constant (a width build's, the call's `dim`), 0 to read them from `p`.
    #[inline(always)]
    pub(super) unsafe fn gather_dequant_pass<
        const CONVERSION: u8,
        const BLOCK: u32,
        const DIM: u32,
        const ELEMS: u32,
    >(
        p: &DequantParams,
    ) {
        let dim = if DIM == 0 { p.dim } else { DIM };
        // At least 4 pieces a row (the host refuses rows narrower than 32), so the divisions
        // cannot trap.
        let pieces = Units::with_per_row((dim / ELEMS).max(1));
        let t = block() * BLOCK + thread_in_block();
        let live = (t as u64) < p.n as u64 * pieces.per_row as u64;
        let (i, c) = pieces.split(t as u64);
        // SAFETY: read only when `live`: i < n, inside the ids array.
        let id = unsafe { load_i64_if(p.ids + 8 * i, live) };
        let found = live && id >= 0 && (id as u64) < p.rows;
        let row = id as u64;
        // Closures, so that each address is computed where it is used (the PTX as when they were
        // written inline: each load's address just before it, the store's after the loads).
        let scales_per_row = (dim / MX_BLOCK) as u64;
        let weights = || p.weights + row.wrapping_mul(dim as u64) + (ELEMS * c) as u64;
        let scale =
            || p.scales + row.wrapping_mul(scales_per_row) + (c / (MX_BLOCK / ELEMS)) as u64;
        let out = || p.out + 2 * ELEMS as u64 * t as u64;
        // SAFETY: read only when `found`: row < rows and c < dim / ELEMS, the piece's ELEMS
        // bytes inside row `row` (aligned to ELEMS: rows are 16-byte aligned) and its block's
        // scale byte; written only when `live`: piece t's output, by this thread alone.
        unsafe {
            if ELEMS == 4 {
                let (w, s) = (
                    load_4_if(weights(), found),
                    load_u8_if(scale(), found, UNIT_SCALE),
                );
                let v = convert_quad::<CONVERSION>(w, s);
                store_8_if(out(), v, live);
            } else {
                let (w, s) = (
                    load_8_if(weights(), found),
                    load_u8_if(scale(), found, UNIT_SCALE),
                );
                let v = convert_unit::<CONVERSION>(w, s);
                store_16_if(out(), v, live);
            }
        }
        if live && !found && c == 0 {
            // SAFETY: the host passes the address of a live IdStatus.
            unsafe { record_bad_id(p.status, i) };
        }
    }

    /// A `chunk_pass` variant: thread `t` converts chunk `t` (16 elements of output row
    /// `t / (dim / 16)`) in straight-line code, as [`gather_dequant_pass`] does a unit: the
    /// row's id, 16 weight bytes and scale byte loaded under predicates, two predicated 16-byte
    /// stores, the bad-id record last. The host launches whole warps over `n * dim / 16 < 2^32`
    /// chunks, in blocks of `BLOCK` threads.
    #[inline(always)]
    pub(super) unsafe fn gather_dequant_chunk_pass<const CONVERSION: u8, const BLOCK: u32>(
        p: &DequantParams,
    ) {
        // At least 2 (the host refuses rows narrower than 32), so the divisions cannot trap.
        let chunks = Units::with_per_row((p.dim / ELEMS_PER_THREAD).max(1));
        let t = block() * BLOCK + thread_in_block();
        let live = (t as u64) < p.n as u64 * chunks.per_row as u64;
        let (i, c) = chunks.split(t as u64);
        // SAFETY: read only when `live`: i < n, inside the ids array.
        let id = unsafe { load_i64_if(p.ids + 8 * i, live) };
        let found = live && id >= 0 && (id as u64) < p.rows;
        let row = id as u64;
        let scales_per_row = (p.dim / MX_BLOCK) as u64;
        // SAFETY: read only when `found`: row < rows and c < dim / 16, 16 bytes inside row `row`
        // (16-byte aligned: rows are 16-byte aligned) and the scale byte of its MX block.
        let (w, s) = unsafe {
            (
                load_16_if(
                    p.weights + row.wrapping_mul(p.dim as u64) + 16 * c as u64,
                    found,
                ),
                load_u8_if(
                    p.scales + row.wrapping_mul(scales_per_row) + (c / 2) as u64,
                    found,
                    UNIT_SCALE,
                ),
            )
        };
        let out = match CONVERSION {
            PACKED => convert_packed(w, s),
            _ => convert_hardware(w, s),
        };
        let dest = p.out + 32 * t as u64;
        // SAFETY: written only when `live`: chunk t's 32 bytes of output, by this thread alone.
        unsafe {
            store_16_if(dest, [out[0], out[1], out[2], out[3]], live);
            store_16_if(dest + 16, [out[4], out[5], out[6], out[7]], live);
        }
        if live && !found && c == 0 {
            // SAFETY: the host passes the address of a live IdStatus.
            unsafe { record_bad_id(p.status, i) };
        }
    }

    /// A `rows_tile` variant ([`WarpRows`]): each lane converts unit `c` (8 elements) of each
    /// of its warp's `ROWS` rows, `c = lane` (and `lane + 32 j` for rows wider than 256). Each
    /// row's 8 weight bytes and scale byte are loaded under predicates (a bad or absent row
    /// reads nothing and converts zero bytes at scale 2^0, a row of +0.0), all `ROWS` rows
    /// before any is converted, one predicated 16-byte store a unit, the bad-id records last.
    /// The host launches whole blocks of `32 WARPS` threads over `n` rows, `ROWS` a warp.
    #[inline(always)]
    pub(super) unsafe fn gather_dequant_rows_tile<
        const ROWS: usize,
        const WARPS: u32,
        const CONVERSION: u8,
    >(
        p: &DequantParams,
    ) {
        // SAFETY: the host passes n ids at p.ids.
        let tile = unsafe { WarpRows::<ROWS>::load::<WARPS>(p.ids, p.n as u64, p.rows) };
        let per_row = (p.dim / 8).max(1);
        let scales_per_row = (p.dim / MX_BLOCK) as u64;
        tile.each_part(per_row, |c| {
            let unit = c < per_row;
            let mut w = [[0u32; 2]; ROWS];
            let mut s = [UNIT_SCALE; ROWS];
            for k in 0..ROWS {
                let row = tile.ids[k] as u64;
                let read = unit & tile.found(k);
                // SAFETY: read only when `read`: row < rows and c < dim / 8, 8 bytes inside
                // row `row` (8-byte aligned: rows are 16-byte aligned) and its scale byte.
                unsafe {
                    w[k] = load_8_if(
                        p.weights + row.wrapping_mul(p.dim as u64) + 8 * c as u64,
                        read,
                    );
                    s[k] = load_u8_if(
                        p.scales + row.wrapping_mul(scales_per_row) + (c / 4) as u64,
                        read,
                        UNIT_SCALE,
                    );
                }
            }
            for k in 0..ROWS {
                let i = tile.first + k as u64;
                let out = convert_unit::<CONVERSION>(w[k], s[k]);
                let dest = p.out + 16 * (i * per_row as u64 + c as u64);
                // SAFETY: written only when row i < n and c < dim / 8: unit c of output row
                // i, by this thread alone.
                unsafe { store_16_if(dest, out, unit & tile.live(k)) };
            }
        });
        // SAFETY: the host passes the address of a live IdStatus.
        unsafe { tile.record_bad_ids(p.status) };
    }

    #[inline(always)]
    pub(super) unsafe fn gather_dequant<const CONVERSION: u8, const AHEAD: bool, const HINT: u8>(
        p: &DequantParams,
    ) {
        // At least 1 (the host refuses narrower rows), as a type whose divisions need no zero
        // check (with `max(1)` LLVM kept a trap for sm_121a once `n` and `dim` shared a word).
        let chunks = NonZeroU32::new(p.dim / ELEMS_PER_THREAD).unwrap_or(NonZeroU32::MIN);
        let scales_per_row = (p.dim / MX_BLOCK) as u64;
        let total = p.n as u64 * chunks.get() as u64;
        let stride = grid_threads();
        // t < n * chunks < 2^32, checked on the host.
        let split = |t: u64| ((t as u32 / chunks) as u64, t as u32 % chunks);
        let id_of = |t: u64| {
            // SAFETY: t < total, so its row is below n and inside the ids array.
            if t < total {
                unsafe { load_i64_early(p.ids + 8 * split(t).0) }
            } else {
                -1
            }
        };
        let valid = |id: i64| id >= 0 && (id as u64) < p.rows;
        let mut t = global_thread();
        // With AHEAD: the id of this thread's coming chunk, loaded one step early.
        let mut next_id_slot = if AHEAD { id_of(t) } else { 0 };
        while t < total {
            let (i, c) = split(t);
            let id = if AHEAD {
                // The next chunk's id now; its row asked of L2 by the thread that will convert
                // the row's first chunk.
                let next = t + stride;
                let next_id = id_of(next);
                if next < total && split(next).1 == 0 && valid(next_id) {
                    let row = next_id as u64;
                    // SAFETY: row < rows: the weight row (a multiple of 32 bytes at a 16-byte
                    // aligned base) and its scales lie in the table.
                    unsafe {
                        prefetch_l2(p.weights + row * p.dim as u64, p.dim);
                        prefetch_line_l2(p.scales + row * scales_per_row);
                    }
                }
                core::mem::replace(&mut next_id_slot, next_id)
            } else {
                // SAFETY: i < n, so ids + 8 i lies in the ids array.
                unsafe { load_i64(p.ids + 8 * i) }
            };
            // A bad id converts zero bytes at scale 2^0: a row of +0.0.
            let (w, s) = if valid(id) {
                let elem = id as u64 * p.dim as u64 + (c * ELEMS_PER_THREAD) as u64;
                // SAFETY: id < rows and c < dim / 16, so both reads lie inside row `id`.
                unsafe {
                    (
                        load_hinted_16::<HINT>(p.weights + elem),
                        load_u8(p.scales + id as u64 * scales_per_row + (c / 2) as u64),
                    )
                }
            } else {
                if c == 0 {
                    // SAFETY: the host passes the address of a live IdStatus.
                    unsafe { record_bad_id(p.status, i) };
                }
                ([0; 4], UNIT_SCALE)
            };
            let out = match CONVERSION {
                PACKED => convert_packed(w, s),
                _ => convert_hardware(w, s),
            };
            let dest = p.out + 2 * (i * p.dim as u64 + (c * ELEMS_PER_THREAD) as u64);
            // SAFETY: 32 bytes of output row i < n, owned by this thread.
            unsafe {
                store_16(dest, [out[0], out[1], out[2], out[3]]);
                store_16(dest + 16, [out[4], out[5], out[6], out[7]]);
            }
            t += stride;
        }
    }
}
