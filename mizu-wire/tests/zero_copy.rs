//! Large values are read in place: no byte of an Arrow body or a large byte string is copied
//! on the receiving side.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_buffer::Buffer;
use arrow_schema::{DataType, Field, Schema};
use mizu_wire::{DataPool, Mapper, Value, encode, read_value, value, write_value};

fn inside(buf_ptr: *const u8, len: usize, region: &mizu_wire::Region) -> bool {
    let r = region.bytes();
    let (lo, hi) = (r.as_ptr() as usize, r.as_ptr() as usize + r.len());
    (buf_ptr as usize) >= lo && (buf_ptr as usize) + len <= hi
}

fn via_region(v: &Value) -> mizu_wire::Received {
    let pool = DataPool::new(1 << 20);
    let mapper = Mapper::new();
    let mut slot = [0u8; 256];
    let n = write_value(v, 7, &mut slot, &pool).unwrap();
    assert_eq!(n, 16 + 64, "a large value travels as a region frame");
    let got = read_value(&slot[..n], &mapper).unwrap();
    assert_eq!(got.aux, 7);
    got
}

#[test]
fn a_float64_array_is_a_view_into_the_region() {
    let a: ArrayRef = Arc::new(Float64Array::from_iter_values(
        (0..100_000).map(|i| i as f64 * 0.5),
    ));
    let v = value::array("x", a.clone());
    let got = via_region(&v);
    let region = got.region.as_ref().unwrap();
    let Value::Array { array, .. } = &got.value else {
        panic!("{:?}", got.value)
    };
    assert_eq!(array.to_data(), a.to_data());
    let data = array.to_data();
    let b = &data.buffers()[0];
    assert_eq!(b.as_ptr() as usize % 64, 0, "64-byte aligned body buffer");
    assert!(
        inside(b.as_ptr(), b.len(), region),
        "the values buffer points into the mapping"
    );
}

#[test]
fn a_table_with_strings_and_nulls_is_a_view_into_the_region() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(0..50_000));
    let names: ArrayRef = Arc::new(StringArray::from_iter(
        (0..50_000).map(|i| (i % 7 != 0).then(|| format!("n{i}"))),
    ));
    let batch = RecordBatch::try_new(schema, vec![ids, names]).unwrap();
    let got = via_region(&Value::Table(batch.clone()));
    let region = got.region.as_ref().unwrap();
    let Value::Table(t) = &got.value else {
        panic!()
    };
    assert_eq!(t, &batch);
    for col in t.columns() {
        let d = col.to_data();
        for b in d.buffers() {
            assert!(inside(b.as_ptr(), b.len(), region));
        }
        if let Some(n) = d.nulls() {
            assert!(inside(n.buffer().as_ptr(), n.buffer().len(), region));
        }
    }
}

#[test]
fn large_bytes_are_a_view_and_small_values_travel_inline() {
    let big = Buffer::from_vec(vec![7u8; 100_000]);
    let got = via_region(&Value::Bytes(big.clone()));
    let Value::Bytes(b) = &got.value else {
        panic!()
    };
    assert_eq!(b.as_slice(), big.as_slice());
    assert_eq!(b.as_ptr() as usize % 64, 0);
    assert!(inside(b.as_ptr(), b.len(), got.region.as_ref().unwrap()));

    let pool = DataPool::new(1 << 20);
    let mut slot = [0u8; 256];
    let n = write_value(&Value::Str("hi".into()), 1, &mut slot, &pool).unwrap();
    assert!(n < 32);
    assert_eq!(
        pool.segments(),
        0,
        "inline values never touch shared storage"
    );
    assert_eq!(
        read_value(&slot[..n], &Mapper::new()).unwrap().value,
        Value::Str("hi".into())
    );
}

#[test]
fn the_decoder_requires_alignment_of_arrow_data() {
    let a: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0]));
    let bytes = encode(&value::array("x", a)).unwrap().to_vec();
    // Shift the value by 8 bytes: the Arrow body is no longer 64-byte aligned in memory.
    let mut shifted = arrow_buffer::MutableBuffer::with_capacity(bytes.len() + 8);
    shifted.extend_from_slice(&[0u8; 8]);
    shifted.extend_from_slice(&bytes);
    let shifted: Buffer = shifted.into();
    let e = mizu_wire::decode(&shifted.slice(8)).unwrap_err();
    assert!(e.to_string().contains("align"), "{e}");
    // The same bytes at an aligned address decode.
    assert!(mizu_wire::decode_slice(&bytes).is_ok());
}
