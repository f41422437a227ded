//! R semantics in Arrow field metadata (normative: `docs/wire-format.md` §R).
//!
//! Builders take R's in-memory representation (as the R binding sees it) and produce the Arrow
//! array and field that carry it; [`classify`] tells a reader which R type to rebuild and
//! rejects inconsistent metadata.
//!
//! | R | Arrow | metadata |
//! |---|---|---|
//! | integer (`NA_integer_`) | int32, NA as null | — |
//! | double (`NA_real_` bits kept) | float64, NA as null, payload bits kept under the null | — |
//! | logical | bool with nulls | — |
//! | character | utf8 with nulls | — |
//! | factor / ordered | dictionary<int32, utf8>, codes − 1 | `mizu.r.class = factor|ordered` |
//! | Date | date32 | — |
//! | POSIXct | timestamp[us, tz] | `mizu.r.tz` (also in the type) |
//! | difftime | `duration[us]` | `mizu.r.units` |
//! | raw | uint8 | — |
//! | integer64 | int64, NA (`i64::MIN`) as null | `mizu.r.class = integer64` |
//! | `dim` | the flat (column-major) array | `mizu.r.dim = "d1,d2,…"` |
//! | data.frame | record batch | schema `mizu.r.class = data.frame` |

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::types::Int32Type;
use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, DictionaryArray, DurationMicrosecondArray,
    Float64Array, Int32Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
    UInt8Array,
};
use arrow_buffer::{NullBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Schema, TimeUnit};

use crate::error::{Result, WireError};

/// Metadata key: the R class the field or schema represents.
pub const CLASS: &str = "mizu.r.class";
/// Metadata key: POSIXct time zone ("" for local time).
pub const TZ: &str = "mizu.r.tz";
/// Metadata key: difftime units (`secs`, `mins`, `hours`, `days`, `weeks`).
pub const UNITS: &str = "mizu.r.units";
/// Metadata key: the `dim` attribute, comma-separated.
pub const DIM: &str = "mizu.r.dim";

/// R's `NA_integer_`.
pub const NA_INTEGER: i32 = i32::MIN;
/// R's `NA_real_`: a NaN whose low word is 1954.
pub const NA_REAL_BITS: u64 = 0x7FF0_0000_0000_07A2;
/// R's `NA` for integer64 (bit64).
pub const NA_INTEGER64: i64 = i64::MIN;

/// What an R reader rebuilds from a field.
#[derive(Debug, Clone, PartialEq)]
pub enum RType {
    /// integer vector.
    Integer,
    /// double vector.
    Double,
    /// logical vector.
    Logical,
    /// character vector.
    Character,
    /// factor (ordered or not).
    Factor {
        /// `ordered` class.
        ordered: bool,
    },
    /// Date.
    Date,
    /// POSIXct with this time zone.
    PosixCt {
        /// "" is local time.
        tz: String,
    },
    /// difftime in these units.
    Difftime {
        /// The units.
        units: String,
    },
    /// raw vector.
    Raw,
    /// bit64 integer64.
    Integer64,
}

fn nulls(valid: impl Iterator<Item = bool>) -> Option<NullBuffer> {
    let nb = NullBuffer::from_iter(valid);
    (nb.null_count() > 0).then_some(nb)
}

fn field(name: &str, a: &ArrayRef, meta: &[(&str, String)]) -> Field {
    let md: HashMap<String, String> = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    ordered_if_so(Field::new(name, a.data_type().clone(), true).with_metadata(md))
}

/// `f` with Arrow's ordered-dictionary flag set when its R class is `ordered`, so that Arrow
/// readers (pandas' ordered categoricals) see the order too.
pub fn ordered_if_so(f: Field) -> Field {
    let ordered = f.metadata().get(CLASS).is_some_and(|c| c == "ordered");
    if ordered && matches!(f.data_type(), DataType::Dictionary(..)) {
        f.with_dict_is_ordered(true)
    } else {
        f
    }
}

