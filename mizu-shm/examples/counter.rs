//! Two processes share a counter and a futex word in one segment: the child adds to the
//! counter and wakes the parent, which sleeps (no spinning) until the count is complete.
//!
//! `cargo run -p mizu-shm --example counter`

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mizu_shm::{CacheLine, Layout, ParkWord, Segment};

/// The segment kind: an opener checks it, so a token of another kind of segment is refused.
const KIND: u32 = u32::from_le_bytes(*b"CNT1");
const N: u64 = 1000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, role, token] = args.as_slice()
        && role == "--child"
    {
        // The child: open by token (the header is validated first), then count.
        let seg = Segment::open(token, KIND)?;
        let count: &CacheLine<AtomicU64> = seg.get(seg.extent(0)?.offset)?;
        let park: &CacheLine<ParkWord> = seg.get(seg.extent(1)?.offset)?;
        for _ in 0..N {
            count.fetch_add(1, Ordering::Release);
            park.wake_all();
        }
        return Ok(());
    }
    let mut layout = Layout::new(KIND);
    layout.add(std::mem::size_of::<CacheLine<AtomicU64>>() as u64, 128)?;
    layout.add(std::mem::size_of::<CacheLine<ParkWord>>() as u64, 128)?;
    // Created 0600 and zeroed; the name goes when `seg` is dropped.
    let seg = Segment::create(&layout, false)?;
    let count: &CacheLine<AtomicU64> = seg.get(seg.extent(0)?.offset)?;
    let park: &CacheLine<ParkWord> = seg.get(seg.extent(1)?.offset)?;
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--child", seg.token()])
        .spawn()?;
    let mut poll = || (count.load(Ordering::Acquire) == N).then_some(());
    while park
        .park(&mut poll, Some(Duration::from_millis(100)))
        .is_none()
    {
        if let Some(status) = child.try_wait()? {
            if count.load(Ordering::Acquire) == N {
                break;
            }
            return Err(format!("the child exited early: {status}").into());
        }
    }
    child.wait()?;
    println!("the child counted to {}", count.load(Ordering::Acquire));
    Ok(())
}
