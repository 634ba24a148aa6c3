//! fetchahead's GPU kernels and everything the host shares with them.
//!
//! The same crate compiles for `nvptx64-nvidia-cuda` (the kernels, built to PTX) and for the
//! host, where only the `#[repr(C)]` parameter structs, the variant tables and the kernel list
//! exist. Those are the one definition of the launch ABI; the host never copies them.
//!
//! Its kernels make two PTX modules ([`Module`]): the product's, which engines load (the
//! product's `build.rs` compiles it), and the lab's (the simulation's readers, hasher, compute
//! and collective stand-ins), which only `fetchahead-lab` loads (`lab/build.rs` compiles it with
//! `--cfg fetchahead_lab`). Each PTX build compiles only its own module's families; the host
//! sees every family, so that one list declares the entries of both.
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_gpu_kernel, asm_experimental_arch, stdarch_nvptx)
)]
// Kernels take one `#[repr(C)]` struct of u64/u32 fields by value (a `.param .b8[N]` array);
// build.rs checks every entry's parameter size against the host's `size_of`.
#![cfg_attr(target_arch = "nvptx64", allow(improper_gpu_kernel_arg))]
// A PTX older than sm_90 leaves out the kernels that need it (`fetchahead_sm90`, set by
// build.rs); their helpers are then unused there.
#![cfg_attr(
    all(target_arch = "nvptx64", not(fetchahead_sm90)),
    allow(dead_code, unused_imports)
)]

/// The oldest arch fetchahead builds PTX for: every kernel that needs nothing newer is in it.
pub const BASELINE_SM: u32 = 80;

/// The SM number of an arch tier a kernel needs: `sm_80` (nothing newer than the baseline),
/// `sm_89` (FP8 conversion instructions), `sm_90` (bulk copies and prefetches, clusters).
macro_rules! sm_number {
    (sm_80) => {
        80
    };
    (sm_89) => {
        89
    };
    (sm_90) => {
        90
    };
}

/// The threads a block of a variant's launch, from its declaration's tokens: the value of a
/// `block: N` among them, [`gather::BLOCK_THREADS`] without one.
macro_rules! block_of {
    () => {
        $crate::gather::BLOCK_THREADS
    };
    (block: $b:literal $($rest:tt)*) => {
        $b
    };
    ($skip:tt $($rest:tt)*) => {
        block_of!($($rest)*)
    };
}

/// `$item`, compiled only into the PTX of archs at least `$tier` (build.rs sets the
/// `fetchahead_sm89` and `fetchahead_sm90` cfgs by the arch it builds).
#[cfg(target_arch = "nvptx64")]
macro_rules! for_tier {
    ({ $($item:tt)* } sm_80) => {
        $($item)*
    };
    ({ $($item:tt)* } sm_89) => {
        #[cfg(fetchahead_sm89)]
        $($item)*
    };
    ({ $($item:tt)* } sm_90) => {
        #[cfg(fetchahead_sm90)]
        $($item)*
    };
}

