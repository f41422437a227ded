//! Cross-language task and result payloads: what a pool sends to a worker of another language
//! and what that worker sends back (normative text: `docs/wire-format.md` §6).
//!
//! A payload is a 64-byte header followed by one value of the compact tagged encoding, which
//! therefore starts 64-byte aligned wherever the payload does (a region, or the aligned copy a
//! reader makes of an inline payload): Arrow bodies inside it are read in place.
//!
//! Both bindings build this payload with the functions here and only convert their own
//! language's objects to and from [`Value`]; neither parses the header itself. Values are
//! written with [`crate::value::encode_aligned`]: a received array or table sent on unmodified
//! ([`Value::Shared`]) travels as a reference to where it already is.

use arrow_buffer::{Buffer, MutableBuffer};

use crate::error::{Result, WireError, malformed};
use crate::store::Mapper;
use crate::value::{CallTarget, Encoded, Value, decode_in, encode_aligned};

/// First byte of every cross-language payload (no same-language payload of either binding
/// starts with it).
pub const TAG: u8 = b'X';
/// Bytes before the value.
pub const HEADER_LEN: usize = 64;
/// The header's version byte.
pub const VERSION: u8 = 1;

const MAGIC: [u8; 3] = [TAG, b'M', b'Z'];
const SEEDED: u8 = 1;
/// A return value with the warnings the task raised: the value is `[value, [message, ...]]`.
const WARNED: u8 = 2;
/// A map chunk whose elements are each a list of positional arguments.
const SPREAD: u8 = 4;

/// What a payload holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A task: the value is a [`Value::Call`].
    Task = 1,
    /// A task's return value.
    Value = 2,
    /// A task's failure: the value is a [`RemoteError`] as a dict.
    Error = 3,
    /// A chunk of a map: the value is `[call, [element, ...]]`; the header's index is the
    /// first element's. The answer is a list of the elements' values, or the first failing
    /// element's error (its `element` set).
    Chunk = 4,
}

/// The elements of a map chunk: element `j` runs the call with it appended to the positional
/// arguments (or, when `spread`, with its items appended), on the stream of
/// `(seed, first index + j)`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Chunk {
    /// The elements, in order.
    pub elements: Vec<Value>,
    /// Whether each element is a list of positional arguments.
    pub spread: bool,
}

/// What a task runs under: the random stream of a seeded map element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Context {
    /// The map's seed, when it has one.
    pub seed: Option<u64>,
    /// The element's index in the map (0 outside maps).
    pub index: u64,
}

/// An error raised by a task in another language, as its caller sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RemoteError {
    /// `"r"` or `"python"`.
    pub language: String,
    /// The condition classes (R, most specific first) or the exception's type and its bases
    /// (Python, e.g. `["ZeroDivisionError", "ArithmeticError", "Exception"]`).
    pub classes: Vec<String>,
    /// The message.
    pub message: String,
    /// The call that raised it (R), or empty.
    pub call: String,
    /// The remote traceback, as text.
    pub traceback: String,
    /// In a map chunk, the index (in the whole map) of the element that failed.
    pub element: Option<u64>,
}

impl RemoteError {
    fn to_value(&self) -> Value {
        let s = |x: &str| Value::Str(x.to_owned());
        let mut fields = vec![
            ("language".into(), s(&self.language)),
            (
                "classes".into(),
                Value::List(self.classes.iter().map(|c| s(c)).collect()),
            ),
            ("message".into(), s(&self.message)),
            ("call".into(), s(&self.call)),
            ("traceback".into(), s(&self.traceback)),
        ];
        if let Some(i) = self.element {
            fields.push(("element".into(), Value::Int(i as i64)));
        }
        Value::Dict(fields)
    }

