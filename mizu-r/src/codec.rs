//! R payloads: R's serialization of a value, with every large atomic vector (and data frame of
//! such columns) taken out and carried as an out-of-band buffer, laid out in one task payload —
//! so a large value travels in one shared-memory region copied once from the sender's vectors,
//! and the receiver sees each buffer as an ALTREP view of that region.
//!
//! Encoding walks the value's lists; each vector of at least [`FLOOR`] bytes (a character
//! vector: of 512 elements or more, see `strview.rs`), and each data frame whose columns Arrow
//! maps (see `arrow_out.rs`) of at least as many bytes, is replaced, for the length of the
//! serialization, by a placeholder (an external pointer tagged `mizu_oob_<k>` carrying the
//! value's attributes; a data frame's also carries a list of its columns' attributes in its
//! `prot` field) and put back afterwards. Decoding unserializes and puts view `k` (with the
//! placeholder's attributes) where each placeholder is. Serialization goes straight through
//! R's C API into a byte buffer.
//!
//! Layout (all integers little-endian; offsets from the payload start):
//! * `R` then the serialization — no buffers;
//! * `S` then the compact encoding of a small plain value (see `small.rs`) — no buffers;
//! * `V`, 3 zero bytes, `u32` buffer count `n`, `u64` serialization length, then `n` entries of
//!   (`u64` offset, `u64` length, `u8` type code, 7 zero bytes), the serialization, then each
//!   buffer at its offset, 64-byte aligned. Type codes: 0–5 a vector in R's layout
//!   ([`VType`]: integer, double, logical, raw, complex, the string layout of `strview.rs`), 6
//!   a `mizu-wire` Arrow array value, 7 a `mizu-wire` record batch value (a data frame), and
//!   with bit `0x80` a reference instead: a region descriptor (64 bytes) and the `u64` offset
//!   in the region of the bytes (code 8: a record batch value, followed by the `u64` column);
//! * `T` then UTF-8 text: a runtime error (not an R condition).

use std::ffi::{CStr, c_int, c_void};

use arrow_buffer::Buffer;
use extendr_api::prelude::*;
use extendr_api::{Error, Result};
use extendr_ffi::{
    CAR, CDR, DATAPTR_RO, PRINTNAME, R_CHAR, R_ExternalPtrTag, R_MakeExternalPtr, R_NilValue,
    R_xlen_t, Rf_allocVector, Rf_install, Rf_protect, Rf_setAttrib, Rf_unprotect, SET_ATTRIB,
    SET_OBJECT, SET_VECTOR_ELT, SEXP, SEXPTYPE, TAG, TYPEOF, VECTOR_ELT, XLENGTH,
};
use std::sync::Arc;

use mizu_pool::Fill;
// The layout's parser, its entry size, reference records and flags (see `mizu_pool::wire::oob`).
use mizu_pool::wire::oob::{
    self, Dialect, Place, R_BY_REF as BY_REF, R_ENTRY as ENTRY, R_FRAME_COL as FRAME_COL,
    REF_RECORD as REF_BYTES,
};
use mizu_pool::wire::{Mapper, Region};

use crate::ffi;
use crate::rtry::try_r;
use crate::view::{self, Shared, VType};

const TAG_PLAIN: u8 = b'R';
pub(crate) const TAG_SMALL: u8 = b'S';
const TAG_BUFFERS: u8 = b'V';
/// Buffers as [`TAG_BUFFERS`], with the compact encoding (`small.rs`) as the body.
const TAG_SMALL_BUFFERS: u8 = b'W';
/// A runtime error message (see the module docs).
pub const TAG_TEXT: u8 = b'T';
const ALIGN: usize = 64;
/// Vectors of at least this many bytes travel out of band (and arrive as views).
pub const FLOOR: usize = 4096;
/// Lists nested deeper than this are serialized whole.
const MAX_DEPTH: usize = 64;
const PLACEHOLDER: &str = "mizu_oob_";

/// A payload to send, written in place by [`Fill`]. Holds the vectors it points into, so
/// their memory stays alive (R does not move vectors).
pub struct Outgoing {
    /// `TAG_PLAIN` or `TAG_SMALL` when there are no buffers.
    tag: u8,
    skel: Vec<u8>,
    bufs: Vec<Oob>,
    at: Vec<usize>,
    size: usize,
}

/// One out-of-band vector.
struct Oob {
    /// Keeps the vector (and the memory `how` points into) alive.
    vec: Robj,
    /// Its type code in the table: a [`VType`], [`ARROW`], [`FRAME`] or [`FRAME_COL`].
    code: u8,
    /// Its length in bytes (of the layout, for a character vector).
    len: usize,
    how: How,
}

enum How {
    /// Copy these bytes.
    Bytes(*const u8),
    /// Write this Arrow value (see `arrow_out.rs`; it borrows the vectors' memory).
    Arrow(crate::arrow_out::ArrowOut),
    /// Lay the character vector out (see `strview.rs`).
    Strings,
    /// An unmodified view of a region: send a reference to the region (and the offset of the
    /// view in it, and for a column of a data frame value the column) instead of the bytes.
    Ref(Arc<Region>, usize, Option<u32>),
}

