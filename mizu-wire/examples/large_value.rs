//! A million doubles cross to another process without being copied there: the parent encodes
//! them once into a region of a data segment and hands the child a 80-byte frame (here on its
//! command line); the child adopts the region and reads the values in place.
//!
//! `cargo run -p mizu-wire --example large_value`

use std::process::Command;

use arrow_array::{Array, Float64Array};
use mizu_wire::frame::{self, Body};
use mizu_wire::{DataPool, Mapper, Value, rmeta};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, role, frame_hex] = args.as_slice()
        && role == "--reader"
    {
        let bytes = unhex(frame_hex);
        let got = frame::read_value(&bytes, &Mapper::new())?;
        let Value::Array { array, .. } = got.value else {
            return Err("not an array".into());
        };
        let x = array
            .as_any()
            .downcast_ref::<Float64Array>()
            .ok_or("not doubles")?;
        let in_region = got.region.as_ref().is_some_and(|r| {
            let base = mizu_wire::Region::buffer(r).as_ptr() as usize;
            let p = x.values().as_ptr() as usize;
            p >= base && p < base + r.len()
        });
        println!(
            "the reader summed {} doubles to {} (read in place in shared memory: {in_region})",
            x.len(),
            x.values().iter().sum::<f64>()
        );
        return Ok(());
    }
    let data: Vec<f64> = (0..1_000_000).map(f64::from).collect();
    let (field, array) = rmeta::double("x", &data);
    let value = Value::Array {
        field: field.into(),
        array,
    };
    let pool = DataPool::new(16 << 20);
    let mut out = [0u8; frame::HEADER_LEN + frame::DESC_LEN];
    let n = frame::write_value(&value, 0, &mut out, &pool)?;
    assert!(matches!(frame::read(&out[..n])?.body, Body::Region(_)));
    let status = Command::new(std::env::current_exe()?)
        .args(["--reader", &hex(&out[..n])])
        .status()?;
    if !status.success() {
        return Err(format!("the reader failed: {status}").into());
    }
    println!(
        "the writer sent an {n}-byte frame for {} bytes of data",
        data.len() * 8
    );
    Ok(())
}
