//! The value tree every language converts to and from: [`Value`] and what a call names.

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_buffer::Buffer;
use arrow_schema::{Field, FieldRef};

/// How a call names its function.
#[derive(Debug, Clone, PartialEq)]
pub enum CallTarget {
    /// A qualified name, e.g. `package.module:function` or `pkg::fun`.
    Name(String),
    /// Source text that evaluates to the function.
    Source(String),
}

/// A value that crosses between processes and languages.
#[derive(Debug, Clone)]
pub enum Value {
    /// Python `None`, R `NULL`.
    None,
    /// A boolean.
    Bool(bool),
    /// A 64-bit integer.
    Int(i64),
    /// A double (bit pattern preserved).
    Float(f64),
    /// A complex number (re, im).
    Complex(f64, f64),
    /// UTF-8 text.
    Str(String),
    /// Bytes; large ones are zero-copy views when decoded from a region.
    Bytes(Buffer),
    /// An ordered list.
    List(Vec<Value>),
    /// String keys, in order.
    Dict(Vec<(String, Value)>),
    /// An error raised by a task.
    Error {
        /// The remote exception type or condition class.
        type_name: String,
        /// Its message.
        message: String,
        /// The remote traceback, if any.
        traceback: String,
    },
    /// A function to call with arguments.
    Call {
        /// What to call.
        target: CallTarget,
        /// Positional arguments.
        args: Vec<Value>,
        /// Keyword (named) arguments.
        kwargs: Vec<(String, Value)>,
    },
    /// One Arrow array with its field (name, nullability, R metadata).
    Array {
        /// The field.
        field: FieldRef,
        /// The data.
        array: ArrayRef,
    },
    /// An Arrow record batch (a data frame).
    Table(RecordBatch),
    /// An array or table that is also a standalone encoded value in shared memory (`bytes`,
    /// 64-byte aligned): what [`decode_shared`] gives for one received in a region, and what
    /// a binding sends back unmodified. [`encode_aligned`] writes a reference to `bytes` (a
    /// region descriptor, no data) while its region can still be adopted, else `value`.
    Shared {
        /// The standalone encoding, inside a received region.
        bytes: Buffer,
        /// The decoded [`Value::Array`] or [`Value::Table`].
        value: Box<Value>,
    },
}

impl Value {
    /// The value itself, whether or not it is [`Value::Shared`].
    pub fn unshared(&self) -> &Value {
        match self {
            Value::Shared { value, .. } => value,
            v => v,
        }
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        use Value::*;
        match (self, other) {
            (None, None) => true,
            (Bool(a), Bool(b)) => a == b,
            (Int(a), Int(b)) => a == b,
            // Bit equality: NaN payloads (R's NA_real_) must survive.
            (Float(a), Float(b)) => a.to_bits() == b.to_bits(),
            (Complex(a, b), Complex(c, d)) => {
                a.to_bits() == c.to_bits() && b.to_bits() == d.to_bits()
            }
            (Str(a), Str(b)) => a == b,
            (Bytes(a), Bytes(b)) => a.as_slice() == b.as_slice(),
            (List(a), List(b)) => a == b,
            (Dict(a), Dict(b)) => a == b,
            (
                Error {
                    type_name: a,
                    message: b,
                    traceback: c,
                },
                Error {
                    type_name: d,
                    message: e,
                    traceback: f,
                },
            ) => a == d && b == e && c == f,
            (
                Call {
                    target: a,
                    args: b,
                    kwargs: c,
                },
                Call {
                    target: d,
                    args: e,
                    kwargs: f,
                },
            ) => a == d && b == e && c == f,
            (Array { field: a, array: b }, Array { field: c, array: d }) => {
                a == c && b.to_data() == d.to_data()
            }
            (Table(a), Table(b)) => a == b,
            (Shared { value, .. }, b) => **value == *b,
            (a, Shared { value, .. }) => *a == **value,
            _ => false,
        }
    }
}

/// Builds an array value with a plain field named `name`.
pub fn array(name: &str, array: ArrayRef) -> Value {
    let field = Field::new(
        name,
        array.data_type().clone(),
        array.null_count() > 0 || array.is_nullable(),
    );
    Value::Array {
        field: Arc::new(field),
        array,
    }
}