/// Declares a kernel family's variants, each once: its name, what it does and its parameters.
/// From the one declaration it emits the family's `VARIANTS` row (on the host and the device)
/// and, for `nvptx64`, the `#[unsafe(no_mangle)]` entry of that name calling the family's generic
/// body. `$row!(name, about, kind { args })` builds the row and `$body!(p, kind { args })` the
/// body's call, both from the same `kind { args }` tokens, so a row's shape and its kernel's
/// const generics cannot disagree. `$needs!(then!(..) kind { args })` names, from the same
/// tokens, the arch tier the variant's instructions need (`sm_80`, `sm_89`, `sm_90`): the
/// family's `NEEDS` row, and the entry compiled only into the PTX of archs that have them.
macro_rules! variants {
    (
        params: $params:ident, row: $row:ident, body: $body:ident, needs: $needs:ident;
        $(
            $(#[$doc:meta])*
            $name:ident: $kind:ident { $($arg:tt)* } => $about:literal;
        )*
    ) => {
        pub const VARIANTS: &[Variant] = &[
            $( $row!(stringify!($name), $about, $kind { $($arg)* }), )*
        ];

        /// Each variant's twin that records the device timeline (`VARIANTS[i]`'s is `TIMED[i]`).
        pub const TIMED: &[&str] = &[ $( concat!(stringify!($name), "_timed"), )* ];

        /// The oldest SM whose PTX holds each variant and its twin (`VARIANTS[i]`'s is
        /// `NEEDS[i]`): what its instructions need.
        pub const NEEDS: &[u32] = &[ $( $needs!(sm_number!() $kind { $($arg)* }), )* ];

        /// Each variant's entry as the kernel list ([`crate::all_kernels`]) holds it: the same
        /// name, description and needs as its row, and the size of its parameter block.
        pub const KERNELS: &[crate::Declared] = &[
            $( crate::Declared {
                name: stringify!($name),
                about: $about,
                needs: $needs!(sm_number!() $kind { $($arg)* }),
                param_bytes: core::mem::size_of::<crate::params::$params>(),
                block_threads: None,
            }, )*
        ];

        #[cfg(target_arch = "nvptx64")]
        mod entries {
            $( $needs!(for_tier!({
                variant_entry!(plain, $body, $params, [$(#[$doc])*] $name, $kind { $($arg)* });
            }) $kind { $($arg)* }); )*
        }

        #[cfg(target_arch = "nvptx64")]
        mod timed_entries {
            $( $needs!(for_tier!({
                variant_entry!(timed, $body, $params, [$(#[$doc])*] $name, $kind { $($arg)* });
            }) $kind { $($arg)* }); )*
        }
    };
}

/// A variant's build for one row width, declared by [`width_builds!`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WidthBuild {
    /// The variant it builds.
    pub of: &'static str,
    /// Its entry: `{of}_w{width}`.
    pub name: &'static str,
    /// The only row width it runs: a gather's row bytes, a dequant's elements a row.
    pub width: u32,
}

/// Declares a family's builds of some of its variants for one row width (the product's rows:
/// 256 bytes, 256 elements): the variant's body with the width a compile-time constant, so that
/// its index arithmetic folds to shifts and masks and nothing before its first load waits on a
/// width read from the parameters, as Triton specializes a kernel on its `constexpr` width.
/// The host launches the build in place of its variant whenever a call's width is the build's
/// (same name to callers, same results); any other width runs the variant as declared. Emits
/// `WIDTH_BUILDS`, `WIDTH_KERNELS` and `WIDTH_TIMED` (the kernel list's rows and `_timed`
/// twins) and, for `nvptx64`, both entries of each build (`$body` named from the family's
/// module), in the PTX of archs at least the declared tier (a const check holds it equal to
/// the variant's).
macro_rules! width_builds {
    (
        params: $params:ident, width: $width:literal;
        $( $variant:ident: $tier:ident => $body:expr; )*
    ) => {
        pub const WIDTH_BUILDS: &[crate::WidthBuild] = &[
            $( crate::WidthBuild {
                of: stringify!($variant),
                name: concat!(stringify!($variant), "_w", stringify!($width)),
                width: $width,
            }, )*
        ];

        /// Each build's row of the kernel list (`WIDTH_BUILDS[i]`'s is `WIDTH_KERNELS[i]`).
        pub const WIDTH_KERNELS: &[crate::Declared] = &[
            $( crate::Declared {
                name: concat!(stringify!($variant), "_w", stringify!($width)),
                about: concat!(
                    "as ", stringify!($variant), ", built for rows of width ", stringify!($width),
                    " (launched in its place for them)"
                ),
                needs: sm_number!($tier),
                param_bytes: core::mem::size_of::<crate::params::$params>(),
                // The block size of the variant's shape, which the build's body takes as a
                // constant.
                block_threads: Some(
                    VARIANTS[built_variant(stringify!($variant))].shape.block_threads()
                ),
            }, )*
        ];

        /// The index of the variant named `name` in `VARIANTS` (and `KERNELS`, its rows in the
        /// kernel list); fails the build when there is none.
        const fn built_variant(name: &str) -> usize {
            let mut k = 0;
            while !crate::const_str_eq(VARIANTS[k].name, name) {
                k += 1;
            }
            k
        }

        /// Each build's twin that records the device timeline.
        pub const WIDTH_TIMED: &[&str] = &[
            $( concat!(stringify!($variant), "_w", stringify!($width), "_timed"), )*
        ];

        // A build needs what its variant needs: it is the same body.
        const _: () = {
            let mut i = 0;
            while i < WIDTH_BUILDS.len() {
                let k = built_variant(WIDTH_BUILDS[i].of);
                assert!(KERNELS[k].needs == WIDTH_KERNELS[i].needs);
                i += 1;
            }
        };

        #[cfg(target_arch = "nvptx64")]
        mod width_entries {
            #[allow(unused_imports)]
            use super::*;
            $( for_tier!({
                #[unsafe(export_name = concat!(stringify!($variant), "_w", stringify!($width)))]
                pub unsafe extern "gpu-kernel" fn $variant(p: crate::params::$params) {
                    // SAFETY: the host launches a build only with parameters it validated, of
                    // rows of its width.
                    unsafe { $body(&p) }
                }
            } $tier); )*
        }

        #[cfg(target_arch = "nvptx64")]
        mod width_timed_entries {
            #[allow(unused_imports)]
            use super::*;
            $( for_tier!({
                #[unsafe(export_name = concat!(
                    stringify!($variant), "_w", stringify!($width), "_timed"
                ))]
                pub unsafe extern "gpu-kernel" fn $variant(p: crate::params::$params) {
                    // SAFETY: as the plain build's.
                    timed!(p, unsafe { $body(&p) })
                }
            } $tier); )*
        }
    };
}

/// Wraps a kernel body in `timeline::device::begin` and `end` on `$p.timeline`: the `_timed`
/// twin of every instrumented entry (the [`variants!`] ones and the hand-written ones) records
/// its blocks. The plain entry stays as it was, so the timeline costs nothing when off.
#[cfg(target_arch = "nvptx64")]
macro_rules! timed {
    ($p:ident, $body:expr) => {{
        // SAFETY: the host passes 0 or a live ring it allocated with a power-of-two capacity.
        unsafe { $crate::timeline::device::begin(&$p.timeline) };
        $body;
        // SAFETY: every thread reaches this after its body, and `begin` ran above.
        unsafe { $crate::timeline::device::end(&$p.timeline) };
    }};
}

/// One entry of [`variants!`] (`plain`, or its `timed` twin named `{name}_timed`). A
/// `hand_written { .. }` variant has only its row here: its entry and its twin are written
/// beside its helpers under the same names (build.rs fails the build if it is not an
/// entry of the PTX), for a body that no parameter of the row feeds.
#[cfg(target_arch = "nvptx64")]
macro_rules! variant_entry {
    ($t:ident, $body:ident, $params:ident, [$(#[$doc:meta])*] $name:ident, hand_written { $($arg:tt)* }) => {};
    (plain, $body:ident, $params:ident, [$(#[$doc:meta])*] $name:ident, $kind:ident { $($arg:tt)* }) => {
        $(#[$doc])*
        #[unsafe(no_mangle)]
        pub unsafe extern "gpu-kernel" fn $name(p: crate::params::$params) {
            // SAFETY: the host launches an entry only with parameters it validated.
            unsafe { $body!(p, $kind { $($arg)* }) }
        }
    };
    (timed, $body:ident, $params:ident, [$(#[$doc:meta])*] $name:ident, $kind:ident { $($arg:tt)* }) => {
        $(#[$doc])*
        #[unsafe(export_name = concat!(stringify!($name), "_timed"))]
        pub unsafe extern "gpu-kernel" fn $name(p: crate::params::$params) {
            // SAFETY: the host launches an entry only with parameters it validated.
            timed!(p, unsafe { $body!(p, $kind { $($arg)* }) })
        }
    };
}

/// A family's variant handle: `$handle(u8)`, always a row of the family's `VARIANTS`, resolved
/// once from a name (or checked from an index), so code that holds one never checks it again.
/// Also `find`, the index of a name. Host code only: it generates no kernel code.
macro_rules! variant_handle {
    ($handle:ident, $family:literal) => {
        /// The index in [`VARIANTS`] of the variant named `name`.
        pub fn find(name: &str) -> Option<usize> {
            VARIANTS.iter().position(|v| v.name == name)
        }

        #[doc = concat!("A ", $family, " variant, resolved once from its name: always a row of")]
        /// [`VARIANTS`], so code that holds one never checks it again.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct $handle(u8);

        impl $handle {
            /// The variant named `name`, if [`VARIANTS`] has one.
            pub fn named(name: &str) -> Option<Self> {
                find(name).map(|i| Self(i as u8))
            }

            /// The variant at `index` in [`VARIANTS`], if there is one (a checked constructor
            /// for an index from outside Rust).
            pub fn at(index: usize) -> Option<Self> {
                (index < VARIANTS.len()).then_some(Self(index as u8))
            }

            /// The variant named `name`, resolved at compile time (a const item fails to build
            /// when no row has that name).
            pub const fn must(name: &str) -> Self {
                let mut i = 0;
                while i < VARIANTS.len() {
                    if $crate::const_str_eq(VARIANTS[i].name, name) {
                        return Self(i as u8);
                    }
                    i += 1;
                }
                panic!(concat!("no ", $family, " variant of that name"))
            }

            /// Every variant, in table order.
            pub fn all() -> impl Iterator<Item = Self> {
                (0..VARIANTS.len()).map(|i| Self(i as u8))
            }

            /// Its index in [`VARIANTS`].
            pub const fn index(self) -> usize {
                self.0 as usize
            }

            /// Its row of [`VARIANTS`].
            pub const fn variant(self) -> &'static Variant {
                &VARIANTS[self.0 as usize]
            }

            /// Its kernel's name.
            pub const fn name(self) -> &'static str {
                self.variant().name
            }
        }

        impl core::fmt::Display for $handle {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str(self.name())
            }
        }

        const _: () = assert!(VARIANTS.len() <= u8::MAX as usize);
    };
}

/// `a == b` in a const context.
pub(crate) const fn const_str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

// The product's families, in the product's PTX and never in the lab's.
#[cfg(not(all(target_arch = "nvptx64", fetchahead_lab)))]
pub mod check;
#[cfg(not(all(target_arch = "nvptx64", fetchahead_lab)))]
pub mod defaults;
#[cfg(not(all(target_arch = "nvptx64", fetchahead_lab)))]
pub mod dequant;
#[cfg(not(all(target_arch = "nvptx64", fetchahead_lab)))]
pub mod gather;
#[cfg(not(all(target_arch = "nvptx64", fetchahead_lab)))]
pub mod l2_prefetch;
#[cfg(not(all(target_arch = "nvptx64", fetchahead_lab)))]
pub mod mxfp8;
#[cfg(not(all(target_arch = "nvptx64", fetchahead_lab)))]
pub mod staged;

// The lab's families, in the lab's PTX only.
#[cfg(any(not(target_arch = "nvptx64"), fetchahead_lab))]
pub mod collective;
#[cfg(any(not(target_arch = "nvptx64"), fetchahead_lab))]
pub mod gemv;
#[cfg(any(not(target_arch = "nvptx64"), fetchahead_lab))]
pub mod hash;
#[cfg(any(not(target_arch = "nvptx64"), fetchahead_lab))]
pub mod spin;

// Shared by both modules.
pub mod params;
pub mod timeline;

#[cfg(all(target_arch = "nvptx64", fetchahead_lab))]
mod cluster;
#[cfg(target_arch = "nvptx64")]
mod device;
#[cfg(target_arch = "nvptx64")]
mod smem;
#[cfg(not(all(target_arch = "nvptx64", fetchahead_lab)))]
pub mod warp_rows;

/// The PTX module a kernel is compiled into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Module {
    /// The product's kernels: what an engine loads (`fetchahead::Kernels`).
    Product,
    /// The lab's: the simulation's GEMV readers, hasher, compute and collective stand-ins, which
    /// only `fetchahead-lab` loads, beside the product's.
    Lab,
}

impl Module {
    pub const ALL: [Module; 2] = [Module::Product, Module::Lab];

    /// `product` or `lab`: how `fetchahead kernels` and `fetchahead ptx --module` name it.
    pub const fn name(self) -> &'static str {
        match self {
            Module::Product => "product",
            Module::Lab => "lab",
        }
    }

    /// The module named `name` (`product` or `lab`).
    pub fn named(name: &str) -> Option<Module> {
        Module::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// A kernel entry point as its declaration states it: its name, what it does (for `fetchahead
/// kernels`), the oldest SM whose PTX holds it (80, 89 or 90: what its instructions need), and
/// the size of the one parameter struct it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Declared {
    pub name: &'static str,
    pub about: &'static str,
    pub needs: u32,
    pub param_bytes: usize,
    /// The block size its PTX requires (`.reqntid`, written in by build.rs), for entries whose
    /// body fixes it; a launch with any other fails. `None`: set at launch.
    pub block_threads: Option<u32>,
}

#[cfg(not(target_arch = "nvptx64"))]
impl Declared {
    /// A hand-written entry (no [`variants!`] table) of parameter struct `P`.
    const fn of<P>(name: &'static str, about: &'static str, needs: u32) -> Declared {
        Declared {
            name,
            about,
            needs,
            param_bytes: core::mem::size_of::<P>(),
            block_threads: None,
        }
    }
}

/// A kernel entry point the host may load: its declaration, its module, and for a `_timed` twin
/// the kernel it records (`about` then says so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub module: Module,
    pub name: &'static str,
    pub param_bytes: usize,
    pub about: &'static str,
    /// The oldest SM whose PTX holds it (80, 89 or 90): what its instructions need.
    pub needs: u32,
    /// The kernel a `_timed` twin records; `None` for a plain kernel.
    pub twin_of: Option<&'static str>,
    /// The block size its PTX requires (`.reqntid`), as declared ([`Declared::block_threads`]).
    pub block_threads: Option<u32>,
}

/// An arch as build.rs and the host name it, split: `sm_121a` -> (121, true), `sm_90` ->
/// (90, false); the flag says arch-specific (`a`) PTX, which loads on exactly that arch.
#[cfg(not(target_arch = "nvptx64"))]
pub fn parse_arch(arch: &str) -> Option<(u32, bool)> {
    let digits = arch.strip_prefix("sm_")?;
    let (digits, specific) = match digits.strip_suffix('a') {
        Some(d) => (d, true),
        None => (digits, false),
    };
    Some((digits.parse().ok()?, specific))
}

/// A family's entries as the list holds them: its declared kernels and their `_timed` twins
/// (`timed[i]` records `kernels[i]`; a family without a timeline has none).
#[cfg(not(target_arch = "nvptx64"))]
struct Family {
    module: Module,
    kernels: &'static [Declared],
    timed: &'static [&'static str],
}

#[cfg(not(target_arch = "nvptx64"))]
const BASE: u32 = BASELINE_SM;

/// Every kernel family, each once: the [`variants!`] tables as they declare them, and the
/// hand-written entries with their constants' names. build.rs fails the build for a PTX entry
/// that no family here declares, so an entry cannot be missed.
#[cfg(not(target_arch = "nvptx64"))]
const FAMILIES: &[Family] = &[
    Family {
        module: Module::Product,
        kernels: gather::KERNELS,
        timed: gather::TIMED,
    },
    Family {
        module: Module::Product,
        kernels: &[Declared::of::<params::GatherParams>(
            gather::EMPTY_KERNEL,
            "does nothing: the launch-cost floor for benches",
            BASE,
        )],
        timed: &[],
    },
    Family {
        module: Module::Product,
        kernels: dequant::KERNELS,
        timed: dequant::TIMED,
    },
    Family {
        module: Module::Product,
        kernels: gather::WIDTH_KERNELS,
        timed: gather::WIDTH_TIMED,
    },
    Family {
        module: Module::Product,
        kernels: dequant::WIDTH_KERNELS,
        timed: dequant::WIDTH_TIMED,
    },
    Family {
        module: Module::Product,
        kernels: &[Declared::of::<params::StagedParams>(
            staged::KERNEL,
            "gather + dequant of staged rows that waits in the kernel for each row's tag (the \
             prefetcher's Join::Tags)",
            BASE,
        )],
        timed: &[staged::KERNEL_TIMED],
    },
    Family {
        module: Module::Product,
        kernels: &[Declared::of::<params::CheckParams>(
            check::KERNEL,
            "counts launches whose two bf16 buffers differ (the prefetcher's check mode)",
            BASE,
        )],
        timed: &[],
    },
    Family {
        module: Module::Product,
        kernels: l2_prefetch::KERNELS,
        timed: l2_prefetch::TIMED,
    },
    Family {
        module: Module::Product,
        kernels: &[Declared::of::<params::PartitionProbeParams>(
            l2_prefetch::PARTITION_PROBE_KERNEL,
            "times each SM's L2 hits on lines SM 0 read: tells the L2 partitions apart",
            BASE,
        )],
        timed: &[],
    },
    Family {
        module: Module::Lab,
        kernels: gemv::KERNELS,
        timed: gemv::TIMED,
    },
    Family {
        module: Module::Lab,
        kernels: &[Declared::of::<params::CollectiveParams>(
            collective::KERNEL,
            "simulated collective: 1-8 CTAs poll a flag for T ns",
            BASE,
        )],
        timed: &[collective::KERNEL_TIMED],
    },
    Family {
        module: Module::Lab,
        kernels: &[Declared::of::<params::HashParams>(
            hash::KERNEL,
            "hashes token n-grams into Engram row ids (the demo's hasher)",
            BASE,
        )],
        timed: &[],
    },
    Family {
        module: Module::Lab,
        kernels: &[Declared::of::<params::SpinParams>(
            spin::KERNEL,
            "busy-waits on the GPU clock: a layer's compute in the demo and benches",
            BASE,
        )],
        timed: &[spin::KERNEL_TIMED],
    },
];

/// What a `_timed` twin's row says it does.
#[cfg(not(target_arch = "nvptx64"))]
const TIMED_ABOUT: &str = "the same kernel, recording its blocks on the device timeline";

/// Every kernel entry point, the one list the host, `build.rs`, the PTX tests and `fetchahead
/// kernels` use, derived from the families' declarations. `build.rs` checks that each is an
/// `.entry` of every PTX whose arch it needs, taking a parameter block of `param_bytes`, and
/// that the PTX has no other entry. The plain kernels come first, then the timed twins, so that
/// a plain kernel's index (the kernel id a timeline record carries) does not depend on them.
#[cfg(not(target_arch = "nvptx64"))]
pub fn all_kernels() -> impl Iterator<Item = Entry> {
    let entry = |f: &Family, k: &Declared, name, twin_of: Option<&'static str>| Entry {
        module: f.module,
        name,
        param_bytes: k.param_bytes,
        about: if twin_of.is_some() {
            TIMED_ABOUT
        } else {
            k.about
        },
        needs: k.needs,
        twin_of,
        block_threads: k.block_threads,
    };
    let plain = FAMILIES
        .iter()
        .flat_map(move |f| f.kernels.iter().map(move |k| entry(f, k, k.name, None)));
    let twins = FAMILIES.iter().flat_map(move |f| {
        f.timed
            .iter()
            .zip(f.kernels)
            .map(move |(&twin, k)| entry(f, k, twin, Some(k.name)))
    });
    plain.chain(twins)
}

/// The `_timed` twin of kernel `name`, if it has one (every kernel the timeline records).
#[cfg(not(target_arch = "nvptx64"))]
pub fn timed_twin(name: &str) -> Option<&'static str> {
    all_kernels()
        .find(|e| e.twin_of == Some(name))
        .map(|e| e.name)
}

/// Every family's width builds ([`width_builds!`]).
#[cfg(not(target_arch = "nvptx64"))]
pub fn width_builds() -> impl Iterator<Item = &'static WidthBuild> {
    gather::WIDTH_BUILDS.iter().chain(dequant::WIDTH_BUILDS)
}

/// The build of variant `name` for one row width, if it has one.
#[cfg(not(target_arch = "nvptx64"))]
pub fn width_build(name: &str) -> Option<&'static WidthBuild> {
    width_builds().find(|b| b.of == name)
}
