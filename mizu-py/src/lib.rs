//! `pymizu._native`: the thin PyO3 layer over `mizu-pool`. The runtime logic lives in the Rust
//! crates; this module converts types, lays out Python payloads (pickle + out-of-band buffers
//! in shared memory), releases the GIL around every wait, and runs Python callables as a
//! worker's executor. The Python API (`Pool`, `PoolExecutor`, ...) is in `python/pymizu`.

mod alloc;
mod cell;
mod channel;
mod codec;
mod cursor;
mod elements;
mod fastcall;
mod future;
mod future_slots;
mod gc;
mod kept;
mod ndarray;
mod payload;
mod pending;
mod pool;
mod pool_class;
mod registry;
mod repeats;
mod shmbuf;
mod signal;
mod small;
mod small_read;
mod spill;
mod task;
mod task_outcome;
mod waits;
mod watch;
mod wire;
mod worker;
mod xarray;
mod xlang;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The allocator of this module's own (Rust) allocations (see `alloc.rs`).
#[global_allocator]
static ALLOC: alloc::Mimalloc = alloc::Mimalloc;

pyo3::create_exception!(
    pymizu._native,
    MizuError,
    PyRuntimeError,
    "Base class of every pymizu error."
);
pyo3::create_exception!(
    pymizu._native,
    SlotsFull,
    MizuError,
    "Every task slot is in use until some results are collected."
);
pyo3::create_exception!(
    pymizu._native,
    StoppedError,
    MizuError,
    "The pool was stopped."
);
pyo3::create_exception!(
    pymizu._native,
    ForkedError,
    MizuError,
    "A pymizu handle was used in a forked child process."
);

fn err(e: impl std::fmt::Display) -> PyErr {
    MizuError::new_err(e.to_string())
}

/// Refuses handles inherited through `fork()`: the child does not own the parent's pool.
fn forked(origin: mizu_pool::Origin) -> PyResult<()> {
    origin.check().map_err(|_| {
        ForkedError::new_err(
            "this pymizu object belongs to the parent process; a forked child cannot use it \
             (create a new Pool in the child)",
        )
    })
}

/// A wait in seconds from Python: `None` (or an infinite or unrepresentably long time) waits
/// forever, a negative one does not wait; NaN is refused.
fn wait_secs(t: Option<f64>, what: &str) -> PyResult<Option<std::time::Duration>> {
    match t {
        None => Ok(None),
        Some(t) if t.is_nan() => Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{what} must be a number of seconds, not NaN"
        ))),
        Some(t) => Ok(std::time::Duration::try_from_secs_f64(t.max(0.0)).ok()),
    }
}

/// [`wait_secs`] for a bound that must be finite: an infinite one becomes a day.
fn bounded_secs(t: f64, what: &str) -> PyResult<std::time::Duration> {
    Ok(wait_secs(Some(t), what)?
        .unwrap_or(std::time::Duration::from_secs(86_400))
        .min(std::time::Duration::from_secs(86_400)))
}

/// The first 64-bit word of the random stream of map element `index` under `seed` (seeds the
/// stdlib `random` module per element).
#[pyfunction]
fn stream_word(seed: u64, index: u64) -> u64 {
    mizu_rng::element_stream(seed, index).next_u64()
}

/// Removes shared-memory names left by processes that are gone; returns them.
/// The chunks of a map of `n` elements over `workers` workers, `(first, length)` each (see
/// `mizu_pool::chunks`); `chunksize` fixes their size.
#[pyfunction]
#[pyo3(signature = (n, workers, chunksize=None))]
fn chunk_plan(n: u64, workers: u64, chunksize: Option<u64>) -> Vec<(u64, u64)> {
    mizu_pool::chunks::plan(n, workers, chunksize)
}

#[pyfunction]
fn prune() -> PyResult<Vec<String>> {
    mizu_pool::machine::prune().map_err(err)
}

