//! Round trips of every value kind, the R mappings, and hostile input.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{Array, ArrayRef, Float64Array, Int32Array};
use arrow_buffer::Buffer;
use mizu_wire::rmeta::{self, RType};
use mizu_wire::value::{self, MAX_DEPTH};
use mizu_wire::{CallTarget, Value, WireError, decode_slice, encode};
use proptest::prelude::*;

fn round_trip(v: &Value) -> Value {
    decode_slice(&encode(v).unwrap().to_vec()).unwrap()
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::None),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        any::<u64>().prop_map(|b| Value::Float(f64::from_bits(b))),
        (any::<u64>(), any::<u64>())
            .prop_map(|(a, b)| Value::Complex(f64::from_bits(a), f64::from_bits(b))),
        ".{0,40}".prop_map(Value::Str),
        proptest::collection::vec(any::<u8>(), 0..300)
            .prop_map(|v| Value::Bytes(Buffer::from_vec(v))),
        (".{0,10}", ".{0,30}", ".{0,30}").prop_map(|(t, m, tb)| Value::Error {
            type_name: t,
            message: m,
            traceback: tb
        }),
        proptest::collection::vec(proptest::option::of(any::<i32>()), 0..50)
            .prop_map(|v| value::array("a", Arc::new(Int32Array::from(v)) as ArrayRef)),
    ]
}

fn any_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::List),
            proptest::collection::vec((".{0,8}", inner.clone()), 0..8).prop_map(Value::Dict),
            (
                any::<bool>(),
                ".{0,20}",
                proptest::collection::vec(inner.clone(), 0..4),
                proptest::collection::vec((".{0,8}", inner), 0..4)
            )
                .prop_map(|(src, t, args, kwargs)| Value::Call {
                    target: if src {
                        CallTarget::Source(t)
                    } else {
                        CallTarget::Name(t)
                    },
                    args,
                    kwargs
                }),
        ]
    })
}

proptest! {
    #[test]
    fn every_value_kind_round_trips(v in any_value()) {
        prop_assert_eq!(round_trip(&v), v);
    }

    /// The fuzz harness over arbitrary bytes: decoding never panics, whatever the input.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_slice(&bytes);
        let _ = mizu_wire::frame::read(&bytes);
    }

    /// Mutations of valid encodings (flips, truncations, splices) give a value or an error.
    #[test]
    fn mutated_encodings_never_panic(v in any_value(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6), cut in any::<usize>()) {
        let mut bytes = encode(&v).unwrap().to_vec();
        for (at, x) in flips {
            if !bytes.is_empty() {
                let i = at % bytes.len();
                bytes[i] ^= x;
            }
        }
        let _ = decode_slice(&bytes);
        let n = if bytes.is_empty() { 0 } else { cut % bytes.len() };
        let _ = decode_slice(&bytes[..n]);
    }
}

#[test]
fn nan_payloads_and_negative_zero_are_kept_bit_exact() {
    for bits in [
        rmeta::NA_REAL_BITS,
        0x7ff8_0000_0000_0001,
        (-0.0f64).to_bits(),
        f64::INFINITY.to_bits(),
    ] {
        let Value::Float(f) = round_trip(&Value::Float(f64::from_bits(bits))) else {
            panic!()
        };
        assert_eq!(f.to_bits(), bits);
    }
}

fn decode_err(bytes: &[u8]) -> WireError {
    decode_slice(bytes).expect_err("must be refused")
}

#[test]
fn hostile_input_gets_clear_errors() {
    // Truncated: an int64 with 3 of its 8 bytes.
    assert!(matches!(
        decode_err(&[0x03, 1, 2, 3]),
        WireError::Truncated {
            needed: 8,
            available: 3,
            ..
        }
    ));
    // Unknown tag.
    assert!(decode_err(&[0xEE]).to_string().contains("unknown tag 0xee"));
    // Trailing garbage.
    assert!(decode_err(&[0x00, 0x00]).to_string().contains("trailing"));
    // A string claiming 2^62 bytes: refused without allocating.
    let mut huge = vec![0x06];
    huge.extend_from_slice(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40]);
    assert!(matches!(decode_err(&huge), WireError::Truncated { .. }));
    // A list claiming 10^12 items with none present.
    let mut many = vec![0x08];
    many.extend_from_slice(&[0x80, 0xa0, 0x94, 0xa5, 0x8d, 0x1d]);
    assert!(matches!(decode_err(&many), WireError::Truncated { .. }));
    // A varint of 11 bytes.
    let long = [
        0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
    ];
    assert!(decode_err(&long).to_string().contains("varint"));
    // Invalid UTF-8.
    assert!(
        decode_err(&[0x06, 2, 0xc3, 0x28])
            .to_string()
            .contains("UTF-8")
    );
    // Nesting past the cap: [[[[...]]]].
    let mut deep = vec![];
    for _ in 0..MAX_DEPTH + 2 {
        deep.extend_from_slice(&[0x08, 1]);
    }
    deep.push(0x00);
    assert!(matches!(decode_err(&deep), WireError::TooDeep { .. }));
    // Non-zero alignment padding before large bytes.
    let mut b = encode(&Value::Bytes(Buffer::from_vec(vec![1u8; 100])))
        .unwrap()
        .to_vec();
    b[5] = 9;
    assert!(decode_err(&b).to_string().contains("padding"));
    // An arrow stream with its body cut short.
    let a = encode(&value::array(
        "x",
        Arc::new(Float64Array::from(vec![1.0; 64])) as ArrayRef,
    ))
    .unwrap()
    .to_vec();
    assert!(decode_slice(&a[..a.len() - 100]).is_err());
    // Unknown call form.
    assert!(
        decode_err(&[0x0B, 7, 0, 0, 0])
            .to_string()
            .contains("call form")
    );
}