impl Oob {
    /// Bytes it takes in the payload.
    fn space(&self) -> usize {
        match self.how {
            How::Ref(_, _, None) => REF_BYTES,
            How::Ref(_, _, Some(_)) => REF_BYTES + 8,
            _ => self.len,
        }
    }
}

/// Type code of a vector carried as a `mizu-wire` Arrow array value (see `arrow_out.rs`).
const ARROW: u8 = 6;
/// Type code of a data frame carried as a `mizu-wire` Arrow record batch value.
const FRAME: u8 = 7;

/// Maps the regions that payloads refer to (segments stay mapped while views of them live).
pub(crate) static MAPPER: std::sync::LazyLock<Mapper> = std::sync::LazyLock::new(Mapper::new);

/// How to send `v` by reference, its length and type code: when it is one of our views,
/// unmodified, of a region whose segment still has its name; else `None`.
fn by_ref(v: SEXP) -> Option<(How, usize, u8)> {
    let (buf, code, col) = match view::shared(v).or_else(|| crate::strview::shared(v))? {
        // SAFETY: TYPEOF reads any live SEXP.
        Shared::Elements(b) => (b, VType::of(unsafe { TYPEOF(v) })? as u8, None),
        Shared::Arrow(s) => (
            s.bytes,
            if s.col.is_some() { FRAME_COL } else { ARROW },
            s.col,
        ),
    };
    let (region, off) = Region::containing(buf.as_ptr())?;
    (off + buf.len() <= region.len() && region.still_named())
        .then(|| (How::Ref(region, off, col), buf.len(), code))
}

/// Takes large vectors out of lists in place, remembering how to put them back.
struct Walk {
    bufs: Vec<Robj>,
    /// For each of `bufs` that is a data frame, its record batch.
    frames: Vec<Option<crate::arrow_out::ArrowOut>>,
    error: Option<Error>,
    swaps: Vec<(SEXP, R_xlen_t, SEXP)>,
    placeholders: Vec<Robj>,
    failed: bool,
}

fn oob_type(x: SEXP) -> Option<VType> {
    // SAFETY: TYPEOF/XLENGTH/ALTREP read any live SEXP.
    unsafe {
        let t = VType::of(TYPEOF(x))?;
        // Reading an ALTREP character vector's elements may run code: it is serialized
        // (unless it is one of ours).
        if t == VType::Str && !crate::strview::can_lay_out(x) {
            return None;
        }
        ((XLENGTH(x) as usize).saturating_mul(t.size()) >= FLOOR).then_some(t)
    }
}

impl Walk {
    /// A placeholder for `x` (which goes out of band as buffer `k`); for a data frame
    /// (`frame`, its record batch) the placeholder also carries each column's attributes, in
    /// a list of external pointers (its `prot` field, which R serializes).
    fn placeholder(&mut self, x: SEXP, frame: Option<crate::arrow_out::ArrowOut>) -> Option<SEXP> {
        let k = self.bufs.len();
        let name = std::ffi::CString::new(format!("{PLACEHOLDER}{k}")).expect("no NUL");
        let is_frame = frame.is_some();
        // SAFETY: `x` is live (reachable from the value being encoded, and protected below);
        // the closure owns nothing, so an allocation error jumping out of it skips no
        // destructor; what it allocates is protected until it is reachable.
        let ph = unsafe {
            let np = name.as_ptr();
            try_r(move || {
                let carriers = if is_frame {
                    let n = XLENGTH(x);
                    let l = Rf_protect(Rf_allocVector(SEXPTYPE::VECSXP, n));
                    for j in 0..n {
                        let c = R_MakeExternalPtr(std::ptr::null_mut(), R_NilValue, R_NilValue);
                        let col = VECTOR_ELT(x, j);
                        SET_ATTRIB(c, ffi::ATTRIB(col));
                        SET_OBJECT(c, ffi::OBJECT(col));
                        SET_VECTOR_ELT(l, j, c);
                    }
                    l
                } else {
                    Rf_protect(R_NilValue)
                };
                let p = R_MakeExternalPtr(std::ptr::null_mut(), Rf_install(np), carriers);
                Rf_unprotect(1);
                SET_ATTRIB(p, ffi::ATTRIB(x));
                SET_OBJECT(p, ffi::OBJECT(x));
                p
            })
        };
        match ph {
            Ok(p) => {
                // SAFETY: both are live SEXPs; Robj protects them until the walk ends.
                unsafe {
                    self.bufs.push(Robj::from_sexp(x));
                    self.placeholders.push(Robj::from_sexp(p));
                }
                self.frames.push(frame);
                Some(p)
            }
            Err(_) => {
                self.failed = true;
                None
            }
        }
    }

