//! A pool of two worker processes running a Rust executor: this program is both the
//! controller and (started again by the pool, with the pool's token) each worker.
//!
//! `cargo run -p mizu-pool --example upper`

use mizu_pool::{
    CollectError, Executor, Launcher, Pool, PoolConfig, TaskContext, TaskError, collect_all,
    run_worker,
};

/// What the workers run: a payload in, a payload out (or an error payload).
struct Upper;

impl Executor for Upper {
    fn execute(&self, _ctx: &TaskContext<'_>, input: &[u8]) -> Result<Vec<u8>, Vec<u8>> {
        if input.is_empty() {
            return Err(b"nothing to shout".to_vec());
        }
        Ok(input.to_ascii_uppercase())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    // The pool starts workers as `<program> <launcher args> <token> <slot>`.
    if let [_, flag, token, slot] = args.as_slice()
        && flag == "--worker"
    {
        run_worker(token, slot.parse()?, &Upper)?;
        return Ok(());
    }
    let pool = Pool::new(
        PoolConfig {
            workers: 2,
            ..Default::default()
        },
        Launcher::new(std::env::current_exe()?, ["--worker"]),
    )?;
    let words = ["shared", "memory", "pools", "of", "processes"];
    let mut tasks = words
        .iter()
        .map(|w| pool.submit(w.as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let out = collect_all(&mut tasks, None).map_err(|(i, e)| format!("task {i}: {e}"))?;
    let shouted: Vec<String> = out
        .iter()
        .map(|b| String::from_utf8_lossy(b.as_slice()).into_owned())
        .collect();
    println!("{}", shouted.join(" "));
    match pool.submit(b"")?.result(None) {
        Err(CollectError::Task(TaskError::Failed(payload))) => {
            println!("an empty task fails: {}", String::from_utf8_lossy(&payload));
        }
        other => return Err(format!("expected the executor's error, got {other:?}").into()),
    }
    Ok(())
}