#[test]
fn nesting_past_the_cap_is_refused_when_encoding_too() {
    let mut v = Value::None;
    for _ in 0..MAX_DEPTH + 2 {
        v = Value::List(vec![v]);
    }
    assert!(matches!(encode(&v), Err(WireError::Unsupported(_))));
}

fn round_trip_field(f: arrow_schema::Field, a: ArrayRef) -> (arrow_schema::FieldRef, ArrayRef) {
    let v = Value::Array {
        field: Arc::new(f),
        array: a,
    };
    match round_trip(&v) {
        Value::Array { field, array } => (field, array),
        other => panic!("{other:?}"),
    }
}

#[test]
fn r_integer_na_is_null() {
    let (f, a) = rmeta::integer("x", &[1, rmeta::NA_INTEGER, 3]);
    let (f, a) = round_trip_field(f, a);
    assert_eq!(rmeta::classify(&f).unwrap(), RType::Integer);
    assert!(a.is_null(1) && a.is_valid(0));
    assert_eq!(a.as_primitive::<Int32Type>().values()[2], 3);
}

#[test]
fn r_double_keeps_the_na_real_payload_and_plain_nan() {
    let na = f64::from_bits(rmeta::NA_REAL_BITS);
    let (f, a) = rmeta::double("x", &[1.5, na, f64::NAN]);
    let (f, a) = round_trip_field(f, a);
    assert_eq!(rmeta::classify(&f).unwrap(), RType::Double);
    let d = a.as_any().downcast_ref::<Float64Array>().unwrap();
    assert!(d.is_null(1), "NA_real_ is null for every Arrow reader");
    assert!(d.is_valid(2), "NaN stays a valid NaN");
    assert_eq!(
        d.values()[1].to_bits(),
        rmeta::NA_REAL_BITS,
        "payload bits kept under the null"
    );
    assert_eq!(rmeta::double_value(d, 1).to_bits(), rmeta::NA_REAL_BITS);
}

#[test]
fn r_logical_character_raw() {
    let (f, a) = round_trip_field(
        rmeta::logical("l", &[1, 0, rmeta::NA_INTEGER]).0,
        rmeta::logical("l", &[1, 0, rmeta::NA_INTEGER]).1,
    );
    assert_eq!(rmeta::classify(&f).unwrap(), RType::Logical);
    let b = a.as_boolean();
    assert!(b.value(0) && !b.value(1) && b.is_null(2));
    let (f, a) = rmeta::character("c", &[Some("a"), None, Some("ü")]);
    let (f, a) = round_trip_field(f, a);
    assert_eq!(rmeta::classify(&f).unwrap(), RType::Character);
    assert_eq!(a.as_string::<i32>().value(2), "ü");
    assert!(a.is_null(1));
    let (f, a) = rmeta::raw("r", &[0, 255]);
    let (f, a) = round_trip_field(f, a);
    assert_eq!(rmeta::classify(&f).unwrap(), RType::Raw);
    assert_eq!(a.len(), 2);
}

#[test]
fn r_factor_is_a_dictionary() {
    let (f, a) = rmeta::factor("f", &[2, 1, rmeta::NA_INTEGER, 2], &["lo", "hi"], true).unwrap();
    let (f, a) = round_trip_field(f, a);
    assert_eq!(
        rmeta::classify(&f).unwrap(),
        RType::Factor { ordered: true }
    );
    let d = a.as_dictionary::<Int32Type>();
    assert_eq!(
        d.keys().values().to_vec()[..2],
        [1, 0],
        "codes are 0-based in Arrow"
    );
    assert!(d.is_null(2));
    assert_eq!(d.values().as_string::<i32>().value(1), "hi");
    assert!(
        rmeta::factor("f", &[3], &["a"], false).is_err(),
        "codes outside the levels are refused"
    );
}

