//! Opening tables: every validation error names the file and tensor, and no input panics.
mod common;

use std::path::Path;

use common::make;
use fetchahead::Error;
use fetchahead::store::layout::{TableLayout, parse_header, parse_index};
use fetchahead::store::{RowStore, StoreOptions};
use proptest::prelude::*;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, serialize_to_file};

fn write(path: &Path, tensors: Vec<(&str, Dtype, Vec<usize>)>) {
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, d, s)| vec![1u8; s.iter().product::<usize>() * d.bitsize() / 8])
        .collect();
    let views: Vec<_> = tensors
        .iter()
        .zip(&data)
        .map(|((n, d, s), bytes)| (*n, TensorView::new(*d, s.clone(), bytes).unwrap()))
        .collect();
    serialize_to_file(views, None, path).unwrap();
}

const W: &str = "layers.1.engram.embed.weight";
const S: &str = "layers.1.engram.embed.scale";

#[test]
fn a_missing_scale_names_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.safetensors");
    write(&file, vec![(W, Dtype::F8_E4M3, vec![64, 256])]);
    match TableLayout::open(&file) {
        Err(Error::MissingTensor { file: f, tensor }) => {
            assert_eq!(f, file);
            assert_eq!(tensor, S);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_file_without_engram_tensors_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.safetensors");
    write(&file, vec![("other", Dtype::U8, vec![64])]);
    assert!(matches!(
        TableLayout::open(&file),
        Err(Error::MissingTensor { .. })
    ));
}

#[test]
fn wrong_dtypes_and_shapes_name_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            vec![(W, Dtype::U8, vec![64, 256]), (S, Dtype::U8, vec![64, 8])],
            W,
        ),
        (
            vec![
                (W, Dtype::F8_E4M3, vec![64, 256]),
                (S, Dtype::F16, vec![64, 8]),
            ],
            S,
        ),
        (
            vec![
                (W, Dtype::F8_E4M3, vec![64, 256]),
                (S, Dtype::U8, vec![64, 4]),
            ],
            S,
        ),
        (
            vec![
                (W, Dtype::F8_E4M3, vec![64, 256]),
                (S, Dtype::U8, vec![63, 8]),
            ],
            S,
        ),
        (
            vec![
                (W, Dtype::F8_E4M3, vec![64, 100]),
                (S, Dtype::U8, vec![64, 3]),
            ],
            W,
        ),
        (
            vec![
                (W, Dtype::F8_E4M3, vec![64 * 256]),
                (S, Dtype::U8, vec![64, 8]),
            ],
            W,
        ),
        // Zero rows of absurd width: the row size itself must not overflow.
        (
            vec![
                (W, Dtype::F8_E4M3, vec![0, 1 << 62]),
                (S, Dtype::U8, vec![0, 8]),
            ],
            W,
        ),
        (
            vec![
                (W, Dtype::F8_E4M3, vec![0, usize::MAX]),
                (S, Dtype::U8, vec![0, 8]),
            ],
            W,
        ),
    ];
    for (i, (tensors, culprit)) in cases.into_iter().enumerate() {
        let file = dir.path().join(format!("case{i}.safetensors"));
        write(&file, tensors);
        match TableLayout::open(&file) {
            Err(Error::BadTensor {
                file: f, tensor, ..
            }) => {
                assert_eq!(f, file, "case {i}");
                assert_eq!(tensor, culprit, "case {i}");
            }
            other => panic!("case {i}: {other:?}"),
        }
    }
}

#[test]
fn a_truncated_shard_names_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let files = make(dir.path(), 1000, &[1, 14], 2, 1);
    let shard = &files[1];
    let len = std::fs::metadata(shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(shard)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    match TableLayout::open(dir.path()) {
        Err(Error::TruncatedShard {
            file,
            tensor,
            len: l,
            end,
        }) => {
            assert_eq!(&file, shard);
            assert!(tensor.starts_with("layers.14."), "{tensor}");
            assert_eq!((l, end), (len - 1, len));
        }
        other => panic!("{other:?}"),
    }
    let err = RowStore::open(dir.path(), StoreOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("truncated") && err.contains("model-00002-of-00002"),
        "{err}"
    );
}