    fn visit(&mut self, x: SEXP, depth: usize) {
        // SAFETY: `x` is a live list; its elements are read and replaced (the originals are
        // protected in `bufs` and put back by `restore`).
        unsafe {
            if TYPEOF(x) != SEXPTYPE::VECSXP || depth >= MAX_DEPTH {
                return;
            }
            for i in 0..XLENGTH(x) {
                if self.failed {
                    return;
                }
                let e = VECTOR_ELT(x, i);
                // The same vector twice (list(a = x, b = x)) travels once.
                let seen = self.bufs.iter().position(|b| b.get() == e);
                let p = match seen {
                    Some(k) => Some(self.placeholders[k].get()),
                    None if oob_type(e).is_some() => self.placeholder(e, None),
                    None => match self.frame(e) {
                        Some(f) => self.placeholder(e, Some(f)),
                        None => {
                            self.visit(e, depth + 1);
                            None
                        }
                    },
                };
                if let Some(p) = p {
                    SET_VECTOR_ELT(x, i, p);
                    self.swaps.push((x, i, e));
                }
            }
        }
    }

    /// The record batch of `x` when it is a data frame that travels as one (see
    /// `arrow_out::encode_frame`).
    fn frame(&mut self, x: SEXP) -> Option<crate::arrow_out::ArrowOut> {
        // SAFETY: `x` is reachable from the value being encoded, which the caller keeps alive
        // and unmodified (but for the placeholders swapped in, never into a data frame that
        // travels whole) until the payload is written.
        match unsafe { crate::arrow_out::encode_frame(x, FLOOR) }? {
            Ok(f) => Some(f),
            Err(e) => {
                self.failed = true;
                self.error = Some(e);
                None
            }
        }
    }

    /// Puts the original vectors back.
    fn restore(&mut self) {
        for (list, i, orig) in self.swaps.drain(..).rev() {
            // SAFETY: the list is the caller's value (alive for the whole encode), `orig` is
            // protected by `bufs`.
            unsafe {
                SET_VECTOR_ELT(list, i, orig);
            }
        }
    }
}

unsafe extern "C" fn out_char(s: *mut ffi::R_outpstream_st, c: c_int) {
    // SAFETY: `data` is the Vec<u8> `serialize` passed, alive for the call.
    unsafe { (*(*s).data.cast::<Vec<u8>>()).push(c as u8) }
}

unsafe extern "C" fn out_bytes(s: *mut ffi::R_outpstream_st, buf: *mut c_void, n: c_int) {
    // SAFETY: as above; R passes `n` readable bytes at `buf`.
    unsafe {
        let v = &mut *(*s).data.cast::<Vec<u8>>();
        v.extend_from_slice(std::slice::from_raw_parts(
            buf.cast::<u8>(),
            n.max(0) as usize,
        ));
    }
}

/// R's serialization (version 2 — which writes ALTREP objects as plain vectors, so the
/// reader never runs an ALTREP class's unserialize method on what it received — native byte
/// order) of `x`.
fn serialize(x: SEXP) -> Result<Vec<u8>> {
    let mut out: Vec<u8> = Vec::with_capacity(256);
    let data = std::ptr::from_mut(&mut out).cast::<c_void>();
    // SAFETY: the stream lives on this frame for the call; the callbacks write into `out`,
    // which this frame owns (an R error jumps out of `try_r`'s closure only).
    let r = unsafe {
        let mut st = std::mem::MaybeUninit::<ffi::R_outpstream_st>::zeroed();
        let sp = st.as_mut_ptr();
        try_r(move || {
            ffi::R_InitOutPStream(
                sp,
                data,
                ffi::R_PSTREAM_BINARY_FORMAT,
                2,
                Some(out_char),
                Some(out_bytes),
                None,
                R_NilValue,
            );
            ffi::R_Serialize(x, sp);
            R_NilValue
        })
    };
    match r {
        Ok(_) => Ok(out),
        Err(_) => Err(crate::rerr("this value cannot be serialized")),
    }
}

struct Input<'a> {
    bytes: &'a [u8],
    at: usize,
}