#[test]
fn r_dates_times_and_durations() {
    let (f, a) = round_trip_field(
        rmeta::date("d", &[0.0, 19000.0, f64::NAN]).0,
        rmeta::date("d", &[0.0, 19000.0, f64::NAN]).1,
    );
    assert_eq!(rmeta::classify(&f).unwrap(), RType::Date);
    assert!(a.is_null(2));
    let (f, a) = rmeta::posixct("t", &[1.5, f64::NAN], "Europe/Zurich");
    let (f, a) = round_trip_field(f, a);
    assert_eq!(
        rmeta::classify(&f).unwrap(),
        RType::PosixCt {
            tz: "Europe/Zurich".into()
        }
    );
    assert_eq!(
        a.as_primitive::<arrow_array::types::TimestampMicrosecondType>()
            .value(0),
        1_500_000
    );
    let (f, _) = rmeta::posixct("t", &[0.0], "");
    assert_eq!(
        rmeta::classify(&f).unwrap(),
        RType::PosixCt { tz: "".into() }
    );
    let (f, a) = rmeta::difftime("dt", &[1.5, 2.0], "hours").unwrap();
    let (f, a) = round_trip_field(f, a);
    assert_eq!(
        rmeta::classify(&f).unwrap(),
        RType::Difftime {
            units: "hours".into()
        }
    );
    assert_eq!(
        a.as_primitive::<arrow_array::types::DurationMicrosecondType>()
            .value(0),
        5_400_000_000
    );
    assert!(rmeta::difftime("dt", &[1.0], "fortnights").is_err());
}

#[test]
fn r_integer64_and_dim() {
    let (f, a) = rmeta::integer64("i", &[1, rmeta::NA_INTEGER64, i64::MAX]);
    let (f, a) = round_trip_field(f, a);
    assert_eq!(rmeta::classify(&f).unwrap(), RType::Integer64);
    assert!(a.is_null(1));
    let (f, a) = rmeta::double("m", &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let f = rmeta::with_dim(f, &[2, 3]);
    let (f, a) = round_trip_field(f, a);
    assert_eq!(rmeta::dim(&f, a.len()).unwrap(), Some(vec![2, 3]));
    assert!(rmeta::dim(&rmeta::with_dim(rmeta::double("m", &[1.0]).0, &[2, 3]), 1).is_err());
}

#[test]
fn r_data_frame_is_a_record_batch() {
    let df = rmeta::data_frame(vec![
        rmeta::integer("a", &[1, 2]),
        rmeta::factor("b", &[1, 2], &["x", "y"], false).unwrap(),
        rmeta::character("c", &[Some("p"), None]),
    ])
    .unwrap();
    let Value::Table(t) = round_trip(&Value::Table(df.clone())) else {
        panic!()
    };
    assert_eq!(t, df);
    assert!(rmeta::is_data_frame(&t.schema()));
    let kinds: Vec<RType> = t
        .schema()
        .fields()
        .iter()
        .map(|f| rmeta::classify(f).unwrap())
        .collect();
    assert_eq!(
        kinds,
        vec![
            RType::Integer,
            RType::Factor { ordered: false },
            RType::Character
        ]
    );
}

#[test]
fn unknown_r_mappings_are_refused() {
    let f = arrow_schema::Field::new("x", arrow_schema::DataType::Float32, true);
    assert!(rmeta::classify(&f).is_err());
    let f = arrow_schema::Field::new("x", arrow_schema::DataType::Int32, true).with_metadata(
        std::collections::HashMap::from([(rmeta::CLASS.to_string(), "factor".to_string())]),
    );
    assert!(rmeta::classify(&f).is_err());
}

fn arrow_corpus() -> Vec<Vec<u8>> {
    let df = rmeta::data_frame(vec![
        rmeta::integer("a", &[1, rmeta::NA_INTEGER, 3]),
        rmeta::factor("b", &[1, 2, rmeta::NA_INTEGER], &["x", "y"], false).unwrap(),
        rmeta::character("c", &[Some("p"), None, Some("qq")]),
        rmeta::double("d", &[1.0, f64::from_bits(rmeta::NA_REAL_BITS), 2.0]),
        rmeta::posixct("t", &[1.0, 2.0, f64::NAN], "UTC"),
    ])
    .unwrap();
    vec![
        encode(&Value::Table(df)).unwrap().to_vec(),
        encode(&value::array(
            "s",
            Arc::new(arrow_array::StringArray::from(vec![Some("a"), None])) as ArrayRef,
        ))
        .unwrap()
        .to_vec(),
    ]
}

proptest! {
    /// Fuzz harness for the Arrow path: byte flips anywhere in real IPC streams (metadata,
    /// offsets, dictionaries, bodies) give a value or an error, never a panic.
    #[test]
    fn mutated_arrow_streams_never_panic(which in 0usize..2, flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4)) {
        let mut bytes = arrow_corpus()[which].clone();
        for (at, x) in flips {
            let i = at % bytes.len();
            bytes[i] ^= x.max(1);
        }
        let _ = decode_slice(&bytes);
    }
}

