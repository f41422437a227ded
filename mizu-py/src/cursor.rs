//! The byte level of the fast path's payloads (`small.rs`): a [`Writer`] that appends items of
//! the compact encoding and gives up past [`MAX_SIZE`], and a [`Reader`] of untrusted bytes.
//! What values become is `small.rs`'s (and `ndarray.rs`'s for arrays).

use std::sync::Arc;

use mizu_pool::wire::Region;
use mizu_pool::wire::compact::{self, tag};
use mizu_pool::wire::oob;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Values that encode larger than this go through pickle.
pub(crate) const MAX_SIZE: usize = 1 << 20;

/// Writes small values; gives up (returns false) on anything else.
#[derive(Default)]
pub(crate) struct Writer {
    pub(crate) out: Vec<u8>,
    /// Mutable containers written so far (by address): one seen twice gives up.
    pub(crate) seen: Vec<usize>,
    /// The arrays that travel beside the values, in the order of their indices.
    pub(crate) beside: Vec<Beside>,
    /// Whether arrays may go by reference (not for bytes that are never delivered).
    pub(crate) refs_ok: bool,
    /// For a task's arguments, the pool they go to: a large array goes by reference to a copy
    /// that serves its later sends to that pool too (see `repeats.rs`).
    pub(crate) repeats: Option<u64>,
}

impl Writer {
    pub(crate) fn len_u32(&mut self, n: usize) -> bool {
        match u32::try_from(n) {
            Ok(n) => {
                self.out.extend_from_slice(&n.to_le_bytes());
                true
            }
            Err(_) => false,
        }
    }

    /// A string item (`false` past the size limit).
    pub(crate) fn str(&mut self, s: &str) -> bool {
        if self.out.len() + s.len() > MAX_SIZE {
            return false;
        }
        self.out.push(tag::STR);
        compact::put_str(&mut self.out, s);
        true
    }

    /// A count of items (the tag written by the caller).
    pub(crate) fn count(&mut self, n: usize) {
        compact::put_varint(&mut self.out, n as u64);
    }

    pub(crate) fn mutable(&mut self, v: &Bound<'_, PyAny>) -> bool {
        let p = v.as_ptr() as usize;
        if self.seen.contains(&p) {
            return false;
        }
        self.seen.push(p);
        true
    }
}

/// An array's bytes beside the values: copied in, or by reference to the region it views.
pub(crate) enum Beside {
    /// Copied when the payload is written.
    Copy(crate::codec::Exported),
    /// `len` bytes at `offset` of `region` (`writable`: memory of `pymizu.empty`/`zeros`).
    Ref {
        region: Arc<Region>,
        offset: usize,
        len: usize,
        writable: bool,
    },
}

pub(crate) fn bad(why: &str) -> PyErr {
    PyValueError::new_err(format!("pymizu: malformed small payload: {why}"))
}

/// Reads values from untrusted bytes (the items through `mizu_pool::wire::compact`).
pub(crate) struct Reader<'a> {
    pub(crate) r: compact::Reader<'a>,
    /// The payload's buffers (arrays beside the values), by index.
    pub(crate) beside: Vec<oob::Buffer>,
}

/// A malformed item.
pub(crate) fn wire_bad(e: mizu_pool::wire::WireError) -> PyErr {
    bad(&e.to_string())
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> PyResult<&'a [u8]> {
        self.r.take("item", n).map_err(wire_bad)
    }

    pub(crate) fn u32(&mut self) -> PyResult<usize> {
        Ok(u32::from_le_bytes(self.r.array("length").map_err(wire_bad)?) as usize)
    }

    /// A count of items, each at least one byte: more than the bytes left is malformed
    /// (and must not size an allocation).
    pub(crate) fn count(&mut self) -> PyResult<usize> {
        self.r.len("count").map_err(wire_bad)
    }
}