unsafe extern "C" fn in_char(s: *mut ffi::R_inpstream_st) -> c_int {
    // SAFETY: `data` is the `Input` `unserialize` passed, alive for the call.
    let inp = unsafe { &mut *(*s).data.cast::<Input<'_>>() };
    match inp.bytes.get(inp.at) {
        Some(&b) => {
            inp.at += 1;
            c_int::from(b)
        }
        // SAFETY: an R error from inside R_Unserialize (caught by `try_r`); this frame owns
        // nothing.
        None => unsafe { extendr_ffi::Rf_error(c"mizu: truncated serialization".as_ptr()) },
    }
}

unsafe extern "C" fn in_bytes(s: *mut ffi::R_inpstream_st, buf: *mut c_void, n: c_int) {
    // SAFETY: as above; R asks for `n` bytes into `buf`, which has room for them.
    unsafe {
        let inp = &mut *(*s).data.cast::<Input<'_>>();
        let n = n.max(0) as usize;
        if inp.bytes.len() - inp.at < n {
            extendr_ffi::Rf_error(c"mizu: truncated serialization".as_ptr());
        }
        std::ptr::copy_nonoverlapping(inp.bytes.as_ptr().add(inp.at), buf.cast::<u8>(), n);
        inp.at += n;
    }
}

fn unserialize(bytes: &[u8]) -> Result<Robj> {
    // R's reader trusts its input (see `mizu_pool::wire::rser`).
    mizu_pool::wire::rser::check(bytes)
        .map_err(|e| bad(format!("the serialization cannot be read: {e}")))?;
    let mut inp = Input { bytes, at: 0 };
    let data = std::ptr::from_mut(&mut inp).cast::<c_void>();
    // SAFETY: the stream lives on this frame for the call; the callbacks read `inp`.
    let r = unsafe {
        let mut st = std::mem::MaybeUninit::<ffi::R_inpstream_st>::zeroed();
        let sp = st.as_mut_ptr();
        // Unreadable input is reported as mizu's error below, not also printed by R.
        crate::rtry::try_r_quiet(move || {
            ffi::R_InitInPStream(
                sp,
                data,
                ffi::R_PSTREAM_BINARY_FORMAT,
                Some(in_char),
                Some(in_bytes),
                None,
                R_NilValue,
            );
            ffi::R_Unserialize(sp)
        })
    };
    match r {
        // SAFETY: a fresh value; Robj protects it.
        Ok(x) => Ok(unsafe { Robj::from_sexp(x) }),
        Err(_) => Err(bad("the serialization cannot be read")),
    }
}

impl Outgoing {
    /// Encodes an R value.
    pub fn encode(value: &Robj) -> Result<Outgoing> {
        // SAFETY: `value` is protected by its Robj for this call.
        Outgoing::encode_sexp(unsafe { value.get() })
    }

    /// [`Outgoing::encode`] of a value the caller keeps alive (protected) for the call.
    pub fn encode_sexp(root: SEXP) -> Result<Outgoing> {
        let mut w = Walk {
            bufs: Vec::new(),
            frames: Vec::new(),
            error: None,
            swaps: Vec::new(),
            placeholders: Vec::new(),
            failed: false,
        };
        if let Some(bytes) = crate::small::encode(root) {
            return Ok(Outgoing::layout(TAG_SMALL, bytes, Vec::new()));
        }
        if let Some((bytes, vecs)) = crate::small::encode_oob(root) {
            return Outgoing::with_oob(bytes, vecs);
        }
        let top = if oob_type(root).is_some() {
            w.placeholder(root, None)
        } else if let Some(f) = w.frame(root) {
            w.placeholder(root, Some(f))
        } else {
            w.visit(root, 0);
            Some(root)
        };
        let skel = match top {
            Some(t) if !w.failed => serialize(t),
            _ => Err(w
                .error
                .take()
                .unwrap_or_else(|| crate::rerr("out of memory while encoding"))),
        };
        w.restore();
        let skel = skel?;
        let mut bufs = Vec::with_capacity(w.bufs.len());
        for (v, frame) in w.bufs.into_iter().zip(w.frames) {
            bufs.push(match frame {
                Some(f) => Oob {
                    vec: v,
                    code: FRAME,
                    len: f.len(),
                    how: How::Arrow(f),
                },
                None => oob_entry(v)?,
            });
        }
        Ok(Outgoing::layout(TAG_PLAIN, skel, bufs))
    }

    /// The compact payload of `list("e", expr, vars)` (an expression task), made without
    /// the list, with large vectors and views of shared memory out of band (a binding that is
    /// a shared view, say); `None` when the message takes another encoding.
    pub fn encode_expr_task(expr: SEXP, vars: SEXP) -> Option<Result<Outgoing>> {
        // SAFETY: R's main thread; the kind string is kept for the session.
        let kind = unsafe { crate::handle::kept_expr_kind() };
        crate::small::encode_list3(kind, expr, vars)
            .map(|(bytes, vecs)| Outgoing::with_oob(bytes, vecs))
    }

    /// A compact payload `bytes` whose out-of-band items are `vecs` (each reachable from a
    /// value the caller keeps protected for the call).
    fn with_oob(bytes: Vec<u8>, vecs: Vec<SEXP>) -> Result<Outgoing> {
        if vecs.is_empty() {
            return Ok(Outgoing::layout(TAG_SMALL, bytes, Vec::new()));
        }
        // SAFETY: the caller's contract; the Robj protects each vector for as long as the
        // payload lives.
        let bufs = vecs
            .into_iter()
            .map(|v| oob_entry(unsafe { Robj::from_sexp(v) }))
            .collect::<Result<Vec<_>>>()?;
        Ok(Outgoing::layout(TAG_SMALL, bytes, bufs))
    }

    fn layout(tag: u8, skel: Vec<u8>, bufs: Vec<Oob>) -> Outgoing {
        let mut out = Outgoing {
            tag,
            size: 1 + skel.len(),
            skel,
            bufs,
            at: Vec::new(),
        };
        if out.bufs.is_empty() {
            return out;
        }
        let mut at = 16 + ENTRY * out.bufs.len() + out.skel.len();
        for b in &out.bufs {
            at = at.next_multiple_of(ALIGN);
            out.at.push(at);
            at += b.space();
        }
        out.size = at;
        out
    }

    /// The payload as bytes (where it cannot be written in place).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.size];
        self.fill(&mut v);
        v
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        if self.tag == TAG_SMALL {
            crate::small::give_back(std::mem::take(&mut self.skel));
        }
    }
}

