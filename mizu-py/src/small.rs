//! The fast path for common values: `None`, `bool`, 64-bit `int`, `float`, `str`, `bytes`,
//! contiguous numpy arrays of plain dtypes (`ndarray.rs`) and tuples, lists and dicts of them
//! are written and read natively, without pickle.
//! A trivial task (`f(1, 2)` returning `3`) spends most of its time in pickling otherwise.
//!
//! Only exact built-in types qualify (a subclass, an `IntEnum`, a big int, a string with lone
//! surrogates goes through pickle, which keeps its type), and a mutable container that occurs
//! twice sends the whole value through pickle, which keeps the sharing.
//!
//! The values are items of the wire format's compact tagged encoding (`docs/wire-format.md`
//! §3, written and read with `mizu_pool::wire::compact`): the shared items for `None`, booleans,
//! ints, floats, strings, bytes, lists and dicts with `str` keys, and the Python items for
//! tuples, dicts with other keys and numpy arrays. A payload is a `K` payload of the runtime's
//! one layout of a language's own payloads (`mizu_pool::wire::oob`) whose body is one value: a
//! task's result, or a call item of form 2 (the function's pickle by reference, the arguments,
//! the keyword arguments).
//!
//! A numpy array item holds: order `C`/`F`, u8 length + the dtype's `str`, u8 dimensions +
//! u64 each, then its bytes: inline (u32 length + the bytes, up to 4 KiB), or the varint index
//! of the payload's buffer that holds them — copied in (viewed in place on arrival), or by
//! reference to a region this process holds (one it received, or a copy kept for repeated
//! sends), which the receiver adopts. Input is untrusted: every length and offset is checked
//! and nesting is bounded.

use std::sync::{Mutex, PoisonError};

use mizu_pool::Fill;
use mizu_pool::wire::compact::{self, form, tag};
use mizu_pool::wire::oob;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

use crate::codec::Exported;
use crate::cursor::{Beside, MAX_SIZE, Writer};

/// Containers nested deeper than this go through pickle.
pub(crate) const MAX_DEPTH: u32 = 16;
impl Writer {
    /// Writes `v` (false: not a small value). An `int`, the commonest argument, is written
    /// here, outside the frame of the function that writes everything else.
    #[inline(always)]
    fn value(&mut self, v: &Bound<'_, PyAny>, depth: u32) -> bool {
        if v.is_exact_instance_of::<PyInt>() && self.out.len() <= MAX_SIZE {
            let Ok(i) = v.extract::<i64>() else {
                return false;
            };
            self.out.push(tag::INT);
            self.out.extend_from_slice(&i.to_le_bytes());
            return true;
        }
        self.other_value(v, depth)
    }

