//! Bulk fills: ns per u64 and per f64, mizu-rng beside numpy's Philox measured in the same run
//! (numpy from the project's .venv, or `MIZU_PYTHON`).

use std::hint::black_box;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use mizu_rng::element_stream;

const N: usize = 1 << 20;
const RUNS: usize = 21;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn time_ns_per_value(mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_nanos() as f64 / N as f64
            })
            .collect(),
    )
}

const NUMPY: &str = r#"
import sys, time
import numpy as np
N, RUNS = int(sys.argv[1]), int(sys.argv[2])
bg = np.random.Philox(key=42, counter=0)
g = np.random.Generator(np.random.Philox(key=42, counter=0))
out = np.empty(N)
def med(f):
    f()
    ts = []
    for _ in range(RUNS):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2] * 1e9 / N
print(med(lambda: bg.random_raw(N)), med(lambda: g.random(N, out=out)), np.__version__)
"#;

fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MIZU_PYTHON") {
        return Some(p.into());
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    venv.exists().then_some(venv)
}

fn numpy() -> Result<(f64, f64, String), String> {
    let py = python().ok_or("no .venv: run `cargo xtask bench`, which creates it")?;
    let out = Command::new(&py)
        .args(["-c", NUMPY, &N.to_string(), &RUNS.to_string()])
        .output()
        .map_err(|e| format!("{}: {e}", py.display()))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let s = String::from_utf8_lossy(&out.stdout);
    let v: Vec<&str> = s.split_whitespace().collect();
    Ok((
        v[0].parse().unwrap(),
        v[1].parse().unwrap(),
        v[2].to_owned(),
    ))
}

fn main() {
    let mut g = element_stream(42, 0);
    let mut raw = vec![0u64; N];
    let mut dbl = vec![0f64; N];
    let u64_ns = time_ns_per_value(|| g.fill_u64(black_box(&mut raw)));
    let f64_ns = time_ns_per_value(|| g.fill_f64(black_box(&mut dbl)));
    println!("mizu-rng: Philox4x64-10 bulk fills of {N} values, median of {RUNS} runs, one thread");
    match numpy() {
        Ok((np_u64, np_f64, ver)) => {
            println!(
                "| fill              | mizu-rng (ns/value) | numpy {ver} Philox (ns/value) | mizu vs numpy |"
            );
            println!(
                "|-------------------|--------------------:|-----------------------------:|--------------:|"
            );
            println!(
                "| u64 (random_raw)  | {u64_ns:>19.2} | {np_u64:>28.2} | {:>12.2}x |",
                np_u64 / u64_ns
            );
            println!(
                "| f64 (random)      | {f64_ns:>19.2} | {np_f64:>28.2} | {:>12.2}x |",
                np_f64 / f64_ns
            );
            println!("ratios > 1 mean mizu-rng is faster. Target: at least as fast as numpy.");
        }
        Err(e) => {
            println!("| u64 | {u64_ns:.2} ns/value |\n| f64 | {f64_ns:.2} ns/value |");
            println!("numpy not measured: {e}");
        }
    }
}