/// Payload bytes this process has written for others to read (tasks, results, messages,
/// shared values): what crossed, for the benchmarks.
static WRITTEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// [`WRITTEN`], in bytes (as a double: R has no 64-bit integers).
#[extendr]
fn payload_bytes_written() -> f64 {
    WRITTEN.load(std::sync::atomic::Ordering::Relaxed) as f64
}

impl Fill for Outgoing {
    fn size(&self) -> usize {
        self.size
    }

    fn fill(&self, out: &mut [u8]) {
        WRITTEN.fetch_add(self.size as u64, std::sync::atomic::Ordering::Relaxed);
        let skel = &self.skel;
        if self.bufs.is_empty() {
            out[0] = self.tag;
            out[1..].copy_from_slice(skel);
            return;
        }
        out[..16].fill(0);
        out[0] = if self.tag == TAG_SMALL {
            TAG_SMALL_BUFFERS
        } else {
            TAG_BUFFERS
        };
        out[4..8].copy_from_slice(&(self.bufs.len() as u32).to_le_bytes());
        out[8..16].copy_from_slice(&(skel.len() as u64).to_le_bytes());
        for (i, (b, &at)) in self.bufs.iter().zip(&self.at).enumerate() {
            let e = 16 + ENTRY * i;
            out[e..e + ENTRY].fill(0);
            out[e..e + 8].copy_from_slice(&(at as u64).to_le_bytes());
            out[e + 8..e + 16].copy_from_slice(&(b.len as u64).to_le_bytes());
            let by_ref = if matches!(b.how, How::Ref(..)) {
                BY_REF
            } else {
                0
            };
            out[e + 16] = b.code | by_ref;
        }
        let p = 16 + ENTRY * self.bufs.len();
        out[p..p + skel.len()].copy_from_slice(skel);
        let mut end = p + skel.len();
        for (b, &at) in self.bufs.iter().zip(&self.at) {
            out[end..at].fill(0);
            match &b.how {
                // SAFETY: a character vector `self` keeps alive, unchanged since its length
                // was measured.
                How::Strings => unsafe {
                    crate::strview::fill(b.vec.get(), &mut out[at..at + b.len])
                },
                How::Arrow(col) => col.write(&mut out[at..at + b.len]),
                How::Bytes(p) => {
                    // SAFETY: `p` points to `b.len` bytes of a vector that `self` keeps alive.
                    let src = unsafe { std::slice::from_raw_parts(*p, b.len) };
                    out[at..at + b.len].copy_from_slice(src);
                }
                How::Ref(region, off, col) => {
                    // The descriptor carries a new reference, which the receiver adopts.
                    region.share().write_to(&mut out[at..at + 64]);
                    out[at + 64..at + REF_BYTES].copy_from_slice(&(*off as u64).to_le_bytes());
                    if let Some(c) = col {
                        out[at + REF_BYTES..at + REF_BYTES + 8]
                            .copy_from_slice(&u64::from(*c).to_le_bytes());
                    }
                }
            }
            end = at + b.space();
        }
    }
}

/// How one out-of-band atomic vector `v` goes: by reference when it is an unmodified view of
/// ours, as Arrow when `arrow_out` encodes it, laid out when it is a character vector, else
/// its bytes.
fn oob_entry(v: Robj) -> Result<Oob> {
    // SAFETY: `v` is an atomic vector (checked by `oob_type` or `small::encode_oob`)
    // protected by its Robj; DATAPTR_RO is valid for XLENGTH elements while it lives
    // unmodified.
    let (t, ptr, n) = unsafe {
        let s = v.get();
        let t = VType::of(TYPEOF(s)).expect("an atomic vector (the caller checked)");
        if let Some((how, len, code)) = by_ref(s) {
            return Ok(Oob {
                vec: v,
                code,
                len,
                how,
            });
        }
        // SAFETY: `v` stays protected (in `bufs`) and unmodified while the payload
        // that holds the encoding exists.
        if let Some(enc) = crate::arrow_out::encode(s) {
            let enc = enc?;
            return Ok(Oob {
                vec: v,
                code: ARROW,
                len: enc.len(),
                how: How::Arrow(enc),
            });
        }
        if t == VType::Str {
            let len = crate::strview::encoded_len(s);
            return Ok(Oob {
                vec: v,
                code: t as u8,
                len,
                how: How::Strings,
            });
        }
        (
            t,
            DATAPTR_RO(s).cast::<u8>(),
            XLENGTH(s) as usize * t.size(),
        )
    };
    Ok(Oob {
        vec: v,
        code: t as u8,
        len: n,
        how: How::Bytes(ptr),
    })
}

