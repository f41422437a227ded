//! Arrow arrays and record batches in as R vectors: the views an out-of-band vector or data
//! frame becomes (see `arrow_out.rs` for the way out).
//!
//! An int32, float64, int64 or uint8 array whose nulls hold R's NA is a plain view of the
//! values (`view.rs`); anything else that needs converting — booleans, dictionary codes,
//! dates, timestamps, or nulls written by another Arrow writer over other values — is a lazy
//! view that converts an element when it is read (`lazyview.rs`). The R attributes (class,
//! levels, tz, names, dim) come from the serialization, not from the field metadata, which is
//! there for other readers. Every view keeps the encoded value it came in (and, for a column
//! of a record batch, the column's index) to be sent on by reference.

use arrow_array::cast::AsArray;
use arrow_array::types::{ArrowPrimitiveType, Float64Type, Int32Type, Int64Type, UInt8Type};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_buffer::{Buffer, MutableBuffer, NullBuffer};
use arrow_schema::{DataType, TimeUnit};
use extendr_api::Result;
use extendr_api::prelude::*;
use mizu_pool::wire::Value;
use mizu_pool::wire::rmeta::{NA_INTEGER, NA_INTEGER64};

use crate::lazyview::Conv;
use crate::view::VType;

use crate::altrep::Source;
use crate::ntcopy::is_na_real;

fn bad(why: impl std::fmt::Display) -> extendr_api::Error {
    crate::rerr(format!("malformed payload: Arrow vector: {why}"))
}

/// Whether every null of `a` holds a value `ok` accepts (R's NA, so the values can be
/// viewed as they are).
fn nulls_hold(nulls: Option<&NullBuffer>, ok: impl Fn(usize) -> bool) -> bool {
    match nulls {
        None => true,
        Some(n) if n.null_count() == 0 => true,
        Some(n) => (!n.inner()).set_indices().all(ok),
    }
}

/// Arrow data is read in place only at 64-byte alignment (a payload copied out of a ring
/// slot may not be): else a copy.
fn aligned(src: Buffer) -> Buffer {
    if (src.as_ptr() as usize).is_multiple_of(64) {
        return src;
    }
    let mut m = MutableBuffer::with_capacity(src.len());
    m.extend_from_slice(src.as_slice());
    m.into()
}

/// The R vector for an out-of-band Arrow array value (`src`, the encoded value as it sits in
/// the payload). `copy` as in `view::account`.
pub fn view(src: Buffer, copy: bool) -> Result<Robj> {
    let src = aligned(src);
    let plain = |values: Buffer, t: VType, src: Buffer| {
        crate::view::make_sourced(
            values,
            t,
            copy,
            Source {
                bytes: src,
                col: None,
            },
        )
    };
    if let Some((t, values)) = known::find(&src) {
        return plain(values, t, src);
    }
    let Value::Array { array, .. } = mizu_pool::wire::decode(&src).map_err(bad)? else {
        return Err(bad("not an array"));
    };
    if let Some((t, values)) = plain_values(&array) {
        known::learn(&src, t, &values);
        return plain(values, t, src);
    }
    column(
        &array,
        Source {
            bytes: src,
            col: None,
        },
        copy,
    )
}

/// The values of an array without nulls that R views as they are (its type there).
fn plain_values(array: &ArrayRef) -> Option<(VType, Buffer)> {
    if array.null_count() > 0 {
        return None;
    }
    fn values<T: ArrowPrimitiveType>(a: &ArrayRef) -> Buffer {
        a.as_primitive::<T>().values().inner().clone()
    }
    Some(match array.data_type() {
        DataType::Int32 => (VType::Int, values::<Int32Type>(array)),
        DataType::Float64 => (VType::Real, values::<Float64Type>(array)),
        DataType::Int64 => (VType::Real, values::<Int64Type>(array)),
        DataType::UInt8 => (VType::Raw, values::<UInt8Type>(array)),
        _ => return None,
    })
}

/// The layouts of the last plain vectors read from shared memory: a task reading a shared
/// vector gets the same encoded value each time, whose header (Arrow's IPC messages, checked
/// flatbuffers) costs more to decode than the rest of the task. A range of a shared region is
/// immutable while it is referenced (as the runtime relies on for what it validated), so the
/// same range of the same region, generation and segment holds the same value: its layout is
/// looked up by that, as the runtime keys what it validated.
mod known {
    use std::cell::RefCell;

    use arrow_buffer::Buffer;
    use mizu_pool::wire::{Region, RegionDesc};

    use crate::view::VType;

    /// Layouts kept (the most recent first).
    const KEPT: usize = 8;

    /// A value's region, its offset in the region and its length.
    type Key = (RegionDesc, usize, usize);

