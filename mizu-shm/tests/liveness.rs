//! Liveness by flock, the pidfd death watch and pruning, with real processes and `kill -9`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, mpsc};
use std::time::Duration;

use mizu_shm::{DeathWatch, Layout, ProcessId, Segment, SegmentName, prune, prune_of};

const PEER: &str = env!("CARGO_BIN_EXE_mizu-shm-peer");
const KIND: u32 = u32::from_le_bytes(*b"TST1");

/// `prune` reaps every dead process's lock file and segments — also those another test is
/// still looking at: the tests that kill peers or prune run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts a peer that creates a segment and holds it; returns the child, the token and the
/// child's identity.
fn holder() -> (Child, String, ProcessId) {
    let mut child = Command::new(PEER)
        .arg("hold")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let mut it = line.split_whitespace();
    let token = it.next().expect("token").to_owned();
    let nonce: u64 = it.next().expect("nonce").parse().unwrap();
    let id = ProcessId::new(child.id(), nonce);
    assert_eq!(SegmentName::parse(&token).unwrap().creator(), id);
    (child, token, id)
}

fn kill9(child: &mut Child) {
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
}

#[test]
fn liveness_follows_the_lock_not_the_pid() {
    let _serial = serial();
    let (mut child, _token, id) = holder();
    assert!(id.is_alive());
    // Same PID, another incarnation: not alive (PID reuse cannot fake life).
    assert!(!ProcessId::new(id.pid, id.nonce ^ 1).is_alive());
    assert!(!id.reap(), "a live process's lock file is never reaped");
    kill9(&mut child);
    assert!(!id.is_alive());
    assert!(
        id.lock_path().exists(),
        "kill -9 leaves the lock file for a survivor to reap"
    );
    assert!(id.reap());
    assert!(!id.lock_path().exists());
}

#[test]
fn my_own_identity_is_alive_and_removed_with_my_last_handle() {
    let _serial = serial();
    let mut l = Layout::new(KIND);
    l.add(64, 64).unwrap();
    let a = Segment::create(&l, false).unwrap();
    let me = a.me();
    assert_eq!(me.pid, std::process::id());
    assert!(me.is_alive());
    assert!(me.lock_path().exists());
    // Other tests in this process may hold segments too; only check our handle is alive.
    drop(a);
}

/// A watch (made by `watch`, calling back with a message) of a live peer fires once the peer
/// is killed, not before.
fn watch_fires_on_kill_9(watch: impl Fn(ProcessId, mpsc::Sender<()>) -> DeathWatch) {
    let (mut child, _token, id) = holder();
    let (tx, rx) = mpsc::channel();
    let w = watch(id, tx);
    assert!(
        rx.try_recv().is_err(),
        "must not fire while the process lives"
    );
    child.kill().unwrap();
    rx.recv_timeout(Duration::from_secs(60))
        .expect("hang guard: watch did not fire");
    child.wait().unwrap();
    assert!(!id.is_alive());
    drop(w);
    id.reap();
}

#[test]
fn death_watch_fires_on_kill_9() {
    let _serial = serial();
    watch_fires_on_kill_9(|id, tx| DeathWatch::spawn(id, move || tx.send(()).unwrap()).unwrap());
}

#[test]
fn death_watch_of_a_dead_process_fires_at_once_and_drop_stops_a_live_one() {
    let _serial = serial();
    let (tx, rx) = mpsc::channel();
    let _w =
        DeathWatch::spawn(ProcessId::new(0x7fff_fff0, 1), move || tx.send(()).unwrap()).unwrap();
    rx.recv_timeout(Duration::from_secs(60))
        .expect("fires for a nonexistent process");
    let (mut child, _t, id) = holder();
    let (tx, rx) = mpsc::channel::<()>();
    let w = DeathWatch::spawn(id, move || tx.send(()).unwrap()).unwrap();
    drop(w); // joins the thread without firing
    assert!(rx.try_recv().is_err());
    kill9(&mut child);
    id.reap();
}

#[test]
fn a_watch_without_pidfds_fires_on_kill_9_and_drop_stops_it() {
    // What a kernel without pidfds (or valgrind) gets: the lock is looked at instead.
    let _serial = serial();
    watch_fires_on_kill_9(|id, tx| {
        let w = DeathWatch::spawn_polling(id, move || tx.send(()).unwrap()).unwrap();
        // Several looks at a live process's lock.
        std::thread::sleep(mizu_shm::LOOK_EVERY * 3);
        w
    });
    let (mut child, _t, id) = holder();
    let (tx, rx) = mpsc::channel::<()>();
    let w = DeathWatch::spawn_polling(id, move || tx.send(()).unwrap()).unwrap();
    drop(w); // the thread stops without firing
    assert!(rx.try_recv().is_err());
    kill9(&mut child);
    id.reap();
}

#[test]
fn prune_removes_what_a_killed_creator_left_and_nothing_live() {
    let _serial = serial();
    let (mut child, token, id) = holder();
    let mine = {
        let mut l = Layout::new(KIND);
        l.add(64, 64).unwrap();
        Segment::create(&l, false).unwrap()
    };
    // While it lives, prune leaves its segment alone.
    let removed = prune().unwrap();
    assert!(
        !removed.iter().any(|n| token.ends_with(n.as_str())),
        "{removed:?}"
    );
    assert!(Segment::open(&token, KIND).is_ok());
    kill9(&mut child);
    let removed = prune().unwrap();
    let seg_file = token[1..].to_owned();
    let lock_file = id
        .lock_path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(removed.contains(&seg_file), "{removed:?}");
    assert!(removed.contains(&lock_file), "{removed:?}");
    assert!(!std::path::Path::new("/dev/shm").join(&seg_file).exists());
    assert!(!id.lock_path().exists());
    // Ours survived.
    assert!(Segment::open(mine.token(), KIND).is_ok());
    let me = mine.me();
    assert!(me.lock_path().exists());
}

#[test]
fn prune_of_removes_only_what_the_named_dead_processes_left() {
    let _serial = serial();
    let (mut a, token_a, id_a) = holder();
    let (mut b, token_b, id_b) = holder();
    kill9(&mut a);
    kill9(&mut b);
    let removed = prune_of(&[id_a.pid]).unwrap();
    assert!(removed.contains(&token_a[1..].to_owned()), "{removed:?}");
    assert!(!id_a.lock_path().exists());
    assert!(
        Segment::open(&token_b, KIND).is_ok(),
        "another dead process's segment is not ours to remove"
    );
    assert!(id_b.lock_path().exists());
    prune_of(&[id_b.pid]).unwrap();
    assert!(Segment::open(&token_b, KIND).is_err());
    assert!(!id_b.lock_path().exists());
}
