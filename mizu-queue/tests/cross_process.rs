//! Rings and deques between real processes: conservation, order, `kill -9` of either side,
//! and nothing left in /dev/shm afterwards.

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::steal_fixture;
use mizu_queue::{Duplex, RecvError};
use mizu_shm::Waiter;

const PEER: &str = env!("CARGO_BIN_EXE_mizu-queue-peer");
const GUARD: Duration = Duration::from_secs(120);

fn spawn(args: &[&str]) -> Child {
    Command::new(PEER)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

fn host_with(role: &str, extra: &[&str]) -> (Duplex, Child) {
    let mut d = Duplex::create(1024, 64).unwrap();
    let mut args = vec![role, d.token()];
    args.extend_from_slice(extra);
    let mut child = spawn(&args);
    d.wait_guest(GUARD, || match child.try_wait() {
        Ok(None) => Ok(()),
        other => Err(format!("guest exited: {other:?}")),
    })
    .unwrap();
    (d, child)
}

fn waiter() -> Waiter {
    Waiter::new(Duration::from_micros(50), Duration::from_millis(20))
}

fn finish(mut child: Child) -> String {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut s = String::new();
            std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut s).unwrap();
            assert!(st.success(), "peer failed: {st}");
            return s;
        }
        assert!(t0.elapsed() < GUARD, "hang guard");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn seq(m: &[u8]) -> u64 {
    u64::from_le_bytes(m[..8].try_into().unwrap())
}

#[test]
fn a_million_messages_round_trip_in_order() {
    const N: u64 = 1_000_000;
    const WINDOW: u64 = 512;
    let (d, child) = host_with("echo", &[]);
    let (mut tx, mut rx) = d.split().unwrap();
    let mut w = waiter();
    let (mut sent, mut got) = (0u64, 0u64);
    while got < N {
        while sent < N
            && sent - got < WINDOW
            && tx
                .write_with(|b| {
                    b[..8].copy_from_slice(&sent.to_le_bytes());
                    8
                })
                .is_ok()
        {
            sent += 1;
        }
        tx.publish();
        let v = d
            .recv_with(&mut rx, &mut w, Some(GUARD), seq)
            .expect("echo");
        assert_eq!(v, got, "lost, duplicated or reordered");
        got += 1;
    }
    tx.close();
    assert_eq!(
        d.recv_with(&mut rx, &mut w, Some(GUARD), seq),
        Err(RecvError::Closed)
    );
    finish(child);
}

#[test]
fn a_million_messages_one_way_in_batches() {
    const N: u64 = 1_000_000;
    let (d, child) = host_with("sink", &["1000000"]);
    let (mut tx, mut rx) = d.split().unwrap();
    let mut w = waiter();
    let mut next = 0u64;
    while next < N {
        let batch: Vec<[u8; 8]> = (next..(next + 64).min(N))
            .map(|i| i.to_le_bytes())
            .collect();
        let n = tx.send_batch(batch.iter().map(|b| &b[..])).unwrap();
        next += n as u64;
        if n == 0 {
            // Full: wait for the consumer rather than spin against it on two cores.
            d.send(&mut tx, &mut w, Some(GUARD), &next.to_le_bytes())
                .unwrap();
            next += 1;
        }
    }
    assert_eq!(
        d.recv_with(&mut rx, &mut w, Some(GUARD), seq),
        Ok(N),
        "the sink counted everything in order"
    );
    finish(child);
}

#[test]
fn two_thief_processes_and_the_owner_take_each_item_exactly_once() {
    const N: u64 = 200_000;
    let seg = steal_fixture::create(256, 1024).unwrap();
    let dq = steal_fixture::deque(&seg).unwrap();
    let rings: Vec<_> = (0..steal_fixture::THIEVES)
        .map(|t| steal_fixture::ring(&seg, t).unwrap())
        .collect();
    // SAFETY: this process is each ring's only consumer (thief `t` is its only producer).
    let mut consumers: Vec<_> = rings.iter().map(|r| unsafe { r.consumer() }).collect();
    let children: Vec<Child> = (0..steal_fixture::THIEVES)
        .map(|t| spawn(&["thief", seg.token(), &t.to_string()]))
        .collect();
    let mut taken: Vec<u64> = Vec::with_capacity(N as usize);
    let drain = |consumers: &mut [mizu_queue::Consumer<'_>], taken: &mut Vec<u64>| {
        for c in consumers.iter_mut() {
            while let Some(v) = c.try_recv_with(seq) {
                taken.push(v);
            }
        }
    };
    let mut own = Vec::new();
    for i in 0..N {
        let mut item = i;
        while let Err(back) = dq.push(item) {
            // Full: the owner works too.
            if let Some(v) = dq.pop() {
                own.push(v);
            }
            item = back;
            drain(&mut consumers, &mut taken);
        }
        if i % 7 == 0
            && let Some(v) = dq.pop()
        {
            own.push(v);
        }
        if i % 64 == 0 {
            drain(&mut consumers, &mut taken);
        }
    }
    while let Some(v) = dq.pop() {
        own.push(v);
    }
    steal_fixture::set_done(&seg);
    let t0 = Instant::now();
    let mut closed = vec![false; consumers.len()];
    while closed.iter().any(|c| !c) {
        drain(&mut consumers, &mut taken);
        for (i, c) in consumers.iter_mut().enumerate() {
            closed[i] = c.is_drained_and_closed();
        }
        assert!(t0.elapsed() < GUARD, "hang guard");
        std::thread::yield_now();
    }
    for c in children {
        finish(c);
    }
    let stolen = taken.len();
    taken.extend(own);
    assert_eq!(
        taken.len() as u64,
        N,
        "every item taken exactly once (count)"
    );
    let set: HashSet<u64> = taken.iter().copied().collect();
    assert_eq!(set.len() as u64, N, "no duplicates");
    assert!(set.iter().all(|&v| v < N));
    // Not an assertion on scheduling, just a sanity check that the test exercised stealing.
    eprintln!("stolen by thieves: {stolen} of {N}");
}

