//! How a binding cuts a map's elements into tasks (chunks), the one policy for both
//! languages: guided — each chunk a `1 / (4 × workers)` share of the elements not yet cut, so
//! the first chunks are large (few round trips while every worker is busy) and the last are
//! small (the workers finish together, whatever the machine or a skewed element did to the
//! ones before) — but never smaller than `1 / (16 × workers)` of the whole map, so that a
//! map of tiny elements does not end in a run of one-element round trips. A size the caller
//! fixes is taken as it is. A batch of calls (each call its own task, travelling in chunks)
//! is cut the same way without the floor and at most [`BATCH_MAX`] calls a chunk, so that a
//! call's result or cancel never waits behind many others.

/// Shares of what is left a guided chunk takes, per worker.
const SHARE: u64 = 4;
/// The smallest guided chunk, as a share of the whole map per worker.
const FLOOR: u64 = 16;

/// Calls a chunk of a batch holds at most.
pub const BATCH_MAX: u64 = 128;

/// The chunks of a map of `n` elements over `workers` workers, as `(first element, length)`,
/// in element order, covering `0..n` once. `fixed`: every chunk that long (the last shorter).
pub fn plan(n: u64, workers: u64, fixed: Option<u64>) -> Vec<(u64, u64)> {
    let floor = n.div_ceil(FLOOR.saturating_mul(workers.max(1))).max(1);
    cut(n, workers, fixed, floor, u64::MAX)
}

/// The chunks of a batch of `n` calls (see the module docs), as [`plan`]'s.
pub fn batch(n: u64, workers: u64, fixed: Option<u64>) -> Vec<(u64, u64)> {
    cut(n, workers, fixed, 1, BATCH_MAX)
}

fn cut(n: u64, workers: u64, fixed: Option<u64>, floor: u64, max: u64) -> Vec<(u64, u64)> {
    let w = workers.max(1);
    let mut out = Vec::new();
    let mut at = 0;
    while at < n {
        let left = n - at;
        let len = match fixed {
            Some(f) => f.max(1),
            None => left
                .div_ceil(SHARE.saturating_mul(w))
                .clamp(floor, max.max(floor)),
        }
        .min(left);
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
    fn guided_chunks_cover_the_map_large_first() {
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
            assert!(
                c.windows(2)
                    .all(|p| p[0].1 >= p[1].1 || p[1].0 + p[1].1 == n)
            );
        }
        let c = plan(8000, 2, None);
        assert_eq!(c[0], (0, 1000), "the first chunk is a 1/(4w) share");
        let (last, rest) = c.split_last().unwrap();
        assert!(
            rest.iter().all(|&(_, l)| l >= 250),
            "none but the rest below 1/(16w) of the map"
        );
        assert!(last.1 <= 250);
        assert!(c.len() < 32, "{} chunks", c.len());
        assert_eq!(plan(40, 2, None)[0], (0, 5));
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
    fn a_fixed_size_is_kept() {
        let c = plan(10, 3, Some(4));
        assert_eq!(c, vec![(0, 4), (4, 4), (8, 2)]);
        covers(5, &plan(5, 2, Some(0)));
        covers(5, &plan(5, 0, None));
        assert_eq!(plan(3, 2, Some(u64::MAX)), vec![(0, 3)]);
    }
}
