//! `include/fetchahead.h` against the Rust exports of `host/ffi.rs`: every `extern "C"` function
//! is declared with the same parameter and return types, every declaration is exported, every
//! `#[repr(C)]` struct has the same fields in the same order, every constant the same value.
//! Both files are embedded at compile time (no path is read when the test runs). CI compiles the
//! header as C11 and C++17 with `-Wall -Wextra -Werror` besides (`tests/c/abi_check.c`).
use std::collections::BTreeMap;

const HEADER: &str = include_str!("../include/fetchahead.h");
const FFI: &str = include_str!("../host/ffi.rs");

/// The C type a Rust FFI type is declared as in the header.
fn c_type(rust: &str) -> String {
    let rust = rust.trim();
    if let Some(inner) = rust.strip_prefix("*mut ") {
        return format!("{} *", c_type(inner)).replace("* *", "**");
    }
    if let Some(inner) = rust.strip_prefix("*const ") {
        let inner = c_type(inner);
        return if inner.ends_with('*') {
            format!("{inner} const *")
        } else {
            format!("const {inner} *")
        };
    }
    if let Some(array) = rust.strip_prefix('[') {
        // `[c_char; FETCHAHEAD_MESSAGE_BYTES]`: the element type, the length kept apart.
        let (elem, len) = array.trim_end_matches(']').split_once(';').unwrap();
        return format!("{}[{}]", c_type(elem), len.trim());
    }
    let named = match rust {
        "c_char" => "char",
        "c_int" => "int",
        "c_void" => "void",
        "usize" => "size_t",
        "u64" => "uint64_t",
        "u32" => "uint32_t",
        "u16" => "uint16_t",
        "u8" => "uint8_t",
        "i64" => "int64_t",
        "i32" => "int32_t",
        "sys::CUstream" => "fetchahead_stream",
        "TableHandle" => "fetchahead_table",
        "PrefetcherHandle" => "fetchahead_prefetcher",
        "FlagLaneHandle" => "fetchahead_flag_lane",
        "L2PlanHandle" => "fetchahead_l2_plan",
        "FfiPrefetcherConfig" => "fetchahead_prefetcher_config",
        "FfiCounters" => "fetchahead_counters",
        "FfiLookupError" => "fetchahead_lookup_error",
        "FfiForwardSummary" => "fetchahead_l2_forward_summary",
        "FfiL2Counters" => "fetchahead_l2_counters",
        "Work" => "fetchahead_work",
        other => panic!("no C spelling for the Rust type `{other}`: add it to c_type"),
    };
    named.to_string()
}

/// `const T *` and `T const *` alike, pointer stars attached: one spelling per type.
fn normal(c: &str) -> String {
    let c = c.split_whitespace().collect::<Vec<_>>().join(" ");
    let c = c.replace(" *", "*").replace("* ", "*");
    c.replace("const char", "char const")
        .replace("const fetchahead", "fetchahead const")
        .replace("const int64_t", "int64_t const")
        .replace("const void", "void const")
}

fn strip_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        rest = &rest[start + 2..];
        let end = rest.find("*/").expect("an unclosed comment");
        rest = &rest[end + 2..];
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split("//").next().unwrap())
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text between the `(` at `open` and its matching `)`.
fn parenthesized(text: &str, open: usize) -> &str {
    let mut depth = 0;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &text[open + 1..open + i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced parentheses");
}

/// Each `fetchahead_*` function the header declares: name -> (return type, parameter types).
fn header_functions() -> BTreeMap<String, (String, Vec<String>)> {
    let text = strip_comments(HEADER);
    let mut found = BTreeMap::new();
    for statement in text.split(';') {
        let s = statement.split_whitespace().collect::<Vec<_>>().join(" ");
        let s = s.rsplit(['{', '}']).next().unwrap().trim();
        if s.starts_with("typedef") || s.contains("static_assert") || s.contains("_Static_assert") {
            continue;
        }
        let Some(open) = s.find('(') else { continue };
        let head = s[..open].trim();
        let Some(name) = head.rsplit([' ', '*']).next() else {
            continue;
        };
        if !name.starts_with("fetchahead_") {
            continue;
        }
        let ret = normal(head[..head.len() - name.len()].trim());
        let params = parenthesized(s, open);
        let params: Vec<String> = if params.trim() == "void" {
            Vec::new()
        } else {
            params
                .split(',')
                .map(|p| {
                    let p = p.trim();
                    let cut = p.rfind([' ', '*']).expect("a named parameter");
                    normal(&p[..=cut])
                })
                .collect()
        };
        assert!(
            found.insert(name.to_string(), (ret, params)).is_none(),
            "{name} declared twice"
        );
    }
    found
}

/// Each `extern "C"` function of `host/ffi.rs`: name -> (return type, parameter types), in C.
fn rust_functions() -> BTreeMap<String, (String, Vec<String>)> {
    let mut found = BTreeMap::new();
    let mut rest = FFI;
    while let Some(at) = rest.find("extern \"C\" fn ") {
        let after = &rest[at + "extern \"C\" fn ".len()..];
        let open = after.find('(').unwrap();
        let name = after[..open].trim().to_string();
        let params = parenthesized(after, open);
        let close = open + params.len() + 2;
        let tail = &after[close..after[close..].find('{').unwrap() + close];
        let ret = match tail.trim().strip_prefix("->") {
            Some(t) => normal(&c_type(t)),
            None => "void".to_string(),
        };
        let params: Vec<String> = params
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| normal(&c_type(p.split_once(':').unwrap().1)))
            .collect();
        assert!(
            found.insert(name.clone(), (ret, params)).is_none(),
            "{name} exported twice"
        );
        rest = &after[close..];
    }
    found
}

