//! The pool against its peers, same run, same placement, printed as ratios:
//! * mizu pool with the Rust test worker (task round trip, pipelined, fan-out over 2 workers),
//! * a request/response pool over Unix socketpairs between processes (the architecture of
//!   `ProcessPoolExecutor` and mirai), with the same worker binary,
//! * an in-process thread pool (crossbeam channels).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command};
use std::time::Instant;

use mizu_pool::{Launcher, Pool, PoolConfig, collect_all};
use rustix::io::FdFlags;
use rustix::net::{AddressFamily, SocketFlags, SocketType};

const WORKER_BIN: &str = env!("CARGO_BIN_EXE_mizu-pool-testworker");

/// The test worker (`MIZU_BENCH_WORKER` overrides it, for A/B runs of two builds).
fn worker_bin() -> String {
    std::env::var("MIZU_BENCH_WORKER").unwrap_or_else(|_| WORKER_BIN.to_string())
}
const RUNS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn scale(n: usize) -> usize {
    let s: f64 = std::env::var("MIZU_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    ((n as f64 * s) as usize).max(100)
}

fn mizu(workers: usize) -> Pool {
    let cfg = PoolConfig {
        workers,
        slots: 8192,
        ring_capacity: 4096,
        ..Default::default()
    };
    Pool::new(cfg, Launcher::new(worker_bin(), Vec::<String>::new())).unwrap()
}

/// Sequential submit+collect; with more than one worker the others stay idle (parked), and
/// the round trip must keep to the worker that ran the previous task.
fn mizu_round_trip(n: usize, workers: usize) -> (f64, u64) {
    mizu_round_trip_of(n, workers, b"echo:x")
}

/// An `echo` request whose reply is `bytes` bytes: a payload that size each way.
fn echo_of(bytes: usize) -> Vec<u8> {
    let mut m = b"echo:".to_vec();
    m.resize(5 + bytes, b'x');
    m
}

/// [`mizu_round_trip`] of the request `msg`.
fn mizu_round_trip_of(n: usize, workers: usize, msg: &[u8]) -> (f64, u64) {
    let p = mizu(workers);
    for _ in 0..n / 10 {
        p.submit(msg).unwrap().result(None).unwrap();
    }
    let ns = median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..n {
                    p.submit(msg).unwrap().result(None).unwrap();
                }
                t.elapsed().as_nanos() as f64 / n as f64
            })
            .collect(),
    );
    if workers > 1 {
        let tasks: Vec<(u64, u64)> = p
            .status()
            .workers
            .iter()
            .map(|w| (w.tasks, w.parks))
            .collect();
        eprintln!("round trip over {workers} workers: (tasks, parks) per worker {tasks:?}");
    }
    (ns, p.status().workers.iter().map(|w| w.parks).sum())
}

/// Fire N then collect N, in batches of 4000: submitted one by one, or with `submit_batch`
/// (one publication per worker queue).
fn mizu_pipelined(workers: usize, n: usize, batched: bool) -> f64 {
    let p = mizu(workers);
    let batch = 4000;
    let inputs: Vec<&[u8]> = vec![b"echo:x"; batch];
    median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                let mut done = 0;
                while done < n {
                    let mut ts = if batched {
                        p.submit_batch(inputs.iter().copied()).unwrap()
                    } else {
                        inputs.iter().map(|i| p.submit(i).unwrap()).collect()
                    };
                    collect_all(&mut ts, None).unwrap();
                    done += batch;
                }
                done as f64 / t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn sock_worker() -> (UnixStream, Child) {
    let (mine, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::io::fcntl_setfd(&theirs, FdFlags::empty()).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&theirs).to_string();
    let child = Command::new(worker_bin())
        .args(["--sock-worker", &fd])
        .spawn()
        .unwrap();
    drop(theirs);
    (UnixStream::from(mine), child)
}

fn sock_call(s: &mut UnixStream, req: &[u8], buf: &mut Vec<u8>) {
    s.write_all(&(req.len() as u32).to_le_bytes()).unwrap();
    s.write_all(req).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    buf.resize(u32::from_le_bytes(len) as usize, 0);
    s.read_exact(buf).unwrap();
}

fn sock_round_trip(n: usize) -> f64 {
    sock_round_trip_of(n, b"echo:x")
}

/// [`sock_round_trip`] of the request `msg`.
fn sock_round_trip_of(n: usize, msg: &[u8]) -> f64 {
    let (mut s, mut child) = sock_worker();
    let mut buf = Vec::new();
    for _ in 0..n / 10 {
        sock_call(&mut s, msg, &mut buf);
    }
    let r = median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..n {
                    sock_call(&mut s, msg, &mut buf);
                }
                t.elapsed().as_nanos() as f64 / n as f64
            })
            .collect(),
    );
    drop(s);
    child.wait().unwrap();
    r
}

