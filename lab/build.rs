//! Compiles the lab's kernels (`gpu/` with `--cfg fetchahead_lab`: the GEMV readers, the hasher,
//! the spin and collective stand-ins) to PTX, once per arch of `FETCHAHEAD_ARCHS`, and embeds
//! them through `$OUT_DIR/ptx.rs`, with the product's own build code (`../build.rs`, included
//! here), so that both modules are compiled and checked against the one kernel list alike.
use std::env;
use std::path::PathBuf;

// Its `main` and the git commit it records are the product's build's, unused here.
#[allow(dead_code)]
#[path = "../build.rs"]
mod product_build;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir
        .parent()
        .expect("lab/ sits in the repository root");
    product_build::embed_ptx(fetchahead_gpu::Module::Lab, root);
}
