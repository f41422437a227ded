//! Two processes exchange messages over a `mizu-queue` ring placed in a `mizu-shm` segment:
//! the child produces, the parent consumes, each parking on the ring's futex words when it
//! has to wait (no spinning forever, no lost wake-up).
//!
//! `cargo run -p mizu-queue --example ring_between_processes`

use std::process::Command;
use std::time::Duration;

use mizu_queue::layout::{add_ring, attach_ring, init_ring};
use mizu_shm::{Layout, Segment};

const KIND: u32 = u32::from_le_bytes(*b"RNG1");
const MESSAGES: u32 = 10_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, role, token] = args.as_slice()
        && role == "--producer"
    {
        let seg = Segment::open(token, KIND)?;
        let ring = attach_ring(&seg, 0, 1)?;
        // SAFETY: this process is the ring's only producer (the parent only consumes).
        let mut tx = unsafe { ring.producer() };
        for i in 0..MESSAGES {
            let msg = format!("message {i}");
            // A full ring: wait for the consumer to make room.
            while tx.try_send(msg.as_bytes()).is_err() {
                let park = ring.producer_park();
                park.park(
                    &mut || tx.poll_space().then_some(()),
                    Some(Duration::from_millis(10)),
                );
            }
        }
        tx.close();
        return Ok(());
    }
    let mut layout = Layout::new(KIND);
    // 64 slots of 64 bytes: a 56-byte message each.
    add_ring(&mut layout, 64, 64)?;
    let seg = Segment::create(&layout, false)?;
    // SAFETY: the segment was created just now; the child gets its token below.
    let ring = unsafe { init_ring(&seg, 0, 1, 64, 64)? };
    // SAFETY: this process is the ring's only consumer (the child only produces).
    let mut rx = unsafe { ring.consumer() };
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--producer", seg.token()])
        .spawn()?;
    let mut got = 0u32;
    loop {
        if let Some(text) = rx.try_recv_with(|m| String::from_utf8_lossy(m).into_owned()) {
            assert_eq!(text, format!("message {got}"), "in order, none lost");
            got += 1;
            continue;
        }
        if rx.is_drained_and_closed() {
            break;
        }
        let park = ring.consumer_park();
        park.park(
            &mut || (rx.poll() || ring.is_closed()).then_some(()),
            Some(Duration::from_millis(10)),
        );
        if let Some(status) = child.try_wait()?
            && !status.success()
        {
            return Err(format!("the producer failed: {status}").into());
        }
    }
    child.wait()?;
    println!(
        "received {got} messages in order from process {}",
        child.id()
    );
    Ok(())
}
