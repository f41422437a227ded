//! How big the parts of a pool segment are, for a number of worker slots: the settings a
//! binding gives, scaled down where they would make the segment grow faster than the workers.
//!
//! A pool's segment lives in `/dev/shm`, which a container often caps at 64 MiB, and
//! `Pool()` defaults to one worker per CPU. Taken as given, the settings make the workers' own
//! rows of the ring matrix grow with the square of the workers, and every worker record's own
//! slots and wide slots add as much again: 256 worker slots would take 124 MB, and the pool
//! could not be made. Here every part grows at most linearly: a worker's own row reaches
//! [`NESTED_RING_SPAN`] workers, the workers' own records share a budget of slots
//! ([`NESTED_SLOTS_TOTAL`]), and the rings of the other rows one of queued ids
//! ([`RING_IDS_PER_ROW`]). With Python's 4 096 slots: up to 8 workers the settings are taken
//! as given (8.6 MB for 2); 64 take 15.6 MB, 256 18.2 MB, 1 024 37.4 MB.

/// Ring capacity of the workers' own rows of the ring matrix: their nested tasks go to their
/// own deques, and to rings only when the deque is full or from another thread.
pub(crate) const NESTED_RING_CAPACITY: u32 = 16;

/// Rings in a worker's own row (itself and the workers after it). Its nested tasks reach every
/// other worker by stealing from its deque; the rings only take what the deque cannot, or
/// what another thread of the task submits.
pub(crate) const NESTED_RING_SPAN: u32 = 8;

/// Task slots of the workers' own records together, beyond which each has fewer than
/// `PoolConfig::nested_slots` (down to [`MIN_NESTED_SLOTS`]): at 384 bytes a slot, 3 MB. A
/// worker whose nested tasks fill its record's slots waits for room while running them, so
/// fewer slots cost no parallelism in a pool that has many workers to run them.
const NESTED_SLOTS_TOTAL: u32 = 8192;

/// The fewest slots a worker's own record is given.
const MIN_NESTED_SLOTS: u32 = 16;

/// Nested slots per wide one: a worker's own record has one wide slot per this many slots
/// (16 of the default 256), at least one.
const NESTED_SLOTS_PER_WIDE: u32 = 16;

/// Queued task ids of a controller's or attached submitter's row together, beyond which its
/// rings hold fewer than `PoolConfig::ring_capacity` (down to [`MIN_RING_CAPACITY`]): a
/// submitter has at most its slots in flight, a few thousand, however many rings share them.
const RING_IDS_PER_ROW: u32 = 16384;

/// The fewest ids a ring of a controller's or attached submitter's row holds.
const MIN_RING_CAPACITY: u32 = 64;

/// The sizes that scale with a pool's worker slots.
pub(crate) struct Scaled {
    /// Task slots of each worker's own record.
    pub nested_slots: u32,
    /// Wide slots among them.
    pub nested_wide_slots: u32,
    /// Ring capacity of the controller's and attached submitters' rows.
    pub ring_capacity: u32,
    /// Ring capacity of the workers' own rows.
    pub nested_ring_capacity: u32,
    /// Rings in each worker's own row.
    pub nested_ring_span: u32,
}

/// The sizes for `max_workers` worker slots (at least 1), given the pool's `slots` and the
/// settings asked for: `nested_slots`, `wide_slots` and `ring_capacity` (see `PoolConfig`).
pub(crate) fn scaled(
    max_workers: u32,
    slots: u32,
    nested_slots: u32,
    wide_slots: u32,
    ring_capacity: u32,
) -> Scaled {
    let w = max_workers.max(1);
    let nested_slots = nested_slots
        .min(slots)
        .min((NESTED_SLOTS_TOTAL / w).max(MIN_NESTED_SLOTS));
    let ring_capacity = ring_capacity.min(
        (RING_IDS_PER_ROW / w)
            .next_power_of_two()
            .max(MIN_RING_CAPACITY),
    );
    Scaled {
        nested_slots,
        nested_wide_slots: wide_slots
            .min((nested_slots / NESTED_SLOTS_PER_WIDE).max(1))
            .min(nested_slots),
        ring_capacity,
        nested_ring_capacity: ring_capacity.min(NESTED_RING_CAPACITY),
        nested_ring_span: w.min(NESTED_RING_SPAN),
    }
}
