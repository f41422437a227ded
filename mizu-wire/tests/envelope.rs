//! Cross-language task payloads: round trips of tasks, values and errors, and every malformed
//! header refused (never a panic).

use arrow_buffer::{Buffer, MutableBuffer};
use mizu_wire::envelope::{self, Context, Envelope, Received, RemoteError};
use mizu_wire::{CallTarget, Value};
use proptest::prelude::*;

/// The payload in a 64-byte aligned buffer, as a region gives it.
fn aligned(v: &[u8]) -> Buffer {
    let mut m = MutableBuffer::with_capacity(v.len());
    m.extend_from_slice(v);
    m.into()
}

fn call() -> Value {
    Value::Call {
        target: CallTarget::Name("stats::quantile".into()),
        args: vec![
            Value::Float(1.5),
            Value::List(vec![Value::None, Value::Int(3)]),
        ],
        kwargs: vec![("names".into(), Value::Bool(false))],
    }
}

#[test]
fn a_task_round_trips_with_its_context() {
    let ctx = Context {
        seed: Some(u64::MAX - 7),
        index: 41,
    };
    let bytes = Envelope::task(&call(), ctx).unwrap().to_vec();
    assert!(envelope::is_envelope(&bytes));
    match envelope::read(&aligned(&bytes)).unwrap() {
        Received::Task {
            target,
            args,
            kwargs,
            ctx: got,
            chunk: None,
        } => {
            let Value::Call {
                target: t,
                args: a,
                kwargs: k,
            } = call()
            else {
                unreachable!()
            };
            assert_eq!((target, args, kwargs, got), (t, a, k, ctx));
        }
        other => panic!("not a task: {other:?}"),
    }
    // Unaligned input (an inline payload copied out of a slot) is copied, not refused.
    let mut shifted = vec![0u8];
    shifted.extend_from_slice(&bytes);
    let b = aligned(&shifted).slice(1);
    assert!(matches!(envelope::read(&b).unwrap(), Received::Task { .. }));
}

#[test]
fn values_and_errors_round_trip() {
    let v = Value::Dict(vec![("a".into(), Value::Str("é".into()))]);
    let bytes = Envelope::value(&v).unwrap().to_vec();
    match envelope::read(&aligned(&bytes)).unwrap() {
        Received::Value(got) => assert_eq!(got, v),
        other => panic!("{other:?}"),
    }
    let e = RemoteError {
        language: "r".into(),
        classes: vec!["simpleError".into(), "error".into(), "condition".into()],
        message: "boom".into(),
        call: "f(1)".into(),
        traceback: "f(1)\nstop(\"boom\")".into(),
        element: None,
    };
    let bytes = Envelope::error(&e).unwrap().to_vec();
    match envelope::read(&aligned(&bytes)).unwrap() {
        Received::Error(got) => assert_eq!(got, e),
        other => panic!("{other:?}"),
    }
    // A map chunk's failure names its element.
    let e = RemoteError {
        element: Some(u64::MAX >> 1),
        ..e
    };
    let bytes = Envelope::error(&e).unwrap().to_vec();
    match envelope::read(&aligned(&bytes)).unwrap() {
        Received::Error(got) => assert_eq!(got, e),
        other => panic!("{other:?}"),
    }
}

fn elements() -> Vec<Value> {
    vec![
        Value::List(vec![Value::Float(1.0)]),
        Value::List(vec![Value::Table(table()), Value::None]),
    ]
}

#[test]
fn a_map_chunk_round_trips_with_its_elements_and_context() {
    let ctx = Context {
        seed: Some(9),
        index: 100,
    };
    for spread in [false, true] {
        let chunk = envelope::Chunk {
            elements: elements(),
            spread,
        };
        let bytes = Envelope::chunk(call(), chunk.clone(), ctx)
            .unwrap()
            .to_vec();
        let task = envelope::read_task(&aligned(&bytes), None).unwrap();
        let Value::Call {
            target,
            args,
            kwargs,
        } = call()
        else {
            unreachable!()
        };
        assert_eq!(
            (task.target, task.args, task.kwargs, task.ctx, task.chunk),
            (target, args, kwargs, ctx, Some(chunk))
        );
    }
    // Source text cannot be mapped, and a plain task is no chunk.
    let source = Value::Call {
        target: CallTarget::Source("x".into()),
        args: vec![],
        kwargs: vec![],
    };
    assert!(Envelope::chunk(source, envelope::Chunk::default(), ctx).is_err());
    let t = Envelope::task(&call(), ctx).unwrap().to_vec();
    assert_eq!(envelope::read_task(&aligned(&t), None).unwrap().chunk, None);
}