fn bad(why: impl std::fmt::Display) -> Error {
    crate::rerr(format!("malformed payload: {why}"))
}

/// A decoded payload.
pub enum Decoded {
    /// The value.
    Value(Robj),
    /// A runtime error's text.
    Text(String),
}

/// Which view a placeholder stands for.
fn placeholder_index(x: SEXP) -> Option<usize> {
    // SAFETY: reading the type, tag and symbol name of a live SEXP.
    unsafe {
        if TYPEOF(x) != SEXPTYPE::EXTPTRSXP {
            return None;
        }
        let tag = R_ExternalPtrTag(x);
        if TYPEOF(tag) != SEXPTYPE::SYMSXP {
            return None;
        }
        let name = CStr::from_ptr(R_CHAR(PRINTNAME(tag))).to_str().ok()?;
        name.strip_prefix(PLACEHOLDER)?.parse().ok()
    }
}

/// The view for placeholder `ph`, with the placeholder's attributes (set one by one, so R
/// checks each: a `dim` that does not fit is refused). For a data frame, each column gets the
/// attributes its carrier holds.
fn fill_in(ph: SEXP, views: &[Robj]) -> Result<SEXP> {
    let k = placeholder_index(ph).ok_or_else(|| bad("bad placeholder"))?;
    let v = views
        .get(k)
        .ok_or_else(|| bad(format!("placeholder {k} has no buffer")))?;
    // SAFETY: `v` and `ph` are live (protected by the caller); the R call's closure owns
    // nothing (SEXPs only), so R's error can jump out of it.
    unsafe {
        let vs = v.get();
        let carriers = extendr_ffi::R_ExternalPtrProtected(ph);
        let frame = TYPEOF(vs) == SEXPTYPE::VECSXP;
        if frame != (TYPEOF(carriers) == SEXPTYPE::VECSXP) {
            return Err(bad(format!("placeholder {k} does not match its buffer")));
        }
        if frame {
            if XLENGTH(carriers) != XLENGTH(vs) {
                return Err(bad(format!("placeholder {k}: columns do not match")));
            }
            if let Some(j) =
                (0..XLENGTH(vs)).find(|&j| TYPEOF(VECTOR_ELT(carriers, j)) != SEXPTYPE::EXTPTRSXP)
            {
                return Err(bad(format!("placeholder {k}: column {j} has no carrier")));
            }
        }
        // R checks each attribute as it is set; one that does not fit is reported as
        // malformed input below, not also printed by R.
        crate::rtry::try_r_quiet(move || {
            let set_attributes = |to: SEXP, from: SEXP| {
                let mut a = ffi::ATTRIB(from);
                while a != R_NilValue {
                    Rf_setAttrib(to, TAG(a), CAR(a));
                    a = CDR(a);
                }
            };
            if frame {
                for j in 0..XLENGTH(vs) {
                    set_attributes(VECTOR_ELT(vs, j), VECTOR_ELT(carriers, j));
                }
            }
            set_attributes(vs, ph);
            vs
        })
        .map_err(|_| bad("an attribute does not fit its vector"))
    }
}

fn fill_lists(x: SEXP, views: &[Robj], depth: usize) -> Result<()> {
    // SAFETY: `x` is a live list inside the (protected) decoded value.
    unsafe {
        if TYPEOF(x) != SEXPTYPE::VECSXP || depth > MAX_DEPTH {
            return Ok(());
        }
        for i in 0..XLENGTH(x) {
            let e = VECTOR_ELT(x, i);
            if TYPEOF(e) == SEXPTYPE::EXTPTRSXP && placeholder_index(e).is_some() {
                SET_VECTOR_ELT(x, i, fill_in(e, views)?);
            } else {
                fill_lists(e, views, depth + 1)?;
            }
        }
    }
    Ok(())
}

/// For a payload in the compact encoding: the value, fresh and unprotected (the caller
/// protects it before anything allocates), without an R handle (see `handle.rs` for why
/// that matters). `None` for any other payload: use [`decode`].
pub fn decode_small(buf: &Buffer) -> Option<Result<SEXP>> {
    let b = buf.as_slice();
    (b.first() == Some(&TAG_SMALL)).then(|| {
        crate::small::decode(&b[1..]).ok_or_else(|| bad("the compact encoding cannot be read"))
    })
}

/// Releases the region references written inside a payload nobody will read (the runtime's
/// discard hook, `mizu_pool::set_discard_hook`): each holds a count of its region, taken by
/// the sender (`Region::share`), that only a decoder adopting it would give back. Touches no
/// R API (it may run on the runtime's threads); malformed input releases nothing.
pub fn release_refs(b: &[u8]) {
    if !matches!(b.first(), Some(&TAG_BUFFERS | &TAG_SMALL_BUFFERS)) {
        return;
    }
    for d in oob::references(b, Dialect::R) {
        // Adopting takes the reference over; dropping the region gives it back.
        drop(MAPPER.adopt(&d));
    }
}

