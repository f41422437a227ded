use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::time::Duration;

use mizu_queue::{Duplex, RecvError, Steal};
use mizu_shm::Waiter;
use mizu_shm::sync::Ordering;

#[path = "../../../tests/common/steal_fixture.rs"]
#[allow(dead_code)]
mod steal_fixture;

pub fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or_else(|| usage());
    let num = |i: usize| arg(i).parse::<u64>().unwrap_or_else(|_| usage());
    if let Some(cpu) = std::env::var("MIZU_PIN_CPU")
        .ok()
        .and_then(|c| c.parse().ok())
    {
        mizu_shm::affinity::pin_to_cpu(cpu).unwrap_or_else(|e| eprintln!("{e}"));
    }
    let result = match arg(0) {
        "echo" => echo(arg(1)),
        "sink" => sink(arg(1), num(2)),
        "stream" => stream(arg(1)),
        "hold" => hold(arg(1)),
        "thief" => thief(arg(1), num(2) as usize),
        "survivor" => survivor(arg(1)),
        "host-hold" => host_hold(),
        "join" => join(arg(1)),
        "sock-echo" => sock_echo(num(1) as i32),
        "sock-sink" => sock_sink(num(1) as i32, num(2)),
        _ => usage(),
    };
    if let Err(e) = result {
        eprintln!("mizu-queue-peer {}: {e}", arg(0));
        std::process::exit(1);
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: mizu-queue-peer echo|sink|stream|hold|thief|survivor|host-hold|join|sock-echo|sock-sink ARGS"
    );
    std::process::exit(2)
}

type Res = Result<(), Box<dyn std::error::Error>>;

fn waiter() -> Waiter {
    Waiter::new(Duration::from_micros(50), Duration::from_millis(20))
}

