//! The default variants (`fetchahead_gpu::defaults`) against the gather bench's recorded winners
//! (`benches/recorded/winners.txt`: per arch, family and size, the variants within 2% of the
//! fastest on the slowest of the bench's three tables). CPU only: it reads the record, not the
//! GPU.
use fetchahead::device_abi::{defaults, dequant, gather};

/// The recorded winners, embedded so that the test binary runs from any folder.
const RECORD: &str = include_str!("../benches/recorded/winners.txt");

/// The recorded winners of `family` on `arch`: `(n, tied variants)` for each size measured.
fn winners(arch: &str, family: &str) -> Vec<(u64, Vec<&'static str>)> {
    RECORD
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some(arch) && words.next() == Some(family)).then(|| {
                let n = words.next().and_then(|n| n.parse().ok()).expect("a size");
                (n, words.collect())
            })
        })
        .collect()
}

#[test]
fn every_default_is_its_own_row() {
    // Handles, resolved when the kernel crate built: each is the row its name finds.
    for d in defaults::BY_ARCH {
        for &(_, v) in d.gather.buckets() {
            assert_eq!(gather::find(v.name()), Some(v.index()), "{}", d.arch);
        }
        for &(_, v) in d.dequant.buckets() {
            assert_eq!(dequant::find(v.name()), Some(v.index()), "{}", d.arch);
        }
    }
}

#[test]
fn buckets_rise_and_end_unbounded() {
    for d in defaults::BY_ARCH {
        let bounds = [
            d.gather.buckets().iter().map(|b| b.0).collect::<Vec<_>>(),
            d.dequant.buckets().iter().map(|b| b.0).collect(),
        ];
        for b in bounds {
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{}: {b:?}", d.arch);
            assert_eq!(b.last(), Some(&u64::MAX), "{}", d.arch);
        }
        assert_eq!(
            d.gather.for_rows(u64::MAX),
            d.gather.buckets().last().unwrap().1
        );
        assert_eq!(d.gather.for_rows(0), d.gather.buckets()[0].1);
    }
}

#[test]
fn defaults_are_the_bench_winners_at_every_measured_size() {
    let mut measured = 0;
    for d in defaults::BY_ARCH {
        for (family, default) in [
            (
                "gather",
                &(|n| d.gather.for_rows(n).name()) as &dyn Fn(u64) -> &'static str,
            ),
            ("dequant", &|n| d.dequant.for_rows(n).name()),
        ] {
            for (n, tied) in winners(d.arch, family) {
                measured += 1;
                let default = default(n);
                assert!(
                    tied.contains(&default),
                    "{} {family} n={n}: the default `{default}` is not among the recorded \
                     winners {tied:?}",
                    d.arch
                );
            }
        }
    }
    assert!(
        measured > 0,
        "no arch of defaults::BY_ARCH has recorded winners"
    );
}

#[test]
fn the_record_names_only_known_variants() {
    for line in RECORD.lines().filter(|l| !l.trim().is_empty()) {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert!(words.len() >= 4, "malformed line `{line}`");
        assert!(words[2].parse::<u64>().is_ok(), "no size in `{line}`");
        for name in &words[3..] {
            let known = match words[1] {
                "gather" => gather::find(name).is_some(),
                "dequant" => dequant::find(name).is_some(),
                other => panic!("unknown family `{other}` in `{line}`"),
            };
            assert!(known, "`{name}` in `{line}` is no variant");
        }
    }
}