    fn other_value(&mut self, v: &Bound<'_, PyAny>, depth: u32) -> bool {
        if self.out.len() > MAX_SIZE {
            return false;
        }
        // (A tuple first: each call of a batch's chunk is one.)
        if let Ok(t) = v.cast_exact::<PyTuple>() {
            return depth < MAX_DEPTH && self.tuple(t, depth + 1);
        }
        if v.is_none() {
            self.out.push(tag::NONE);
        } else if let Ok(b) = v.cast_exact::<PyBool>() {
            self.out
                .push(if b.is_true() { tag::TRUE } else { tag::FALSE });
        } else if v.is_exact_instance_of::<PyInt>() {
            let Ok(i) = v.extract::<i64>() else {
                return false;
            };
            self.out.push(tag::INT);
            self.out.extend_from_slice(&i.to_le_bytes());
        } else if let Ok(f) = v.cast_exact::<PyFloat>() {
            self.out.push(tag::FLOAT);
            self.out
                .extend_from_slice(&f.value().to_bits().to_le_bytes());
        } else if let Ok(s) = v.cast_exact::<PyString>() {
            let Ok(s) = s.to_str() else {
                return false; // lone surrogates: pickle keeps them
            };
            return self.str(s);
        } else if let Ok(b) = v.cast_exact::<PyBytes>() {
            let b = b.as_bytes();
            if self.out.len() + b.len() > MAX_SIZE {
                return false;
            }
            compact::put_bytes(&mut self.out, 0, b);
        } else if let Ok(l) = v.cast_exact::<PyList>() {
            if depth >= MAX_DEPTH || !self.mutable(v) {
                return false;
            }
            self.out.push(tag::LIST);
            self.count(l.len());
            // Items are read by index with the length checked each time: a change made by a
            // finalizer (writing an array calls numpy) cannot read past the end. The count
            // written first must still hold.
            let (n, mut k) = (l.len(), 0);
            return l.iter().all(|x| {
                k += 1;
                self.value(&x, depth + 1)
            }) && k == n;
        } else if let Ok(d) = v.cast_exact::<PyDict>() {
            if depth >= MAX_DEPTH || !self.mutable(v) {
                return false;
            }
            // String keys are the shared dict item; any other key makes it Python's. (Checking
            // the keys runs no Python code, so nothing can change the dict meanwhile.)
            let str_keys = d.iter().all(|(k, _)| k.is_exact_instance_of::<PyString>());
            // A snapshot of the items: writing an array calls numpy, and a garbage collection
            // there could run a finalizer that changes this dict.
            let items = d.items();
            self.out
                .push(if str_keys { tag::DICT } else { tag::PY_DICT });
            self.count(items.len());
            return items.iter().all(|kv| {
                kv.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>()
                    .is_ok_and(|(k, x)| {
                        let key = if str_keys {
                            match k
                                .cast_exact::<PyString>()
                                .ok()
                                .and_then(|s| s.to_str().ok())
                            {
                                Some(name) => {
                                    compact::put_str(&mut self.out, name);
                                    true
                                }
                                None => false,
                            }
                        } else {
                            self.value(&k, depth + 1)
                        };
                        key && self.value(&x, depth + 1)
                    })
            });
        } else {
            return depth < MAX_DEPTH && self.mutable(v) && self.array(v).unwrap_or(false);
        }
        true
    }

    fn tuple(&mut self, t: &Bound<'_, PyTuple>, depth: u32) -> bool {
        self.out.push(tag::PY_TUPLE);
        self.items(t, depth)
    }

    /// A count and the items of `t` (no tag: a call's arguments).
    fn items(&mut self, t: &Bound<'_, PyTuple>, depth: u32) -> bool {
        self.count(t.len());
        // Borrowed: a tuple keeps its items (a reference count taken and given back per item
        // is two calls into the interpreter under the stable ABI).
        t.iter_borrowed().all(|x| self.value(&x, depth))
    }
}

/// A call's positional arguments: a tuple, or the argument array of a vectorcall (read in
/// place, without making a tuple).
#[derive(Clone, Copy)]
pub enum Args<'a, 'py> {
    /// A tuple of the arguments.
    Tuple(&'a Bound<'py, PyTuple>),
    /// Borrowed pointers to the arguments (made by [`Args::array`]).
    Array(Python<'py>, RawArgs<'a>),
}

/// A vectorcall's argument array, live for the call (only [`Args::array`] makes one).
#[derive(Clone, Copy)]
pub struct RawArgs<'a>(&'a [*mut pyo3::ffi::PyObject]);

impl<'a, 'py> Args<'a, 'py> {
    /// The arguments at `args`.
    ///
    /// # Safety
    /// Every pointer is a live object for `'a` (a vectorcall's arguments, for the call).
    pub unsafe fn array(py: Python<'py>, args: &'a [*mut pyo3::ffi::PyObject]) -> Self {
        Args::Array(py, RawArgs(args))
    }

    fn len(&self) -> usize {
        match self {
            Args::Tuple(t) => t.len(),
            Args::Array(_, a) => a.0.len(),
        }
    }

