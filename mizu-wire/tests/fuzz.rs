//! Structure-aware fuzz harnesses of every decoder in this crate: each starts from valid inputs
//! (the golden frame corpus, real envelopes, region descriptors of a live data segment, both
//! bindings' out-of-band layouts, R's own serializations) and mutates them — byte flips, truncation, splices of another seed — so
//! that mutations get past the magic numbers and headers into the parsers behind them. Every
//! input must give a value or a typed error: no panic, no hang, no out-of-bounds access.
//!
//! `cargo test` runs a few hundred cases of each; `cargo xtask test` runs 100 000
//! (`PROPTEST_CASES`), `cargo xtask fuzz --long` ten million.

use std::path::PathBuf;
use std::sync::OnceLock;

use arrow_buffer::{Buffer, MutableBuffer};
use mizu_shm::fuzzing::{apply, mutation, private_place};
use mizu_wire::envelope::{self, Context, Envelope, RemoteError};
use mizu_wire::frame::{self, Body};
use mizu_wire::oob::{self, Place};
use mizu_wire::{CallTarget, DataPool, Mapper, RegionDesc, Value, decode_slice, rser};
use proptest::prelude::*;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

fn files(dir: PathBuf, ext: &str) -> Vec<Vec<u8>> {
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    paths.sort();
    let out: Vec<_> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(!out.is_empty(), "no seeds in {}", dir.display());
    out
}

/// The golden frames (`tests/corpus/*.bin`).
fn frames() -> &'static [Vec<u8>] {
    static S: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    S.get_or_init(|| files(corpus_dir(), "bin"))
}

/// R's own serializations, version 2, native byte order, as the R binding writes them
/// (`tests/corpus/rser/*.rds`, see its README).
fn r_serializations() -> &'static [Vec<u8>] {
    static S: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    S.get_or_init(|| files(corpus_dir().join("rser"), "rds"))
}

/// Envelopes of every kind: tasks (named, source and seeded), values, warned values, errors.
fn envelopes() -> &'static [Vec<u8>] {
    static S: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    S.get_or_init(|| {
        let call = |target, args| Value::Call {
            target,
            args,
            kwargs: vec![
                ("names".into(), Value::Bool(false)),
                ("x".into(), Value::Float(1.5)),
            ],
        };
        let args = vec![
            Value::Float(1.5),
            Value::List(vec![Value::None, Value::Str("水".into())]),
        ];
        let ctx = Context {
            seed: Some(7),
            index: 3,
        };
        let err = RemoteError {
            language: "r".into(),
            classes: vec!["simpleError".into(), "error".into()],
            message: "boom".into(),
            call: "f(x)".into(),
            traceback: "f()\ng()".into(),
            element: Some(7),
        };
        [
            Envelope::task(&call(CallTarget::Name("stats::median".into()), args), ctx).unwrap(),
            Envelope::task(
                &call(CallTarget::Source("y <- x * 2".into()), vec![]),
                Context::default(),
            )
            .unwrap(),
            Envelope::value(&Value::List(vec![
                Value::Int(1),
                Value::Bytes(Buffer::from_vec(vec![0u8; 40])),
            ]))
            .unwrap(),
            Envelope::value_warned(&Value::Float(2.0), &["careful".into()]).unwrap(),
            Envelope::error(&err).unwrap(),
            Envelope::chunk(
                call(CallTarget::Name("math.sqrt".into()), vec![]),
                envelope::Chunk {
                    elements: vec![Value::List(vec![Value::Float(4.0)]), Value::List(vec![])],
                    spread: true,
                },
                ctx,
            )
            .unwrap(),
        ]
        .iter()
        .map(Envelope::to_vec)
        .collect()
    })
}

/// Runs `f` with the descriptor (64 bytes) of a live region of a fresh data segment, which is
/// gone again (unlinked) when `f` returns.
fn with_live_region<R>(f: impl FnOnce(&[u8; 64]) -> R) -> R {
    let pool = DataPool::new(1 << 20);
    let mut r = pool.alloc(4096).unwrap();
    r.bytes_mut().fill(0xab);
    let region = r.commit();
    let mut frame = [0u8; frame::HEADER_LEN + frame::DESC_LEN];
    frame::write_region(&region, 0, &mut frame).unwrap();
    let desc: [u8; 64] = frame[frame::HEADER_LEN..].try_into().unwrap();
    let out = f(&desc);
    drop(region);
    drop(pool);
    out
}