/// An integer vector.
pub fn integer(name: &str, x: &[i32]) -> (Field, ArrayRef) {
    let a: ArrayRef = Arc::new(Int32Array::new(
        ScalarBuffer::from(x.to_vec()),
        nulls(x.iter().map(|&v| v != NA_INTEGER)),
    ));
    (field(name, &a, &[]), a)
}

/// A double vector: `NA_real_` becomes null with its bits kept in the data buffer; other NaNs
/// stay valid NaNs.
pub fn double(name: &str, x: &[f64]) -> (Field, ArrayRef) {
    let a: ArrayRef = Arc::new(Float64Array::new(
        ScalarBuffer::from(x.to_vec()),
        nulls(x.iter().map(|v| v.to_bits() != NA_REAL_BITS)),
    ));
    (field(name, &a, &[]), a)
}

/// A logical vector (R stores logicals as int: 0, 1, `NA_integer_`).
pub fn logical(name: &str, x: &[i32]) -> (Field, ArrayRef) {
    let a: ArrayRef = Arc::new(BooleanArray::from(
        x.iter()
            .map(|&v| (v != NA_INTEGER).then_some(v != 0))
            .collect::<Vec<_>>(),
    ));
    (field(name, &a, &[]), a)
}

/// A character vector (`None` is `NA_character_`).
pub fn character(name: &str, x: &[Option<&str>]) -> (Field, ArrayRef) {
    let a: ArrayRef = Arc::new(StringArray::from(x.to_vec()));
    (field(name, &a, &[]), a)
}

/// A factor: 1-based codes (`NA_integer_` for NA) over `levels`.
pub fn factor(
    name: &str,
    codes: &[i32],
    levels: &[&str],
    ordered: bool,
) -> Result<(Field, ArrayRef)> {
    let keys = Int32Array::from(
        codes
            .iter()
            .map(|&c| {
                if c == NA_INTEGER {
                    Ok(None)
                } else if c >= 1 && (c as usize) <= levels.len() {
                    Ok(Some(c - 1))
                } else {
                    Err(WireError::Unsupported(format!(
                        "factor code {c} outside 1..={}",
                        levels.len()
                    )))
                }
            })
            .collect::<Result<Vec<_>>>()?,
    );
    let values: ArrayRef = Arc::new(StringArray::from(levels.to_vec()));
    let a: ArrayRef = Arc::new(DictionaryArray::<Int32Type>::try_new(keys, values)?);
    let class = if ordered { "ordered" } else { "factor" };
    Ok((field(name, &a, &[(CLASS, class.into())]), a))
}

/// A Date vector (R: double days since 1970-01-01; `NA_real_` for NA).
pub fn date(name: &str, days: &[f64]) -> (Field, ArrayRef) {
    let a: ArrayRef = Arc::new(Date32Array::from(
        days.iter()
            .map(|d| (!d.is_nan()).then(|| d.floor() as i32))
            .collect::<Vec<_>>(),
    ));
    (field(name, &a, &[]), a)
}

/// A POSIXct vector (R: double seconds since the epoch) in time zone `tz` ("" = local).
pub fn posixct(name: &str, secs: &[f64], tz: &str) -> (Field, ArrayRef) {
    let us: Vec<Option<i64>> = secs
        .iter()
        .map(|s| (!s.is_nan()).then(|| (s * 1e6).round() as i64))
        .collect();
    let arr = TimestampMicrosecondArray::from(us);
    let arr = if tz.is_empty() {
        arr
    } else {
        arr.with_timezone(tz)
    };
    let a: ArrayRef = Arc::new(arr);
    (field(name, &a, &[(TZ, tz.into())]), a)
}

fn unit_seconds(units: &str) -> Result<f64> {
    Ok(match units {
        "secs" => 1.0,
        "mins" => 60.0,
        "hours" => 3600.0,
        "days" => 86400.0,
        "weeks" => 604800.0,
        u => return Err(WireError::Unsupported(format!("difftime units {u:?}"))),
    })
}