    /// Whether `f` holds for every argument, in order.
    fn all(&self, mut f: impl FnMut(&Bound<'py, PyAny>) -> bool) -> bool {
        match self {
            Args::Tuple(t) => t.iter_borrowed().all(|x| f(&x)),
            Args::Array(py, a) => a.0.iter().all(|&p| {
                // SAFETY: a live object for the call (`Args::array`'s contract), borrowed.
                let x = unsafe { pyo3::Borrowed::from_ptr(*py, p) };
                f(&x)
            }),
        }
    }

    /// The arguments as a tuple.
    pub fn tuple(&self) -> PyResult<Bound<'py, PyTuple>> {
        match self {
            Args::Tuple(t) => Ok((*t).clone()),
            Args::Array(py, a) => {
                let mut items = Vec::with_capacity(a.0.len());
                self.all(|x| {
                    items.push(x.clone());
                    true
                });
                PyTuple::new(*py, items)
            }
        }
    }
}

/// A small-value payload ready to write: a `K` payload whose buffers are the arrays that
/// travel beside the values.
pub struct Payload(oob::Writer<Vec<u8>, Exported>);

thread_local! {
    /// The body buffer of the last payload dropped on this thread, for the next payload
    /// written here: a payload lives from its encoding to its write into a task slot, and a
    /// fresh buffer's allocation and free cost as much as writing a small call.
    static SPARE_BODY: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Bodies larger than this are freed rather than kept.
const SPARE_MAX: usize = 64 * 1024;

/// An empty buffer with room for `n` bytes, the spare one of this thread if there is one.
fn body_buffer(n: usize) -> Vec<u8> {
    let mut v = SPARE_BODY.try_with(|s| s.take()).unwrap_or_default();
    v.clear();
    v.reserve(n);
    v
}

impl Drop for Payload {
    fn drop(&mut self) {
        if self.0.body().capacity() <= SPARE_MAX {
            let body = std::mem::take(self.0.body_mut());
            // (A thread being torn down frees it instead.)
            let _ = SPARE_BODY.try_with(|s| s.set(body));
        }
    }
}

impl Payload {
    fn new(w: Writer) -> Option<Payload> {
        let mut p = oob::Writer::new(oob::tag::COMPACT, w.out);
        for b in w.beside {
            match b {
                Beside::Copy(e) => p.push(oob::code::BYTES, e),
                Beside::Ref {
                    region,
                    offset,
                    len,
                    writable,
                } => p.push_ref(oob::code::BYTES, region, offset, len, writable, None),
            };
        }
        Some(Payload(p))
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.0.size()
    }

    /// The payload as bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        self.0.to_vec()
    }
}

impl Fill for Payload {
    fn size(&self) -> usize {
        self.0.size()
    }

    /// Each write takes a new reference of every region referred to: adopted by the
    /// receiver, or given back by `codec::release_refs` when the runtime discards the payload.
    fn fill(&self, out: &mut [u8]) {
        self.0.write(out);
    }
}

/// The payload of the value `v`, or None when `v` is not a small value. With `refs`, arrays that
/// view a region this process holds are sent by reference (the payload must then be
/// delivered or discarded by the runtime).
pub fn encode_value(v: &Bound<'_, PyAny>, refs: bool) -> Option<Payload> {
    let mut w = Writer {
        out: body_buffer(16),
        refs_ok: refs,
        ..Writer::default()
    };
    if w.value(v, 0) { Payload::new(w) } else { None }
}

/// The payload of a call of the function pickled as `head` (`fn_ref`), or None when
/// an argument is not a small value or a keyword is not a plain `str`. `repeats`: the pool
/// the call goes to, when large arrays may go by reference to copies kept for their next
/// sends (see `repeats.rs`).
pub fn encode_call(
    head: &[u8],
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
    repeats: Option<u64>,
) -> Option<Payload> {
    encode_call_of(head, Args::Tuple(args), kwargs, repeats)
}

/// A writer of the payload of a call of the function pickled as `head`, its count of positional
/// arguments written.
fn call_writer(head: &[u8], nargs: usize, repeats: Option<u64>) -> Writer {
    let mut w = Writer {
        // (Room for a few small values, or one array sent by reference, without growing.)
        out: body_buffer(head.len() + 128),
        refs_ok: true,
        repeats,
        ..Writer::default()
    };
    w.out.extend_from_slice(&[tag::CALL, form::NATIVE]);
    compact::put_varint(&mut w.out, head.len() as u64);
    w.out.extend_from_slice(head);
    w.count(nargs);
    w
}