/// Pipelined over sockets: write a batch of requests, then read the batch of replies.
fn sock_pipelined(workers: usize, n: usize) -> f64 {
    let mut ws: Vec<_> = (0..workers).map(|_| sock_worker()).collect();
    let batch = 256;
    let req = {
        let mut r = (6u32).to_le_bytes().to_vec();
        r.extend_from_slice(b"echo:x");
        r
    };
    let r = median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                let mut done = 0;
                while done < n {
                    for (s, _) in ws.iter_mut() {
                        let mut out = Vec::with_capacity(req.len() * batch);
                        for _ in 0..batch {
                            out.extend_from_slice(&req);
                        }
                        s.write_all(&out).unwrap();
                    }
                    for (s, _) in ws.iter_mut() {
                        let mut back = vec![0u8; batch * 5];
                        s.read_exact(&mut back).unwrap();
                    }
                    done += batch * ws.len();
                }
                done as f64 / t.elapsed().as_secs_f64()
            })
            .collect(),
    );
    for (s, mut c) in ws {
        drop(s);
        c.wait().unwrap();
    }
    r
}

fn threads_round_trip(n: usize) -> f64 {
    let (tx, rx) = crossbeam_channel::bounded::<Vec<u8>>(1024);
    let (btx, brx) = crossbeam_channel::bounded::<Vec<u8>>(1024);
    let h = std::thread::spawn(move || {
        // The peer thread runs where a worker process would: CPU 1.
        mizu_shm::affinity::pin_to_cpu(1).unwrap();
        while let Ok(m) = rx.recv() {
            btx.send(m[5..].to_vec()).unwrap();
        }
    });
    for _ in 0..n / 10 {
        tx.send(b"echo:x".to_vec()).unwrap();
        brx.recv().unwrap();
    }
    let r = median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..n {
                    tx.send(b"echo:x".to_vec()).unwrap();
                    brx.recv().unwrap();
                }
                t.elapsed().as_nanos() as f64 / n as f64
            })
            .collect(),
    );
    drop(tx);
    h.join().unwrap();
    r
}

/// µs per element of a map of `n` echo elements over `workers` workers.
fn mizu_map(workers: usize, n: usize) -> f64 {
    let p = mizu(workers);
    let inputs: Vec<Vec<u8>> = (0..n).map(|i| format!("echo:{i}").into_bytes()).collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
    p.map(&refs, &mizu_pool::MapOptions::default()).unwrap();
    median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                p.map(&refs, &mizu_pool::MapOptions::default()).unwrap();
                t.elapsed().as_secs_f64() * 1e6 / n as f64
            })
            .collect(),
    )
}

fn channel_round_trip(n: usize) -> f64 {
    let mut ch = mizu_pool::Channel::launch(
        worker_bin(),
        ["--channel-echo"],
        1024,
        256,
        std::time::Duration::from_secs(60),
    )
    .unwrap();
    for _ in 0..n / 10 {
        ch.send(b"x").unwrap();
        ch.recv(None).unwrap();
    }
    median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..n {
                    ch.send(b"x").unwrap();
                    ch.recv(None).unwrap();
                }
                t.elapsed().as_nanos() as f64 / n as f64
            })
            .collect(),
    )
}