/// Names in /dev/shm that belong to these pids (segments and lock files).
fn leftovers(pids: &[u32]) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| pids.iter().any(|p| n.starts_with(&format!("mizu_{p:x}_"))))
        .collect()
}

fn survivor(mode: &str) {
    let out = finish(spawn(&["survivor", mode]));
    let mut pids = Vec::new();
    for kv in out.split_whitespace() {
        let (_, v) = kv.split_once('=').expect("host=<pid> guest=<pid>");
        pids.push(v.parse::<u32>().unwrap());
    }
    assert_eq!(pids.len(), 2, "{out}");
    assert_eq!(
        leftovers(&pids),
        Vec::<String>::new(),
        "the survivor left nothing behind"
    );
}

#[test]
fn consumer_sees_peer_gone_when_the_producer_is_killed_and_nothing_leaks() {
    survivor("producer-dies");
}

#[test]
fn producer_sees_peer_gone_when_the_consumer_is_killed_and_nothing_leaks() {
    survivor("consumer-dies");
}

#[test]
fn guest_sees_peer_gone_when_the_host_is_killed() {
    let mut host = spawn(&["host-hold"]);
    let mut token = String::new();
    BufReader::new(host.stdout.as_mut().unwrap())
        .read_line(&mut token)
        .unwrap();
    let d = Duplex::join(token.trim()).unwrap();
    let (_, mut rx) = d.split().unwrap();
    let mut w = waiter();
    assert_eq!(
        d.recv_with(&mut rx, &mut w, Some(GUARD), |m| m.to_vec()),
        Ok(b"welcome".to_vec())
    );
    let host_id = d.peer().unwrap();
    host.kill().unwrap();
    host.wait().unwrap();
    assert_eq!(
        d.recv_with(&mut rx, &mut w, Some(GUARD), |_| ()),
        Err(RecvError::PeerGone)
    );
    assert!(
        !host_id.lock_path().exists(),
        "the survivor reaped the dead host's lock file"
    );
    assert_eq!(leftovers(&[host_id.pid]), Vec::<String>::new());
}

#[test]
fn a_second_guest_and_bad_tokens_are_refused_cleanly() {
    let (d, child) = host_with("echo", &[]);
    // The host unlinked the name once the guest joined: nobody else can attach.
    assert!(Duplex::join(d.token()).is_err());
    d.split().unwrap().0.close();
    finish(child);
    for t in ["nonsense", "/mizu_1_0123456789abcdef01234567"] {
        let out = Command::new(PEER).args(["echo", t]).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{t}");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    }
}

/// Four processes join one duplex at the same moment: exactly one becomes the guest.
#[test]
fn of_guests_joining_at_once_exactly_one_gets_in() {
    let d = Duplex::create(8, 64).unwrap();
    let guests: Vec<Child> = (0..4)
        .map(|_| {
            Command::new(PEER)
                .args(["join", d.token()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut said = Vec::new();
    for mut g in guests {
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(g.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        said.push(line.trim().to_owned());
        drop(g.stdin.take());
        assert!(g.wait().unwrap().success());
    }
    said.sort();
    assert_eq!(said, ["joined", "refused", "refused", "refused"]);
}

#[test]
fn joining_a_segment_of_another_kind_is_refused() {
    let seg = steal_fixture::create(16, 16).unwrap();
    let e = Duplex::join(seg.token())
        .err()
        .expect("wrong kind must be refused");
    assert!(e.to_string().contains("layout kind"), "{e}");
}
