//! Writing a value as an R payload (the layout: `codec.rs`): the walk that takes large vectors
//! out, R's serialization of the rest, and [`Outgoing`], which writes itself in place.

use std::ffi::{c_int, c_void};

use extendr_api::prelude::*;
use extendr_api::{Error, Result};
use extendr_ffi::{
    DATAPTR_RO, R_MakeExternalPtr, R_NilValue, R_xlen_t, Rf_allocVector, Rf_install, Rf_protect,
    Rf_unprotect, SET_ATTRIB, SET_OBJECT, SET_VECTOR_ELT, SEXP, SEXPTYPE, TYPEOF, VECTOR_ELT,
    XLENGTH,
};
use std::sync::Arc;

use mizu_pool::Fill;
use mizu_pool::wire::Region;
use mizu_pool::wire::oob::{self, Source};

use crate::altrep::Shared;
use crate::codec::*;
use crate::ffi;
use crate::payload::FLOOR;
use crate::rtry::try_r;
use crate::view::{self, VType};

/// A payload to send, written in place by [`Fill`] with the runtime's one writer of a
/// language's own payloads. Holds the vectors it points into, so their memory stays alive (R
/// does not move vectors).
pub struct Outgoing {
    w: oob::Writer<Vec<u8>, Oob>,
    /// Whether the body is the compact encoding (whose buffer `small.rs` reuses).
    compact: bool,
}

/// One out-of-band vector.
pub(crate) struct Oob {
    /// Keeps the vector (and the memory `how` points into) alive.
    pub(crate) vec: Robj,
    /// Its code in the table (`oob::code`): a vector's [`VType::wire`], [`ARROW`], [`FRAME`]
    /// or [`FRAME_COL`].
    pub(crate) code: u8,
    /// Its length in bytes (of the layout, for a character vector).
    pub(crate) len: usize,
    pub(crate) how: How,
}

pub(crate) enum How {
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

impl Source for Oob {
    fn len(&self) -> usize {
        self.len
    }

