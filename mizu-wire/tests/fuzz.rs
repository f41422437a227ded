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

/// A mutation: byte flips, then an optional splice of another seed's tail, then a cut.
#[derive(Debug, Clone)]
struct Mutation {
    flips: Vec<(usize, u8)>,
    splice: Option<(usize, usize, usize)>,
    cut: Option<usize>,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    (
        proptest::collection::vec((any::<usize>(), 1..=255u8), 0..6),
        proptest::option::weighted(0.2, (any::<usize>(), any::<usize>(), any::<usize>())),
        proptest::option::weighted(0.2, any::<usize>()),
    )
        .prop_map(|(flips, splice, cut)| Mutation { flips, splice, cut })
}

fn apply(seed: &[u8], m: &Mutation, others: &[Vec<u8>]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for &(at, x) in &m.flips {
        if !b.is_empty() {
            let i = at % b.len();
            b[i] ^= x;
        }
    }
    if let Some((which, from, into)) = m.splice {
        let o = &others[which % others.len()];
        let from = if o.is_empty() { 0 } else { from % o.len() };
        let into = if b.is_empty() { 0 } else { into % b.len() };
        b.truncate(into);
        b.extend_from_slice(&o[from..]);
    }
    if let Some(cut) = m.cut {
        let n = if b.is_empty() { 0 } else { cut % b.len() };
        b.truncate(n);
    }
    b
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
