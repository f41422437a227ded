//! Reproducible parallel random numbers: each element of a map draws from its own stream, so
//! the draws are the same whichever thread (or process, or language) computes which element.
//! Here four threads take the elements in an interleaved order and one thread takes them in
//! order: the results agree, and element 0's first value is what numpy gives for
//! `np.random.Generator(np.random.Philox(key=42, counter=0 << 128)).random()`.
//!
//! `cargo run -p mizu-rng --example parallel_draws`

use std::sync::Mutex;

use mizu_rng::element_stream;

const SEED: u64 = 42;
const ELEMENTS: u64 = 1000;

/// The work of element `i`: the mean of its first 100 uniform draws.
fn element(i: u64) -> f64 {
    let mut rng = element_stream(SEED, i);
    (0..100).map(|_| rng.next_f64()).sum::<f64>() / 100.0
}

fn main() {
    let sequential: Vec<f64> = (0..ELEMENTS).map(element).collect();
    let parallel = Mutex::new(vec![0.0; ELEMENTS as usize]);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let parallel = &parallel;
            s.spawn(move || {
                let mine: Vec<u64> = (t..ELEMENTS).step_by(4).collect();
                for &i in mine.iter().rev() {
                    let v = element(i);
                    parallel.lock().unwrap_or_else(|p| p.into_inner())[i as usize] = v;
                }
            });
        }
    });
    let parallel = parallel.into_inner().unwrap_or_else(|p| p.into_inner());
    assert_eq!(sequential, parallel, "the same draws for any schedule");
    println!(
        "{ELEMENTS} elements, same results on 1 and 4 threads; element 0 starts with {}",
        element_stream(SEED, 0).next_f64()
    );
}