/// Nanoseconds for one cache line's round trip between CPUs `a` and `b` now (the median of 5
/// runs of `rounds`): the floor under any shared-memory round trip, which benchmarks print
/// beside theirs. It spins both CPUs for a while (the GIL is released).
#[pyfunction]
#[pyo3(signature = (a=0, b=1, rounds=20_000))]
fn line_round_trip_ns(py: Python<'_>, a: usize, b: usize, rounds: u64) -> PyResult<f64> {
    py.detach(|| mizu_pool::machine::line_round_trip(a, b, rounds.clamp(1, 10_000_000), 5))
        .map_err(err)
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // Payloads the runtime discards unread give back the regions their arrays refer to.
    mizu_pool::set_discard_hook(codec::release_refs);
    // A full `/dev/shm`: what Python's garbage holds (views of earlier values, copies kept
    // for arrays sent again) goes before the runtime gives up.
    mizu_pool::set_pressure_hook(pool::relieve_pressure);
    // The copies kept for arrays sent again go at exit, even of pools never stopped.
    py.import("atexit")?
        .call_method1("register", (wrap_pyfunction!(repeats::release_all, m)?,))?;
    m.add("MizuError", py.get_type::<MizuError>())?;
    m.add("SlotsFull", py.get_type::<SlotsFull>())?;
    m.add("StoppedError", py.get_type::<StoppedError>())?;
    m.add("ForkedError", py.get_type::<ForkedError>())?;
    m.add("MAX_WORKERS", mizu_pool::MAX_WORKERS)?;
    m.add("MAX_SLOTS", mizu_pool::MAX_SLOTS)?;
    m.add_class::<pool_class::Pool>()?;
    m.add_class::<task::Task>()?;
    m.add_class::<watch::Watch>()?;
    m.add_class::<signal::Signal>()?;
    m.add_class::<pending::PendingSet>()?;
    m.add_class::<elements::Elements>()?;
    m.add_class::<shmbuf::ShmBuffer>()?;
    m.add_class::<channel::Channel>()?;
    m.add_class::<wire::ArrowArray>()?;
    m.add_class::<wire::ArrowTable>()?;
    m.add_function(wrap_pyfunction!(wire::wire_dumps, m)?)?;
    m.add_function(wrap_pyfunction!(wire::wire_loads, m)?)?;
    m.add_function(wrap_pyfunction!(xlang::xlang_dumps, m)?)?;
    m.add_function(wrap_pyfunction!(xlang::xlang_loads, m)?)?;
    m.add_function(wrap_pyfunction!(xlang::xlang_task_loads, m)?)?;
    m.add_function(wrap_pyfunction!(xlang::xlang_task_dumps, m)?)?;
    m.add_function(wrap_pyfunction!(kept::still_held, m)?)?;
    m.add_function(wrap_pyfunction!(waits::wait_any, m)?)?;
    m.add_function(wrap_pyfunction!(waits::wait_ahead, m)?)?;
    m.add_function(wrap_pyfunction!(waits::collect_all, m)?)?;
    m.add_function(wrap_pyfunction!(worker::run_worker, m)?)?;
    m.add_function(wrap_pyfunction!(worker::in_task, m)?)?;
    m.add_function(wrap_pyfunction!(worker::run_calls, m)?)?;
    m.add_function(wrap_pyfunction!(worker::run_batch_calls, m)?)?;
    m.add_function(wrap_pyfunction!(worker::current_element, m)?)?;
    m.add_function(wrap_pyfunction!(worker::nested_submit, m)?)?;
    m.add_function(wrap_pyfunction!(worker::nested_submit_batch, m)?)?;
    m.add_function(wrap_pyfunction!(
        worker::exit_if_orphaned_while_starting,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(worker::nested_submit_small, m)?)?;
    m.add_function(wrap_pyfunction!(worker::decode_payload, m)?)?;
    m.add_function(wrap_pyfunction!(worker::small_dumps, m)?)?;
    m.add_function(wrap_pyfunction!(worker::small_loads, m)?)?;
    m.add_function(wrap_pyfunction!(stream_word, m)?)?;
    m.add_function(wrap_pyfunction!(prune, m)?)?;
    m.add_function(wrap_pyfunction!(chunk_plan, m)?)?;
    m.add_function(wrap_pyfunction!(codec::share_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(codec::shared_empty, m)?)?;
    m.add_function(wrap_pyfunction!(xlang::share_ndarray, m)?)?;
    m.add_function(wrap_pyfunction!(codec::shared_region, m)?)?;
    m.add_function(wrap_pyfunction!(codec::release_shared, m)?)?;
    m.add_function(wrap_pyfunction!(line_round_trip_ns, m)?)?;
    m.add_function(wrap_pyfunction!(future::install_future_result, m)?)?;
    m.add_function(wrap_pyfunction!(future::new_future, m)?)?;
    m.add_function(wrap_pyfunction!(future::settle_done, m)?)?;
    m.add_function(wrap_pyfunction!(future::settle_watched, m)?)?;
    m.add_function(wrap_pyfunction!(gc::gc_track, m)?)?;
    Ok(())
}
