//! Payload storage across real processes: views outlive their sender (clean exit or
//! `kill -9`), a killed receiver's reference is cleaned up by prune, re-sending passes a
//! reference, and nothing is left in /dev/shm.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mizu_wire::{DataPool, Mapper, Received, Value, read_value};

const PEER: &str = env!("CARGO_BIN_EXE_mizu-wire-peer");
const GUARD: Duration = Duration::from_secs(120);
const PAYLOAD: usize = 1 << 20;

/// `prune` removes every segment whose creator is dead — including one a test keeps alive on
/// purpose for a receiver that has not read it yet: tests run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn payload() -> Value {
    Value::Bytes(arrow_buffer::Buffer::from_vec(
        (0..PAYLOAD).map(|i| (i % 251) as u8).collect::<Vec<u8>>(),
    ))
}

fn spawn(role: &str) -> Child {
    Command::new(PEER)
        .arg(role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads one length-prefixed frame from the child's stdout and decodes it.
fn recv(child: &mut Child, mapper: &Mapper) -> Received {
    let out = child.stdout.as_mut().unwrap();
    let mut n = [0u8; 4];
    out.read_exact(&mut n).unwrap();
    let mut f = vec![0u8; u32::from_le_bytes(n) as usize];
    out.read_exact(&mut f).unwrap();
    read_value(&f, mapper).unwrap()
}

fn wait(mut c: Child) -> String {
    let t0 = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            let mut s = String::new();
            std::io::Read::read_to_string(c.stdout.as_mut().unwrap(), &mut s).unwrap();
            assert!(st.success(), "peer failed: {st}");
            return s;
        }
        assert!(t0.elapsed() < GUARD, "hang guard");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn exists(name: &str) -> bool {
    std::path::Path::new("/dev/shm")
        .join(name.trim_start_matches('/'))
        .exists()
}

fn left_by(pid: u32) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&format!("mizu_{pid:x}_")))
        .collect()
}

#[test]
fn a_view_outlives_a_sender_that_exited_and_the_last_holder_unlinks() {
    let _serial = serial();
    let mut child = spawn("send-exit");
    let pid = child.id();
    let mapper = Mapper::new();
    let mut frame = [0u8; 84];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut frame)
        .unwrap();
    wait(child); // the sender is gone before we even look at its frame
    let got = read_value(&frame[4..], &mapper).unwrap();
    assert_eq!(got.value, payload());
    let name = got.region.as_ref().unwrap().segment().name().to_string();
    assert!(exists(&name));
    drop(got);
    assert!(
        !exists(&name),
        "the receiver, last holder after the owner detached, unlinked it"
    );
    assert_eq!(left_by(pid), Vec::<String>::new());
}

#[test]
fn a_view_outlives_a_sender_killed_with_sigkill_and_prune_cleans_up() {
    let _serial = serial();
    let mut child = spawn("send-hold");
    let pid = child.id();
    let mapper = Mapper::new();
    let got = recv(&mut child, &mapper);
    child.kill().unwrap();
    child.wait().unwrap();
    let name = got.region.as_ref().unwrap().segment().name().to_string();
    // The dead owner never detached: the name stays until prune (its creator is dead).
    let removed = mizu_shm::prune().unwrap();
    assert!(
        removed.iter().any(|n| name.ends_with(n.as_str())),
        "{removed:?}"
    );
    assert_eq!(
        got.value,
        payload(),
        "the mapping outlives both the sender and the name"
    );
    drop(got);
    assert_eq!(left_by(pid), Vec::<String>::new());
}

#[test]
fn a_receiver_killed_while_holding_a_reference_leaves_nothing_after_prune() {
    let _serial = serial();
    let out = wait(
        Command::new(PEER)
            .arg("sender-survives")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut it = out.split_whitespace();
    let name = it.next().unwrap().to_owned();
    let receiver: u32 = it.next().unwrap().parse().unwrap();
    // The killed receiver still "holds" a reference, so the exited sender could not unlink;
    // its creator is dead, so prune does.
    assert!(exists(&name), "expected the orphan {name} before prune");
    mizu_shm::prune().unwrap();
    assert!(!exists(&name));
    let sender = mizu_shm::SegmentName::parse(&name).unwrap().creator().pid;
    assert_eq!(left_by(sender), Vec::<String>::new());
    assert_eq!(left_by(receiver), Vec::<String>::new());
}

#[test]
fn a_region_relayed_through_a_second_process_is_passed_by_reference() {
    let _serial = serial();
    let mut child = spawn("relay");
    let pool = DataPool::new(4 << 20);
    let enc = mizu_wire::encode(&payload()).unwrap();
    let mut r = pool.alloc(enc.len()).unwrap();
    enc.write_to(r.bytes_mut());
    let region = r.commit();
    let mut slot = [0u8; 256];
    let n = mizu_wire::write_region(&region, 0, &mut slot).unwrap();
    let i = child.stdin.as_mut().unwrap();
    i.write_all(&(n as u32).to_le_bytes()).unwrap();
    i.write_all(&slot[..n]).unwrap();
    i.flush().unwrap();
    let mapper = Mapper::new();
    let report = recv(&mut child, &mapper);
    let Value::List(items) = report.value else {
        panic!("{:?}", report.value)
    };
    let [Value::Str(name), Value::Int(offset), Value::Bool(ok)] = &items[..] else {
        panic!("{items:?}")
    };
    assert!(*ok, "the third process read the right bytes");
    // The same segment and offset as ours: the relay passed a reference, not a copy.
    assert_eq!(name, &region.segment().name().to_string());
    assert_eq!(*offset as u64, region.offset());
    wait(child);
    let seg = name.clone();
    drop(region);
    assert!(exists(&seg), "the owner is still attached");
    drop(pool);
    assert!(
        !exists(&seg),
        "every reference was released: the owner's detach unlinked it"
    );
}
