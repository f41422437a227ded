//! The other process in `mizu-shm`'s cross-process tests.
//!
//! Roles: `hold` (create a segment, print its token, sleep until killed), `open TOKEN`
//! (open and report), `wake TOKEN` (set the flag, wake sleepers), `wait TOKEN` (park until the
//! flag is set). Exit status 0 on success, 1 with a message on failure, 2 on bad usage.
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