/// The descriptor of the golden region frame (a segment that does not exist): for layouts
/// that are parsed, not adopted.
fn corpus_desc() -> [u8; 64] {
    let f = std::fs::read(corpus_dir().join("region-frame.bin")).unwrap();
    f[frame::HEADER_LEN..frame::HEADER_LEN + 64]
        .try_into()
        .unwrap()
}

/// Same-language payloads of both bindings, in their one layout: a body, an inline buffer, and
/// buffers by reference to the live region (a data frame column by reference; a writable one).
fn oob_payloads() -> &'static [Vec<u8>] {
    static S: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    S.get_or_init(|| {
        let desc = &corpus_desc();
        let build = |tag: u8, refs: &[(u8, Option<u64>)]| {
            let entry = oob::ENTRY;
            let body = b"the language's own serialization";
            let n = 1 + refs.len();
            let body_end = oob::HEADER + entry * n + body.len();
            let mut out = vec![tag | oob::tag::WITH_BUFFERS, 0, 0, 0];
            out.extend_from_slice(&(n as u32).to_le_bytes());
            out.extend_from_slice(&(body.len() as u64).to_le_bytes());
            out.resize(oob::HEADER + entry * n, 0);
            out.extend_from_slice(body);
            out.resize(body_end.next_multiple_of(64), 0);
            let put = |out: &mut Vec<u8>, i: usize, at: u64, len: u64, code: u8| {
                let e = oob::HEADER + entry * i;
                out[e..e + 8].copy_from_slice(&at.to_le_bytes());
                out[e + 8..e + 16].copy_from_slice(&len.to_le_bytes());
                out[e + 16] = code;
            };
            let at = out.len() as u64;
            put(&mut out, 0, at, 100, oob::code::R_DOUBLE);
            out.resize(out.len() + 128, 7);
            for (i, (code, col)) in refs.iter().enumerate() {
                out.resize(out.len().next_multiple_of(64), 0);
                let at = out.len() as u64;
                put(&mut out, 1 + i, at, 1000, code | oob::code::BY_REF);
                out.extend_from_slice(desc);
                out.extend_from_slice(&64u64.to_le_bytes());
                if let Some(c) = col {
                    out.extend_from_slice(&c.to_le_bytes());
                }
            }
            out
        };
        vec![
            build(oob::tag::PICKLE, &[(oob::code::BYTES, None)]),
            build(
                oob::tag::R_SERIAL,
                &[
                    (oob::code::R_STRINGS, None),
                    (oob::code::ARROW_COLUMN, Some(2)),
                ],
            ),
            build(
                oob::tag::COMPACT,
                &[(oob::code::BYTES | oob::code::WRITABLE, None)],
            ),
        ]
    })
}

/// The bytes in a 64-byte aligned buffer, as a region hands them over.
fn aligned(v: &[u8]) -> Buffer {
    let mut m = MutableBuffer::with_capacity(v.len());
    m.extend_from_slice(v);
    m.into()
}

/// Region descriptors of a live segment with their name kept and their numbers mutated
/// (offset, length, generation): adopting one gives the region or a typed error — never a view
/// outside the segment. Mutated names go through the parser only (adopting them could open
/// another test's segment). The segment lives for this test only.
#[test]
fn mutated_region_descriptors_never_panic() {
    use proptest::test_runner::{Config, TestRunner};
    private_place();
    with_live_region(|desc| {
        let mut runner = TestRunner::new(Config::default());
        runner
            .run(&(mutation(), any::<bool>()), |(m, keep_name)| {
                let mut b = apply(desc, &m, &[desc.to_vec()]);
                b.resize(64, 0);
                if keep_name {
                    b[..40].copy_from_slice(&desc[..40]);
                }
                if let Ok(d) = RegionDesc::read_from(&b) {
                    if keep_name {
                        if let Ok(r) = Mapper::new().adopt(&d) {
                            let view = mizu_wire::Region::buffer(&std::sync::Arc::new(r));
                            prop_assert_eq!(view.len() as u64, d.len);
                        }
                    } else {
                        let _ = mizu_shm::SegmentName::parse(&d.name);
                    }
                }
                Ok(())
            })
            .unwrap();
    });
}