    fn write_to(&self, out: &mut [u8]) {
        match &self.how {
            // SAFETY: a character vector `self` keeps alive, unchanged since its length was
            // measured.
            How::Strings => unsafe { crate::strview::fill(self.vec.get(), out) },
            How::Arrow(col) => col.write(out),
            How::Bytes(p) => {
                // SAFETY: `p` points to `self.len` bytes of a vector that `self` keeps alive.
                let src = unsafe { std::slice::from_raw_parts(*p, self.len) };
                src.write_to(out);
            }
            How::Ref(..) => unreachable!("a reference is written by the writer"),
        }
    }
}

/// How to send `v` by reference, its length and type code: when it is one of our views,
/// unmodified, of a region whose segment still has its name; else `None`.
fn by_ref(v: SEXP) -> Option<(How, usize, u8)> {
    let (buf, code, col) = match view::shared(v).or_else(|| crate::strview::shared(v))? {
        // SAFETY: TYPEOF reads any live SEXP.
        Shared::Elements(b) => (b, VType::of(unsafe { TYPEOF(v) })?.wire(), None),
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

pub(crate) fn unserialize(bytes: &[u8]) -> Result<Robj> {
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
        Outgoing::encode_to(root, None)
    }

    /// [`Outgoing::encode_sexp`] of a task for the pool numbered `to` (`mizu_pool::Pool::id`):
    /// a large plain vector goes by reference to a copy the runtime keeps for its next sends
    /// to that pool (`mizu_pool::repeats`).
    pub fn encode_to(root: SEXP, to: Option<u64>) -> Result<Outgoing> {
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
            return Outgoing::with_oob(bytes, vecs, to);
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
                None => oob_entry(v, to)?,
            });
        }
        Ok(Outgoing::layout(TAG_PLAIN, skel, bufs))
    }

    /// [`Outgoing::encode_to`] of a task's message, whose functions travel without the source
    /// R keeps of them (`small::as_task`).
    pub fn encode_task(msg: SEXP, to: Option<u64>) -> Result<Outgoing> {
        crate::small::as_task(|| Outgoing::encode_to(msg, to))
    }

    /// The compact payload of `list("e", expr, vars)` (an expression task), made without
    /// the list, with large vectors and views of shared memory out of band (a binding that is
    /// a shared view, say); `None` when the message takes another encoding.
    pub fn encode_expr_task(expr: SEXP, vars: SEXP, to: Option<u64>) -> Option<Result<Outgoing>> {
        // SAFETY: R's main thread; the kind string is kept for the session.
        let kind = unsafe { crate::handle::kept_expr_kind() };
        crate::small::as_task(|| crate::small::encode_list3(kind, expr, vars))
            .map(|(bytes, vecs)| Outgoing::with_oob(bytes, vecs, to))
    }

    /// A compact payload `bytes` whose out-of-band items are `vecs` (each reachable from a
    /// value the caller keeps protected for the call).
    fn with_oob(bytes: Vec<u8>, vecs: Vec<SEXP>, to: Option<u64>) -> Result<Outgoing> {
        if vecs.is_empty() {
            return Ok(Outgoing::layout(TAG_SMALL, bytes, Vec::new()));
        }
        // SAFETY: the caller's contract; the Robj protects each vector for as long as the
        // payload lives.
        let bufs = vecs
            .into_iter()
            .map(|v| oob_entry(unsafe { Robj::from_sexp(v) }, to))
            .collect::<Result<Vec<_>>>()?;
        Ok(Outgoing::layout(TAG_SMALL, bytes, bufs))
    }

    fn layout(tag: u8, skel: Vec<u8>, bufs: Vec<Oob>) -> Outgoing {
        let mut w = oob::Writer::new(tag, skel);
        for b in bufs {
            match b.how {
                How::Ref(region, off, col) => {
                    w.push_ref(b.code, region, off, b.len, false, col.map(u64::from));
                }
                _ => {
                    w.push(b.code, b);
                }
            }
        }
        Outgoing {
            w,
            compact: tag == TAG_SMALL,
        }
    }

    /// The vectors copied in, in order.
    pub(crate) fn buffers(&self) -> impl Iterator<Item = &Oob> {
        self.w.sources()
    }

    /// The payload as bytes (where it cannot be written in place).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.size()];
        self.fill(&mut v);
        v
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        if self.compact {
            crate::small::give_back(std::mem::take(self.w.body_mut()));
        }
    }
}

/// Payload bytes this process has written for others to read (tasks, results, messages,
/// shared values): what crossed, for the benchmarks.
static WRITTEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub(crate) fn payload_bytes_written() -> f64 {
    WRITTEN.load(std::sync::atomic::Ordering::Relaxed) as f64
}

impl Fill for Outgoing {
    fn size(&self) -> usize {
        self.w.size()
    }

    fn fill(&self, out: &mut [u8]) {
        WRITTEN.fetch_add(out.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.w.write(out);
    }
}

/// How one out-of-band atomic vector `v` goes: by reference when it is an unmodified view of
/// ours, as Arrow when `arrow_out` encodes it, laid out when it is a character vector, else
/// its bytes.
///
/// With `to`, a task for that pool: a large plain vector (numbers, logicals, raw bytes) goes by
/// reference to the copy `mizu_pool::repeats` keeps of it, made on its first send and served
/// while its bytes stay the same, as pymizu does for numpy arrays.
fn oob_entry(v: Robj, to: Option<u64>) -> Result<Oob> {
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
        let n = XLENGTH(s) as usize * t.size();
        if let Some(pool) = to
            && t != VType::Str
            && extendr_ffi::ALTREP(s) == 0
            && n >= mizu_pool::repeats::REPEAT_MIN
        {
            // SAFETY: a plain (not ALTREP) vector's elements, `n` bytes, which `v` keeps alive
            // and the caller unmodified while they are compared or copied.
            let bytes = std::slice::from_raw_parts(DATAPTR_RO(s).cast::<u8>(), n);
            let region = mizu_pool::repeats::shared_copy(pool, bytes)
                .map_err(|e| crate::rerr(e.to_string()))?;
            return Ok(Oob {
                vec: v,
                code: t.wire(),
                len: n,
                how: How::Ref(region, 0, None),
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
                code: t.wire(),
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
        code: t.wire(),
        len: n,
        how: How::Bytes(ptr),
    })
}