/// Decodes a received payload. Input is untrusted: every offset is checked.
pub fn decode(buf: Buffer) -> Result<Decoded> {
    crate::view::collect_garbage_if_due();
    let b = buf.as_slice();
    match b.first() {
        Some(&TAG_PLAIN) => Ok(Decoded::Value(unserialize(&b[1..])?)),
        Some(&mizu_pool::wire::envelope::TAG) => crate::xvalue::received(&buf).map(Decoded::Value),
        Some(&TAG_SMALL) => match crate::small::decode(&b[1..]) {
            // SAFETY: a fresh value; Robj protects it.
            Some(v) => Ok(Decoded::Value(unsafe { Robj::from_sexp(v) })),
            None => Err(bad("the compact encoding cannot be read")),
        },
        // R strings cannot hold a NUL: one in a message is shown as U+FFFD, as bad UTF-8 is.
        Some(&TAG_TEXT) => Ok(Decoded::Text(
            String::from_utf8_lossy(&b[1..]).replace('\0', "\u{fffd}"),
        )),
        Some(&TAG_SMALL_BUFFERS) => {
            let layout = oob::parse(b, Dialect::R).map_err(bad)?;
            let views = buffer_views(&buf, layout.entries)?;
            // SAFETY: each view is protected by its Robj in `views` while the value is read.
            let sexps: Vec<SEXP> = views.iter().map(|v| unsafe { v.get() }).collect();
            match crate::small::decode_with(&b[layout.body], &sexps) {
                // SAFETY: a fresh value; Robj protects it.
                Some(v) => Ok(Decoded::Value(unsafe { Robj::from_sexp(v) })),
                None => Err(bad("the compact encoding cannot be read")),
            }
        }
        Some(&TAG_BUFFERS) => {
            let layout = oob::parse(b, Dialect::R).map_err(bad)?;
            let views = buffer_views(&buf, layout.entries)?;
            let value = unserialize(&b[layout.body])?;
            // SAFETY: `value` is protected by its Robj.
            let root = unsafe { value.get() };
            if placeholder_index(root).is_some() {
                // SAFETY: the view is protected by `views` until wrapped.
                return Ok(Decoded::Value(unsafe {
                    Robj::from_sexp(fill_in(root, &views)?)
                }));
            }
            fill_lists(root, &views, 0)?;
            Ok(Decoded::Value(value))
        }
        Some(t) => Err(bad(format!("unknown tag {t:#04x}"))),
        None => Err(bad("empty")),
    }
}

/// The views of a payload's out-of-band buffers (`entries`, parsed from `buf`), in order.
fn buffer_views(buf: &Buffer, entries: Vec<oob::Entry>) -> Result<Vec<Robj>> {
    let mut views = Vec::with_capacity(entries.len());
    // Data frame values already read for a column sent on by reference (every column
    // of one frame refers to the same value).
    let mut tables: Vec<(usize, arrow_array::RecordBatch, Buffer)> = Vec::new();
    for (i, entry) in entries.into_iter().enumerate() {
        let kind = entry.code;
        let by_ref = matches!(entry.place, Place::Ref { .. });
        let t = match kind {
            ARROW => None,
            FRAME if !by_ref => None,
            FRAME_COL if by_ref => None,
            c => Some(
                VType::from_code(c)
                    .ok_or_else(|| bad(format!("buffer {i} has unknown type {kind}")))?,
            ),
        };
        let (bytes, column) = match entry.place {
            Place::Inline(r) => (buf.slice_with_length(r.start, r.len()), None),
            Place::Ref {
                desc,
                offset,
                len,
                column,
            } => {
                let region = Arc::new(MAPPER.adopt(&desc).map_err(bad)?);
                let end = offset
                    .checked_add(len)
                    .filter(|&x| x <= region.len() as u64)
                    .ok_or_else(|| bad(format!("reference {i} beyond its region")))?;
                let whole = Region::buffer(&region);
                (
                    whole.slice_with_length(offset as usize, (end - offset) as usize),
                    column,
                )
            }
        };
        let copy = !by_ref;
        views.push(match (t, column) {
            (Some(t), _) => view::make(bytes, t, copy)?,
            (None, _) if kind == ARROW => crate::arrow_in::view(bytes, copy)?,
            (None, Some(col)) => {
                let key = bytes.as_ptr() as usize;
                let k = match tables.iter().position(|(a, ..)| *a == key) {
                    Some(k) => k,
                    None => {
                        let (batch, src) = crate::arrow_in::table(bytes)?;
                        tables.push((key, batch, src));
                        tables.len() - 1
                    }
                };
                let (_, batch, src) = &tables[k];
                let j = usize::try_from(col)
                    .ok()
                    .filter(|&j| j < batch.num_columns())
                    .ok_or_else(|| bad(format!("reference {i}: no column {col}")))?;
                let s = crate::arrow_in::Source {
                    bytes: src.clone(),
                    col: Some(j as u32),
                };
                crate::arrow_in::column(batch.column(j), s, false)?
            }
            (None, None) => {
                let cols = crate::arrow_in::frame(bytes, true)?;
                Robj::from(List::from_values(cols))
            }
        });
    }
    Ok(views)
}

