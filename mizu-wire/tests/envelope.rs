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
    };
    let bytes = Envelope::error(&e).unwrap().to_vec();
    match envelope::read(&aligned(&bytes)).unwrap() {
        Received::Error(got) => assert_eq!(got, e),
        other => panic!("{other:?}"),
    }
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
