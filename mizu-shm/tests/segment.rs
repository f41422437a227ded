//! Segment creation, opening, validation and access, within one process and across processes.

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use mizu_shm::header::{HEADER_RESERVED, SegmentHeader};
use mizu_shm::sync::{AtomicU32, AtomicU64, Ordering};
use mizu_shm::{HeaderFault, Layout, ParkWord, Segment, ShmError};

const KIND: u32 = u32::from_le_bytes(*b"TST1");
const PEER: &str = env!("CARGO_BIN_EXE_mizu-shm-peer");

fn small() -> Segment {
    let mut l = Layout::new(KIND);
    l.add(4096, 128).unwrap();
    l.add(100, 64).unwrap();
    Segment::create(&l, true).unwrap()
}

fn exists(seg_name: &str) -> bool {
    std::path::Path::new("/dev/shm")
        .join(&seg_name[1..])
        .exists()
}

#[test]
fn create_then_open_sees_the_same_memory() {
    let a = small();
    let name = a.token().to_owned();
    assert!(
        name.starts_with(&format!("/mizu_{:x}_", std::process::id())),
        "{name}"
    );
    let meta = std::fs::metadata(a.name().path()).unwrap();
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "segments are private to the user"
    );
    assert_eq!(meta.len(), a.len());
    let b = Segment::open(&name, KIND).unwrap();
    assert_eq!(b.header().extents(), a.header().extents());
    let off = a.extent(0).unwrap().offset;
    let x: &AtomicU64 = a.get(off + 8).unwrap();
    let y: &AtomicU64 = b.get(off + 8).unwrap();
    x.store(0xfeed, Ordering::Release);
    assert_eq!(y.load(Ordering::Acquire), 0xfeed);
    // The join token works without the leading slash too.
    assert!(Segment::open(&name[1..], KIND).is_ok());
    drop(b);
    assert!(exists(&name), "an opener's handle must not unlink");
    drop(a);
    assert!(!exists(&name), "the creator's handle unlinks on drop");
    assert!(matches!(
        Segment::open(&name, KIND),
        Err(ShmError::NotFound(_))
    ));
}

#[test]
fn unlink_is_idempotent_and_keeps_mappings() {
    let a = small();
    let off = a.extent(0).unwrap().offset;
    a.unlink().unwrap();
    a.unlink().unwrap();
    assert!(!exists(a.token()));
    let w: &AtomicU32 = a.get(off).unwrap();
    w.store(7, Ordering::Relaxed);
    assert_eq!(w.load(Ordering::Relaxed), 7);
}

#[test]
fn typed_access_is_bounds_and_alignment_checked() {
    let a = small();
    let len = a.len();
    assert!(matches!(
        a.get::<AtomicU64>(len - 4),
        Err(ShmError::BadAccess {
            why: "out of bounds",
            ..
        })
    ));
    assert!(matches!(
        a.get::<AtomicU64>(u64::MAX - 2),
        Err(ShmError::BadAccess {
            why: "out of bounds",
            ..
        })
    ));
    assert!(matches!(
        a.get::<AtomicU64>(HEADER_RESERVED + 4),
        Err(ShmError::BadAccess {
            why: "misaligned",
            ..
        })
    ));
    assert!(
        a.get_slice::<AtomicU64>(HEADER_RESERVED, usize::MAX)
            .is_err()
    );
    assert!(a.extent(2).is_err());
    let e = a.extent(1).unwrap();
    assert!(
        a.bytes(e, 64).is_err(),
        "100 bytes are not whole 64-byte granules"
    );
    assert_eq!(a.bytes(e, 50).unwrap().count(), 2);
}

#[test]
fn layout_rejects_impossible_requests() {
    let mut l = Layout::new(KIND);
    assert!(l.add(10, 3).is_err());
    assert!(l.add(u64::MAX - 10, 64).is_err());
    for _ in 0..mizu_shm::header::MAX_EXTENTS {
        l.add(8, 64).unwrap();
    }
    assert!(matches!(l.add(8, 64), Err(ShmError::InvalidLayout(_))));
}

#[test]
fn bad_tokens_are_clear_errors() {
    for t in [
        "",
        "garbage",
        "/mizu_zz_0123456789abcdef01234567",
        "/etc/passwd",
        "mizu_1_0123",
    ] {
        let e = Segment::open(t, KIND).unwrap_err();
        assert!(matches!(e, ShmError::InvalidName(_)), "{t:?}: {e}");
        assert!(e.to_string().contains("invalid segment name"), "{e}");
    }
    let e = Segment::open("/mizu_1_0123456789abcdef01234567", KIND).unwrap_err();
    assert!(matches!(e, ShmError::NotFound(_)), "{e}");
}