#[test]
fn malformed_map_chunks_are_refused() {
    let ctx = Context::default();
    let chunk = |spread| envelope::Chunk {
        elements: vec![Value::List(vec![]), Value::Int(1)],
        spread,
    };
    // A spread element must be a list of arguments.
    let bytes = Envelope::chunk(call(), chunk(false), ctx).unwrap().to_vec();
    assert!(envelope::read(&aligned(&bytes)).is_ok());
    let mut spread = bytes.clone();
    spread[5] |= 4;
    assert!(envelope::read(&aligned(&spread)).is_err());
    // The spread flag belongs to chunks only.
    let mut t = Envelope::task(&call(), ctx).unwrap().to_vec();
    t[5] |= 4;
    assert!(envelope::read(&aligned(&t)).is_err());
    // A chunk kind over a task, a value, or a list of the wrong shape.
    t[5] &= !4;
    t[4] = 4;
    assert!(envelope::read(&aligned(&t)).is_err());
    let as_chunk = |v: Value| {
        let mut b = Envelope::value(&v).unwrap().to_vec();
        b[4] = 4;
        envelope::read(&aligned(&b))
    };
    assert!(as_chunk(Value::List(vec![call(), Value::List(vec![])])).is_ok());
    assert!(as_chunk(Value::List(vec![call()])).is_err());
    assert!(as_chunk(Value::List(vec![call(), Value::Int(1)])).is_err());
    assert!(as_chunk(Value::List(vec![Value::Int(1), Value::List(vec![])])).is_err());
    let source = Value::Call {
        target: CallTarget::Source("x".into()),
        args: vec![],
        kwargs: vec![],
    };
    assert!(as_chunk(Value::List(vec![source, Value::List(vec![])])).is_err());
    // Element indices that would overflow.
    let mut far = Envelope::chunk(
        call(),
        chunk(false),
        Context {
            seed: None,
            index: u64::MAX,
        },
    )
    .unwrap()
    .to_vec();
    assert!(envelope::read(&aligned(&far)).is_err());
    far[16..24].copy_from_slice(&(u64::MAX - 2).to_le_bytes());
    assert!(envelope::read(&aligned(&far)).is_ok());
    // An error's element must be a non-negative int.
    let bad_error = |element: Value| {
        let v = Value::Dict(vec![
            ("message".into(), Value::Str("m".into())),
            ("element".into(), element),
        ]);
        let mut b = Envelope::value(&v).unwrap().to_vec();
        b[4] = 3;
        envelope::read(&aligned(&b)).is_err()
    };
    assert!(bad_error(Value::Int(-1)));
    assert!(bad_error(Value::Str("1".into())));
    assert!(!bad_error(Value::Int(3)));
}

#[test]
fn a_source_call_takes_no_positional_arguments() {
    let bad = Value::Call {
        target: CallTarget::Source("x + 1".into()),
        args: vec![Value::Int(1)],
        kwargs: vec![],
    };
    assert!(Envelope::task(&bad, Context::default()).is_err());
    assert!(Envelope::task(&Value::Int(1), Context::default()).is_err());
}

#[test]
fn malformed_headers_are_refused() {
    let good = Envelope::task(&call(), Context::default())
        .unwrap()
        .to_vec();
    let refused = |mutate: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        mutate(&mut b);
        envelope::read(&aligned(&b)).is_err()
    };
    assert!(refused(&|b| b.truncate(63)));
    assert!(refused(&|b| b[0] = b'Y'));
    assert!(refused(&|b| b[3] = 2));
    assert!(refused(&|b| b[4] = 9));
    assert!(refused(&|b| b[5] = 2));
    assert!(refused(&|b| b[6] = 1));
    assert!(refused(&|b| b[8] = 1)); // a seed without the flag
    assert!(refused(&|b| b[40] = 1));
    assert!(refused(&|b| b.push(0))); // trailing bytes
    assert!(refused(&|b| b[4] = 2 + 1)); // an error that is not an error dict
    // A task kind over a plain value.
    let v = Envelope::value(&Value::Int(1)).unwrap().to_vec();
    let mut t = v.clone();
    t[4] = 1;
    assert!(envelope::read(&aligned(&t)).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Any bytes after a valid header, and any change to a valid payload, give a value or an
    /// error — never a panic.
    #[test]
    fn mutated_payloads_never_panic(at in 0usize..200, byte in any::<u8>(), tail in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut b = Envelope::task(&call(), Context { seed: Some(3), index: 2 }).unwrap().to_vec();
        let n = b.len();
        b[at % n] = byte;
        let _ = envelope::read(&aligned(&b));
        let mut h = b[..64].to_vec();
        h.extend_from_slice(&tail);
        let _ = envelope::read(&aligned(&h));
    }
}

