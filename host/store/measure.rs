//! Timing lookups and raw reads, for `bench-io`, `tune` and the criterion bench.
use std::collections::HashSet;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, types};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};

use super::aligned::AlignedBuf;
use super::layout::PAGE;
use super::{ReadPath, RowStore};
use crate::{Error, Result};

/// `n` distinct random row ids from `rows` (all of them, shuffled, when `n` covers the range).
pub fn unique_rows(rows: std::ops::Range<u64>, n: usize, seed: u64) -> Vec<i64> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let span = rows.end.saturating_sub(rows.start);
    if n as u64 >= span {
        let mut all: Vec<i64> = (rows.start..rows.end).map(|r| r as i64).collect();
        for i in (1..all.len()).rev() {
            let j = rng.random_range(0..=i);
            all.swap(i, j);
        }
        return all;
    }
    let mut seen = HashSet::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let r = rows.start + rng.random_range(0..span);
        if seen.insert(r) {
            out.push(r as i64);
        }
    }
    out
}

/// Median and 99th percentile of `samples`, in microseconds.
pub fn percentiles_us(samples: &[Duration]) -> (f64, f64) {
    let mut us: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    us.sort_by(f64::total_cmp);
    let at = |p: f64| {
        if us.is_empty() {
            return 0.0;
        }
        let i = ((p * us.len() as f64).ceil() as usize).clamp(1, us.len()) - 1;
        us[i]
    };
    (at(0.5), at(0.99))
}

/// Times one lookup per batch on `path`; `cold` evicts the table's pages before each.
pub fn time_lookups(
    store: &RowStore,
    path: ReadPath,
    layer: u32,
    batches: &[Vec<i64>],
    cold: bool,
) -> Result<Vec<Duration>> {
    let dim = store.dim();
    let longest = batches.iter().map(Vec::len).max().unwrap_or(0) as u64;
    let bytes = crate::memory::product(longest, dim as u64, "lookup outputs")?;
    let mut weights = crate::memory::zeroed(bytes, "lookup outputs")?;
    let mut scales = crate::memory::zeroed(
        bytes / super::layout::MX_BLOCK as u64,
        "lookup outputs (scales)",
    )?;
    let mut times = Vec::with_capacity(batches.len());
    for ids in batches {
        if cold {
            store.evict_page_cache()?;
        }
        let (w, s) = (
            &mut weights[..ids.len() * dim],
            &mut scales[..ids.len() * dim / super::layout::MX_BLOCK],
        );
        let t = Instant::now();
        store.lookup_with(path, layer, ids, w, s)?;
        times.push(t.elapsed());
    }
    Ok(times)
}