#[test]
fn every_seed_is_accepted() {
    private_place();
    for f in frames() {
        frame::read(f).unwrap();
    }
    for e in envelopes() {
        envelope::read(&aligned(e)).unwrap();
    }
    for (i, s) in r_serializations().iter().enumerate() {
        rser::check(s).unwrap_or_else(|e| panic!("R serialization seed {i}: {e}"));
    }
    with_live_region(|desc| {
        let d = RegionDesc::read_from(desc).unwrap();
        Mapper::new().adopt(&d).unwrap();
    });
    let d = RegionDesc::read_from(&corpus_desc()).unwrap();
    for p in oob_payloads() {
        let parsed = oob::parse(p).unwrap();
        let refs = oob::references(p);
        assert_eq!(parsed.entries.len(), 1 + refs.len());
        assert!(matches!(parsed.entries[0].place, Place::Inline(_)));
        assert!(refs.iter().all(|r| *r == d));
    }
    // Only a buffer by reference can be writable, and its entry says so.
    let w = &oob_payloads()[2];
    assert!(oob::parse(w).unwrap().entries[1].writable);
    assert!(!oob::parse(&oob_payloads()[0]).unwrap().entries[1].writable);
    let mut inline_writable = w.clone();
    inline_writable[oob::HEADER + 16] |= oob::code::WRITABLE; // on the inline buffer's entry
    assert!(oob::parse(&inline_writable).is_err());
    // A column of a table travels by reference only.
    let mut inline_column = w.clone();
    inline_column[oob::HEADER + 16] = oob::code::ARROW_COLUMN;
    assert!(oob::parse(&inline_column).is_err());
}

proptest! {
    /// Frames: header, then the inline value's decoder or the region descriptor's parser.
    #[test]
    fn mutated_frames_never_panic(which in any::<usize>(), m in mutation()) {
        private_place();
        let seeds = frames();
        let b = apply(&seeds[which % seeds.len()], &m, seeds);
        if let Ok(f) = frame::read(&b) {
            match f.body {
                Body::Inline(v) => { let _ = decode_slice(v); }
                Body::Region(d) => { let _ = mizu_shm::SegmentName::parse(&d.name); }
            }
        }
    }

    /// Envelopes, aligned (read in place) and one byte off (copied first); tasks as a worker
    /// reads them too.
    #[test]
    fn mutated_envelopes_never_panic(which in any::<usize>(), m in mutation(), shift in any::<bool>()) {
        let seeds = envelopes();
        let b = apply(&seeds[which % seeds.len()], &m, seeds);
        let buf = if shift {
            let mut s = vec![0u8];
            s.extend_from_slice(&b);
            aligned(&s).slice(1)
        } else {
            aligned(&b)
        };
        let _ = envelope::read(&buf);
        let _ = envelope::read_task(&buf, None);
    }

    /// The bindings' same-language payloads: every range a parse gives lies inside the
    /// payload, after the body.
    #[test]
    fn mutated_out_of_band_payloads_never_panic(which in any::<usize>(), m in mutation()) {
        let seeds = oob_payloads();
        let b = apply(&seeds[which % seeds.len()], &m, seeds);
        let _ = oob::references(&b);
        if let Ok(p) = oob::parse(&b) {
            prop_assert!(p.body.start <= p.body.end && p.body.end <= b.len());
            for e in &p.entries {
                if let Place::Inline(r) = &e.place {
                    prop_assert!(r.start >= p.body.end && r.end <= b.len());
                }
            }
        }
    }

    /// R's serializations: the check R's reader relies on refuses or accepts, never panics.
    #[test]
    fn mutated_r_serializations_never_panic(which in any::<usize>(), m in mutation()) {
        let seeds = r_serializations();
        let b = apply(&seeds[which % seeds.len()], &m, seeds);
        let _ = rser::check(&b);
    }
}

/// Every array a decoded value holds passes arrow's full validation: what a reader accepted
/// can be read without going out of bounds.
fn assert_valid(v: &Value) {
    use arrow_array::Array;
    match v {
        Value::Array { array, .. } => array.to_data().validate_full().unwrap(),
        Value::Table(t) => t
            .columns()
            .iter()
            .for_each(|c| c.to_data().validate_full().unwrap()),
        Value::Shared { value, .. } => assert_valid(value),
        Value::List(items) => items.iter().for_each(assert_valid),
        Value::Dict(items) => items.iter().for_each(|(_, v)| assert_valid(v)),
        _ => {}
    }
}