    struct Layout {
        key: Key,
        t: VType,
        /// Where its values are in it.
        values: std::ops::Range<usize>,
    }

    thread_local! {
        static LAYOUTS: RefCell<Vec<Layout>> = const { RefCell::new(Vec::new()) };
    }

    fn key(src: &Buffer) -> Option<Key> {
        let (region, at) = Region::containing(src.as_ptr())?;
        Some((region.describe(), at, src.len()))
    }

    /// The type and values of `src` if it is a range of a shared region read before.
    pub fn find(src: &Buffer) -> Option<(VType, Buffer)> {
        let key = key(src)?;
        LAYOUTS.with(|l| {
            let mut l = l.borrow_mut();
            let i = l.iter().position(|k| k.key == key)?;
            let k = l.remove(i);
            let found = (k.t, src.slice_with_length(k.values.start, k.values.len()));
            l.insert(0, k);
            Some(found)
        })
    }

    /// Remembers that `src` holds `values` (a slice of it) of type `t`, if it is a range of a
    /// shared region.
    pub fn learn(src: &Buffer, t: VType, values: &Buffer) {
        let start = (values.as_ptr() as usize).wrapping_sub(src.as_ptr() as usize);
        let Some(end) = start.checked_add(values.len()).filter(|&e| e <= src.len()) else {
            return;
        };
        let Some(key) = key(src) else {
            return;
        };
        LAYOUTS.with(|l| {
            let mut l = l.borrow_mut();
            l.retain(|k| k.key != key);
            l.truncate(KEPT - 1);
            l.insert(
                0,
                Layout {
                    key,
                    t,
                    values: start..end,
                },
            );
        });
    }
}

/// The record batch of an out-of-band data frame value (`src` as in [`view`]), and the
/// aligned bytes it was read from.
pub fn table(src: Buffer) -> Result<(RecordBatch, Buffer)> {
    let src = aligned(src);
    match mizu_pool::wire::decode(&src).map_err(bad)? {
        Value::Table(b) => Ok((b, src)),
        _ => Err(bad("not a record batch")),
    }
}

/// The columns of an out-of-band data frame value (`src` as in [`view`]) as views.
pub fn frame(src: Buffer, copy: bool) -> Result<Vec<Robj>> {
    let (batch, src) = table(src)?;
    (0..batch.num_columns())
        .map(|j| {
            let s = Source {
                bytes: src.clone(),
                col: Some(j as u32),
            };
            column(batch.column(j), s, copy)
        })
        .collect()
}

/// The R vector for one array (of the value `src`).
pub fn column(array: &ArrayRef, src: Source, copy: bool) -> Result<Robj> {
    let plain =
        |values: &Buffer, t: VType| crate::view::make_sourced(values.clone(), t, copy, src.clone());
    let lazy = |conv: Conv| crate::lazyview::make(array.clone(), conv, copy, src.clone());
    match array.data_type() {
        DataType::Int32 => {
            let a = array.as_primitive::<Int32Type>();
            let v = a.values();
            if nulls_hold(a.nulls(), |i| v[i] == NA_INTEGER) {
                plain(v.inner(), VType::Int)
            } else {
                lazy(Conv::Int32)
            }
        }
        DataType::Float64 => {
            let a = array.as_primitive::<Float64Type>();
            let v = a.values();
            if nulls_hold(a.nulls(), |i| is_na_real(v[i])) {
                plain(v.inner(), VType::Real)
            } else {
                lazy(Conv::Float64)
            }
        }
        DataType::Int64 => {
            let a = array.as_primitive::<Int64Type>();
            let v = a.values();
            if nulls_hold(a.nulls(), |i| v[i] == NA_INTEGER64) {
                plain(v.inner(), VType::Real)
            } else {
                lazy(Conv::Int64)
            }
        }
        DataType::UInt8 => {
            let a = array.as_primitive::<UInt8Type>();
            if a.null_count() > 0 {
                return Err(bad("a raw vector has no NA"));
            }
            plain(a.values().inner(), VType::Raw)
        }
        DataType::Boolean => lazy(Conv::Bool),
        DataType::Utf8 => crate::strview::make_arrow(array.as_string::<i32>().clone(), src, copy),
        DataType::LargeUtf8 => {
            crate::strview::make_arrow(array.as_string::<i64>().clone(), src, copy)
        }
        DataType::Date32 => lazy(Conv::Date),
        DataType::Timestamp(TimeUnit::Microsecond, _) => lazy(Conv::Micros),
        DataType::Dictionary(k, _) if **k == DataType::Int32 => lazy(Conv::Codes),
        t => Err(bad(format!("{t} has no R mapping"))),
    }
}
