use std::io::Write;
use std::time::Duration;

use mizu_shm::sync::{AtomicU32, Ordering};
use mizu_shm::{Layout, ParkWord, Segment, Waiter};

/// Kind of the test segment: extent 0 holds a ParkWord at 0 and a flag at 128.
const KIND: u32 = u32::from_le_bytes(*b"TST1");

pub fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let role = args.first().map(String::as_str).unwrap_or("");
    let token = args.get(1).map(String::as_str).unwrap_or("");
    let r = match role {
        "hold" => hold(false),
        "hold-spilled" => hold(true),
        "open" => Segment::open(token, KIND)
            .map(|_| println!("ok"))
            .map_err(|e| e.to_string()),
        "wake" => wake(token),
        "wait" => wait(token),
        "prune" => mizu_shm::prune().map(|_| ()).map_err(|e| e.to_string()),
        _ => {
            eprintln!(
                "usage: mizu-shm-peer hold|hold-spilled|open TOKEN|wake TOKEN|wait TOKEN|prune"
            );
            std::process::exit(2)
        }
    };
    if let Err(e) = r {
        eprintln!("mizu-shm-peer {role}: {e}");
        std::process::exit(1);
    }
}

fn words(seg: &Segment) -> Result<(&ParkWord, &AtomicU32), String> {
    let off = seg.extent(0).map_err(|e| e.to_string())?.offset;
    Ok((
        seg.get(off).map_err(|e| e.to_string())?,
        seg.get(off + 128).map_err(|e| e.to_string())?,
    ))
}

/// Creates a segment (in the spill directory when `spilled`), says its token and holds it.
fn hold(spilled: bool) -> Result<(), String> {
    let mut l = Layout::new(KIND);
    l.add(4096, 128).map_err(|e| e.to_string())?;
    let seg = if spilled {
        Segment::create_spilled(&l, true)
    } else {
        Segment::create(&l, true)
    }
    .map_err(|e| e.to_string())?;
    println!("{} {}", seg.token(), seg.me().nonce);
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn wake(token: &str) -> Result<(), String> {
    let seg = Segment::open(token, KIND).map_err(|e| e.to_string())?;
    let (park, flag) = words(&seg)?;
    flag.store(1, Ordering::Release);
    park.wake_all();
    Ok(())
}

fn wait(token: &str) -> Result<(), String> {
    let seg = Segment::open(token, KIND).map_err(|e| e.to_string())?;
    let (park, flag) = words(&seg)?;
    // No spinning and hour-long slices: only a cross-process futex wake can end this wait.
    let mut w = Waiter::new(Duration::ZERO, Duration::from_secs(3600));
    w.wait(
        park,
        || (flag.load(Ordering::Acquire) == 1).then_some(()),
        None,
        || Ok::<(), ()>(()),
    )
    .map_err(|e| format!("{e:?}"))?;
    println!("woken after {} park(s)", w.parks());
    Ok(())
}