/// Overwrites `bytes` at `offset` of the segment's backing object, as a buggy or hostile
/// process could.
fn corrupt(seg: &Segment, offset: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(seg.name().path())
        .unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(bytes).unwrap();
}

fn open_fault(seg: &Segment) -> HeaderFault {
    match Segment::open(seg.token(), KIND) {
        Err(ShmError::BadHeader { fault, .. }) => fault,
        other => panic!("expected a header fault, got {other:?}"),
    }
}

#[test]
fn every_header_field_corruption_is_a_clear_error() {
    use std::mem::offset_of;
    let h = |f: usize| f as u64;
    type H = SegmentHeader;
    type Case = (u64, Vec<u8>, fn(&HeaderFault) -> bool);
    let cases: Vec<Case> = vec![
        (h(offset_of!(H, magic)), b"NOTMIZU!".to_vec(), |f| {
            matches!(f, HeaderFault::Magic { .. })
        }),
        (
            h(offset_of!(H, abi_version)),
            99u32.to_le_bytes().to_vec(),
            |f| matches!(f, HeaderFault::AbiVersion { found: 99, .. }),
        ),
        (
            h(offset_of!(H, header_size)),
            8u32.to_le_bytes().to_vec(),
            |f| matches!(f, HeaderFault::HeaderSize { found: 8, .. }),
        ),
        (
            h(offset_of!(H, total_size)),
            (1u64 << 40).to_le_bytes().to_vec(),
            |f| matches!(f, HeaderFault::TotalSize { .. }),
        ),
        (h(offset_of!(H, kind)), 5u32.to_le_bytes().to_vec(), |f| {
            matches!(f, HeaderFault::Kind { found: 5, .. })
        }),
        (
            h(offset_of!(H, extent_count)),
            13u32.to_le_bytes().to_vec(),
            |f| matches!(f, HeaderFault::ExtentCount { found: 13, .. }),
        ),
        // extent 0's offset pushed past the end
        (
            h(offset_of!(H, extents)),
            (1u64 << 40).to_le_bytes().to_vec(),
            |f| {
                matches!(
                    f,
                    HeaderFault::Extent {
                        index: 0,
                        why: "extends past the end of the segment",
                        ..
                    }
                )
            },
        ),
        // extent 0's offset misaligned
        (
            h(offset_of!(H, extents)),
            (HEADER_RESERVED + 8).to_le_bytes().to_vec(),
            |f| {
                matches!(
                    f,
                    HeaderFault::Extent {
                        index: 0,
                        why: "not 64-byte aligned",
                        ..
                    }
                )
            },
        ),
        // extent 0 inside the header
        (
            h(offset_of!(H, extents)),
            64u64.to_le_bytes().to_vec(),
            |f| matches!(f, HeaderFault::Extent { index: 0, .. }),
        ),
        // extent 0's length so large the end overflows
        (
            h(offset_of!(H, extents)) + 8,
            u64::MAX.to_le_bytes().to_vec(),
            |f| {
                matches!(
                    f,
                    HeaderFault::Extent {
                        index: 0,
                        why: "offset + length overflows",
                        ..
                    }
                )
            },
        ),
        // extent 1 overlapping extent 0
        (
            h(offset_of!(H, extents)) + 16,
            HEADER_RESERVED.to_le_bytes().to_vec(),
            |f| matches!(f, HeaderFault::Extent { index: 1, .. }),
        ),
        // the creator is covered by the checksum
        (
            h(offset_of!(H, creator)),
            1234u32.to_le_bytes().to_vec(),
            |f| matches!(f, HeaderFault::Checksum { .. }),
        ),
        (
            h(offset_of!(H, checksum)),
            1u64.to_le_bytes().to_vec(),
            |f| matches!(f, HeaderFault::Checksum { .. }),
        ),
    ];
    for (i, (off, bytes, check)) in cases.into_iter().enumerate() {
        let seg = small();
        corrupt(&seg, off, &bytes);
        let fault = open_fault(&seg);
        assert!(check(&fault), "case {i}: unexpected {fault:?}");
        assert!(!fault.to_string().is_empty());
    }
    // An opener expecting another layout kind is refused too.
    let seg = small();
    assert!(matches!(
        Segment::open(seg.token(), KIND + 1),
        Err(ShmError::BadHeader {
            fault: HeaderFault::Kind { .. },
            ..
        })
    ));
}

