//! The peer's roles (see `main.rs`).

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use arrow_buffer::Buffer;
use mizu_wire::{DataPool, Mapper, Received, Value, frame, read_value, write_region, write_value};

type Res<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Size of the payload every test sends.
const PAYLOAD: usize = 1 << 20;

pub(crate) fn main() {
    let role = std::env::args().nth(1).unwrap_or_default();
    let r = match role.as_str() {
        "send-exit" => send(false),
        "send-hold" => send(true),
        "recv-hold" => recv_hold(),
        "relay" => relay(),
        "report" => report(),
        "sender-survives" => sender_survives(),
        "keep-idle" => keep_idle(),
        _ => {
            eprintln!(
                "usage: mizu-wire-peer \
                 send-exit|send-hold|recv-hold|relay|report|sender-survives|keep-idle <bytes>"
            );
            std::process::exit(2)
        }
    };
    if let Err(e) = r {
        eprintln!("mizu-wire-peer {role}: {e}");
        std::process::exit(1);
    }
}

/// Stores `<bytes>` and lets go of the region, so that its pool keeps the segment idle for
/// reuse; prints its name, then waits for stdin to close (the test's end).
fn keep_idle() -> Res {
    let n: usize = std::env::args()
        .nth(2)
        .ok_or("keep-idle <bytes>")?
        .parse()?;
    let pool = DataPool::new(1 << 20);
    let r = pool.store(&vec![7u8; n])?;
    println!("{}", r.segment().name());
    drop(r);
    std::io::stdout().flush()?;
    let mut rest = Vec::new();
    std::io::stdin().read_to_end(&mut rest)?;
    drop(pool);
    Ok(())
}

/// The payload: byte i is i mod 251.
fn payload() -> Value {
    Value::Bytes(Buffer::from_vec(
        (0..PAYLOAD).map(|i| (i % 251) as u8).collect::<Vec<u8>>(),
    ))
}

fn put(w: &mut impl Write, frame: &[u8]) -> Res {
    w.write_all(&(frame.len() as u32).to_le_bytes())?;
    w.write_all(frame)?;
    w.flush()?;
    Ok(())
}

fn get(r: &mut impl Read) -> Res<Vec<u8>> {
    let mut n = [0u8; 4];
    r.read_exact(&mut n)?;
    let mut f = vec![0u8; u32::from_le_bytes(n) as usize];
    r.read_exact(&mut f)?;
    Ok(f)
}

fn put_value(w: &mut impl Write, v: &Value, pool: &DataPool) -> Res {
    let mut slot = [0u8; 256];
    let n = write_value(v, 0, &mut slot, pool)?;
    put(w, &slot[..n])
}

fn get_value(r: &mut impl Read, mapper: &Mapper) -> Res<Received> {
    Ok(read_value(&get(r)?, mapper)?)
}

fn hold() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Sends the payload through a region, then exits (dropping its pool) or sleeps until killed.
fn send(hold_on: bool) -> Res {
    let pool = DataPool::new(4 << 20);
    put_value(&mut std::io::stdout(), &payload(), &pool)?;
    if hold_on {
        hold();
    }
    Ok(())
}

/// Adopts one region frame, answers "got", then holds it until killed.
fn recv_hold() -> Res {
    let mapper = Mapper::new();
    let got = get_value(&mut std::io::stdin(), &mapper)?;
    if got.value != payload() {
        return Err("payload differs".into());
    }
    put_value(
        &mut std::io::stdout(),
        &Value::Str("got".into()),
        &DataPool::new(1 << 16),
    )?;
    let _keep = got;
    hold();
}

fn spawn(role: &str) -> Res<(Child, ChildStdin, ChildStdout)> {
    let mut c = Command::new(std::env::current_exe()?)
        .arg(role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let (i, o) = (
        c.stdin.take().ok_or("stdin")?,
        c.stdout.take().ok_or("stdout")?,
    );
    Ok((c, i, o))
}

/// Receives a region frame and re-sends it, by reference, to a `report` child; forwards the
/// child's report back.
fn relay() -> Res {
    let mapper = Mapper::new();
    let got = get_value(&mut std::io::stdin(), &mapper)?;
    let region = got.region.as_ref().ok_or("expected a region frame")?;
    let (mut child, mut cin, mut cout) = spawn("report")?;
    let mut slot = [0u8; 256];
    let n = write_region(region, 0, &mut slot)?;
    put(&mut cin, &slot[..n])?;
    let report = get_value(&mut cout, &mapper)?;
    drop(got);
    put_value(
        &mut std::io::stdout(),
        &report.value,
        &DataPool::new(1 << 16),
    )?;
    child.wait()?;
    Ok(())
}

/// Reports where the received region lives and whether its bytes are right.
fn report() -> Res {
    let mapper = Mapper::new();
    let f = get(&mut std::io::stdin())?;
    let frame::Body::Region(desc) = frame::read(&f)?.body else {
        return Err("not a region frame".into());
    };
    let region = std::sync::Arc::new(mapper.adopt(&desc)?);
    let ok = mizu_wire::decode(&mizu_wire::Region::buffer(&region))? == payload();
    let v = Value::List(vec![
        Value::Str(desc.name.clone()),
        Value::Int(desc.offset as i64),
        Value::Bool(ok),
    ]);
    drop(region);
    put_value(&mut std::io::stdout(), &v, &DataPool::new(1 << 16))
}

/// Sends a region to a `recv-hold` child, kills the child with SIGKILL while it holds the
/// reference, then exits; prints the data segment's name and the child's pid.
fn sender_survives() -> Res {
    let (mut child, mut cin, mut cout) = spawn("recv-hold")?;
    let pool = DataPool::new(4 << 20);
    let mapper = Mapper::new();
    put_value(&mut cin, &payload(), &pool)?;
    if get_value(&mut cout, &mapper)?.value != Value::Str("got".into()) {
        return Err("no ack".into());
    }
    let probe = pool.store(b"x")?;
    let name = probe.segment().name().to_string();
    drop(probe);
    child.kill()?;
    child.wait()?;
    println!("{name} {}", child.id());
    Ok(())
}