    fn from_value(v: Value) -> Result<RemoteError> {
        let bad = |why: &str| malformed(HEADER_LEN, format!("error payload: {why}"));
        let Value::Dict(kv) = v else {
            return Err(bad("not a dict"));
        };
        let mut e = RemoteError::default();
        for (k, v) in kv {
            let text = |v: Value| match v {
                Value::Str(s) => Ok(s),
                _ => Err(bad("a field that is not a string")),
            };
            match k.as_str() {
                "language" => e.language = text(v)?,
                "message" => e.message = text(v)?,
                "call" => e.call = text(v)?,
                "traceback" => e.traceback = text(v)?,
                "element" => match v {
                    Value::Int(i) if i >= 0 => e.element = Some(i as u64),
                    _ => return Err(bad("element is not a non-negative int")),
                },
                "classes" => {
                    let Value::List(cs) = v else {
                        return Err(bad("classes is not a list"));
                    };
                    e.classes = cs.into_iter().map(text).collect::<Result<_>>()?;
                }
                // Fields added by later writers of this version are ignored.
                _ => {}
            }
        }
        Ok(e)
    }
}

/// An encoded payload: the header and the value's scatter list (large buffers are referenced,
/// not copied, until [`Envelope::write_to`]).
#[derive(Debug, Clone)]
pub struct Envelope {
    header: [u8; HEADER_LEN],
    body: Encoded,
}

impl Envelope {
    fn new(kind: Kind, ctx: Context, v: &Value) -> Result<Envelope> {
        let mut header = [0u8; HEADER_LEN];
        header[..3].copy_from_slice(&MAGIC);
        header[3] = VERSION;
        header[4] = kind as u8;
        if let Some(seed) = ctx.seed {
            header[5] = SEEDED;
            header[8..16].copy_from_slice(&seed.to_le_bytes());
        }
        header[16..24].copy_from_slice(&ctx.index.to_le_bytes());
        Ok(Envelope {
            header,
            body: encode_aligned(v)?,
        })
    }

    /// A task calling `call` (a [`Value::Call`]).
    pub fn task(call: &Value, ctx: Context) -> Result<Envelope> {
        if !matches!(call, Value::Call { .. }) {
            return Err(WireError::Unsupported("a task must be a call".into()));
        }
        if let Value::Call {
            target: CallTarget::Source(_),
            args,
            ..
        } = call
            && !args.is_empty()
        {
            return Err(WireError::Unsupported(
                "a source call takes named arguments only (they become variables)".into(),
            ));
        }
        Envelope::new(Kind::Task, ctx, call)
    }

    /// A chunk of a map calling `call` (a [`Value::Call`] naming a function) on each element;
    /// `ctx.index` is the first element's index in the map.
    pub fn chunk(call: Value, chunk: Chunk, ctx: Context) -> Result<Envelope> {
        if !matches!(
            call,
            Value::Call {
                target: CallTarget::Name(_),
                ..
            }
        ) {
            return Err(WireError::Unsupported(
                "a map chunk needs a call that names a function".into(),
            ));
        }
        let mut e = Envelope::new(
            Kind::Chunk,
            ctx,
            &Value::List(vec![call, Value::List(chunk.elements)]),
        )?;
        if chunk.spread {
            e.header[5] |= SPREAD;
        }
        Ok(e)
    }

    /// A task's return value.
    pub fn value(v: &Value) -> Result<Envelope> {
        Envelope::new(Kind::Value, Context::default(), v)
    }

    /// A task's return value and the messages of the warnings it raised (R's warnings, which
    /// the caller signals again).
    pub fn value_warned(v: &Value, warnings: &[String]) -> Result<Envelope> {
        if warnings.is_empty() {
            return Envelope::value(v);
        }
        let w = Value::List(warnings.iter().map(|m| Value::Str(m.clone())).collect());
        let mut e = Envelope::new(
            Kind::Value,
            Context::default(),
            &Value::List(vec![v.clone(), w]),
        )?;
        e.header[5] = WARNED;
        Ok(e)
    }

    /// A task's failure.
    pub fn error(e: &RemoteError) -> Result<Envelope> {
        Envelope::new(Kind::Error, Context::default(), &e.to_value())
    }