/// Arrays of the R mapping's types and a table of strings, the values the shared-reference and
/// schema harnesses start from.
fn r_typed_values() -> Vec<Value> {
    use mizu_wire::rmeta;
    let pairs = [
        rmeta::integer("i", &[1, rmeta::NA_INTEGER, 3]),
        rmeta::double("d", &[1.5, f64::NAN]),
        rmeta::character("s", &[Some("a"), None, Some("水")]),
        rmeta::factor("f", &[1, 2, rmeta::NA_INTEGER], &["u", "v"], false).unwrap(),
        rmeta::date("t", &[19000.0]),
        rmeta::posixct("p", &[1.5e9], "UTC"),
        rmeta::difftime("h", &[3.0], "hours").unwrap(),
        rmeta::integer64("b", &[1, rmeta::NA_INTEGER64]),
        {
            let (f, a) = rmeta::integer("m", &[1, 2, 3, 4, 5, 6]);
            (rmeta::with_dim(f, &[2, 3]), a)
        },
    ];
    let mut out: Vec<Value> = pairs
        .iter()
        .map(|(f, a)| Value::Array {
            field: std::sync::Arc::new(f.clone()),
            array: a.clone(),
        })
        .collect();
    out.push(Value::Table(
        rmeta::data_frame(
            pairs
                .iter()
                .take(3)
                .map(|(f, a)| {
                    let a = a.slice(0, 2);
                    (f.clone(), a)
                })
                .collect(),
        )
        .unwrap(),
    ));
    out
}

/// Payloads holding references (tag `0E`) to arrays and a table in a live region, mutated and
/// read as a pool payload is (with a mapper): the descriptor, the value's range in its region,
/// and the array bytes there (reached by a mutated range) give a value whose arrays validate,
/// or an error. Each case sends the value on again, so each adoption has a reference to take.
#[test]
fn mutated_shared_references_never_panic() {
    use mizu_wire::envelope::Received;
    use proptest::test_runner::{Config, TestRunner};
    private_place();
    let pool = DataPool::new(1 << 22);
    let first = Envelope::value(&Value::List(r_typed_values()))
        .unwrap()
        .to_vec();
    let region = pool.store(&first).unwrap();
    let mapper = Mapper::new();
    let adopted = std::sync::Arc::new(mapper.adopt(&region.share()).unwrap());
    let got = match envelope::read_with(&mizu_wire::Region::buffer(&adopted), Some(&mapper)) {
        Ok(Received::Value(v)) => v,
        other => panic!("{other:?}"),
    };
    let Value::List(items) = &got else {
        panic!("{got:?}")
    };
    assert!(items.iter().all(|v| matches!(v, Value::Shared { .. })));
    let (accepted, refused) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    let mut runner = TestRunner::new(Config::default());
    runner
        .run(&(mutation(), 0..items.len()), |(m, which)| {
            // One reference, sent on afresh: the bytes hold a new reference to take.
            let seed = Envelope::value(&items[which]).unwrap().to_vec();
            prop_assert!(seed.len() < 256, "sent as a reference");
            let b = apply(&seed, &m, std::slice::from_ref(&first));
            match envelope::read_with(&aligned(&b), Some(&mapper)) {
                Ok(Received::Value(v)) => {
                    assert_valid(&v);
                    accepted.set(accepted.get() + 1);
                }
                Ok(_) => accepted.set(accepted.get() + 1),
                Err(_) => refused.set(refused.get() + 1),
            }
            Ok(())
        })
        .unwrap();
    eprintln!(
        "fuzz shared references: {} accepted, {} refused",
        accepted.get(),
        refused.get()
    );
    assert!(accepted.get() > 0 && refused.get() > 0);
}