/// A fio-like baseline: 4 KiB O_DIRECT random reads through io_uring.
#[derive(Clone, Copy, Debug)]
pub struct RawReads {
    pub reads: u64,
    pub seconds: f64,
    pub iops: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// `reads` random page-aligned 4 KiB O_DIRECT reads of `file` within `bytes`, `depth` in flight.
pub fn raw_random_reads(
    file: &Path,
    bytes: std::ops::Range<u64>,
    depth: u32,
    reads: u64,
    seed: u64,
) -> Result<RawReads> {
    if reads == 0 || depth == 0 {
        return Err(Error::invalid(
            "raw reads",
            format!("{reads} reads at depth {depth}; want at least one of each"),
        ));
    }
    let f = super::file::open_regular(file, libc::O_DIRECT)?;
    let fd = f.as_raw_fd();
    let first_page = bytes.start.div_ceil(PAGE);
    let pages = (bytes.end / PAGE).saturating_sub(first_page).max(1);
    let mut ring = IoUring::new(depth.next_power_of_two())
        .map_err(|e| Error::io(file, "io_uring_setup", e))?;
    let mut buf = AlignedBuf::new(depth as usize * PAGE as usize);
    let base = buf.as_mut_ptr();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut started = vec![Instant::now(); depth as usize];
    // Each read's latency is kept for the percentiles: sized by the argument, so checked.
    crate::memory::check_fits(
        crate::memory::product(reads, 8, "read latencies")?,
        "the baseline's read latencies",
    )?;
    let mut latencies = Vec::new();
    latencies
        .try_reserve_exact(reads as usize)
        .map_err(|_| Error::OutOfMemory {
            what: "the baseline's read latencies".into(),
            bytes: reads.saturating_mul(8),
            available: None,
        })?;
    let (mut submitted, mut completed, mut in_flight) = (0u64, 0u64, 0u32);
    let mut free: Vec<u32> = (0..depth).collect();
    let t0 = Instant::now();
    while completed < reads {
        {
            let mut sq = ring.submission();
            while submitted < reads
                && let Some(slot) = free.pop()
            {
                let offset = (first_page + rng.random_range(0..pages)) * PAGE;
                // SAFETY: slot < depth, so the 4 KiB at slot * PAGE lie inside `buf`, which lives
                // until every read completes (the loop runs until completed == reads).
                let dst = unsafe { base.add(slot as usize * PAGE as usize) };
                let entry = opcode::Read::new(types::Fd(fd), dst, PAGE as u32)
                    .offset(offset)
                    .build()
                    .user_data(u64::from(slot));
                // SAFETY: as above.
                if unsafe { sq.push(&entry) }.is_err() {
                    free.push(slot);
                    break;
                }
                started[slot as usize] = Instant::now();
                submitted += 1;
                in_flight += 1;
            }
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Error::io(file, "io_uring_enter", e)),
        }
        let mut failed = None;
        for cqe in ring.completion() {
            let slot = cqe.user_data() as u32;
            in_flight -= 1;
            if cqe.result() < 0 {
                failed = Some(std::io::Error::from_raw_os_error(-cqe.result()));
                continue;
            }
            latencies.push(started[slot as usize].elapsed());
            free.push(slot);
            completed += 1;
        }
        if let Some(e) = failed {
            // Wait out the rest so the buffer outlives every read.
            while in_flight > 0 && ring.submit_and_wait(1).is_ok() {
                in_flight -= ring.completion().count() as u32;
            }
            return Err(Error::io(file, "O_DIRECT read", e));
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let (p50_us, p99_us) = percentiles_us(&latencies);
    Ok(RawReads {
        reads,
        seconds,
        iops: reads as f64 / seconds,
        p50_us,
        p99_us,
    })
}

/// User + system CPU seconds this process has used (all threads, io_uring's workers included).
pub fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain old data; all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid, writable rusage buffer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// fio's random O_DIRECT reads of a file region through io_uring, from its JSON report.
#[derive(Clone, Debug)]
pub struct FioReads {
    pub command: String,
    pub reads: u64,
    pub iops: f64,
    /// (usr + sys) CPU seconds over reads.
    pub cpu_us_per_read: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// Runs `fio` (the peer the store's io_uring path is held against): `block`-byte random reads of
/// `bytes` of `file`, `depth` in flight, registered files and buffers, for `seconds`. Err says
/// why there is no figure (fio missing, failed, or its report unreadable).
pub fn fio_random_reads(
    file: &Path,
    bytes: std::ops::Range<u64>,
    block: u64,
    depth: u32,
    seconds: u32,
) -> std::result::Result<FioReads, String> {
    let start = bytes.start.next_multiple_of(block);
    let size = (bytes.end.saturating_sub(start) / block) * block;
    let args = [
        "--name=peer".to_string(),
        format!("--filename={}", file.display()),
        "--rw=randread".into(),
        format!("--bs={block}"),
        "--direct=1".into(),
        "--ioengine=io_uring".into(),
        "--fixedbufs=1".into(),
        "--registerfiles=1".into(),
        format!("--iodepth={depth}"),
        format!("--iodepth_batch_submit={}", depth.div_ceil(4)),
        format!("--iodepth_batch_complete_min={}", depth.div_ceil(4).min(16)),
        format!("--offset={start}"),
        format!("--size={size}"),
        "--time_based=1".into(),
        format!("--runtime={seconds}"),
        "--norandommap=1".into(),
        "--randrepeat=0".into(),
        "--output-format=json".into(),
    ];
    let command = format!("fio {}", args.join(" "));
    let out = std::process::Command::new("fio")
        .args(&args)
        .output()
        .map_err(|e| format!("fio not run ({e}); install it with `apt-get install -y fio`"))?;
    if !out.status.success() {
        return Err(format!(
            "fio failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print notes before the JSON object.
    let json = text.find('{').map_or("", |i| &text[i..]);
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("fio's report: {e}"))?;
    let job = &v["jobs"][0];
    let read = &job["read"];
    let reads = read["total_ios"].as_u64().unwrap_or(0);
    let runtime_s = job["job_runtime"].as_f64().unwrap_or(0.0) / 1e3;
    let cpu_pct = job["usr_cpu"].as_f64().unwrap_or(0.0) + job["sys_cpu"].as_f64().unwrap_or(0.0);
    let pct = |p: &str| {
        read["clat_ns"]["percentile"][p]
            .as_f64()
            .map_or(0.0, |ns| ns / 1e3)
    };
    if reads == 0 || runtime_s <= 0.0 {
        return Err("fio reported no reads".into());
    }
    Ok(FioReads {
        command,
        reads,
        iops: read["iops"].as_f64().unwrap_or(0.0),
        cpu_us_per_read: cpu_pct / 100.0 * runtime_s / reads as f64 * 1e6,
        p50_us: pct("50.000000"),
        p99_us: pct("99.000000"),
    })
}
