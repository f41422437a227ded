//! Arrow IPC streams inside values: reading one zero-copy, validating what another process
//! wrote, and what this process already checked of shared bytes.

use std::sync::Arc;

use arrow_array::{Array, RecordBatch};
use arrow_buffer::Buffer;
use arrow_schema::Schema;

use crate::checked::validated;
use crate::error::{Result, malformed};

/// Whether this process recorded (with [`passed_check`]) that `bytes`, a range of a shared
/// region, passed `check`: a binding's own test of received data (R: no string holds a NUL)
/// is made once per received value, not each time it is received again. Always `false`
/// outside shared regions.
pub fn passed_before(bytes: &[u8], check: &'static str) -> bool {
    crate::store::Region::containing(bytes.as_ptr()).is_some_and(|(r, at)| {
        validated::contains(&validated::checked(r.place(), at, bytes.len(), check))
    })
}

/// Records that `bytes` (a range of a shared region, immutable while referenced) passed
/// `check`; see [`passed_before`]. Nothing outside shared regions.
pub fn passed_check(bytes: &[u8], check: &'static str) {
    if let Some((r, at)) = crate::store::Region::containing(bytes.as_ptr()) {
        validated::insert(validated::checked(r.place(), at, bytes.len(), check));
    }
}

/// Decodes an IPC stream holding exactly one record batch, zero-copy, requiring alignment.
pub(super) fn decode_arrow(stream: Buffer, at: usize, trusted: bool) -> Result<RecordBatch> {
    // Arrow only checks each buffer's natural alignment; the format promises 64 so receivers
    // get SIMD-friendly views, and a value placed otherwise is a misuse worth an error.
    if !(stream.as_ptr() as usize).is_multiple_of(64) {
        return Err(malformed(
            at,
            "arrow stream is not 64-byte aligned in memory (decode from an aligned buffer)",
        ));
    }
    validate_ipc_stream(stream.as_slice(), at)?;
    // arrow-data 60.1 still asserts (panics) on some malformed bodies, e.g. an offsets buffer
    // whose length is not a whole number of offsets. Contain that here, on local state only,
    // so hostile bytes are an error and never a panic that could cross an FFI boundary.
    let decoded = quietly(move || read_ipc_stream(&stream, trusted));
    let (batch, extra) = match decoded {
        Ok(r) => r?,
        Err(p) => {
            let why = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            return Err(malformed(
                at,
                format!("arrow-ipc could not decode the stream: {why}"),
            ));
        }
    };
    if extra {
        return Err(malformed(
            at,
            "an arrow value holds more than one record batch",
        ));
    }
    batch.ok_or_else(|| malformed(at, "an arrow value holds no record batch"))
}