/// A runtime error as a payload.
pub fn text(msg: &str) -> Vec<u8> {
    let mut v = vec![TAG_TEXT];
    v.extend_from_slice(msg.as_bytes());
    v
}

/// Encodes and decodes in this process (tests of the payload format and of views).
#[extendr]
fn codec_roundtrip(value: Robj) -> Result<Robj> {
    let out = Outgoing::encode(&value)?;
    match decode(Buffer::from_vec(out.to_vec()))? {
        Decoded::Value(v) => Ok(v),
        Decoded::Text(t) => Err(crate::rerr(t)),
    }
}

/// `mizu_share()`: the value with every vector of 4 KiB or more (and every data frame of
/// such columns) copied once into shared memory of this process and read through views of
/// it, which travel by reference from then on (see `docs/r.md`, "Sharing data").
#[extendr]
fn share_value(value: Robj) -> Result<Robj> {
    let out = Outgoing::encode(&value)?;
    let n = out.size();
    let region = mizu_pool::share::filled(n, |b| out.fill(b))
        .map_err(|e| crate::rerr(format!("mizu_share: {e}")))?;
    let region = Arc::new(region);
    match decode(Region::buffer(&region).slice_with_length(0, n))? {
        Decoded::Value(v) => Ok(v),
        Decoded::Text(t) => Err(crate::rerr(t)),
    }
}

/// When R exits: the names of the segments holding shared values go (processes still
/// reading them keep their mappings), so that nothing of this session's is left in /dev/shm
/// by values R never freed.
#[extendr]
fn release_shared() {
    mizu_pool::share::release();
}

/// The payload bytes of a value (tests).
#[extendr]
fn codec_encode(value: Robj) -> Result<Raw> {
    Ok(Raw::from_bytes(&Outgoing::encode(&value)?.to_vec()))
}

/// The out-of-band vectors of a value's payload that travel as Arrow arrays, each as an
/// inline frame of the cross-language format (tests: Python reads them with
/// `pymizu.wire.loads`).
#[extendr]
fn codec_arrow_frames(value: Robj) -> Result<List> {
    let out = Outgoing::encode(&value)?;
    let mut frames = Vec::new();
    for b in &out.bufs {
        if let How::Arrow(col) = &b.how {
            // As written into a payload, read back (so arrow checks it) and framed.
            let mut bytes = arrow_buffer::MutableBuffer::from_len_zeroed(col.len());
            col.write(bytes.as_slice_mut());
            let value = mizu_pool::wire::decode(&bytes.into()).map_err(bad)?;
            let enc = mizu_pool::wire::encode(&value).map_err(bad)?;
            let mut f = vec![0u8; enc.len() + 16];
            mizu_pool::wire::frame::write_inline(&enc, 0, &mut f);
            frames.push(Raw::from_bytes(&f));
        }
    }
    Ok(List::from_values(frames))
}

/// The vector an inline frame of the cross-language format holding an Arrow array becomes
/// when it arrives out of band (tests: arrays written by Python).
#[extendr]
fn codec_arrow_read(frame: Raw) -> Result<Robj> {
    let f = mizu_pool::wire::frame::read(frame.as_slice()).map_err(bad)?;
    let mizu_pool::wire::frame::Body::Inline(value) = f.body else {
        return Err(bad("not an inline frame"));
    };
    crate::arrow_in::view(Buffer::from_slice_ref(value), true)
}

/// Unmaps the data segments kept mapped only for reuse (regions views still hold stay
/// mapped). Called when R exits, so that nothing of this process's outlives it.
#[extendr]
fn release_mappings() {
    MAPPER.release_unused();
}

/// Gives back now the data segments and mappings this process keeps only for reuse (they
/// would go after a few idle seconds).
#[extendr]
fn give_back_idle() {
    mizu_pool::machine::give_back_idle_now();
}

/// The size of a value's payload (tests; nothing is shared).
#[extendr]
fn codec_size(value: Robj) -> Result<f64> {
    Ok(Outgoing::encode(&value)?.size() as f64)
}

/// Decodes arbitrary bytes as a payload (tests: malformed input gives an error).
#[extendr]
fn codec_decode(bytes: Raw) -> Result<Robj> {
    match decode(Buffer::from_slice_ref(bytes.as_slice()))? {
        Decoded::Value(v) => Ok(v),
        Decoded::Text(t) => Ok(Robj::from(t)),
    }
}

extendr_module! {
    mod codec;
    fn share_value;
    fn payload_bytes_written;
    fn release_shared;
    fn codec_roundtrip;
    fn codec_encode;
    fn codec_arrow_frames;
    fn codec_arrow_read;
    fn codec_size;
    fn release_mappings;
    fn give_back_idle;
    fn codec_decode;
}
