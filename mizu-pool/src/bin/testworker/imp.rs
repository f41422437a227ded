//! The test worker itself (see `main.rs`).

use mizu_pool::{Executor, TaskContext, run_worker};

struct TestExec;

impl Executor for TestExec {
    fn execute(&self, ctx: &TaskContext<'_>, input: &[u8]) -> Result<Vec<u8>, Vec<u8>> {
        let (cmd, arg) = match input.iter().position(|&b| b == b':') {
            Some(i) => (&input[..i], &input[i + 1..]),
            None => (input, &[][..]),
        };
        let num = || {
            std::str::from_utf8(arg)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or(b"bad number".to_vec())
        };
        match cmd {
            b"echo" => Ok(arg.to_vec()),
            b"sleep" => {
                std::thread::sleep(std::time::Duration::from_millis(num()?));
                Ok(b"slept".to_vec())
            }
            b"fail" => Err(arg.to_vec()),
            b"abort" => {
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::KILL,
                );
                Err(b"unreachable".to_vec())
            }
            b"pid" => Ok(std::process::id().to_string().into_bytes()),
            b"count" => {
                // How many tasks this worker ran before this one: the order it ran them in.
                static RAN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = RAN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(n.to_string().into_bytes())
            }
            b"recycle" => {
                ctx.recycle();
                Ok(std::process::id().to_string().into_bytes())
            }
            b"reply" => {
                // The result is written in place; what is returned afterwards is ignored.
                let out = vec![9u8; num()? as usize];
                ctx.reply(true, &out)
                    .map_err(|e| e.to_string().into_bytes())?;
                Ok(b"ignored".to_vec())
            }
            b"input" => Ok(ctx.input().map_or(0, |b| b.len()).to_string().into_bytes()),
            b"big" => Ok(vec![7u8; num()? as usize]),
            b"nested" => {
                let n = num()?;
                let mut tasks = (0..n)
                    .map(|i| ctx.submit(format!("echo:{i}").as_bytes()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string().into_bytes())?;
                let mut sum = 0u64;
                for t in &mut tasks {
                    let b = ctx
                        .collect(t, None)
                        .map_err(|e| e.to_string().into_bytes())?;
                    sum += std::str::from_utf8(&b)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok())
                        .unwrap_or(0);
                }
                Ok(sum.to_string().into_bytes())
            }
            b"nestedwait" => {
                let n = num()?;
                let mut tasks = (0..n)
                    .map(|_| ctx.submit(b"pid"))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string().into_bytes())?;
                // A hang guard only: the tasks are stolen within milliseconds.
                let t0 = std::time::Instant::now();
                while !tasks.iter().all(|t| t.is_done()) {
                    if t0.elapsed() > std::time::Duration::from_secs(60) {
                        return Err(b"nobody stole the nested tasks".to_vec());
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                let pids = tasks
                    .iter_mut()
                    .map(|t| {
                        t.result(None)
                            .map(|b| String::from_utf8_lossy(&b).into_owned())
                            .map_err(|e| e.to_string().into_bytes())
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(pids.join(",").into_bytes())
            }
            b"nestedabort" => {
                let n = num()?;
                let tasks = (0..n)
                    .map(|i| ctx.submit(format!("echo:{i}").as_bytes()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string().into_bytes())?;
                std::mem::forget(tasks);
                let _ = rustix::process::kill_process(
                    rustix::process::getpid(),
                    rustix::process::Signal::KILL,
                );
                Err(b"unreachable".to_vec())
            }
            b"nestedmap" => {
                let n = num()?;
                let inputs: Vec<Vec<u8>> =
                    (0..n).map(|i| format!("echo:{i}").into_bytes()).collect();
                let refs: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
                let out = ctx
                    .map(&refs, &mizu_pool::MapOptions::default())
                    .map_err(|e| e.to_string().into_bytes())?;
                let mizu_pool::MapOutput::List(out) = out else {
                    return Err(b"typed".to_vec());
                };
                let sum: u64 = out
                    .iter()
                    .map(|b| {
                        std::str::from_utf8(b)
                            .ok()
                            .and_then(|s| s.parse::<u64>().ok())
                            .unwrap_or(0)
                    })
                    .sum();
                Ok(sum.to_string().into_bytes())
            }
            b"sum" => Ok(arg
                .iter()
                .map(|&b| u64::from(b))
                .sum::<u64>()
                .to_string()
                .into_bytes()),
            _ => Err(format!("unknown command {:?}", String::from_utf8_lossy(cmd)).into_bytes()),
        }
    }
}

/// `--controller`: create a pool of two workers (this binary), print their pids and the token,
/// then sleep until killed (for the controller-death test). With `bytes`, first send a task
/// of that many bytes and have a worker answer one as large, keeping both (with a small
/// `/dev/shm`, they spill).
fn controller(bytes: Option<usize>) {
    let exe = std::env::current_exe().expect("own path");
    let cfg = mizu_pool::PoolConfig {
        workers: 2,
        ..Default::default()
    };
    let pool = mizu_pool::Pool::new(cfg, mizu_pool::Launcher::new(exe, Vec::<String>::new()))
        .expect("pool");
    let pids: Vec<String> = pool
        .status()
        .workers
        .iter()
        .map(|w| w.pid.to_string())
        .collect();
    let mut kept = Vec::new();
    if let Some(n) = bytes {
        let mut task = b"input:".to_vec();
        task.resize(6 + n, 1);
        let sent = pool
            .submit(&task)
            .expect("submit")
            .result(None)
            .expect("input");
        assert_eq!(sent.as_slice(), (6 + n).to_string().as_bytes()); // the whole input
        let mut big = pool.submit(format!("big:{n}").as_bytes()).expect("submit");
        let got = big.outcome(None).expect("big");
        assert_eq!(got.len(), n);
        kept.push(got);
    }
    println!("{} {}", pool.token(), pids.join(" "));
    use std::io::Write;
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

/// `--sock-worker FD`: the socketpair peer the benchmark compares against — a
/// request/response worker over an inherited Unix socket, running the same commands (only
/// those that need no pool).
fn sock_worker(fd: i32) {
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;
    // SAFETY: the benchmark passes this inherited socket descriptor; nothing else owns it.
    let mut s = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
    let mut len = [0u8; 4];
    let mut buf = Vec::new();
    while s.read_exact(&mut len).is_ok() {
        buf.resize(u32::from_le_bytes(len) as usize, 0);
        if s.read_exact(&mut buf).is_err() {
            break;
        }
        let out = match buf.strip_prefix(b"echo:") {
            Some(a) => a.to_vec(),
            None => b"unsupported".to_vec(),
        };
        let _ = s.write_all(&(out.len() as u32).to_le_bytes());
        let _ = s.write_all(&out);
    }
}

pub fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(cpu) = std::env::var("MIZU_PIN_CPU")
        .ok()
        .and_then(|c| c.parse().ok())
    {
        let _ = mizu_shm::affinity::pin_to_cpu(cpu);
    }
    let token = || args.get(1).cloned().unwrap_or_default();
    match args.first().map(String::as_str) {
        Some("--controller") => controller(args.get(1).and_then(|n| n.parse().ok())),
        Some("--channel-echo") => {
            // Echo every message back until the host closes, then close.
            let mut ch = mizu_pool::Channel::attach(&token()).expect("attach");
            while let Ok(m) = ch.recv(None) {
                while ch.send(&m) == Err(mizu_pool::ChannelSendError::Full) {
                    std::thread::yield_now();
                }
            }
            return;
        }
        Some("--channel-hold") => {
            // Attach, say hello, never read.
            let mut ch = mizu_pool::Channel::attach(&token()).expect("attach");
            ch.send(b"hello").expect("hello");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        Some("--channel-keep") => {
            // Attach, keep the first message (a view of the host's memory for a large one),
            // say so, and wait to be killed.
            let mut ch = mizu_pool::Channel::attach(&token()).expect("attach");
            let kept = ch.recv(None).expect("a message");
            ch.send(b"got").expect("got");
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
                assert!(!kept.is_empty());
            }
        }
        Some("--channel-close") => {
            let mut ch = mizu_pool::Channel::attach(&token()).expect("attach");
            ch.send(b"bye").expect("bye");
            ch.close();
            return;
        }
        Some("--submit") => {
            // Attach to a pool as an extra submitter and run 100 tasks.
            let s = mizu_pool::Submitter::attach(&token()).expect("attach");
            let mut ts: Vec<_> = (0..100)
                .map(|i| s.submit(format!("echo:{i}").as_bytes()).expect("submit"))
                .collect();
            let out = mizu_pool::collect_all(&mut ts, None).expect("collect");
            let ok = out
                .iter()
                .enumerate()
                .all(|(i, b)| b.as_slice() == i.to_string().as_bytes());
            println!("{} {}", s.index(), if ok { "ok" } else { "bad" });
            return;
        }
        Some("--attach-hold") => {
            // Attach as an extra submitter, say which record, and wait to be killed.
            let s = mizu_pool::Submitter::attach(&token()).expect("attach");
            println!("{}", s.index());
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        Some("--sock-worker") => {
            sock_worker(args.get(1).and_then(|f| f.parse().ok()).unwrap_or(-1));
            return;
        }
        _ => {}
    }
    let (Some(token), Some(slot)) = (args.first(), args.get(1).and_then(|s| s.parse().ok())) else {
        eprintln!("usage: mizu-pool-testworker <token> <slot>");
        std::process::exit(2);
    };
    // A gate for the join test: joiners launched together wait here (a FIFO read to its end
    // once the test writes and closes it), so that they join at the same moment.
    if let Some(gate) = std::env::var_os("MIZU_TEST_JOIN_GATE") {
        let _ = std::fs::read(gate);
    }
    if let Err(e) = run_worker(token, slot, &TestExec) {
        eprintln!("mizu-pool-testworker: {e}");
        std::process::exit(1);
    }
}