/// The payload of a batch chunk's call `run(head, calls, ())` (`run` pickled as
/// `run_head`), written as [`encode_call`] would write it with `calls` in a list, without
/// making the list. None when an argument is not a small value.
pub fn encode_chunk_call(
    run_head: &[u8],
    head: &Bound<'_, PyBytes>,
    calls: &[Bound<'_, PyAny>],
    repeats: Option<u64>,
) -> Option<Payload> {
    let mut w = call_writer(run_head, 3, repeats);
    // (Room for calls of a few small arguments each.)
    w.out
        .reserve(head.as_bytes().len() + calls.len().saturating_mul(32));
    if !w.value(head.as_any(), 1) {
        return None;
    }
    w.out.push(tag::LIST);
    w.count(calls.len());
    if !calls.iter().all(|c| w.value(c, 2)) {
        return None;
    }
    w.out.push(tag::PY_TUPLE);
    w.count(0);
    w.count(0); // no keyword arguments
    Payload::new(w)
}

/// [`encode_call`] of arguments given as [`Args`].
fn encode_call_of(
    head: &[u8],
    args: Args<'_, '_>,
    kwargs: Option<&Bound<'_, PyDict>>,
    repeats: Option<u64>,
) -> Option<Payload> {
    let mut w = call_writer(head, args.len(), repeats);
    if !args.all(|x| w.value(x, 1)) {
        return None;
    }
    match kwargs {
        Some(k) if !k.is_empty() => {
            let items = k.items();
            w.count(items.len());
            for kv in items.iter() {
                let (name, x) = kv.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>().ok()?;
                let name = name.cast_exact::<PyString>().ok()?.to_str().ok()?;
                compact::put_str(&mut w.out, name);
                if !w.value(&x, 1) {
                    return None;
                }
            }
        }
        _ => w.count(0),
    }
    Payload::new(w)
}

/// `types.FunctionType`, `types.BuiltinFunctionType` and `type`: what `pymizu._codec.fn_ref`
/// pickles by reference.
fn fn_types(py: Python<'_>) -> PyResult<&[Py<PyType>; 3]> {
    static TYPES: PyOnceLock<[Py<PyType>; 3]> = PyOnceLock::new();
    TYPES.get_or_try_init(py, || {
        let types = py.import("types")?;
        let t = |n: &str| -> PyResult<Py<PyType>> {
            Ok(types.getattr(n)?.cast_into::<PyType>()?.unbind())
        };
        Ok([
            t("FunctionType")?,
            t("BuiltinFunctionType")?,
            PyType::new::<PyType>(py).unbind(),
        ])
    })
}

/// A call ready to submit: written natively, or pickled by `pymizu._codec`.
pub enum CallPayload<'py> {
    /// A small call's payload.
    Small(Payload),
    /// Pickled.
    Pickled(PickledCall<'py>),
}

/// A pickled call: `(pickle, buffers, head)` as `pymizu._codec.dumps_call` gives it — with
/// `head`, the function's pickle (`fn_ref`) and the arguments' pickle; without, the whole
/// call's pickle.
pub struct PickledCall<'py> {
    /// The pickle.
    pub data: Bound<'py, PyBytes>,
    /// Its out-of-band buffers (an iterable, or None).
    pub bufs: Bound<'py, PyAny>,
    /// The function's pickle by reference.
    pub head: Option<Bound<'py, PyBytes>>,
}

impl<'py> PickledCall<'py> {
    /// From Python's `(pickle, buffers, head)`.
    pub fn from_python(t: &Bound<'py, PyAny>) -> PyResult<Self> {
        let (data, bufs, head) = t.extract()?;
        Ok(PickledCall { data, bufs, head })
    }

    /// Its payload.
    pub fn outgoing(&self) -> PyResult<crate::codec::Outgoing<'_>> {
        let py = self.data.py();
        match &self.head {
            Some(h) => {
                crate::codec::Outgoing::call(py, h.as_bytes(), self.data.as_bytes(), &self.bufs)
            }
            None => crate::codec::Outgoing::new(py, self.data.as_bytes(), &self.bufs),
        }
    }
}

