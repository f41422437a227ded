//! Segments spilled to the spill directory (where data goes when `/dev/shm` has no room):
//! created `0600` there, found by name from another process, removed with their last handle,
//! and pruned after `kill -9` of their creator; with spilling off, a clear error.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use mizu_shm::{Layout, Segment, SegmentName, prune};

const PEER: &str = env!("CARGO_BIN_EXE_mizu-shm-peer");
const KIND: u32 = u32::from_le_bytes(*b"TST1");

fn layout() -> Layout {
    let mut l = Layout::new(KIND);
    l.add(4096, 128).unwrap();
    l
}

#[test]
fn spilled_segments_live_in_the_spill_directory_and_go_with_their_creator() {
    let dir = PathBuf::from(format!("/tmp/mizu-spill-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // SAFETY: the only test of this binary, before anything in it reads the environment
    // (the spill directory is read once, on first use); no other thread reads it meanwhile.
    unsafe { std::env::set_var("MIZU_SPILL_DIR", &dir) };
    assert_eq!(mizu_shm::place::spill_dir(), Some(dir.as_path()));

    // Created here: in the spill directory, owner-only, readable by another process by name.
    let mine = Segment::create_spilled(&layout(), false).unwrap();
    let name = SegmentName::parse(mine.token()).unwrap();
    assert!(name.is_spilled());
    let file = dir.join(&mine.token()[1..]);
    assert_eq!(name.path(), file);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(!PathBuf::from("/dev/shm").join(&mine.token()[1..]).exists());
    let out = Command::new(PEER)
        .args(["open", mine.token()])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok", "{out:?}");
    drop(mine);
    assert!(!file.exists(), "removed with its last handle");

    // A creator killed while it holds one: prune removes it, and nothing of a live process.
    let keep = Segment::create_spilled(&layout(), false).unwrap();
    let mut child = Command::new(PEER)
        .arg("hold-spilled")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let token = line.split_whitespace().next().unwrap().to_owned();
    let theirs = dir.join(&token[1..]);
    assert!(theirs.exists());
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let removed = prune().unwrap();
    assert!(removed.contains(&token[1..].to_owned()), "{removed:?}");
    assert!(!theirs.exists());
    assert!(
        dir.join(&keep.token()[1..]).exists(),
        "a live creator's stays"
    );
    drop(keep);

    // Spilling off: a clear error, nothing made.
    let out = Command::new(PEER)
        .arg("hold-spilled")
        .env("MIZU_SPILL_DIR", "none")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("spilling is off"), "{err}");

    // A spill setting that is no directory, and a directory no file can be made in: errors
    // that name the directory.
    for (setting, says) in [
        ("relative/spill", "not an absolute path to a directory"),
        (
            "/proc",
            "in the spill directory (MIZU_SPILL_DIR chooses another)",
        ),
    ] {
        let out = Command::new(PEER)
            .arg("hold-spilled")
            .env("MIZU_SPILL_DIR", setting)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says) && err.contains(setting), "{err}");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing left");
    std::fs::remove_dir(&dir).unwrap();
}
