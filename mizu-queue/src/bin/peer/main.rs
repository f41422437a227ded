//! The other process in `mizu-queue`'s cross-process tests and benchmarks.
//!
//! `mizu-queue-peer <role> <args…>`; exit status 0 on success, 1 on a detected fault (with a
//! message on stderr), 2 on bad usage.
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
