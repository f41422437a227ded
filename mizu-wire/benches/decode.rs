//! Decoding from a data segment: mizu's zero-copy path vs arrow-ipc's standard reader on the
//! same bytes (which copies every buffer) vs a plain memcpy of the payload; and encode
//! throughput as a fraction of memcpy bandwidth. Median of several runs, one thread.

use std::hint::black_box;
use std::io::Cursor;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch};
use arrow_ipc::reader::StreamReader;
use arrow_schema::{DataType, Field, Schema};
use mizu_wire::{DataPool, Region, Value, decode, encode, value};

const RUNS: usize = 15;

fn median_us(mut f: impl FnMut()) -> f64 {
    f();
    let mut v: Vec<f64> = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn f64_array(n: usize) -> Value {
    value::array(
        "x",
        Arc::new(Float64Array::from_iter_values((0..n).map(|i| i as f64))) as ArrayRef,
    )
}

fn table(rows: usize) -> Value {
    let fields: Vec<Field> = (0..10)
        .map(|c| {
            Field::new(
                format!("c{c}"),
                if c % 2 == 0 {
                    DataType::Float64
                } else {
                    DataType::Int64
                },
                false,
            )
        })
        .collect();
    let cols: Vec<ArrayRef> = (0..10)
        .map(|c| -> ArrayRef {
            if c % 2 == 0 {
                Arc::new(Float64Array::from_iter_values(
                    (0..rows).map(|i| (i * c) as f64),
                ))
            } else {
                Arc::new(Int64Array::from_iter_values(
                    (0..rows).map(|i| (i * c) as i64),
                ))
            }
        })
        .collect();
    Value::Table(RecordBatch::try_new(Arc::new(Schema::new(fields)), cols).unwrap())
}

struct Row {
    what: String,
    bytes: usize,
    zero_copy_us: f64,
    arrow_reader_us: f64,
    memcpy_us: f64,
    encode_us: f64,
}

fn measure(what: &str, v: &Value, pool: &DataPool) -> Row {
    let enc = encode(v).unwrap();
    let mut r = pool.alloc(enc.len()).unwrap();
    enc.write_to(r.bytes_mut());
    let region = Arc::new(r.commit());
    let buf = Region::buffer(&region);
    // The IPC stream starts at the first 64-byte boundary after the tag and length.
    let stream = &region.bytes()[64..];
    let zero_copy_us = median_us(|| {
        black_box(decode(black_box(&buf)).unwrap());
    });
    let arrow_reader_us = median_us(|| {
        let rd = StreamReader::try_new(Cursor::new(black_box(stream)), None).unwrap();
        for b in rd {
            black_box(b.unwrap());
        }
    });
    let mut dst = vec![0u8; region.len()];
    let memcpy_us = median_us(|| {
        dst.copy_from_slice(black_box(region.bytes()));
        black_box(&dst);
    });
    let encode_us = median_us(|| {
        let e = encode(black_box(v)).unwrap();
        let mut r = pool.alloc(e.len()).unwrap();
        e.write_to(r.bytes_mut());
        black_box(r.commit());
    });
    Row {
        what: what.into(),
        bytes: region.len(),
        zero_copy_us,
        arrow_reader_us,
        memcpy_us,
        encode_us,
    }
}

fn main() {
    let pool = DataPool::new(256 << 20);
    let rows = vec![
        measure("float64 array, 1 MB", &f64_array(1 << 17), &pool),
        measure("float64 array, 8 MB", &f64_array(1 << 20), &pool),
        measure("float64 array, 64 MB", &f64_array(1 << 23), &pool),
        measure("table 100k x 10", &table(100_000), &pool),
        measure("table 1M x 10 (80 MB)", &table(1_000_000), &pool),
    ];
    println!(
        "mizu-wire: decoding a value that sits in a data segment, median of {RUNS} runs, one thread"
    );
    println!(
        "| value                  |  bytes | mizu zero-copy decode | arrow-ipc StreamReader (copies) | memcpy of payload | zero-copy vs reader | zero-copy vs memcpy |"
    );
    println!(
        "|------------------------|-------:|----------------------:|--------------------------------:|------------------:|--------------------:|--------------------:|"
    );
    for r in &rows {
        println!(
            "| {:<22} | {:>5.1}M | {:>18.1} µs | {:>28.1} µs | {:>14.1} µs | {:>18.0}x | {:>18.0}x |",
            r.what,
            r.bytes as f64 / 1e6,
            r.zero_copy_us,
            r.arrow_reader_us,
            r.memcpy_us,
            r.arrow_reader_us / r.zero_copy_us,
            r.memcpy_us / r.zero_copy_us
        );
    }
    println!();
    println!("Encoding into a region (encode + one copy into shared memory) vs memcpy bandwidth:");
    println!("| value                  | encode GB/s | memcpy GB/s | fraction of memcpy |");
    println!("|------------------------|------------:|------------:|-------------------:|");
    for r in &rows {
        let enc = r.bytes as f64 / r.encode_us / 1e3;
        let mem = r.bytes as f64 / r.memcpy_us / 1e3;
        println!(
            "| {:<22} | {:>11.2} | {:>11.2} | {:>17.0}% |",
            r.what,
            enc,
            mem,
            100.0 * enc / mem
        );
    }
}