proptest! {
    /// The schema reader a binding uses on a value it received (`arrow_schema`): mutated
    /// encodings of arrays and tables give a schema or an error.
    #[test]
    fn mutated_values_never_panic_the_schema_reader(which in any::<usize>(), m in mutation()) {
        static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
        let seeds = SEEDS.get_or_init(|| {
            r_typed_values()
                .iter()
                .map(|v| mizu_wire::encode(v).unwrap().to_vec())
                .collect()
        });
        let b = apply(&seeds[which % seeds.len()], &m, seeds);
        let _ = mizu_wire::arrow_schema(&b);
    }

    /// The R mapping's metadata as another writer may have set it (a pyarrow field with any
    /// `mizu.r.*` keys, on any of the mapping's array types): `classify`, `dim` and
    /// `normalize` give an answer or an error.
    #[test]
    fn any_r_metadata_never_panics(
        field in any::<usize>(),
        array in any::<usize>(),
        keys in proptest::collection::vec((0..4usize, any::<usize>(), mutation()), 0..3),
    ) {
        use mizu_wire::rmeta;
        static SEEDS: OnceLock<Vec<Value>> = OnceLock::new();
        let seeds = SEEDS.get_or_init(r_typed_values);
        let arrays: Vec<_> = seeds
            .iter()
            .filter_map(|v| match v {
                Value::Array { field, array } => Some((field.clone(), array.clone())),
                _ => None,
            })
            .collect();
        let words: Vec<Vec<u8>> = arrays
            .iter()
            .flat_map(|(f, _)| f.metadata().values().map(|v| v.as_bytes().to_vec()))
            .chain(["factor", "ordered", "integer64", "data.frame", "2,3", "-1", "0,0"]
                .map(|s| s.as_bytes().to_vec()))
            .collect();
        let (f, _) = &arrays[field % arrays.len()];
        let (_, a) = &arrays[array % arrays.len()];
        // A decoded value's field always has its array's type.
        let mut md = f.metadata().clone();
        for (key, word, m) in &keys {
            let k = [rmeta::CLASS, rmeta::TZ, rmeta::UNITS, rmeta::DIM][*key];
            let v = apply(&words[word % words.len()], m, &words);
            md.insert(k.to_string(), String::from_utf8_lossy(&v).into_owned());
        }
        let f = arrow_schema::Field::new(f.name(), a.data_type().clone(), true).with_metadata(md);
        let _ = rmeta::classify(&f);
        let _ = rmeta::dim(&f, a.len());
        if let Some((nf, na)) = rmeta::normalize(&f, a) {
            prop_assert_eq!(nf.data_type(), na.data_type());
            na.to_data().validate_full().unwrap();
        }
        let schema = arrow_schema::Schema::new(vec![f.clone()]);
        if let Ok(b) = arrow_array::RecordBatch::try_new(std::sync::Arc::new(schema), vec![a.clone()]) {
            let _ = rmeta::normalize_batch(b);
        }
    }
}

/// Ledger entries as a killed process may have left them, mutated, given back by a reaper:
/// entries naming live regions, with the right or a mutated offset and generation (and name),
/// release at most what they list — never a panic or a count taken from a region that does
/// not match.
#[test]
fn mutated_ledger_entries_never_panic() {
    use mizu_wire::ledger::WrittenLedger;
    use proptest::test_runner::{Config, TestRunner};
    private_place();
    let pool = DataPool::new(1 << 20);
    let regions: Vec<_> = (0..4)
        .map(|i| {
            let mut r = pool.alloc(256 * (i + 1)).unwrap();
            r.bytes_mut().fill(i as u8);
            r.commit()
        })
        .collect();
    let entry = |d: &RegionDesc| {
        let mut e = vec![0u8; 64];
        e[..8].copy_from_slice(&1u64.to_le_bytes());
        e[8..16].copy_from_slice(&d.offset.to_le_bytes());
        e[16..24].copy_from_slice(&d.generation.to_le_bytes());
        e[24..24 + d.name.len()].copy_from_slice(d.name.as_bytes());
        e
    };
    let ledger = WrittenLedger::new().expect("a ledger segment");
    let seeds: Vec<Vec<u8>> = regions.iter().map(|r| entry(&r.describe())).collect();
    // A well-formed entry gives its reference back: one added here first.
    let d = regions[0].share();
    assert_eq!(ledger.reap(&entry(&d)), 1);
    let mut runner = TestRunner::new(Config::default());
    runner
        .run(
            &proptest::collection::vec((any::<usize>(), mutation()), 1..4),
            |picks| {
                let mut raw = Vec::new();
                for (which, m) in &picks {
                    // Each listed region holds a reference for its entry to give back.
                    let r = &regions[which % regions.len()];
                    let seed = entry(&r.share());
                    let mut e = apply(&seed, m, &seeds);
                    e.resize(64, 0);
                    raw.extend_from_slice(&e);
                }
                let given = ledger.reap(&raw);
                prop_assert!(given <= picks.len());
                Ok(())
            },
        )
        .unwrap();
    // The regions the harness holds are still whole.
    for (i, r) in regions.iter().enumerate() {
        assert!(r.bytes().iter().all(|&b| b == i as u8));
    }
}