/// The pickle of `f` to send ahead of a call's arguments (`pymizu._codec.fn_ref`): by
/// reference, or by value while `pymizu._by_value` can keep it; None when `f` must be pickled
/// with each call.
pub fn fn_head<'py>(f: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyBytes>>> {
    static FN_REF: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    Ok(
        match head_of(f, FN_REF.import(f.py(), "pymizu._codec", "fn_ref")?)? {
            Head::Whole(h) => Some(h),
            Head::Rebound(..) | Head::Pickled => None,
        },
    )
}

/// How a call's function travels.
enum Head<'py> {
    /// As this pickle (by reference, or by value while kept).
    Whole(Bound<'py, PyBytes>),
    /// As the pickle of its `pymizu._by_value.Template`, which takes this state as the call's
    /// first argument (a function made anew for each call).
    Rebound(Bound<'py, PyBytes>, Bound<'py, PyAny>),
    /// Pickled with each call.
    Pickled,
}

/// [`fn_head`], asking `lookup` (`pymizu._codec.fn_ref` or `call_ref`) when no cache knows
/// `f`.
fn head_of<'py>(f: &Bound<'py, PyAny>, lookup: &Bound<'py, PyAny>) -> PyResult<Head<'py>> {
    static FN_BYTES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    // The last function found and its pickle: a loop submits one function over and over, and
    // the lookup in `fn_ref`'s cache below costs a few hundred instructions. (Held only with
    // the GIL, so never contended; what it held is dropped after it is let go, since dropping
    // a function can run Python code.)
    static LAST: Mutex<Option<(Py<PyAny>, Py<PyBytes>)>> = Mutex::new(None);
    let py = f.py();
    {
        let last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((lf, head)) = last.as_ref()
            && lf.as_ptr() == f.as_ptr()
        {
            return Ok(Head::Whole(head.bind(py).clone()));
        }
    }
    // `fn_ref`'s cache next (it holds only functions and classes it accepted): a hit costs no
    // Python call.
    let cached = match fn_types(py)?.iter().any(|t| f.get_type().is(t)) {
        true => FN_BYTES
            .import(py, "pymizu._codec", "_fn_bytes")?
            .get_item(f)
            .ok()
            .flatten(),
        false => None,
    };
    // A by-value pickle `_by_value` keeps, if still good (else `lookup` makes another).
    let cached = match cached {
        None if f.get_type().is(&fn_types(py)?[0]) => {
            if let Some(h) = crate::kept::head(f)? {
                return Ok(Head::Whole(h));
            }
            None
        }
        c => c,
    };
    let from_cache = cached.is_some();
    let head = match cached {
        Some(h) => h,
        None => lookup.call1((f,))?,
    };
    let head = match head.cast_into::<PyBytes>() {
        Ok(h) => h,
        Err(e) => {
            let other = e.into_inner();
            return Ok(match other.cast::<PyTuple>() {
                Ok(t) if t.len() == 2 => {
                    Head::Rebound(t.get_item(0)?.cast_into::<PyBytes>()?, t.get_item(1)?)
                }
                _ => Head::Pickled,
            });
        }
    };
    if !from_cache {
        // A by-value pickle (`pymizu._by_value`) is checked against what the function holds
        // at each call; one by reference is remembered once `fn_ref` has cached it.
        return Ok(Head::Whole(head));
    }
    let before = LAST
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .replace((f.clone().unbind(), head.clone().unbind()));
    drop(before);
    Ok(Head::Whole(head))
}

/// A call's function, positional arguments and keyword arguments.
type Unwrapped<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyTuple>,
    Option<Bound<'py, PyDict>>,
);

