//! How a binding cuts a map's elements into tasks (chunks), the one policy for both
//! languages: guided — rounds of one chunk per worker, each chunk a `1 / (4 × workers)` share
//! of the elements not yet cut, so the early chunks are large (few round trips while every
//! worker is busy) and the last are small (the workers finish together, whatever the machine
//! or a skewed element did to the ones before) — but not smaller than `1 / (32 × workers)` of
//! the whole map (the last round splits what is left evenly), so that a map of tiny elements
//! does not end in a run of one-element round trips. The last chunks still leave the workers
//! up to one of them apart: at `1 / (16 × workers)`, 40 elements of 1 ms ended in chunks of
//! two, and R maps of 5 µs, 50 µs and 1 ms elements measured a point or two below what this
//! floor gives (medians of 31 maps, six chunks more in a map of 8 000). The first round is
//! that small too, so that every worker starts at once: the caller serializes one chunk after
//! another, and the last worker of a round waits for all of them.
//!
//! The chunks of a round are equal: submitted in order, they go to the workers in turn, so
//! each worker is handed the same share (chunks shrinking one by one gave the first worker of
//! every round the larger one — 4 248 against 3 752 elements of 8 000 — and left the other
//! idle until it stole). A size the caller fixes is taken as it is. A batch of calls (each
//! call its own task, travelling in chunks) is cut the same way without the floor and at most
//! [`BATCH_MAX`] calls a chunk, so that a call's result or cancel never waits behind many
//! others.

/// Shares of what is left a guided chunk takes, per worker.
const SHARE: u64 = 4;
/// The smallest guided chunk, as a share of the whole map per worker.
const FLOOR: u64 = 32;

/// Calls a chunk of a batch holds at most.
pub const BATCH_MAX: u64 = 128;

/// The chunks of a map of `n` elements over `workers` workers, as `(first element, length)`,
/// in element order, covering `0..n` once. `fixed`: every chunk that long (the last shorter).
pub fn plan(n: u64, workers: u64, fixed: Option<u64>) -> Vec<(u64, u64)> {
    let floor = n.div_ceil(FLOOR.saturating_mul(workers.max(1))).max(1);
    cut(n, workers, fixed, floor, u64::MAX)
}

/// Whether a caller that encodes a map's chunks in one go should submit the first round (one
/// chunk per worker) before it encodes the rest, so that the workers start meanwhile: only
/// when the machine has a CPU for the caller beside the workers'. Where the workers take every
/// CPU, those the first round woke take the caller's CPU too, finish their small chunks and
/// park before the rest is sent, which then waits for a second wake-up (R maps of 40 to 2 000
/// trivial elements on 2 workers and 2 CPUs took 10–35% longer that way than sent at once; with
/// a CPU to spare, a map of 200 elements of 100 KB each took ~5% less).
pub fn first_round_apart(workers: u64) -> bool {
    crate::watch::cpus() as u64 > workers
}

/// The chunks of a batch of `n` calls (see the module docs), as [`plan`]'s.
pub fn batch(n: u64, workers: u64, fixed: Option<u64>) -> Vec<(u64, u64)> {
    cut(n, workers, fixed, 1, BATCH_MAX)
}

fn cut(n: u64, workers: u64, fixed: Option<u64>, floor: u64, max: u64) -> Vec<(u64, u64)> {
    let w = workers.max(1);
    let mut out = Vec::new();
    let mut at = 0;
    let mut size = 0;
    while at < n {
        let left = n - at;
        // A new round: one size for the next `w` chunks.
        if (out.len() as u64).is_multiple_of(w) {
            size = match fixed {
                Some(f) => f.max(1),
                None if out.is_empty() => floor.min(max).min(left.div_ceil(w)),
                // (The last round splits what is left evenly.)
                None => left
                    .div_ceil(SHARE.saturating_mul(w))
                    .clamp(floor, max.max(floor))
                    .min(left.div_ceil(w)),
            };
        }
        let len = size.min(left);
        out.push((at, len));
        at += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::plan;

    fn covers(n: u64, chunks: &[(u64, u64)]) {
        let mut at = 0;
        for &(s, l) in chunks {
            assert_eq!(s, at, "{chunks:?}");
            assert!(l >= 1);
            at += l;
        }
        assert_eq!(at, n);
    }

    #[test]
    fn guided_chunks_cover_the_map_in_equal_rounds_that_shrink() {
        for (n, w) in [
            (0, 2),
            (1, 2),
            (7, 2),
            (40, 2),
            (8000, 2),
            (8000, 64),
            (3, 1000),
        ] {
            let c = plan(n, w, None);
            covers(n, &c);
            // After the first round, chunks only shrink.
            let later = &c[c.len().min(w as usize)..];
            assert!(
                later
                    .windows(2)
                    .all(|p| p[0].1 >= p[1].1 || p[1].0 + p[1].1 == n)
            );
            // Handed to the workers in turn, the workers' shares differ by less than one
            // chunk of the last round.
            let mut share = vec![0u64; w as usize];
            for (i, &(_, l)) in c.iter().enumerate() {
                share[i % w as usize] += l;
            }
            let spread = share.iter().max().unwrap() - share.iter().min().unwrap();
            assert!(spread <= c.last().map_or(0, |l| l.1), "{share:?} {c:?}");
        }
        let c = plan(8000, 2, None);
        assert_eq!(
            &c[..3],
            &[(0, 125), (125, 125), (250, 969)],
            "a small first round"
        );
        let (rest, last_round) = c.split_at(c.len() - 2);
        assert!(
            rest.iter().all(|&(_, l)| l >= 125),
            "none but the last round below 1/(32w) of the map"
        );
        assert!(last_round.iter().all(|&(_, l)| l <= 125));
        assert!(c.len() < 32, "{} chunks", c.len());
        assert_eq!(plan(40, 2, None)[..3], [(0, 1), (1, 1), (2, 5)]);
    }

    #[test]
    fn batches_take_at_most_128_calls_a_chunk_down_to_one() {
        let c = super::batch(10_000, 2, None);
        covers(10_000, &c);
        assert!(c.iter().all(|&(_, l)| l <= 128));
        assert_eq!(c.last().unwrap().1, 1);
        assert_eq!(super::batch(10, 3, Some(4)), vec![(0, 4), (4, 4), (8, 2)]);
    }

    #[test]
    fn the_first_round_goes_apart_only_with_a_cpu_beyond_the_workers() {
        let cpus = crate::watch::cpus() as u64;
        assert!(super::first_round_apart(cpus - 1));
        assert!(!super::first_round_apart(cpus));
        assert!(!super::first_round_apart(u64::MAX));
    }

    #[test]
    fn a_fixed_size_is_kept() {
        let c = plan(10, 3, Some(4));
        assert_eq!(c, vec![(0, 4), (4, 4), (8, 2)]);
        covers(5, &plan(5, 2, Some(0)));
        covers(5, &plan(5, 0, None));
        assert_eq!(plan(3, 2, Some(u64::MAX)), vec![(0, 3)]);
    }
}