/// A difftime vector in `units` (stored as microseconds; sub-microsecond parts are rounded).
pub fn difftime(name: &str, x: &[f64], units: &str) -> Result<(Field, ArrayRef)> {
    let k = unit_seconds(units)? * 1e6;
    let a: ArrayRef = Arc::new(DurationMicrosecondArray::from(
        x.iter()
            .map(|v| (!v.is_nan()).then(|| (v * k).round() as i64))
            .collect::<Vec<_>>(),
    ));
    Ok((field(name, &a, &[(UNITS, units.into())]), a))
}

/// A raw vector.
pub fn raw(name: &str, x: &[u8]) -> (Field, ArrayRef) {
    let a: ArrayRef = Arc::new(UInt8Array::from(x.to_vec()));
    (field(name, &a, &[]), a)
}

/// A bit64 integer64 vector.
pub fn integer64(name: &str, x: &[i64]) -> (Field, ArrayRef) {
    let a: ArrayRef = Arc::new(Int64Array::new(
        ScalarBuffer::from(x.to_vec()),
        nulls(x.iter().map(|&v| v != NA_INTEGER64)),
    ));
    (field(name, &a, &[(CLASS, "integer64".into())]), a)
}

/// Adds a `dim` attribute to a field (the array holds the data column-major).
pub fn with_dim(f: Field, dim: &[i32]) -> Field {
    let mut md = f.metadata().clone();
    md.insert(
        DIM.to_string(),
        dim.iter().map(i32::to_string).collect::<Vec<_>>().join(","),
    );
    f.with_metadata(md)
}

/// The `dim` attribute of a field, checked against the array length.
pub fn dim(f: &Field, len: usize) -> Result<Option<Vec<i32>>> {
    let Some(s) = f.metadata().get(DIM) else {
        return Ok(None);
    };
    let d: Vec<i32> = s
        .split(',')
        .map(|p| p.parse::<i32>().ok().filter(|&v| v >= 0))
        .collect::<Option<_>>()
        .ok_or_else(|| WireError::Unsupported(format!("bad {DIM} {s:?}")))?;
    let n = d
        .iter()
        .try_fold(1usize, |acc, &v| acc.checked_mul(v as usize));
    if n != Some(len) {
        return Err(WireError::Unsupported(format!(
            "{DIM} {s:?} does not match {len} elements"
        )));
    }
    Ok(Some(d))
}

/// A data.frame from named columns.
pub fn data_frame(cols: Vec<(Field, ArrayRef)>) -> Result<RecordBatch> {
    let (fields, arrays): (Vec<Field>, Vec<ArrayRef>) = cols.into_iter().unzip();
    let md = HashMap::from([(CLASS.to_string(), "data.frame".to_string())]);
    Ok(RecordBatch::try_new(
        Arc::new(Schema::new(fields).with_metadata(md)),
        arrays,
    )?)
}

/// Whether a schema is an R data.frame.
pub fn is_data_frame(s: &Schema) -> bool {
    s.metadata().get(CLASS).is_some_and(|c| c == "data.frame")
}