fn table() -> arrow_array::RecordBatch {
    use arrow_array::{ArrayRef, Float64Array, RecordBatch, StringArray};
    use std::sync::Arc;
    let a: ArrayRef = Arc::new(Float64Array::from(
        (0..1000).map(f64::from).collect::<Vec<_>>(),
    ));
    let s: ArrayRef = Arc::new(StringArray::from(
        (0..1000).map(|i| format!("s{i}")).collect::<Vec<_>>(),
    ));
    RecordBatch::try_from_iter([("a", a), ("s", s)]).unwrap()
}

#[test]
fn arrays_in_payloads_start_aligned_and_plain_readers_skip_the_padding() {
    let v = Value::List(vec![
        Value::Int(1),
        Value::Table(table()),
        Value::Str("x".into()),
    ]);
    let enc = mizu_wire::encode_aligned(&v).unwrap().to_vec();
    // The table's tag sits at a multiple of 64 after an 0F padding item.
    let plain = mizu_wire::encode(&v).unwrap().to_vec();
    assert_ne!(enc, plain);
    assert_eq!(mizu_wire::decode(&aligned(&enc)).unwrap(), v);
    // Padding rules: under 64 zero bytes, and only before an array or a table.
    let pad_at = enc.iter().position(|&b| b == 0x0F).unwrap();
    let mut bad = enc.clone();
    bad[pad_at + 2] = 1; // a non-zero padding byte
    assert!(mizu_wire::decode(&aligned(&bad)).is_err());
    let mut not_arrow = vec![0x0F, 3, 0, 0, 0, 0x00];
    assert!(mizu_wire::decode(&aligned(&not_arrow)).is_err());
    not_arrow = vec![0x0F, 64];
    not_arrow.extend([0u8; 64]);
    not_arrow.push(0x00);
    assert!(mizu_wire::decode(&aligned(&not_arrow)).is_err());
}

#[test]
fn a_shared_table_is_sent_on_as_a_reference_to_its_region() {
    use mizu_wire::{DataPool, Mapper, Region};
    use std::sync::Arc;
    // A payload holding a table arrives in a region (here: stored by this process).
    let pool = DataPool::new(1 << 22);
    let first = Envelope::value(&Value::Table(table())).unwrap().to_vec();
    let region = pool.store(&first).unwrap();
    let mapper = Mapper::new();
    let adopted = Arc::new(mapper.adopt(&region.share()).unwrap());
    let got = match envelope::read_with(&Region::buffer(&adopted), Some(&mapper)).unwrap() {
        Received::Value(v) => v,
        other => panic!("{other:?}"),
    };
    assert!(
        matches!(got, Value::Shared { .. }),
        "an aligned table is shared"
    );
    assert_eq!(got, Value::Table(table()));
    // Sent on unmodified, it is a reference (a few dozen bytes), not the table.
    let again = Envelope::value(&got).unwrap().to_vec();
    assert!(again.len() < 256, "{} bytes", again.len());
    assert_eq!(again[envelope::HEADER_LEN], 0x0E);
    // A reader adopts the reference and reads the same table, in the same region.
    let back = match envelope::read_with(&aligned(&again), Some(&mapper)).unwrap() {
        Received::Value(v) => v,
        other => panic!("{other:?}"),
    };
    assert_eq!(back, Value::Table(table()));
    let Value::Shared { bytes, .. } = &back else {
        panic!("not shared")
    };
    let (r, _) = Region::containing(bytes.as_ptr()).expect("inside an adopted region");
    assert_eq!(r.describe().name, region.describe().name);
    // Without a mapper (a plain frame, say) a reference is refused, not followed.
    assert!(envelope::read(&aligned(&again)).is_err());
    assert!(mizu_wire::decode(&aligned(&again[envelope::HEADER_LEN..])).is_err());
    // A reference to a range that is not an aligned value of its region is refused.
    let mut off = again.clone();
    let at = envelope::HEADER_LEN + 1 + 64;
    off[at] = off[at].wrapping_add(8);
    assert!(envelope::read_with(&aligned(&off), Some(&mapper)).is_err());
}