#[test]
fn every_export_is_declared_with_its_signature_and_nothing_else_is() {
    let header = header_functions();
    let rust = rust_functions();
    assert!(rust.len() >= 37, "found only {} exports", rust.len());
    let declared: Vec<_> = header.keys().collect();
    let exported: Vec<_> = rust.keys().collect();
    assert_eq!(
        declared, exported,
        "the header's functions and the Rust exports differ"
    );
    for (name, (ret, params)) in &rust {
        let (h_ret, h_params) = &header[name];
        assert_eq!(h_ret, ret, "{name}: return type");
        assert_eq!(h_params, params, "{name}: parameter types");
    }
}

/// The fields of each `#[repr(C)] pub struct` of `host/ffi.rs`, as C: name -> [(type, field)].
fn rust_structs() -> BTreeMap<String, Vec<(String, String)>> {
    let mut found = BTreeMap::new();
    for piece in FFI.split("#[repr(C)]").skip(1) {
        let start = piece.find("pub struct ").unwrap() + "pub struct ".len();
        let name = piece[start..].split_whitespace().next().unwrap();
        let body = &piece[piece.find('{').unwrap() + 1..piece.find("\n}").unwrap()];
        let fields = body
            .lines()
            .map(|l| l.split("//").next().unwrap().trim())
            .filter_map(|l| l.strip_prefix("pub "))
            .map(|l| {
                let (field, ty) = l.trim_end_matches(',').split_once(':').unwrap();
                (normal(&c_type(ty)), field.trim().to_string())
            })
            .collect();
        found.insert(c_type(name), fields);
    }
    found
}

/// The fields of each `typedef struct X { ... } X;` of the header.
fn header_structs() -> BTreeMap<String, Vec<(String, String)>> {
    let text = strip_comments(HEADER);
    let mut found = BTreeMap::new();
    for piece in text.split("typedef struct ").skip(1) {
        // An opaque `typedef struct X X;` has no body of its own.
        let Some(open) = piece.find('{').filter(|&o| !piece[..o].contains(';')) else {
            continue;
        };
        let name = piece[..open].trim().to_string();
        let body = &piece[open + 1..piece.find('}').unwrap()];
        let fields = body
            .split(';')
            .map(|f| f.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|f| !f.is_empty())
            .map(|f| {
                let (decl, len) = match f.split_once('[') {
                    Some((d, len)) => (d.to_string(), Some(len.trim_end_matches(']').to_string())),
                    None => (f.clone(), None),
                };
                let cut = decl.rfind([' ', '*']).unwrap();
                let ty = normal(&decl[..=cut]);
                let ty = match len {
                    Some(len) => format!("{ty}[{len}]"),
                    None => ty,
                };
                (ty, decl[cut + 1..].to_string())
            })
            .collect();
        found.insert(name, fields);
    }
    found
}

#[test]
fn every_struct_has_the_same_fields_in_the_same_order() {
    let rust = rust_structs();
    let header = header_structs();
    assert!(rust.len() >= 6, "{rust:?}");
    assert_eq!(
        rust.keys().collect::<Vec<_>>(),
        header.keys().collect::<Vec<_>>()
    );
    for (name, fields) in &rust {
        assert_eq!(&header[name], fields, "struct {name}");
    }
}

#[test]
fn every_constant_has_the_same_value() {
    let mut rust = BTreeMap::new();
    for line in FFI.lines() {
        if let Some(rest) = line.trim().strip_prefix("pub const FETCHAHEAD_") {
            let (name, value) = rest.split_once(':').unwrap();
            let value = value
                .split('=')
                .nth(1)
                .unwrap()
                .trim()
                .trim_end_matches(';');
            rust.insert(format!("FETCHAHEAD_{name}"), value.parse::<i64>().unwrap());
        }
    }
    let mut header = BTreeMap::new();
    for line in HEADER.lines().map(str::trim) {
        let line = line.split("/*").next().unwrap().trim();
        if let Some(rest) = line.strip_prefix("#define FETCHAHEAD_") {
            // The include guard defines no value.
            if let Some((name, value)) = rest.split_once(' ')
                && let Ok(v) = value.trim().parse::<i64>()
            {
                header.insert(format!("FETCHAHEAD_{name}"), v);
            }
        } else if line.starts_with("FETCHAHEAD_")
            && let Some((name, value)) = line.trim_end_matches(',').split_once('=')
        {
            header.insert(
                name.trim().to_string(),
                value.trim().parse::<i64>().unwrap(),
            );
        }
    }
    assert!(rust.len() > 20, "{rust:?}");
    assert_eq!(rust, header);
}