/// The R type a field maps to; an error for combinations this format does not define.
pub fn classify(f: &Field) -> Result<RType> {
    let class = f.metadata().get(CLASS).map(String::as_str);
    let bad = || {
        WireError::Unsupported(format!(
            "field {:?}: {} with class {:?} has no R mapping",
            f.name(),
            f.data_type(),
            class
        ))
    };
    Ok(match (f.data_type(), class) {
        (DataType::Int32, None) => RType::Integer,
        (DataType::Float64, None) => RType::Double,
        (DataType::Boolean, None) => RType::Logical,
        (DataType::Utf8 | DataType::LargeUtf8, None) => RType::Character,
        (DataType::Dictionary(k, v), Some(c @ ("factor" | "ordered")))
            if **k == DataType::Int32 && matches!(**v, DataType::Utf8 | DataType::LargeUtf8) =>
        {
            RType::Factor {
                ordered: c == "ordered",
            }
        }
        (DataType::Date32, None) => RType::Date,
        (DataType::Timestamp(TimeUnit::Microsecond, tz), None) => {
            let t = tz.as_deref().unwrap_or("").to_owned();
            if let Some(m) = f.metadata().get(TZ)
                && *m != t
            {
                return Err(WireError::Unsupported(format!(
                    "{TZ} {m:?} disagrees with the type's {t:?}"
                )));
            }
            RType::PosixCt { tz: t }
        }
        (DataType::Duration(TimeUnit::Microsecond), None) => {
            let units = f
                .metadata()
                .get(UNITS)
                .cloned()
                .unwrap_or_else(|| "secs".into());
            unit_seconds(&units)?;
            RType::Difftime { units }
        }
        (DataType::UInt8, None) => RType::Raw,
        (DataType::Int64, Some("integer64")) => RType::Integer64,
        _ => return Err(bad()),
    })
}

/// R's double for element `i` of a float64 array: `NA_real_` (payload bits kept) for nulls.
pub fn double_value(a: &Float64Array, i: usize) -> f64 {
    let v = a.values()[i];
    if a.is_null(i) && v.to_bits() != NA_REAL_BITS {
        f64::from_bits(NA_REAL_BITS)
    } else {
        v
    }
}

/// An array another writer made (pyarrow, polars, pandas) in the R mapping's types: narrower
/// integers widen to int32, unsigned and float32 to float64, int64 becomes `integer64`,
/// string views become utf8,
/// dictionaries of strings become factors (int32 keys), timestamps and durations of any unit
/// become microseconds, date64 becomes date32. `None`: no R counterpart.
pub fn normalize(field: &Field, array: &ArrayRef) -> Option<(Field, ArrayRef)> {
    use arrow_array::PrimitiveArray;
    use arrow_array::cast::AsArray;
    use arrow_array::types::*;
    let mut meta: HashMap<String, String> = field.metadata().clone().into();
    meta.remove(CLASS);
    let out: ArrayRef = match array.data_type() {
        DataType::Int8 => Arc::new(
            array
                .as_primitive::<Int8Type>()
                .unary::<_, Int32Type>(i32::from),
        ),
        DataType::Int16 => Arc::new(
            array
                .as_primitive::<Int16Type>()
                .unary::<_, Int32Type>(i32::from),
        ),
        DataType::UInt16 => Arc::new(
            array
                .as_primitive::<UInt16Type>()
                .unary::<_, Int32Type>(i32::from),
        ),
        DataType::UInt32 => Arc::new(
            array
                .as_primitive::<UInt32Type>()
                .unary::<_, Float64Type>(f64::from),
        ),
        DataType::UInt64 => Arc::new(
            array
                .as_primitive::<UInt64Type>()
                .unary::<_, Float64Type>(|v| v as f64),
        ),
        DataType::Float32 => Arc::new(
            array
                .as_primitive::<Float32Type>()
                .unary::<_, Float64Type>(f64::from),
        ),
        DataType::Int64 => {
            meta.insert(CLASS.into(), "integer64".into());
            array.clone()
        }
        DataType::Date64 => Arc::new(
            array
                .as_primitive::<Date64Type>()
                .unary::<_, Date32Type>(|ms| ms.div_euclid(86_400_000) as i32),
        ),
        DataType::Timestamp(unit, tz) => {
            let unit = *unit;
            let per_us = |v: i64| micros(unit, v);
            let a: PrimitiveArray<TimestampMicrosecondType> = match unit {
                TimeUnit::Second => array.as_primitive::<TimestampSecondType>().unary(per_us),
                TimeUnit::Millisecond => array
                    .as_primitive::<TimestampMillisecondType>()
                    .unary(per_us),
                TimeUnit::Microsecond => array
                    .as_primitive::<TimestampMicrosecondType>()
                    .unary(per_us),
                TimeUnit::Nanosecond => array
                    .as_primitive::<TimestampNanosecondType>()
                    .unary(per_us),
            };
            meta.remove(TZ);
            Arc::new(a.with_timezone_opt(tz.clone()))
        }
        DataType::Duration(unit) => {
            let unit = *unit;
            let per_us = |v: i64| micros(unit, v);
            let a: PrimitiveArray<DurationMicrosecondType> = match unit {
                TimeUnit::Second => array.as_primitive::<DurationSecondType>().unary(per_us),
                TimeUnit::Millisecond => array
                    .as_primitive::<DurationMillisecondType>()
                    .unary(per_us),
                TimeUnit::Microsecond => array
                    .as_primitive::<DurationMicrosecondType>()
                    .unary(per_us),
                TimeUnit::Nanosecond => {
                    array.as_primitive::<DurationNanosecondType>().unary(per_us)
                }
            };
            Arc::new(a)
        }
        DataType::Utf8View => Arc::new(
            array
                .as_string_view()
                .iter()
                .collect::<arrow_array::StringArray>(),
        ),
        DataType::Dictionary(k, v)
            if matches!(
                **v,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            ) =>
        {
            macro_rules! keys {
                ($t:ty) => {{
                    let d = array.as_dictionary::<$t>();
                    (
                        d.keys().unary::<_, Int32Type>(|k| k as i32),
                        d.values().clone(),
                    )
                }};
            }
            let (keys, values) = match **k {
                DataType::Int8 => keys!(Int8Type),
                DataType::Int16 => keys!(Int16Type),
                DataType::Int32 => keys!(Int32Type),
                DataType::Int64 => keys!(Int64Type),
                DataType::UInt8 => keys!(UInt8Type),
                DataType::UInt16 => keys!(UInt16Type),
                DataType::UInt32 => keys!(UInt32Type),
                _ => return None,
            };
            let values: ArrayRef = match values.data_type() {
                DataType::Utf8View => Arc::new(
                    values
                        .as_string_view()
                        .iter()
                        .collect::<arrow_array::StringArray>(),
                ),
                _ => values,
            };
            let d = DictionaryArray::<Int32Type>::try_new(keys, values).ok()?;
            let class = if field.dict_is_ordered() == Some(true) {
                "ordered"
            } else {
                "factor"
            };
            meta.insert(CLASS.into(), class.into());
            Arc::new(d)
        }
        _ => return None,
    };
    let f =
        ordered_if_so(Field::new(field.name(), out.data_type().clone(), true).with_metadata(meta));
    classify(&f).ok()?;
    Some((f, out))
}

