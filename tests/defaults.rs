//! The default variants (`fetchahead_gpu::defaults`) against the gather bench's recorded winners
//! (`benches/recorded/winners.txt`: per arch and family, the variants tied fastest on the slowest
//! of the bench's three tables). CPU only: it reads the record, not the GPU.
use fetchahead::device_abi::{defaults, dequant, gather};

/// The recorded winners, embedded so that the test binary runs from any folder.
const RECORD: &str = include_str!("../benches/recorded/winners.txt");

fn winners(arch: &str, family: &str) -> Option<Vec<&'static str>> {
    RECORD.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some(arch) && words.next() == Some(family)).then(|| words.collect())
    })
}

#[test]
fn every_default_is_its_own_row() {
    // Handles, resolved when the kernel crate built: each is the row its name finds.
    for d in defaults::BY_ARCH {
        assert_eq!(
            gather::find(d.gather.name()),
            Some(d.gather.index()),
            "{}",
            d.arch
        );
        assert_eq!(
            dequant::find(d.dequant.name()),
            Some(d.dequant.index()),
            "{}",
            d.arch
        );
    }
}

#[test]
fn defaults_are_the_bench_winners_where_measured() {
    let mut measured = 0;
    for d in defaults::BY_ARCH {
        for (family, default) in [("gather", d.gather.name()), ("dequant", d.dequant.name())] {
            let Some(tied) = winners(d.arch, family) else {
                continue;
            };
            measured += 1;
            assert!(
                tied.contains(&default),
                "{} {family}: the default `{default}` is not among the recorded winners {tied:?}",
                d.arch
            );
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
        assert!(words.len() >= 3, "malformed line `{line}`");
        for name in &words[2..] {
            let known = match words[1] {
                "gather" => gather::find(name).is_some(),
                "dequant" => dequant::find(name).is_some(),
                other => panic!("unknown family `{other}` in `{line}`"),
            };
            assert!(known, "`{name}` in `{line}` is no variant");
        }
    }
}