    /// A task's failure in `language` with these classes and message (what a worker reports
    /// when it cannot run or answer a task): never fails to encode.
    pub fn failure(language: &str, classes: &[&str], message: String) -> Envelope {
        Envelope::failure_of(&RemoteError {
            language: language.into(),
            classes: classes.iter().map(|c| (*c).to_owned()).collect(),
            message,
            ..Default::default()
        })
    }

    /// [`Envelope::error`], or a plain error saying that `e` could not be encoded.
    pub fn failure_of(e: &RemoteError) -> Envelope {
        Envelope::error(e).unwrap_or_else(|_| {
            Envelope::error(&RemoteError {
                language: e.language.clone(),
                classes: vec!["error".into()],
                message: "the task's error could not be encoded".into(),
                ..Default::default()
            })
            .expect("a plain error encodes")
        })
    }

    /// Total length in bytes.
    pub fn len(&self) -> usize {
        HEADER_LEN + self.body.len()
    }

    /// Never true: the header is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the payload into `out` (exactly [`Envelope::len`] bytes).
    pub fn write_to(&self, out: &mut [u8]) {
        out[..HEADER_LEN].copy_from_slice(&self.header);
        self.body.write_to(&mut out[HEADER_LEN..]);
    }

    /// The payload as one private buffer (tests, and replies that cannot be written in place).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.write_to(&mut v);
        v
    }
}

/// Whether `payload` is a cross-language payload (by its first bytes; [`read`] validates).
pub fn is_envelope(payload: &[u8]) -> bool {
    payload.len() >= 3 && payload[..3] == MAGIC
}

/// A decoded payload.
#[derive(Debug)]
pub enum Received {
    /// A task (or a map chunk): its call's parts, and its context.
    Task {
        /// What to call.
        target: CallTarget,
        /// Positional arguments.
        args: Vec<Value>,
        /// Named arguments.
        kwargs: Vec<(String, Value)>,
        /// Seed and element index (of the first element, for a chunk).
        ctx: Context,
        /// The elements, when the task is a map chunk.
        chunk: Option<Chunk>,
    },
    /// A return value.
    Value(Value),
    /// A return value with the messages of the warnings the task raised.
    Warned {
        /// The value.
        value: Value,
        /// The warnings' messages, in order.
        warnings: Vec<String>,
    },
    /// A failure.
    Error(RemoteError),
}

/// Reads a payload. Arrow data and large byte strings are views into `payload` when it is
/// 64-byte aligned in memory (region payloads are); else it is copied once into an aligned
/// buffer first. Arrays and tables come as [`Value::Shared`] (so they can be sent on by
/// reference); a payload that refers to values in other regions needs [`read_with`].
pub fn read(payload: &Buffer) -> Result<Received> {
    read_with(payload, None)
}

/// A task's parts, as a worker runs it.
#[derive(Debug)]
pub struct Task {
    /// What to call.
    pub target: CallTarget,
    /// Positional arguments.
    pub args: Vec<Value>,
    /// Named arguments.
    pub kwargs: Vec<(String, Value)>,
    /// Seed and element index (of the first element, for a chunk).
    pub ctx: Context,
    /// The elements, when the task is a map chunk.
    pub chunk: Option<Chunk>,
}

/// [`read_with`] for a worker: the task, or an error for a payload that is not one.
pub fn read_task(payload: &Buffer, mapper: Option<&Mapper>) -> Result<Task> {
    match read_with(payload, mapper)? {
        Received::Task {
            target,
            args,
            kwargs,
            ctx,
            chunk,
        } => Ok(Task {
            target,
            args,
            kwargs,
            ctx,
            chunk,
        }),
        _ => Err(malformed(4, "a result where a task was expected")),
    }
}