/// Joins as the guest and says whether it got in ("joined") or found the guest's place taken
/// ("refused"), then stays joined until stdin closes (so a racing joiner sees it).
fn join(token: &str) -> Res {
    match Duplex::join(token) {
        Ok(_d) => {
            println!("joined");
            std::io::stdout().flush()?;
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        }
        Err(e) if e.to_string().contains("already joined") => println!("refused"),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// Returns every message to the sender until the sender closes its ring.
fn echo(token: &str) -> Res {
    let d = Duplex::join(token)?;
    let (mut tx, mut rx) = d.split().ok_or("ends taken")?;
    let mut w = waiter();
    let mut buf = Vec::new();
    loop {
        match d.recv_with(&mut rx, &mut w, None, |m| {
            buf.clear();
            buf.extend_from_slice(m)
        }) {
            Ok(()) => d
                .send(&mut tx, &mut w, None, &buf)
                .map_err(|e| format!("send: {e:?}"))?,
            Err(RecvError::Closed) => break,
            Err(e) => return Err(format!("recv: {e:?}").into()),
        }
    }
    tx.close();
    Ok(())
}

/// Receives `n` little-endian sequence numbers, checks 0..n in order, replies with n.
fn sink(token: &str, n: u64) -> Res {
    let d = Duplex::join(token)?;
    let (mut tx, mut rx) = d.split().ok_or("ends taken")?;
    let mut w = waiter();
    for expect in 0..n {
        let got = d
            .recv_with(&mut rx, &mut w, None, |m| {
                u64::from_le_bytes(m[..8].try_into().unwrap())
            })
            .map_err(|e| format!("recv #{expect}: {e:?}"))?;
        if got != expect {
            return Err(format!("expected {expect}, got {got}").into());
        }
    }
    d.send(&mut tx, &mut w, None, &n.to_le_bytes())
        .map_err(|e| format!("{e:?}"))?;
    tx.close();
    Ok(())
}

/// Sends 0, 1, 2, … until the host is gone.
fn stream(token: &str) -> Res {
    let d = Duplex::join(token)?;
    let (mut tx, _) = d.split().ok_or("ends taken")?;
    let mut w = waiter();
    for i in 0u64.. {
        if d.send(&mut tx, &mut w, None, &i.to_le_bytes()).is_err() {
            break;
        }
    }
    Ok(())
}

/// Joins, says hello, then sleeps until killed.
fn hold(token: &str) -> Res {
    let d = Duplex::join(token)?;
    d.split()
        .ok_or("ends taken")?
        .0
        .try_send(b"hello")
        .map_err(|e| format!("{e}"))?;
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Steals from the fixture's deque until the owner says done and the deque is empty; sends
/// every stolen item on its own ring, then closes the ring.
fn thief(token: &str, index: usize) -> Res {
    let seg = mizu_shm::Segment::open(token, steal_fixture::STEAL_KIND)?;
    let dq = steal_fixture::deque(&seg)?;
    let ring = steal_fixture::ring(&seg, index)?;
    // SAFETY: thief `index` is its ring's only producer (the test process its only consumer).
    let mut tx = unsafe { ring.producer() };
    let done = steal_fixture::done(&seg);
    loop {
        match dq.steal() {
            Steal::Success(item) => {
                while tx.try_send(&item.to_le_bytes()).is_err() {
                    std::thread::yield_now();
                }
            }
            Steal::Retry => {}
            Steal::Empty => {
                if done.load(Ordering::Acquire) == 1 && dq.steal() == Steal::Empty {
                    break;
                }
                std::thread::yield_now();
            }
        }
    }
    tx.close();
    Ok(())
}

/// Hosts a duplex, launches a guest (`stream` when `producer-dies`, `hold` when
/// `consumer-dies`), kills it with SIGKILL mid-stream and checks that this side sees the peer
/// gone. Prints `host=<pid> guest=<pid>` so the test can look for leftovers after we exit.
fn survivor(mode: &str) -> Res {
    let guest_role = match mode {
        "producer-dies" => "stream",
        "consumer-dies" => "hold",
        _ => usage(),
    };
    let mut d = Duplex::create(64, 64)?;
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args([guest_role, d.token()])
        .spawn()?;
    let guest = d
        .wait_guest(Duration::from_secs(60), || match child.try_wait() {
            Ok(None) => Ok(()),
            _ => Err("guest exited before joining"),
        })
        .map_err(|e| format!("{e:?}"))?;
    let mut w = waiter();
    let (mut tx, mut rx) = d.split().ok_or("ends taken")?;
    if mode == "producer-dies" {
        for expect in 0..10_000u64 {
            let got = d
                .recv_with(&mut rx, &mut w, Some(Duration::from_secs(60)), |m| {
                    u64::from_le_bytes(m[..8].try_into().unwrap())
                })
                .map_err(|e| format!("{e:?}"))?;
            if got != expect {
                return Err(format!("expected {expect}, got {got}").into());
            }
        }
        child.kill()?;
        let mut last = 9_999u64;
        let outcome = loop {
            match d.recv_with(&mut rx, &mut w, Some(Duration::from_secs(60)), |m| {
                u64::from_le_bytes(m[..8].try_into().unwrap())
            }) {
                Ok(v) if v == last + 1 => last = v,
                Ok(v) => return Err(format!("after {last} got {v}").into()),
                Err(e) => break e,
            }
        };
        if outcome != RecvError::PeerGone {
            return Err(format!("expected PeerGone, got {outcome:?}").into());
        }
        // Sticky.
        if d.recv_with(&mut rx, &mut w, Some(Duration::from_secs(60)), |_| ())
            != Err(RecvError::PeerGone)
        {
            return Err("peer gone is not sticky".into());
        }
    } else {
        d.recv_with(&mut rx, &mut w, Some(Duration::from_secs(60)), |_| ())
            .map_err(|e| format!("hello: {e:?}"))?;
        // Fill the ring: the guest never reads.
        while tx.try_send(b"x").is_ok() {}
        child.kill()?;
        match d.send(&mut tx, &mut w, Some(Duration::from_secs(60)), b"x") {
            Err(mizu_queue::SendBlockingError::PeerGone) => {}
            other => return Err(format!("expected PeerGone, got {other:?}").into()),
        }
    }
    child.wait()?;
    if guest.is_alive() {
        return Err("guest still alive after SIGKILL".into());
    }
    println!("host={} guest={}", std::process::id(), guest.pid);
    Ok(())
}

/// Hosts a duplex, prints its token, waits for a guest, then sleeps until killed.
fn host_hold() -> Res {
    let mut d = Duplex::create(64, 64)?;
    println!("{}", d.token());
    std::io::stdout().flush()?;
    d.wait_guest(Duration::from_secs(120), || Ok::<(), ()>(()))
        .map_err(|e| format!("{e:?}"))?;
    d.split()
        .ok_or("ends taken")?
        .0
        .try_send(b"welcome")
        .map_err(|e| format!("{e}"))?;
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn socket(fd: i32) -> std::os::unix::net::UnixStream {
    // SAFETY: the parent passed us this inherited socket descriptor, which nothing else owns.
    unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) }
}

/// Echoes 8-byte messages over an inherited socket until EOF.
fn sock_echo(fd: i32) -> Res {
    let mut s = socket(fd);
    let mut b = [0u8; 8];
    while s.read_exact(&mut b).is_ok() {
        s.write_all(&b)?;
    }
    Ok(())
}

/// Reads n 8-byte messages over an inherited socket, then writes n back.
fn sock_sink(fd: i32, n: u64) -> Res {
    let mut s = socket(fd);
    let mut buf = vec![0u8; 64 * 1024];
    let mut left = n * 8;
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        let k = s.read(&mut buf[..want])?;
        if k == 0 {
            return Err("EOF".into());
        }
        left -= k as u64;
    }
    s.write_all(&n.to_le_bytes())?;
    Ok(())
}