#[test]
fn truncated_segments_are_rejected() {
    let seg = small();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(seg.name().path())
        .unwrap();
    f.set_len(100).unwrap();
    assert!(matches!(
        Segment::open(seg.token(), KIND),
        Err(ShmError::Truncated { actual: 100, .. })
    ));
    f.set_len(4096).unwrap();
    // Header intact but the object is shorter than it says: refused before any access.
    let e = Segment::open(seg.token(), KIND).unwrap_err();
    assert!(
        matches!(
            e,
            ShmError::BadHeader {
                fault: HeaderFault::TotalSize { actual: 4096, .. },
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_size_larger_than_dev_shm_is_enospc_not_sigbus() {
    let vfs = rustix::fs::statvfs("/dev/shm").unwrap();
    let too_big = vfs.f_blocks * vfs.f_frsize + (1 << 20);
    let mut l = Layout::new(KIND);
    l.add(too_big, 64).unwrap();
    let e = Segment::create(&l, false).unwrap_err();
    match &e {
        ShmError::NoSpace {
            name,
            requested,
            available,
            ..
        } => {
            assert!(*requested >= too_big);
            assert!(*available <= vfs.f_blocks * vfs.f_frsize);
            assert!(!exists(name), "a failed create leaves nothing behind");
        }
        other => panic!("expected NoSpace, got {other}"),
    }
    assert!(e.to_string().contains("bytes free"), "{e}");
}

#[test]
fn another_process_opens_and_reports_bad_tokens_cleanly() {
    let seg = small();
    let out = Command::new(PEER)
        .args(["open", seg.token()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(PEER)
        .args(["open", "not-a-token"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a bad token is an error exit, not a crash"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid segment name"));
    corrupt(&seg, 0, b"XXXXXXXX");
    let out = Command::new(PEER)
        .args(["open", seg.token()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("wrong magic"));
}

#[test]
fn a_futex_wake_crosses_processes() {
    let seg = small();
    let off = seg.extent(0).unwrap().offset;
    let park: &ParkWord = seg.get(off).unwrap();
    let mut child = Command::new(PEER)
        .args(["wait", seg.token()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait (hang guard only) until the child has announced itself asleep.
    let t0 = std::time::Instant::now();
    while park.sleepers() == 0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "child never parked");
        std::thread::sleep(Duration::from_millis(1));
    }
    let flag: &AtomicU32 = seg.get(off + 128).unwrap();
    flag.store(1, Ordering::Release);
    assert!(
        park.wake_all(),
        "a sleeper was announced, so a wake syscall is due"
    );
    // The child parks with hour-long slices: it can only finish because the shared wake
    // reached it. The hang guard below is far shorter than the slice.
    let out = wait_with_guard(&mut child, Duration::from_secs(120));
    assert!(out.contains("woken after 1 park"), "{out}");
}

#[test]
fn waking_nobody_makes_no_syscall() {
    let seg = small();
    let park: &ParkWord = seg.get(seg.extent(0).unwrap().offset).unwrap();
    assert!(!park.wake_all());
}

fn wait_with_guard(child: &mut std::process::Child, guard: Duration) -> String {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut s = String::new();
            use std::io::Read;
            child.stdout.take().unwrap().read_to_string(&mut s).unwrap();
            assert!(st.success(), "child failed: {st} {s}");
            return s;
        }
        if t0.elapsed() > guard {
            let _ = child.kill();
            panic!("hang guard: child did not finish within {guard:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// `MIZU_SHM_DIR` and `MIZU_SHM_PREFIX` move every file of the processes that have them: a
/// segment and the lock file of its creator go to that directory under that prefix, another
/// process with the same setting opens it, one with the default setting is refused the token,
/// the files go with the creator, and a wrong setting is an error before anything is created.
#[test]
fn the_shared_memory_directory_and_prefix_come_from_the_environment() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = std::path::Path::new("/dev/shm").join(format!("mzplace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let peer = |args: &[&str]| {
        let mut c = Command::new(PEER);
        c.args(args)
            .env("MIZU_SHM_DIR", &dir)
            .env("MIZU_SHM_PREFIX", "mzt_");
        c
    };
    let mut holder = peer(&["hold"]).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let token = line.split_whitespace().next().unwrap().to_owned();
    assert!(token.starts_with("/mzt_"), "{token}");
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(files.contains(&token[1..].to_owned()), "{files:?}");
    assert!(files.iter().any(|f| f.ends_with(".lock")), "{files:?}");
    assert!(!exists(&token), "nothing in /dev/shm itself");
    let out = peer(&["open", &token]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(PEER).args(["open", &token]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid segment name"));
    holder.kill().unwrap();
    holder.wait().unwrap();
    // The dead creator's files are pruned by a process with the same setting.
    let out = peer(&["prune"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "pruned");
    for (var, value) in [("MIZU_SHM_PREFIX", "BAD/"), ("MIZU_SHM_DIR", "relative")] {
        let out = Command::new(PEER)
            .arg("hold")
            .env(var, value)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{var}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("MIZU_SHM_DIR / MIZU_SHM_PREFIX"), "{err}");
    }
    std::fs::remove_dir(&dir).unwrap();
}
