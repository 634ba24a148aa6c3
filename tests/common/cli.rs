//! The command lines end to end, for the product's tests and the lab's (`lab/tests/`, which
//! include this file by path): a binary found beside the test binary's folder at run time, run
//! with a time limit.
use std::ffi::CString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The binary `name` beside this test binary's folder (`target/release/fetchahead` for
/// `target/release/deps/robustness-*`, `.gpu/fetchahead` for `.gpu/tests/test-robustness`),
/// found at run time, never from a compile-time path; `None`, saying so, when it is not there.
pub fn binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join(name);
    if bin.is_file() {
        Some(bin)
    } else {
        eprintln!(
            "SKIP the command-line cases: no {name} binary at {}",
            bin.display()
        );
        None
    }
}

/// Runs the CLI with `args`; its exit status and stderr, or a panic if it is still running
/// after `limit`.
pub fn run_cli(bin: &Path, args: &[&str], env: &[(&str, &str)], limit: Duration) -> (i32, String) {
    let mut child = Command::new(bin)
        .args(args)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            assert!(
                status.signal().is_none(),
                "{args:?}: killed by {status}\n{err}"
            );
            return (status.code().unwrap_or(-1), err);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("fetchahead {args:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A FIFO at `path`, as a careless user leaves one where a table's file should be.
pub fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is NUL-terminated.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
    assert_eq!(rc, 0, "mkfifo {}", path.display());
}