fn main() {
    mizu_shm::affinity::pin_to_cpu(0).unwrap();
    // Workers inherit this process's mask, then pin themselves to CPU 1.
    // SAFETY: single-threaded at this point; nothing reads the environment concurrently.
    unsafe { std::env::set_var("MIZU_PIN_CPU", "1") };
    let rt_n = scale(100_000);
    // The machine's floor, on both sides of the round-trip rows (a VM's changes over time).
    let floor = || mizu_shm::affinity::line_round_trip(0, 1, scale(20_000) as u64, RUNS).ok();
    let floor_before = floor();
    let (mizu_rt, parks) = mizu_round_trip(rt_n, 1);
    let floor_after = floor();
    if std::env::var_os("MIZU_BENCH_RT_ONLY").is_some() {
        println!(
            "rt {mizu_rt:.1} ns parks {parks} floor {:.0}/{:.0} ns",
            floor_before.unwrap_or(f64::NAN),
            floor_after.unwrap_or(f64::NAN)
        );
        return;
    }
    let (mizu_rt2, _) = mizu_round_trip(rt_n, 2);
    let sock_rt = sock_round_trip(scale(10_000));
    // Payloads past a task slot's 256 bytes: inline in a wide slot (up to 4 KiB), then
    // through a data segment region.
    let sized: Vec<(usize, f64, f64)> = [1024, 3072, 16384]
        .into_iter()
        .map(|b| {
            let m = echo_of(b);
            let mizu = mizu_round_trip_of(scale(40_000), 1, &m).0;
            (b, mizu, sock_round_trip_of(scale(10_000), &m))
        })
        .collect();
    let thr_rt = threads_round_trip(rt_n);
    let chan_rt = channel_round_trip(rt_n);
    let mizu_pipe = mizu_pipelined(1, scale(400_000), false);
    let mizu_batched = mizu_pipelined(1, scale(400_000), true);
    let sock_pipe = sock_pipelined(1, scale(100_000));
    // Fan-out: two workers; the controller's CPU is shared with the second worker.
    mizu_shm::affinity::allow_cpus(&mizu_shm::affinity::available_cpus_all()).unwrap();
    // SAFETY: as above.
    unsafe { std::env::remove_var("MIZU_PIN_CPU") };
    let mizu_fan = mizu_pipelined(2, scale(400_000), false);
    let map_us = mizu_map(2, scale(200_000));
    let sock_fan = sock_pipelined(2, scale(100_000));
    println!(
        "mizu-pool: task round trip and throughput with the Rust test worker (echo), median of {RUNS} runs"
    );
    println!(
        "placement: controller cpu0, workers cpu1 (fan-out and map rows: unpinned, 2 workers)"
    );
    println!(
        "| measure                         | mizu pool | socketpair pool | crossbeam thread pool | mizu vs socketpair | mizu vs threads |"
    );
    println!(
        "|---------------------------------|----------:|----------------:|----------------------:|-------------------:|----------------:|"
    );
    println!(
        "| round trip (µs)                 | {:>9.3} | {:>15.1} | {:>21.3} | {:>17.0}x | {:>14.2}x |",
        mizu_rt / 1e3,
        sock_rt / 1e3,
        thr_rt / 1e3,
        sock_rt / mizu_rt,
        thr_rt / mizu_rt
    );
    println!(
        "| round trip, 2 workers (µs)      | {:>9.3} | {:>15.1} | {:>21.3} | {:>17.0}x | {:>14.2}x |",
        mizu_rt2 / 1e3,
        sock_rt / 1e3,
        thr_rt / 1e3,
        sock_rt / mizu_rt2,
        thr_rt / mizu_rt2
    );
    for (b, mizu, sock) in &sized {
        println!(
            "| round trip, {:<6} (µs)         | {:>9.3} | {:>15.1} | {:>21} | {:>17.0}x | {:>15} |",
            format!("{} KiB", b / 1024),
            mizu / 1e3,
            sock / 1e3,
            "-",
            sock / mizu,
            "-"
        );
    }
    println!(
        "| pipelined, 1 worker (M tasks/s) | {:>9.2} | {:>15.3} | {:>21} | {:>17.1}x | {:>15} |",
        mizu_pipe / 1e6,
        sock_pipe / 1e6,
        "-",
        mizu_pipe / sock_pipe,
        "-"
    );
    println!(
        "| pipelined, batched (M tasks/s)  | {:>9.2} | {:>15.3} | {:>21} | {:>17.1}x | {:>15} |",
        mizu_batched / 1e6,
        sock_pipe / 1e6,
        "-",
        mizu_batched / sock_pipe,
        "-"
    );
    println!(
        "| fan-out, 2 workers (M tasks/s)  | {:>9.2} | {:>15.3} | {:>21} | {:>17.1}x | {:>15} |",
        mizu_fan / 1e6,
        sock_fan / 1e6,
        "-",
        mizu_fan / sock_fan,
        "-"
    );
    println!(
        "| channel round trip (µs)         | {:>9.3} | {:>15.1} | {:>21} | {:>17.0}x | {:>15} |",
        chan_rt / 1e3,
        sock_rt / 1e3,
        "-",
        sock_rt / chan_rt,
        "-"
    );
    println!(
        "| map, 2 workers (µs/element)     | {:>9.3} | {:>15.2} | {:>21} | {:>17.0}x | {:>15} |",
        map_us,
        1e6 / sock_fan,
        "-",
        (1e6 / sock_fan) / map_us,
        "-"
    );
    println!(
        "(the socketpair column of the map row is its fan-out cost per task, the best a socket pool's map can do; \
         a round trip of N KiB sends N KiB and gets them back)"
    );
    println!("worker parks during the round-trip runs: {parks}");
    if let (Some(b), Some(a)) = (floor_before, floor_after) {
        println!(
            "machine floor: one cache line's round trip between cpu0 and cpu1 took {b:.0} ns \
             before and {a:.0} ns after the round-trip row (no shared-memory round trip can be \
             faster; on this VM it moves between ~100 and ~400 ns with the host's placement); \
             the pool's round trip is {:.1} of them",
            mizu_rt / ((a + b) / 2.0)
        );
    }
    println!(
        "Targets: round trip <= 0.5 µs and >= 50x the socketpair pool; pipelined >= 2 M tasks/s."
    );
}
