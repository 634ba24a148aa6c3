//! `fetchahead kernels` and `fetchahead ptx --arch ARCH`.
use std::process::ExitCode;

use fetchahead::ptx;

pub fn list() -> fetchahead::Result<ExitCode> {
    use fetchahead::device_abi::{collective, dequant, gather, gemv, l2_prefetch};
    let about = |name: &str| {
        let gathers = gather::VARIANTS.iter().map(|v| (v.name, v.about));
        let dequants = dequant::VARIANTS.iter().map(|v| (v.name, v.about));
        let prefetches = l2_prefetch::VARIANTS.iter().map(|v| (v.name, v.about));
        let gemvs = gemv::VARIANTS.iter().map(|v| (v.name, v.about));
        gathers
            .chain(dequants)
            .chain(prefetches)
            .chain(gemvs)
            .chain([(
                collective::KERNEL,
                "simulated collective: 1-8 CTAs poll a flag for T ns",
            )])
            .chain([(
                gather::EMPTY_KERNEL,
                "does nothing: the launch-cost floor for benches",
            )])
            .find(|(n, _)| *n == name)
            .map_or("", |(_, a)| a)
    };
    for built in ptx::BUILT {
        println!("{} ({} bytes of PTX)", built.arch, built.text.len());
        for entry in ptx::entries(built.text) {
            println!("  {entry:<24} {}", about(entry));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn print_ptx(arch: &str) -> fetchahead::Result<ExitCode> {
    print!("{}", ptx::for_arch(arch)?.text);
    Ok(ExitCode::SUCCESS)
}