/// [`read`], adopting the regions that shared values refer to with `mapper`.
pub fn read_with(payload: &Buffer, mapper: Option<&Mapper>) -> Result<Received> {
    if payload.len() < HEADER_LEN {
        return Err(WireError::Truncated {
            what: "cross-language header",
            offset: 0,
            needed: HEADER_LEN,
            available: payload.len(),
        });
    }
    let h = &payload.as_slice()[..HEADER_LEN];
    if h[..3] != MAGIC {
        return Err(malformed(0, "not a cross-language payload"));
    }
    if h[3] != VERSION {
        return Err(malformed(
            3,
            format!(
                "cross-language payload version {} (this build reads {VERSION})",
                h[3]
            ),
        ));
    }
    if h[5] & !(SEEDED | WARNED | SPREAD) != 0
        || h[6..8] != [0, 0]
        || h[24..].iter().any(|&b| b != 0)
    {
        return Err(malformed(5, "reserved header bytes are not zero"));
    }
    let warned = h[5] & WARNED != 0;
    if warned && (h[4] != Kind::Value as u8 || h[5] & SEEDED != 0) {
        return Err(malformed(
            5,
            "warnings on a payload that is not a return value",
        ));
    }
    let spread = h[5] & SPREAD != 0;
    if spread && h[4] != Kind::Chunk as u8 {
        return Err(malformed(
            5,
            "the spread flag on a payload that is not a map chunk",
        ));
    }
    let seeded = h[5] & SEEDED != 0;
    let word = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().expect("8 bytes"));
    let ctx = Context {
        seed: seeded.then(|| word(8)),
        index: word(16),
    };
    if !seeded && word(8) != 0 {
        return Err(malformed(8, "a seed in an unseeded payload"));
    }
    let kind = h[4];
    let body = payload.slice(HEADER_LEN);
    let body = if (body.as_ptr() as usize).is_multiple_of(64) {
        body
    } else {
        let mut m = MutableBuffer::with_capacity(body.len());
        m.extend_from_slice(body.as_slice());
        m.into()
    };
    let v = decode_in(&body, mapper, true)?;
    match kind {
        1 => match v {
            Value::Call {
                target,
                args,
                kwargs,
            } => {
                if matches!(target, CallTarget::Source(_)) && !args.is_empty() {
                    return Err(malformed(
                        HEADER_LEN,
                        "a source call with positional arguments",
                    ));
                }
                Ok(Received::Task {
                    target,
                    args,
                    kwargs,
                    ctx,
                    chunk: None,
                })
            }
            _ => Err(malformed(HEADER_LEN, "a task that is not a call")),
        },
        4 => {
            let bad = |why: &str| malformed(HEADER_LEN, format!("map chunk: {why}"));
            let Value::List(mut parts) = v else {
                return Err(bad("not [call, elements]"));
            };
            if parts.len() != 2 {
                return Err(bad("not [call, elements]"));
            }
            let Value::List(elements) = parts.pop().expect("two") else {
                return Err(bad("the elements are not a list"));
            };
            if spread && elements.iter().any(|e| !matches!(e, Value::List(_))) {
                return Err(bad("a spread element that is not a list"));
            }
            if ctx.index.checked_add(elements.len() as u64).is_none() {
                return Err(bad("element indices overflow"));
            }
            match parts.pop().expect("one") {
                Value::Call {
                    target: target @ CallTarget::Name(_),
                    args,
                    kwargs,
                } => Ok(Received::Task {
                    target,
                    args,
                    kwargs,
                    ctx,
                    chunk: Some(Chunk { elements, spread }),
                }),
                _ => Err(bad("not a call that names a function")),
            }
        }
        2 if warned => {
            let bad = || malformed(HEADER_LEN, "a warned value that is not [value, [messages]]");
            let Value::List(mut parts) = v else {
                return Err(bad());
            };
            if parts.len() != 2 {
                return Err(bad());
            }
            let Value::List(ws) = parts.pop().expect("two") else {
                return Err(bad());
            };
            let warnings = ws
                .into_iter()
                .map(|w| match w {
                    Value::Str(s) => Ok(s),
                    _ => Err(bad()),
                })
                .collect::<Result<_>>()?;
            Ok(Received::Warned {
                value: parts.pop().expect("one"),
                warnings,
            })
        }
        2 => Ok(Received::Value(v)),
        3 => RemoteError::from_value(v).map(Received::Error),
        k => Err(malformed(4, format!("unknown payload kind {k}"))),
    }
}