/// Rewrites `file`'s header with `edit` applied to its JSON text, keeping the length prefix
/// honest.
fn edit_header(file: &Path, edit: impl Fn(String) -> String) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let json = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let edited = edit(json).into_bytes();
    let mut out = (edited.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&edited);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(file, out).unwrap();
}

#[test]
fn a_header_that_lies_about_offsets_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let files = make(dir.path(), 1000, &[1], 1, 1);
    // The scale tensor claims to start inside the weights.
    edit_header(&files[0], |j| {
        j.replace("[256000,264000]", "[255000,263000]")
    });
    match TableLayout::open(dir.path()) {
        Err(Error::TableHeader { file, why }) => {
            assert_eq!(file, files[0]);
            assert!(
                why.contains("offset") && why.contains("layers.1.engram.embed.scale"),
                "{why}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A length prefix past the end of the file.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&files[0], &bytes).unwrap();
    assert!(matches!(
        TableLayout::open(dir.path()),
        Err(Error::TableHeader { .. })
    ));
}

#[test]
fn an_index_naming_a_missing_shard_or_tensor_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    make(dir.path(), 1000, &[1, 14], 2, 1);
    let index = dir.path().join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(
        &index,
        text.replace("model-00002-of-00002", "model-00009-of-00002"),
    )
    .unwrap();
    let err = TableLayout::open(dir.path()).unwrap_err();
    assert!(
        matches!(&err, Error::Io { file, .. } if file.ends_with("model-00009-of-00002.safetensors")),
        "{err}"
    );
    // The index places layer 14's scale in the first shard, which lacks it.
    std::fs::write(
        &index,
        text.replace(
            r#""layers.14.engram.embed.scale": "model-00002-of-00002.safetensors""#,
            r#""layers.14.engram.embed.scale": "model-00001-of-00002.safetensors""#,
        ),
    )
    .unwrap();
    match TableLayout::open(dir.path()) {
        Err(Error::MissingTensor { file, tensor }) => {
            assert!(file.ends_with("model-00001-of-00002.safetensors"));
            assert_eq!(tensor, "layers.14.engram.embed.scale");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn parsing_an_index() {
    let ok = parse_index(br#"{"metadata": {}, "weight_map": {"a": "x.safetensors"}}"#).unwrap();
    assert_eq!(ok.get("a").map(String::as_str), Some("x.safetensors"));
    assert!(parse_index(br#"{"weight_map": {"a": 3}}"#).is_err());
    assert!(parse_index(br#"{"weight_map": {"a": "../etc/passwd"}}"#).is_err());
    assert!(parse_index(b"{}").is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn header_and_index_parsing_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_header(&bytes);
        let _ = parse_index(&bytes);
    }

    #[test]
    fn json_like_headers_never_panic(
        rows in 0usize..1 << 40,
        cols in 0usize..1 << 30,
        start in 0usize..1 << 62,
        len in 0usize..1 << 62,
        dtype in prop::sample::select(vec!["F8_E4M3", "F8_E8M0", "U8", "BOOL", "F4", "XX"]),
    ) {
        let json = format!(
            r#"{{"{W}":{{"dtype":"{dtype}","shape":[{rows},{cols}],"data_offsets":[{start},{}]}}}}"#,
            start.saturating_add(len)
        );
        let _ = parse_header(json.as_bytes());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Random bytes written over a real shard's header, and random truncations: opening and
    /// looking up return Ok or an error, never a panic.
    #[test]
    fn corrupted_shards_never_panic(
        edits in proptest::collection::vec((0usize..600, any::<u8>()), 0..6),
        cut in prop::option::of(0u64..300_000),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let files = make(dir.path(), 1000, &[1], 1, 1);
        let mut bytes = std::fs::read(&files[0]).unwrap();
        for (at, b) in edits {
            bytes[at] = b;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut as usize);
        }
        std::fs::write(&files[0], &bytes).unwrap();
        if let Ok(store) = RowStore::open(dir.path(), StoreOptions::default()) {
            let layer = store.layers()[0];
            let end = store.row_range().end as i64;
            let ids = [0, end / 2, end - 1];
            let mut w = vec![0u8; ids.len() * store.dim()];
            let mut s = vec![0u8; ids.len() * store.dim() / 32];
            let _ = store.lookup(layer, &ids, &mut w, &mut s);
        }
    }
}
