//! A Rust worker for testing and benchmarking the runtime without any language binding.
//!
//! `mizu-pool-testworker <token> <slot>`. Task payloads are commands:
//! `echo:<bytes>` returns the bytes; `sleep:<ms>` sleeps then returns `slept`; `fail:<msg>`
//! fails with the message; `abort` kills this process (SIGKILL to itself); `pid` returns the
//! pid; `big:<n>` returns n bytes; `nested:<n>` submits n nested `echo:<i>` tasks, collects
//! them and returns their sum; `nestedmap:<n>` maps `echo` over n nested
//! elements; `nestedwait:<n>` submits n nested `pid` tasks and waits for them without running
//! any itself (another worker must steal them), returning their pids; `nestedabort:<n>`
//! submits n nested `echo` tasks and kills this process; `sum` returns the sum of the
//! payload's remaining bytes.
//!
//! Not built under `--cfg mizu_loom`, where the pool runtime it uses does not exist.

#[cfg(not(mizu_loom))]
mod imp;

fn main() {
    #[cfg(not(mizu_loom))]
    imp::main();
    #[cfg(mizu_loom)]
    {
        eprintln!("the test worker is not available in a loom build");
        std::process::exit(2);
    }
}