#[test]
fn dictionary_keys_out_of_range_are_refused_unless_under_a_null() {
    use arrow_array::{DictionaryArray, StringArray};
    let dict = |keys: Int32Array| {
        let a: ArrayRef = Arc::new(
            // SAFETY: an invalid array on purpose; it is only encoded, never read.
            unsafe {
                DictionaryArray::<Int32Type>::new_unchecked(
                    keys,
                    Arc::new(StringArray::from(vec!["a", "b"])),
                )
            },
        );
        encode(&value::array("f", a)).unwrap().to_vec()
    };
    let big: Vec<i32> = (0..1000).map(|i| i % 2).collect();
    for bad in [2, -1, i32::MAX] {
        let mut k = big.clone();
        k[777] = bad;
        let err = decode_slice(&dict(Int32Array::from(k))).unwrap_err();
        assert!(err.to_string().contains("dictionary key"), "{err}");
    }
    // Under a null a key may be anything.
    let mut k: Vec<Option<i32>> = big.iter().map(|&v| Some(v)).collect();
    k[5] = None;
    let keys = Int32Array::from(k);
    let (values, nulls) = (keys.values().clone(), keys.nulls().cloned());
    let mut raw: Vec<i32> = values.to_vec();
    raw[5] = 99;
    let v = decode_slice(&dict(Int32Array::new(raw.into(), nulls))).unwrap();
    let Value::Array { array, .. } = v else {
        panic!("not an array")
    };
    let d = array.as_dictionary::<Int32Type>();
    assert!(d.is_null(5));
    assert_eq!(d.keys().value(777), 1);
}

#[test]
fn primitive_layout_places_the_bitmap_values_and_null_count() {
    let a: ArrayRef = Arc::new(Float64Array::from(
        (0..2000)
            .map(|i| (i % 7 != 3).then_some(i as f64))
            .collect::<Vec<_>>(),
    ));
    let nulls = a.null_count();
    let e = encode(&value::array("x", a.clone())).unwrap();
    let l = e.column_layouts().expect("an array")[0]
        .clone()
        .expect("validity and values");
    let bytes = e.to_vec();
    let count = i64::from_le_bytes(
        bytes[l.null_count_at..l.null_count_at + 8]
            .try_into()
            .unwrap(),
    );
    assert_eq!(count as usize, nulls);
    assert_eq!(
        &bytes[l.validity.start..l.validity.start + 250],
        a.nulls().unwrap().validity()
    );
    let f = a.as_primitive::<arrow_array::types::Float64Type>();
    let vals: &[u8] = f.values().inner().as_slice();
    assert_eq!(&bytes[l.values.clone()], vals);
    // The parts skipped are left alone; everything else is written.
    let mut out = vec![0xAAu8; e.len()];
    e.write_to_except(&mut out, &[vals.as_ptr()]);
    assert!(out[l.values.clone()].iter().all(|&b| b == 0xAA));
    assert_eq!(out[..l.values.start], bytes[..l.values.start]);
    // A table: one layout per column (none for strings), dictionaries skipped over.
    let strs: ArrayRef = Arc::new(arrow_array::StringArray::from(vec![
        Some("a"),
        None,
        Some("bc"),
    ]));
    let ints: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(3)]));
    let dict: ArrayRef = Arc::new(
        vec![Some("x"), None, Some("y")]
            .into_iter()
            .collect::<arrow_array::DictionaryArray<Int32Type>>(),
    );
    let t =
        arrow_array::RecordBatch::try_from_iter([("s", strs), ("d", dict), ("i", ints)]).unwrap();
    let e = encode(&Value::Table(t)).unwrap();
    let ls = e.column_layouts().expect("a table");
    let bytes = e.to_vec();
    assert!(ls[0].is_none());
    for (l, k) in [(ls[1].clone().unwrap(), 1i32), (ls[2].clone().unwrap(), 3)] {
        let at = l.null_count_at;
        assert_eq!(i64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()), 1);
        let v = &bytes[l.values.clone()];
        assert_eq!(i32::from_le_bytes(v[8..12].try_into().unwrap()), k);
    }
    assert!(encode(&Value::Int(1)).unwrap().column_layouts().is_none());
}
