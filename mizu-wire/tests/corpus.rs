//! The golden corpus: the exact bytes of representative frames, pinned in both directions
//! (encoding gives the file; decoding the file gives the value), so the Python and R bindings
//! read and write the very same bytes. `MIZU_BLESS=1 cargo test -p mizu-wire --test corpus`
//! rewrites the files after an intended format change (see docs/wire-format.md, versioning).

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, Int32Array};
use arrow_buffer::Buffer;
use mizu_wire::frame::{self, Body};
use mizu_wire::{CallTarget, Mapper, Value, encode, rmeta, value};

fn corpus() -> Vec<(&'static str, u64, Value)> {
    let df = rmeta::data_frame(vec![
        rmeta::integer("n", &[1, rmeta::NA_INTEGER, 3]),
        rmeta::factor("f", &[1, 2, rmeta::NA_INTEGER], &["lo", "hi"], false).unwrap(),
        rmeta::character("s", &[Some("a"), None, Some("水")]),
        rmeta::date("d", &[0.0, 19000.0, f64::NAN]),
        rmeta::posixct("t", &[0.5, 1.0e9, f64::NAN], "UTC"),
    ])
    .unwrap();
    let (dt_f, dt_a) = rmeta::difftime("dt", &[1.5, 2.0], "mins").unwrap();
    let (m_f, m_a) = rmeta::double("m", &[1.0, 2.0, 3.0, f64::from_bits(rmeta::NA_REAL_BITS)]);
    vec![
        ("none", 0, Value::None),
        ("true", 1, Value::Bool(true)),
        ("false", 2, Value::Bool(false)),
        ("int-negative", 3, Value::Int(-42)),
        ("int-max", 4, Value::Int(i64::MAX)),
        (
            "float-na-real",
            5,
            Value::Float(f64::from_bits(rmeta::NA_REAL_BITS)),
        ),
        ("float-pi", 6, Value::Float(std::f64::consts::PI)),
        ("complex", 7, Value::Complex(1.5, -2.0)),
        ("str-utf8", 8, Value::Str("mizu 水 ✓".into())),
        (
            "bytes-small",
            9,
            Value::Bytes(Buffer::from_vec(vec![0u8, 1, 0xff])),
        ),
        (
            "bytes-aligned",
            10,
            Value::Bytes(Buffer::from_vec((0..100u8).collect::<Vec<u8>>())),
        ),
        (
            "list-mixed",
            11,
            Value::List(vec![
                Value::Int(1),
                Value::Str("two".into()),
                Value::None,
                Value::List(vec![]),
            ]),
        ),
        (
            "dict",
            12,
            Value::Dict(vec![
                ("a".into(), Value::Int(1)),
                ("b".into(), Value::Bool(false)),
            ]),
        ),
        (
            "error",
            13,
            Value::Error {
                type_name: "ValueError".into(),
                message: "bad input".into(),
                traceback: "Traceback (most recent call last):\n  ...".into(),
            },
        ),
        (
            "call-name",
            14,
            Value::Call {
                target: CallTarget::Name("math:sqrt".into()),
                args: vec![Value::Float(2.0)],
                kwargs: vec![],
            },
        ),
        (
            "call-source",
            15,
            Value::Call {
                target: CallTarget::Source("function(x, y) x + y".into()),
                args: vec![Value::Int(1)],
                kwargs: vec![("y".into(), Value::Int(2))],
            },
        ),
        (
            "array-int32-nulls",
            16,
            value::array(
                "x",
                Arc::new(Int32Array::from(vec![Some(1), None, Some(3)])) as ArrayRef,
            ),
        ),
        (
            "array-float64",
            17,
            value::array(
                "x",
                Arc::new(Float64Array::from(vec![0.5, -1.0])) as ArrayRef,
            ),
        ),
        (
            "r-double-matrix",
            18,
            Value::Array {
                field: Arc::new(rmeta::with_dim(m_f, &[2, 2])),
                array: m_a,
            },
        ),
        (
            "r-difftime",
            19,
            Value::Array {
                field: Arc::new(dt_f),
                array: dt_a,
            },
        ),
        ("r-data-frame", 20, Value::Table(df)),
    ]
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn frame_bytes(aux: u64, v: &Value) -> Vec<u8> {
    let enc = encode(v).unwrap();
    let mut out = vec![0u8; frame::HEADER_LEN + enc.len()];
    let n = frame::write_inline(&enc, aux, &mut out).unwrap();
    out.truncate(n);
    out
}

#[test]
fn the_corpus_is_pinned_in_both_directions() {
    let bless = std::env::var_os("MIZU_BLESS").is_some();
    let mapper = Mapper::new();
    for (name, aux, v) in corpus() {
        let path = dir().join(format!("{name}.bin"));
        let bytes = frame_bytes(aux, &v);
        if bless {
            std::fs::write(&path, &bytes).unwrap();
        }
        let pinned = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (MIZU_BLESS=1 creates it)", path.display()));
        assert_eq!(
            bytes, pinned,
            "{name}: encoding changed; a format change needs a version bump"
        );
        let got = mizu_wire::read_value(&pinned, &mapper).unwrap();
        assert_eq!(got.aux, aux, "{name}");
        assert_eq!(got.value, v, "{name}: decoding the pinned bytes");
    }
}

#[test]
fn the_region_frame_layout_is_pinned() {
    let path = dir().join("region-frame.bin");
    let pinned = std::fs::read(&path).unwrap();
    let f = frame::read(&pinned).unwrap();
    assert_eq!(f.aux, 0x0102_0304_0506_0708);
    let Body::Region(d) = f.body else {
        panic!("not a region frame")
    };
    assert_eq!(d.name, "/mizu_1a2b_0123456789abcdef01234567");
    assert_eq!((d.offset, d.len, d.generation), (4160, 1048600, 3));
}

#[test]
fn every_corpus_file_is_described() {
    let readme = std::fs::read_to_string(dir().join("README.md")).unwrap();
    for (name, _, _) in corpus() {
        assert!(
            readme.contains(&format!("`{name}.bin`")),
            "{name} is not described in corpus/README.md"
        );
    }
    assert!(readme.contains("`region-frame.bin`"));
    for (name, ..) in own_payloads() {
        assert!(
            readme.contains(&format!("`{name}.bin`")),
            "{name} is not described in corpus/README.md"
        );
    }
}

/// A same-language payload of the corpus: its name, body, buffers (code, bytes) and tag.
type Own = (&'static str, Vec<u8>, Vec<(u8, Vec<u8>)>, u8);

/// Same-language payloads (`oob`): written by the one writer both bindings use, their bytes
/// pinned, and parsed back to the same body and buffers.
fn own_payloads() -> Vec<Own> {
    use mizu_wire::oob::{code, tag};
    vec![
        (
            "own-compact",
            vec![0x08, 0x01, 0x03, 2, 0, 0, 0, 0, 0, 0, 0],
            vec![],
            tag::COMPACT,
        ),
        (
            "own-pickle-buffers",
            b"\x80\x05a pickle's bytes".to_vec(),
            vec![
                (code::BYTES, (0..100u8).collect()),
                (code::BYTES, vec![1, 2, 3]),
            ],
            tag::PICKLE,
        ),
        (
            "own-r-double",
            b"R's serialization".to_vec(),
            vec![(code::R_DOUBLE, 1.5f64.to_le_bytes().repeat(4))],
            tag::R_SERIAL,
        ),
    ]
}

#[test]
fn same_language_payloads_are_pinned() {
    use mizu_wire::oob::{self, Place};
    let bless = std::env::var_os("MIZU_BLESS").is_some();
    for (name, body, bufs, tag) in own_payloads() {
        let mut w = oob::Writer::<&[u8], &[u8]>::new(tag, &body);
        for (c, b) in &bufs {
            w.push(*c, b);
        }
        let bytes = w.to_vec();
        let path = dir().join(format!("own/{name}.bin"));
        if bless {
            std::fs::write(&path, &bytes).unwrap();
        }
        let pinned = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (MIZU_BLESS=1 creates it)", path.display()));
        assert_eq!(bytes, pinned, "{name}: the layout changed");
        let p = oob::parse(&pinned).unwrap();
        assert_eq!(p.tag, tag, "{name}");
        assert_eq!(&pinned[p.body], &body[..], "{name}");
        assert_eq!(p.entries.len(), bufs.len(), "{name}");
        for (e, (c, b)) in p.entries.iter().zip(&bufs) {
            let Place::Inline(r) = &e.place else {
                panic!("{name}: a buffer by reference")
            };
            assert_eq!((e.code, &pinned[r.clone()]), (*c, &b[..]), "{name}");
            assert_eq!(r.start % oob::ALIGN, 0, "{name}: an unaligned buffer");
        }
    }
}