thread_local! {
    /// Set while this thread runs arrow on untrusted bytes (see [`quietly`]).
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` catching a panic, without the panic hook's message: arrow asserts (panics) on
/// some malformed input, which is an error for us, not news for the user's terminal. The
/// hook, installed once, stays silent only on a thread inside `quietly`; any other panic is
/// reported by the hook that was there before.
fn quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(std::cell::Cell::get) {
                before(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    r
}

/// Reads a one-batch IPC stream whose framing `validate_ipc_stream` checked. arrow-ipc's
/// `StreamDecoder` would validate every array as it builds it, but checks dictionary keys at
/// ~1.5 ns a key (a factor of 54 000 rows took 85 µs each time it arrived): the messages are
/// read here with arrow's validation off, then every array is validated by `validate_array`
/// before it is returned.
fn read_ipc_stream(
    stream: &Buffer,
    trusted: bool,
) -> std::result::Result<(Option<RecordBatch>, bool), arrow_schema::ArrowError> {
    use arrow_ipc::MessageHeader;
    use arrow_schema::ArrowError;
    let ipc = |why: &str| ArrowError::IpcError(why.to_string());
    let b = stream.as_slice();
    let mut skip = arrow_data::UnsafeFlag::new();
    // SAFETY: nothing read with it leaves this function before `validate_array` checked it.
    unsafe { skip.set(true) };
    let mut schema: Option<Arc<Schema>> = None;
    let mut dictionaries = std::collections::HashMap::new();
    let (mut batch, mut extra) = (None, false);
    let mut pos = 0usize;
    loop {
        let head = b.get(pos..pos + 8).ok_or_else(|| ipc("truncated"))?;
        let meta_len = usize::try_from(i32::from_le_bytes(head[4..8].try_into().expect("4")))
            .map_err(|_| ipc("negative metadata length"))?;
        if meta_len == 0 {
            break;
        }
        let meta_end = pos + 8 + meta_len;
        let msg = arrow_ipc::root_as_message(&b[pos + 8..meta_end])
            .map_err(|e| ipc(&format!("message metadata: {e}")))?;
        let body_len = usize::try_from(msg.bodyLength()).map_err(|_| ipc("body length"))?;
        let body = stream.slice_with_length(meta_end, body_len);
        let version = msg.version();
        match msg.header_type() {
            MessageHeader::Schema => {
                let s = msg.header_as_schema().ok_or_else(|| ipc("no schema"))?;
                schema = Some(Arc::new(arrow_ipc::convert::try_fb_to_schema(s)?));
            }
            MessageHeader::DictionaryBatch => {
                let d = msg
                    .header_as_dictionary_batch()
                    .ok_or_else(|| ipc("no dictionary"))?;
                let s = schema
                    .as_deref()
                    .ok_or_else(|| ipc("dictionary before the schema"))?;
                arrow_ipc::reader::read_dictionary_impl(
                    &body,
                    d,
                    s,
                    &mut dictionaries,
                    &version,
                    true,
                    skip.clone(),
                )?;
            }
            MessageHeader::RecordBatch => {
                let rb = msg
                    .header_as_record_batch()
                    .ok_or_else(|| ipc("no batch"))?;
                let s = schema
                    .clone()
                    .ok_or_else(|| ipc("batch before the schema"))?;
                let read = arrow_ipc::reader::RecordBatchDecoder::try_new(
                    &body,
                    rb,
                    s,
                    &dictionaries,
                    &version,
                )?
                .with_require_alignment(true)
                .with_skip_validation(skip.clone())
                .read_record_batch()?;
                if !trusted {
                    for c in read.columns() {
                        validate_array(&c.to_data())?;
                    }
                }
                extra |= batch.replace(read).is_some();
            }
            t => return Err(ipc(&format!("unsupported message type {t:?}"))),
        }
        pos = meta_end + body_len;
    }
    Ok((batch, extra))
}

/// What `ArrayData::validate_full` checks (structure, nulls, values, children), with int32
/// dictionary keys checked by a loop the compiler vectorizes.
fn validate_array(d: &arrow_data::ArrayData) -> std::result::Result<(), arrow_schema::ArrowError> {
    d.validate()?;
    d.validate_nulls()?;
    match d.data_type() {
        arrow_schema::DataType::Dictionary(k, _) if **k == arrow_schema::DataType::Int32 => {
            let values = d.child_data().first().map_or(0, |c| c.len());
            let lim = u32::try_from(values).unwrap_or(u32::MAX);
            // `validate` checked that the buffer holds offset + len keys.
            let keys = &d.buffers()[0].typed_data::<i32>()[d.offset()..d.offset() + d.len()];
            // A plain reduction the compiler vectorizes; the positions only when it finds one.
            if keys.iter().fold(false, |a, &x| a | (x as u32 >= lim)) {
                for (i, &x) in keys.iter().enumerate() {
                    // Keys under nulls may be anything.
                    if x as u32 >= lim && d.is_valid(i) {
                        return Err(arrow_schema::ArrowError::InvalidArgumentError(format!(
                            "dictionary key {x} at {i} out of 0..{values}"
                        )));
                    }
                }
            }
        }
        _ => d.validate_values()?,
    }
    d.child_data().iter().try_for_each(validate_array)
}

/// Checks the framing of an IPC stream before arrow-ipc reads it: arrow trusts buffer offsets
/// and panics on out-of-range ones, so every message's metadata is verified (flatbuffer
/// verifier) and every body buffer is checked to lie inside its message body.
fn validate_ipc_stream(b: &[u8], at: usize) -> Result<()> {
    use arrow_ipc::MessageHeader;
    let bad = |off: usize, why: String| malformed(at + off, format!("arrow stream: {why}"));
    let mut pos = 0usize;
    loop {
        let head = b
            .get(pos..pos + 8)
            .ok_or_else(|| bad(pos, "truncated before end-of-stream".into()))?;
        if head[..4] != [0xff; 4] {
            return Err(bad(pos, "message without continuation marker".into()));
        }
        let meta_len = i32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
        if meta_len == 0 {
            if pos + 8 != b.len() {
                return Err(bad(
                    pos,
                    format!("{} bytes after end-of-stream", b.len() - pos - 8),
                ));
            }
            return Ok(());
        }
        let meta_end = usize::try_from(meta_len)
            .ok()
            .and_then(|m| (pos + 8).checked_add(m))
            .filter(|&e| e <= b.len())
            .ok_or_else(|| bad(pos, format!("metadata length {meta_len} out of range")))?;
        let msg = arrow_ipc::root_as_message(&b[pos + 8..meta_end])
            .map_err(|e| bad(pos, format!("invalid message metadata: {e}")))?;
        let body_len =
            u64::try_from(msg.bodyLength()).map_err(|_| bad(pos, "negative body length".into()))?;
        let end = (meta_end as u64)
            .checked_add(body_len)
            .filter(|&e| e <= b.len() as u64)
            .ok_or_else(|| bad(pos, format!("body of {body_len} bytes past the end")))?
            as usize;
        let batch = match msg.header_type() {
            MessageHeader::Schema => None,
            MessageHeader::RecordBatch => msg.header_as_record_batch(),
            MessageHeader::DictionaryBatch => {
                msg.header_as_dictionary_batch().and_then(|d| d.data())
            }
            other => return Err(bad(pos, format!("unsupported message type {other:?}"))),
        };
        if let Some(rb) = batch {
            for buf in rb.buffers().iter().flatten() {
                let ok = u64::try_from(buf.offset())
                    .ok()
                    .zip(u64::try_from(buf.length()).ok())
                    .and_then(|(o, l)| o.checked_add(l))
                    .is_some_and(|e| e <= body_len)
                    && buf.offset() % 8 == 0;
                if !ok {
                    return Err(bad(
                        pos,
                        format!(
                            "buffer {}+{} misaligned or outside a {body_len}-byte body",
                            buf.offset(),
                            buf.length()
                        ),
                    ));
                }
            }
        } else if msg.header_type() != MessageHeader::Schema {
            return Err(bad(pos, "batch message without a batch".into()));
        }
        pos = end;
    }
}
