//! Cross-process ring vs its peers, measured in the same run and printed as ratios:
//! * mizu ring between two processes (duplex segment, both sides spin-then-park),
//! * a Unix socketpair between two processes (what pipe- and socket-based pools pay),
//! * a crossbeam channel between two threads (in-process reference).
//!
//! Each is measured under the same placement: pinned (this process on CPU 0, the peer on
//! CPU 1) and unpinned (the scheduler decides). `MIZU_BENCH_SCALE` (default 1.0) scales the
//! iteration counts.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use mizu_queue::Duplex;
use mizu_shm::Waiter;
use rustix::io::FdFlags;
use rustix::net::{AddressFamily, SocketFlags, SocketType};

const PEER: &str = env!("CARGO_BIN_EXE_mizu-queue-peer");
const RUNS: usize = 5;

#[derive(Clone, Copy, PartialEq)]
enum Placement {
    Pinned,
    Unpinned,
}

impl Placement {
    fn name(self) -> &'static str {
        match self {
            Placement::Pinned => "pinned (this process cpu0, peer cpu1)",
            Placement::Unpinned => "unpinned (scheduler decides)",
        }
    }
    fn apply_self(self) {
        let cpus = mizu_shm::affinity::available_cpus_all();
        match self {
            Placement::Pinned => mizu_shm::affinity::pin_to_cpu(0).unwrap(),
            Placement::Unpinned => mizu_shm::affinity::allow_cpus(&cpus).unwrap(),
        }
    }
    fn peer(self, cmd: &mut Command) -> &mut Command {
        match self {
            Placement::Pinned => cmd.env("MIZU_PIN_CPU", "1"),
            Placement::Unpinned => cmd.env_remove("MIZU_PIN_CPU"),
        }
    }
}