/// [`normalize`] for every column of `batch` that has no R mapping as it is (columns that have
/// one, or that cannot be normalized, stay as they are).
pub fn normalize_batch(batch: RecordBatch) -> RecordBatch {
    let schema = batch.schema();
    let mut changed = false;
    let (fields, cols): (Vec<Field>, Vec<ArrayRef>) = schema
        .fields()
        .iter()
        .zip(batch.columns())
        .map(|(f, a)| match classify(f) {
            Ok(_) => (f.as_ref().clone(), a.clone()),
            Err(_) => match normalize(f, a) {
                Some(fa) => {
                    changed = true;
                    fa
                }
                None => (f.as_ref().clone(), a.clone()),
            },
        })
        .unzip();
    if !changed {
        return batch;
    }
    let schema = Schema::new(fields).with_metadata(schema.metadata().clone());
    RecordBatch::try_new(Arc::new(schema), cols).unwrap_or(batch)
}

/// `v` in `unit`s as microseconds (R's resolution for times and durations), saturating.
fn micros(unit: TimeUnit, v: i64) -> i64 {
    match unit {
        TimeUnit::Second => v.saturating_mul(1_000_000),
        TimeUnit::Millisecond => v.saturating_mul(1_000),
        TimeUnit::Microsecond => v,
        TimeUnit::Nanosecond => v.div_euclid(1_000),
    }
}
