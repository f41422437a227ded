//! Channels between real processes, and submitters attached from other processes.

use std::process::Command;
use std::time::Duration;

use mizu_pool::{Channel, ChannelSendError, Launcher, Pool, PoolConfig, RecvError};

const WORKER: &str = env!("CARGO_BIN_EXE_mizu-pool-testworker");
const GUARD: Option<Duration> = Some(Duration::from_secs(120));

fn launch(mode: &str, capacity: u64) -> Channel {
    Channel::launch(WORKER, [mode], capacity, 256, Duration::from_secs(60)).unwrap()
}

#[test]
fn messages_small_and_large_echo_in_order() {
    let mut ch = launch("--channel-echo", 64);
    for i in 0..1000u32 {
        ch.send(&i.to_le_bytes()).unwrap();
        assert_eq!(ch.recv(GUARD).unwrap().as_slice(), i.to_le_bytes());
    }
    let big = vec![9u8; 2 << 20];
    ch.send(&big).unwrap();
    assert_eq!(
        ch.recv(GUARD).unwrap().as_slice(),
        &big[..],
        "large messages travel through data segments"
    );
    // Around the size where a message stops fitting its ring slot raw (slots of 256 bytes,
    // their header and our tag byte included), with contents that look like wire frames.
    for n in (0..8).chain(230..300) {
        let m: Vec<u8> = (0..n)
            .map(|i| if i % 2 == 0 { b'M' } else { b'Z' })
            .collect();
        ch.send(&m).unwrap();
        assert_eq!(ch.recv(GUARD).unwrap().as_slice(), &m[..], "{n} bytes");
    }
    let batch: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 3]).collect();
    assert_eq!(ch.send_batch(batch.iter().map(|b| &b[..])).unwrap(), 10);
    for b in &batch {
        assert_eq!(ch.recv(GUARD).unwrap().as_slice(), &b[..]);
    }
    ch.close();
    assert_eq!(
        ch.recv(GUARD),
        Err(RecvError::Closed),
        "the peer closes after we do"
    );
}

#[test]
fn a_peer_killed_while_holding_a_large_message_gives_it_back() {
    let mut ch = launch("--channel-keep", 64);
    ch.send(&vec![5u8; 2 << 20]).unwrap();
    assert_eq!(ch.recv(GUARD).unwrap().as_slice(), b"got");
    assert_eq!(
        ch.data_pool().live_regions(),
        1,
        "the peer holds our message"
    );
    let c = ch.child().unwrap();
    c.kill().unwrap();
    c.wait().unwrap();
    assert_eq!(ch.recv(GUARD), Err(RecvError::PeerGone));
    assert_eq!(
        ch.data_pool().live_regions(),
        0,
        "given back from the dead peer's ledger"
    );
}

#[test]
fn send_never_blocks_it_reports_full_and_recv_times_out() {
    let mut ch = launch("--channel-hold", 4);
    assert_eq!(ch.recv(GUARD).unwrap().as_slice(), b"hello");
    let mut sent = 0;
    loop {
        match ch.send(b"x") {
            Ok(()) => sent += 1,
            Err(ChannelSendError::Full) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(sent, 4, "exactly the capacity fits");
    assert_eq!(
        ch.recv(Some(Duration::from_millis(20))),
        Err(RecvError::Timeout)
    );
    // kill -9 of the peer: sticky PeerGone on both directions.
    ch.child().unwrap().kill().unwrap();
    ch.child().unwrap().wait().unwrap();
    assert_eq!(ch.recv(GUARD), Err(RecvError::PeerGone));
    assert_eq!(ch.recv(GUARD), Err(RecvError::PeerGone));
    assert_eq!(ch.send(b"x"), Err(ChannelSendError::PeerGone));
}

#[test]
fn an_orderly_close_by_the_peer_reads_as_closed_after_its_messages() {
    let mut ch = launch("--channel-close", 8);
    assert_eq!(ch.recv(GUARD).unwrap().as_slice(), b"bye");
    assert_eq!(ch.recv(GUARD), Err(RecvError::Closed));
}

#[test]
fn a_peer_that_never_attaches_is_an_error() {
    let fails = |program: &str| {
        Channel::launch(
            program,
            Vec::<String>::new(),
            8,
            256,
            Duration::from_secs(60),
        )
        .err()
        .unwrap()
        .to_string()
    };
    let e = fails("/bin/true");
    assert!(
        e.starts_with("cannot start the channel's peer: it did not attach"),
        "{e}"
    );
    let e = fails("/nonexistent/peer");
    assert!(
        e.starts_with("cannot start the channel's peer: \"/nonexistent/peer\""),
        "{e}"
    );
}

#[test]
fn other_processes_attach_as_submitters() {
    let p = Pool::new(
        PoolConfig {
            workers: 2,
            extra_submitters: 2,
            ..Default::default()
        },
        Launcher::new(WORKER, Vec::<String>::new()),
    )
    .unwrap();
    let outs: Vec<String> = (0..3)
        .map(|_| {
            let o = Command::new(WORKER)
                .args(["--submit", p.token()])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            String::from_utf8(o.stdout).unwrap()
        })
        .collect();
    for o in &outs {
        assert!(o.trim().ends_with("ok"), "{o}");
    }
    // Records are released when a submitter leaves, so three runs fit into two records.
    let idx: Vec<&str> = outs
        .iter()
        .map(|o| o.split_whitespace().next().unwrap())
        .collect();
    assert!(idx.iter().all(|i| *i == "3" || *i == "4"), "{idx:?}");
    assert!(
        mizu_pool::Submitter::attach("nonsense")
            .err()
            .unwrap()
            .to_string()
            .contains("invalid segment name")
    );
}

/// A submitter killed with `kill -9` leaves its record held by a dead process: attaching
/// processes take it over, never two at once (each that gets in submits 100 tasks on the
/// record's single-producer rings and checks every result), and the rest are told that every
/// record is taken.
#[test]
fn a_dead_submitters_record_is_taken_over_by_one_process_at_a_time() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let p = Pool::new(
        PoolConfig {
            workers: 2,
            extra_submitters: 1,
            ..Default::default()
        },
        Launcher::new(WORKER, Vec::<String>::new()),
    )
    .unwrap();
    let mut holder = Command::new(WORKER)
        .args(["--attach-hold", p.token()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "3", "the one extra record");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let racers: Vec<_> = (0..4)
        .map(|_| {
            Command::new(WORKER)
                .args(["--submit", p.token()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut served = 0;
    for r in racers {
        let o = r.wait_with_output().unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        if o.status.success() {
            assert_eq!(out.trim(), "3 ok", "{err}");
            served += 1;
        } else {
            assert!(err.contains("extra submitter records are taken"), "{err}");
        }
    }
    assert!(served >= 1, "nobody took the dead submitter's record over");
}