fn scale(n: u64) -> u64 {
    let s: f64 = std::env::var("MIZU_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    ((n as f64 * s) as u64).max(1000)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn waiter() -> Waiter {
    Waiter::new(Duration::from_micros(50), Duration::from_millis(20))
}

fn ring_host(place: Placement, role: &str, extra: &[&str]) -> (Duplex, Child) {
    let mut d = Duplex::create(1024, 64).unwrap();
    let mut cmd = Command::new(PEER);
    cmd.arg(role).arg(d.token()).args(extra);
    let mut child = place.peer(&mut cmd).spawn().unwrap();
    d.wait_guest(Duration::from_secs(60), || match child.try_wait() {
        Ok(None) => Ok(()),
        _ => Err(()),
    })
    .unwrap();
    (d, child)
}

/// Median ns per round trip.
fn ring_round_trip(place: Placement, n: u64) -> f64 {
    let (d, mut child) = ring_host(place, "echo", &[]);
    let (mut tx, mut rx) = d.split().expect("a fresh duplex");
    let mut w = waiter();
    let mut one = |i: u64| {
        tx.try_send(&i.to_le_bytes()).unwrap();
        d.recv_with(&mut rx, &mut w, None, |m| m[0]).unwrap();
    };
    for i in 0..n / 10 {
        one(i);
    }
    let runs = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            for i in 0..n {
                one(i);
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    tx.close();
    child.wait().unwrap();
    median(runs)
}

/// Median messages per second, one way, published in batches of 64.
fn ring_throughput(place: Placement, n: u64) -> f64 {
    let runs = (0..RUNS)
        .map(|_| {
            let (d, mut child) = ring_host(place, "sink", &[&n.to_string()]);
            let (mut tx, mut rx) = d.split().expect("a fresh duplex");
            let mut w = waiter();
            let t = Instant::now();
            let mut i = 0u64;
            while i < n {
                let end = (i + 64).min(n);
                while i < end
                    && tx
                        .write_with(|b| {
                            b[..8].copy_from_slice(&i.to_le_bytes());
                            8
                        })
                        .is_ok()
                {
                    i += 1;
                }
                tx.publish();
                if i < end {
                    d.send(&mut tx, &mut w, None, &i.to_le_bytes()).unwrap();
                    i += 1;
                }
            }
            let count = d
                .recv_with(&mut rx, &mut w, None, |m| {
                    u64::from_le_bytes(m[..8].try_into().unwrap())
                })
                .unwrap();
            let dt = t.elapsed().as_secs_f64();
            assert_eq!(count, n);
            child.wait().unwrap();
            n as f64 / dt
        })
        .collect();
    median(runs)
}

fn socket_peer(place: Placement, role: &str, extra: &[&str]) -> (UnixStream, Child) {
    let (mine, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::io::fcntl_setfd(&theirs, FdFlags::empty()).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&theirs).to_string();
    let mut cmd = Command::new(PEER);
    cmd.arg(role).arg(&fd).args(extra);
    let child = place.peer(&mut cmd).spawn().unwrap();
    drop(theirs);
    (UnixStream::from(mine), child)
}

fn socket_round_trip(place: Placement, n: u64) -> f64 {
    let (mut s, mut child) = socket_peer(place, "sock-echo", &[]);
    let mut b = [0u8; 8];
    let mut one = |i: u64, s: &mut UnixStream| {
        s.write_all(&i.to_le_bytes()).unwrap();
        s.read_exact(&mut b).unwrap();
    };
    for i in 0..n / 10 {
        one(i, &mut s);
    }
    let runs = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            for i in 0..n {
                one(i, &mut s);
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    drop(s);
    child.wait().unwrap();
    median(runs)
}

fn socket_throughput(place: Placement, n: u64) -> f64 {
    let runs = (0..RUNS)
        .map(|_| {
            let (mut s, mut child) = socket_peer(place, "sock-sink", &[&n.to_string()]);
            let t = Instant::now();
            let mut buf = Vec::with_capacity(64 * 8);
            let mut i = 0u64;
            while i < n {
                buf.clear();
                let end = (i + 64).min(n);
                for k in i..end {
                    buf.extend_from_slice(&k.to_le_bytes());
                }
                s.write_all(&buf).unwrap();
                i = end;
            }
            let mut b = [0u8; 8];
            s.read_exact(&mut b).unwrap();
            let dt = t.elapsed().as_secs_f64();
            assert_eq!(u64::from_le_bytes(b), n);
            child.wait().unwrap();
            n as f64 / dt
        })
        .collect();
    median(runs)
}

fn thread_peer<R: Send + 'static>(
    place: Placement,
    f: impl FnOnce() -> R + Send + 'static,
) -> std::thread::JoinHandle<R> {
    std::thread::spawn(move || {
        if place == Placement::Pinned {
            mizu_shm::affinity::pin_to_cpu(1).unwrap();
        }
        f()
    })
}

fn threads_round_trip(place: Placement, n: u64) -> f64 {
    let (to_tx, to_rx) = crossbeam_channel::bounded::<u64>(1024);
    let (back_tx, back_rx) = crossbeam_channel::bounded::<u64>(1024);
    let peer = thread_peer(place, move || {
        while let Ok(v) = to_rx.recv() {
            back_tx.send(v).unwrap();
        }
    });
    for i in 0..n / 10 {
        to_tx.send(i).unwrap();
        back_rx.recv().unwrap();
    }
    let runs = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            for i in 0..n {
                to_tx.send(i).unwrap();
                back_rx.recv().unwrap();
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .collect();
    drop(to_tx);
    peer.join().unwrap();
    median(runs)
}

fn threads_throughput(place: Placement, n: u64) -> f64 {
    let runs = (0..RUNS)
        .map(|_| {
            let (tx, rx) = crossbeam_channel::bounded::<u64>(1024);
            let peer = thread_peer(place, move || {
                let mut expect = 0;
                while let Ok(v) = rx.recv() {
                    assert_eq!(v, expect);
                    expect += 1;
                }
                expect
            });
            let t = Instant::now();
            for i in 0..n {
                tx.send(i).unwrap();
            }
            drop(tx);
            let got = peer.join().unwrap();
            let dt = t.elapsed().as_secs_f64();
            assert_eq!(got, n);
            n as f64 / dt
        })
        .collect();
    median(runs)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let rt_n = scale(200_000);
    let sock_n = scale(20_000);
    let tp_n = scale(5_000_000);
    println!(
        "mizu-queue: cross-process SPSC ring vs peers, 8-byte messages, median of {RUNS} runs"
    );
    println!(
        "machine: {} CPUs available",
        mizu_shm::affinity::available_cpus_all().len()
    );
    for place in [Placement::Pinned, Placement::Unpinned] {
        place.apply_self();
        let ring_rt = ring_round_trip(place, rt_n);
        let sock_rt = socket_round_trip(place, sock_n);
        let thr_rt = threads_round_trip(place, rt_n);
        let ring_tp = ring_throughput(place, tp_n);
        let sock_tp = socket_throughput(place, tp_n / 5);
        let thr_tp = threads_throughput(place, tp_n);
        println!();
        println!("placement: {}", place.name());
        println!(
            "| measure                    | mizu ring (2 processes) | socketpair (2 processes) | crossbeam (2 threads) | ring vs socketpair | ring vs threads |"
        );
        println!(
            "|----------------------------|------------------------:|-------------------------:|----------------------:|-------------------:|----------------:|"
        );
        println!(
            "| round trip (ns)            | {:>23.0} | {:>24.0} | {:>21.0} | {:>17.1}x | {:>14.2}x |",
            ring_rt,
            sock_rt,
            thr_rt,
            sock_rt / ring_rt,
            thr_rt / ring_rt
        );
        println!(
            "| one-way throughput (M/s)   | {:>23.2} | {:>24.2} | {:>21.2} | {:>17.1}x | {:>14.2}x |",
            ring_tp / 1e6,
            sock_tp / 1e6,
            thr_tp / 1e6,
            ring_tp / sock_tp,
            ring_tp / thr_tp
        );
    }
    println!();
    println!(
        "ratios > 1 mean the mizu ring is faster. Targets: round trip <= 300 ns and >= 30x the socketpair."
    );
}
