//! The other processes in `mizu-wire`'s cross-process tests: senders that exit or get killed
//! after sending a region, receivers that hold or report, and a relay that re-sends by
//! reference. Frames travel length-prefixed over stdin/stdout (the transport is not what these
//! tests are about; the payload stays in shared memory). Exit 0 on success, 1 on failure.
//!
//! Not built under `--cfg mizu_loom`, where the segment code it uses does not exist.

#[cfg(not(mizu_loom))]
mod imp;

fn main() {
    #[cfg(not(mizu_loom))]
    imp::main();
    #[cfg(mizu_loom)]
    {
        eprintln!("this peer is not available in a loom build");
        std::process::exit(2);
    }
}