#[test]
fn warnings_ride_with_a_value() {
    let w = vec!["careful".to_string(), "twice".to_string()];
    let bytes = Envelope::value_warned(&Value::Float(1.0), &w)
        .unwrap()
        .to_vec();
    match envelope::read(&aligned(&bytes)).unwrap() {
        Received::Warned { value, warnings } => {
            assert_eq!(value, Value::Float(1.0));
            assert_eq!(warnings, w);
        }
        other => panic!("{other:?}"),
    }
    // No warnings: a plain value.
    let plain = Envelope::value_warned(&Value::Int(2), &[])
        .unwrap()
        .to_vec();
    assert!(matches!(
        envelope::read(&aligned(&plain)).unwrap(),
        Received::Value(Value::Int(2))
    ));
    // The flag on anything but a value, or over a value of another shape, is refused.
    let mut bad = Envelope::error(&RemoteError::default()).unwrap().to_vec();
    bad[5] = 2;
    assert!(envelope::read(&aligned(&bad)).is_err());
    let mut bad = Envelope::value(&Value::Int(3)).unwrap().to_vec();
    bad[5] = 2;
    assert!(envelope::read(&aligned(&bad)).is_err());
}

#[test]
fn a_referenced_value_decoded_once_is_not_validated_again_but_still_checked() {
    use mizu_wire::{DataPool, Mapper, Region};
    use std::sync::Arc;
    let pool = DataPool::new(1 << 22);
    let region = pool
        .store(&Envelope::value(&Value::Table(table())).unwrap().to_vec())
        .unwrap();
    let mapper = Mapper::new();
    let adopted = Arc::new(mapper.adopt(&region.share()).unwrap());
    let Received::Value(got) =
        envelope::read_with(&Region::buffer(&adopted), Some(&mapper)).unwrap()
    else {
        panic!("not a value")
    };
    // Two trips by reference: the second reads bytes this process validated in the first.
    for _ in 0..2 {
        let again = Envelope::value(&got).unwrap().to_vec();
        let Received::Value(back) = envelope::read_with(&aligned(&again), Some(&mapper)).unwrap()
        else {
            panic!("not a value")
        };
        assert_eq!(back, Value::Table(table()));
    }
    // The structure of trusted bytes is still checked: a reference to a range that is not the
    // value (shorter) is an error, not a read past it.
    let again = Envelope::value(&got).unwrap().to_vec();
    let mut cut = again.clone();
    let len_at = envelope::HEADER_LEN + 1 + 64 + 8;
    let len = u64::from_le_bytes(cut[len_at..len_at + 8].try_into().unwrap());
    cut[len_at..len_at + 8].copy_from_slice(&(len - 64).to_le_bytes());
    assert!(envelope::read_with(&aligned(&cut), Some(&mapper)).is_err());
}

#[test]
fn a_received_value_decodes_again_from_its_bytes_and_remembers_checks_made_on_them() {
    use mizu_wire::{DataPool, Mapper, Region};
    use std::sync::Arc;
    let pool = DataPool::new(1 << 22);
    // Written in place into a region being filled (as a pool writes a task), then committed.
    let env = Envelope::value(&Value::Table(table())).unwrap();
    let mut r = pool.alloc(env.len()).unwrap();
    env.write_to(r.bytes_mut());
    let region = r.commit();
    let mapper = Mapper::new();
    let adopted = Arc::new(mapper.adopt(&region.share()).unwrap());
    let Received::Value(Value::Shared { bytes, .. }) =
        envelope::read_with(&Region::buffer(&adopted), Some(&mapper)).unwrap()
    else {
        panic!("an aligned table arrives shared")
    };
    // The standalone encoding decodes again to the table, as views of the same bytes.
    let again = mizu_wire::decode_received(&bytes).unwrap();
    assert_eq!(again, Value::Table(table()));
    let Value::Table(t) = &again else {
        panic!("a table")
    };
    let col = t.column(0).to_data();
    let p = col.buffers()[0].as_ptr();
    assert!(p >= bytes.as_ptr() && p < bytes.as_ptr().wrapping_add(bytes.len()));
    // Anything but one array or table is refused.
    assert!(mizu_wire::decode_received(&bytes.slice_with_length(0, 8)).is_err());
    // A binding's own check of received bytes is remembered for those bytes and that check.
    let part = &bytes.as_slice()[64..128];
    assert!(!mizu_wire::passed_before(part, "test: check"));
    mizu_wire::passed_check(part, "test: check");
    assert!(mizu_wire::passed_before(part, "test: check"));
    assert!(!mizu_wire::passed_before(part, "test: another check"));
    assert!(!mizu_wire::passed_before(
        &bytes.as_slice()[64..127],
        "test: check"
    ));
    // Outside shared regions nothing is remembered.
    let private = aligned(&[1u8; 64]);
    mizu_wire::passed_check(private.as_slice(), "test: check");
    assert!(!mizu_wire::passed_before(private.as_slice(), "test: check"));
}