/// A call of `functools.partial(g, *p, **k)` (exactly that type) as the call of `g` it makes:
/// `g(*p, *args, **{**k, **kwargs})`. The worker then calls `g` as the partial would, and `g`
/// goes by reference (cached) instead of the partial being pickled with each call — which is
/// what `loop.run_in_executor(pool, partial(f, key=v))` submits. None for anything else.
fn unwrap_partial<'py>(
    f: &Bound<'py, PyAny>,
    args: &Args<'_, 'py>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Option<Unwrapped<'py>>> {
    static PARTIAL: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let py = f.py();
    if !f.get_type().is(PARTIAL.import(py, "functools", "partial")?) {
        return Ok(None);
    }
    let inner = f.getattr(pyo3::intern!(py, "func"))?;
    let bound = f
        .getattr(pyo3::intern!(py, "args"))?
        .cast_into::<PyTuple>()?;
    let given = args.tuple()?;
    let all = if bound.is_empty() {
        given
    } else {
        PyTuple::new(py, bound.iter().chain(given.iter()).collect::<Vec<_>>())?
    };
    let keywords = f
        .getattr(pyo3::intern!(py, "keywords"))?
        .cast_into::<PyDict>()?;
    let kw = match kwargs {
        _ if keywords.is_empty() => kwargs.cloned(),
        Some(k) if !k.is_empty() => {
            let merged = keywords.copy()?;
            merged.update(k.as_mapping())?;
            Some(merged)
        }
        _ => Some(keywords),
    };
    Ok(Some((inner, all, kw)))
}

/// `fn(*args, **kwargs)` as a payload: natively when `fn` is a module-level function or class
/// (its pickle by reference is cached in `pymizu._codec`) and every argument is small, else
/// pickled by `pymizu._codec.dumps_call` (which raises for what cannot be pickled).
pub fn call_payload<'py>(
    f: &Bound<'py, PyAny>,
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
    repeats: Option<u64>,
) -> PyResult<CallPayload<'py>> {
    call_payload_of(f, Args::Tuple(args), kwargs, repeats)
}

/// [`call_payload`] of arguments given as [`Args`].
pub fn call_payload_of<'py>(
    f: &Bound<'py, PyAny>,
    args: Args<'_, 'py>,
    kwargs: Option<&Bound<'py, PyDict>>,
    repeats: Option<u64>,
) -> PyResult<CallPayload<'py>> {
    static DUMPS_CALL: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    static CALL_REF: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let py = f.py();
    if let Some((inner, args, kwargs)) = unwrap_partial(f, &args, kwargs)? {
        return call_payload_of(&inner, Args::Tuple(&args), kwargs.as_ref(), repeats);
    }
    match head_of(f, CALL_REF.import(py, "pymizu._codec", "call_ref")?)? {
        Head::Whole(h) => call_with_head(h, args, kwargs, repeats),
        Head::Rebound(h, state) => {
            let given = args.tuple()?;
            let all = PyTuple::new(
                py,
                std::iter::once(state)
                    .chain(given.iter())
                    .collect::<Vec<_>>(),
            )?;
            call_with_head(h, Args::Tuple(&all), kwargs, repeats)
        }
        Head::Pickled => {
            // The whole call, pickled in Python.
            let kw = match kwargs {
                Some(k) => k.clone(),
                None => PyDict::new(py),
            };
            Ok(CallPayload::Pickled(PickledCall::from_python(
                &DUMPS_CALL
                    .import(py, "pymizu._codec", "dumps_call")?
                    .call1((f, args.tuple()?, kw))?,
            )?))
        }
    }
}

/// A call of the function pickled as `head`: written natively when every argument is small,
/// else with its arguments pickled in Python.
fn call_with_head<'py>(
    head: Bound<'py, PyBytes>,
    args: Args<'_, 'py>,
    kwargs: Option<&Bound<'py, PyDict>>,
    repeats: Option<u64>,
) -> PyResult<CallPayload<'py>> {
    static DUMPS_ARGS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    if let Some(p) = encode_call_of(head.as_bytes(), args, kwargs, repeats) {
        return Ok(CallPayload::Small(p));
    }
    let (data, bufs) = DUMPS_ARGS
        .import(head.py(), "pymizu._codec", "dumps_args")?
        .call1((args.tuple()?, kwargs))?
        .extract::<(Bound<'py, PyBytes>, Bound<'py, PyAny>)>()?;
    Ok(CallPayload::Pickled(PickledCall {
        data,
        bufs,
        head: Some(head),
    }))
}
