//! What the lab's tests share with the product's: the GPU-aware harness and the command-line
//! helpers of `tests/common/`, included by path (one source).
#![allow(dead_code)]
#[path = "../../../tests/common/cli.rs"]
pub mod cli;
#[path = "../../../tests/common/harness.rs"]
pub mod harness;
