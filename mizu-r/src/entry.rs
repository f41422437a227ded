//! Every function R calls (`.Call(wrap__<name>, ...)` from `pkg/R/`): the package's native
//! interface in one place, each entry forwarding to the module that implements it. What R sees
//! of each is documented here; the R API above them is documented in `pkg/man`.

use extendr_api::Result;
use extendr_api::prelude::*;

/// Collections of R's garbage this process ran for its views (young and full).
#[extendr]
fn view_collections() -> f64 {
    crate::altrep::view_collections()
}

/// Views in this process not finalized yet: `c(count, bytes)` (bytes as `account` counts them).
#[extendr]
fn view_live() -> Vec<f64> {
    crate::altrep::view_live()
}

/// Launches `program args… <token>` as the peer; returns once it attached.
#[extendr]
fn channel_launch(program: &str, args: Vec<String>, capacity: Robj, timeout: f64) -> Result<Robj> {
    crate::channel::channel_launch(program, args, capacity, timeout)
}

/// Attaches to the channel named by `token` (the peer's side).
#[extendr]
fn channel_attach(token: &str) -> Result<Robj> {
    crate::channel::channel_attach(token)
}

/// Sends values (a list) without blocking: `c(sent, status)`, the
/// status of the first message not sent (0 when all were; 1 full, 2 closed, 3 peer gone).
#[extendr]
fn channel_send_batch(ch: Robj, payloads: List) -> Result<Vec<i32>> {
    crate::channel::channel_send_batch(ch, payloads)
}

/// Waits at most `timeout` seconds (Inf: forever) for a message: `list(status, value)`
/// with status 0 message, 1 timeout, 2 closed, 3 peer gone, 8 interrupted (Ctrl-C).
#[extendr]
fn channel_recv(ch: Robj, timeout: f64) -> Result<List> {
    crate::channel::channel_recv(ch, timeout)
}

/// Marks the channel's peer as one of another language (messages cross as cross-language
/// values).
#[extendr]
fn channel_set_foreign(ch: Robj) -> Result<()> {
    crate::channel::channel_set_foreign(ch)
}

/// Closes this side: the peer reads what was sent, then sees the channel closed.
#[extendr]
fn channel_close(ch: Robj) -> Result<()> {
    crate::channel::channel_close(ch)
}

/// Closes, then waits up to `timeout` seconds for a launched peer to exit (killing it after
/// that): its exit code, or NA if it was killed or this end attached.
#[extendr]
fn channel_finish(ch: Robj, timeout: f64) -> Result<Option<i32>> {
    crate::channel::channel_finish(ch, timeout)
}

/// The launched peer's process id (NA when this end attached).
#[extendr]
fn channel_peer_pid(ch: Robj) -> Result<Option<f64>> {
    crate::channel::channel_peer_pid(ch)
}

/// Waits at most `timeout` seconds (Inf: forever) for the task's outcome (see `outcome`);
/// asked again, returns the same outcome. Inside a worker, waiting runs other tasks (nested
/// maps never deadlock).
#[extendr]
fn task_collect(task: Robj, timeout: Robj) -> Result<Robj> {
    crate::collect::task_collect(task, timeout)
}

/// Whether the task's outcome is ready to collect (or was collected).
#[extendr]
fn task_done(task: Robj) -> Result<bool> {
    crate::collect::task_done(task)
}

/// Whether the task was collected.
#[extendr]
fn task_collected(task: Robj) -> Result<bool> {
    crate::collect::task_collected(task)
}

/// Cancels the task if it has not started; whether it will never run.
#[extendr]
fn task_cancel(task: Robj) -> Result<bool> {
    crate::collect::task_cancel(task)
}

/// Waits until one of `tasks` that was not collected yet has an outcome: its 1-based
/// position, 0 after `timeout` seconds, -1 on Ctrl-C, -2 when every task was collected.
#[extendr]
fn task_wait_any(tasks: List, timeout: Robj) -> Result<i32> {
    crate::collect::task_wait_any(tasks, timeout)
}

/// Before collecting `tasks` in order (a map, `mizu_collect_all`): waits as
/// `mizu_pool::Ahead` does, from the first not collected yet; `stream` when each result is
/// shown as it comes (a progress bar). 1 when done waiting, 0 after `timeout` seconds, -1 on
/// Ctrl-C.
#[extendr]
fn tasks_wait_ahead(tasks: List, stream: bool, timeout: Robj) -> Result<i32> {
    crate::collect::tasks_wait_ahead(tasks, stream, timeout)
}

/// [`WRITTEN`], in bytes (as a double: R has no 64-bit integers).
#[extendr]
fn payload_bytes_written() -> f64 {
    crate::encode::payload_bytes_written()
}

/// The routines R calls through `.native_…` bindings: `list(submit = , submit_expr = ,
/// collect = , collect_value = , tasks_ok = , nop = )`.
#[extendr]
fn native_routines() -> List {
    crate::fast::native_routines()
}

/// TRUE when `expr` names something that is neither bound by `vars` (the task's named
/// values) nor a base function it calls — so the caller should look for its globals. A name
/// in call position found in base (and not redefined in the global environment: a user's own
/// `sum` is a global) is one the worker has too; any other name might be a global, and
/// `codetools` decides. Conservative: TRUE whenever unsure.
#[extendr]
fn may_use_globals(expr: Robj, vars: Robj) -> bool {
    crate::globals::may_use_globals(expr, vars)
}

/// Called when the package loads: registers the runtime's discard hook, and keeps the panics
/// that carry errors this crate returns (extendr turns a returned `Err` into a panic it
/// catches, and R sees an R error) from printing a Rust panic report. Genuine panics still
/// print.
#[extendr]
fn init_native() {
    crate::init_native()
}

/// Whether `f` is a closure whose body is byte code (compiled by `compiler::cmpfun` or R's
/// JIT); false for anything else.
#[extendr]
fn is_compiled(f: Robj) -> bool {
    crate::is_compiled(f)
}

/// Removes shared-memory names left by processes that are gone; returns them.
#[extendr]
fn prune() -> Result<Vec<String>> {
    crate::prune()
}

/// The shared-memory names this machine has under mizu's prefix.
#[extendr]
fn shm_names() -> Vec<String> {
    crate::shm_names()
}

/// The most workers a pool can have and the most task slots it can have (the runtime's
/// limits, which the R functions name in their errors).
#[extendr]
fn pool_limits() -> Vec<f64> {
    vec![
        mizu_pool::MAX_WORKERS as f64,
        f64::from(mizu_pool::MAX_SLOTS),
    ]
}

/// Nanoseconds for one cache line's round trip between CPUs `a` and `b` now (the median of 5
/// runs of 20 000): the floor under any shared-memory round trip, which the benchmarks print
/// beside theirs. It spins both CPUs for a while.
#[extendr]
fn line_round_trip_ns(a: i32, b: i32) -> Result<f64> {
    crate::line_round_trip_ns(a, b)
}

/// An output area for `n` results of `ptype`'s type: `list(handle, spec)`, the spec
/// (`list(token, descriptor, type code and count)`) to pass to every chunk task; NULL when
/// the results are not of a fixed-size type or would be smaller than a view's floor (the
/// caller then assembles them itself).
#[extendr]
fn out_new(pool: Robj, ptype: Robj, n: f64) -> Result<Robj> {
    crate::outvec::out_new(pool, ptype, n)
}

/// In a chunk task: writes `values` (the results of elements `start`, `start + 1`, ...) into
/// the output area `spec` names.
#[extendr]
fn out_write(spec: Robj, start: f64, values: Robj) -> Result<()> {
    crate::outvec::out_write(spec, start, values)
}

/// Of the caller's output area, once every chunk task finished: the results as a view.
#[extendr]
fn out_view(handle: Robj) -> Result<Robj> {
    crate::outvec::out_view(handle)
}

/// Starts a pool: `workers` processes `program args… <token> <slot>`; the failure
/// `c("interrupt", …)` if Ctrl-C came while they started (the R wrapper signals it).
#[allow(clippy::too_many_arguments)]
#[extendr]
fn pool_new(
    workers: i32,
    program: &str,
    args: Vec<String>,
    slots: i32,
    exec_timeout: f64,
    submit_timeout: f64,
    respawn: bool,
    foreign: bool,
) -> Result<Robj> {
    crate::pool::pool_new(
        workers,
        program,
        args,
        slots,
        exec_timeout,
        submit_timeout,
        respawn,
        foreign,
    )
}

/// The pool running the current task (see `mizu_current_pool()`).
#[extendr]
fn pool_nested() -> Result<Robj> {
    crate::pool::pool_nested()
}

/// `list(n_workers, nested, running, foreign)`.
#[extendr]
fn pool_info(pool: Robj) -> Result<List> {
    crate::pool::pool_info(pool)
}

/// Per worker: `list(slot, pid, state, busy, tasks, steals)` columns.
#[extendr]
fn pool_status(pool: Robj) -> Result<List> {
    crate::pool::pool_status(pool)
}

/// Stops the pool (queued tasks cancelled, running ones fail, uncollected results dropped);
/// idempotent; a no-op on the handle of `mizu_current_pool()`. What its workers left in shared
/// memory is removed.
#[extendr]
fn pool_stop(pool: Robj, grace: f64) -> Result<()> {
    crate::pool::pool_stop(pool, grace)
}

/// Makes R's hook draw from the stream of `(seed, index)` (0-based element index).
#[extendr]
fn rng_enter(seed: f64, index: f64) -> Result<()> {
    crate::rng::rng_enter(seed, index)
}

/// Forgets the current stream.
#[extendr]
fn rng_exit() {
    crate::rng::rng_exit()
}

/// The first `n` doubles of the stream of `(seed, index)` (tests and documentation).
#[extendr]
fn rng_stream(seed: f64, index: f64, n: i32) -> Result<Vec<f64>> {
    crate::rng::rng_stream(seed, index, n)
}

/// `NULL` when nothing in `x` is an environment or external pointer (see [`portability`]),
/// else the failure `c("mizu_error_not_portable", message)`, its place named after `what`
/// (e.g. "argument " or "`.x` element ").
#[extendr]
fn check_portable(x: Robj, what: &str) -> Robj {
    crate::sendable::check_portable(x, what)
}

/// Submits a chunk of a map over a pool of another language's workers: `call` a
/// `mizu_call()`, `vars` further keyword arguments (a named list), `elements` the chunk's
/// elements (a list; each is appended to the arguments), element `j` under the stream
/// `(seed, first + j)`. The task handle, or a failure `c(class, message)`.
#[extendr]
fn pool_submit_xchunk(
    pool: Robj,
    call: Robj,
    vars: Robj,
    elements: Robj,
    seed: Robj,
    first: f64,
) -> Result<Robj> {
    crate::submit::pool_submit_xchunk(pool, call, vars, elements, seed, first)
}

/// Submits a task message: the task (class `mizu_task`), or `c(class, message)` when it
/// cannot be submitted. When every task slot is taken, finished outcomes are moved into their
/// tasks first (and, if none is finished, it waits for one, up to the pool's submit timeout).
#[extendr]
fn pool_submit(pool: Robj, msg: Robj) -> Result<Robj> {
    crate::submit::pool_submit(pool, msg)
}

/// Submits several task messages with one publication per worker queue: `list(tasks,
/// failure)` where `failure` is NULL or `c(class, message)` for the rest.
#[extendr]
fn pool_submit_batch(pool: Robj, msgs: List) -> Result<List> {
    crate::submit::pool_submit_batch(pool, msgs)
}

/// How many task objects this process holds (a test hook: see `test-pool.R`).
#[extendr]
fn live_tasks() -> f64 {
    crate::task::live_tasks()
}

/// Encodes and decodes in this process (tests of the payload format and of views).
#[extendr]
fn codec_roundtrip(value: Robj) -> Result<Robj> {
    crate::values::codec_roundtrip(value)
}

/// `mizu_share()`: the value with every vector of 4 KiB or more (and every data frame of
/// such columns) copied once into shared memory of this process and read through views of
/// it, which travel by reference from then on (see `docs/r.md`, "Sharing data").
#[extendr]
fn share_value(value: Robj) -> Result<Robj> {
    crate::values::share_value(value)
}

/// When R exits: the names of the segments holding shared values go (processes still
/// reading them keep their mappings), so that nothing of this session's is left in /dev/shm
/// by values R never freed.
#[extendr]
fn release_shared() {
    crate::values::release_shared()
}

/// The payload bytes of a value (tests).
#[extendr]
fn codec_encode(value: Robj) -> Result<Raw> {
    crate::values::codec_encode(value)
}

/// The out-of-band vectors of a value's payload that travel as Arrow arrays, each as an
/// inline frame of the cross-language format (tests: Python reads them with
/// `pymizu.wire.loads`).
#[extendr]
fn codec_arrow_frames(value: Robj) -> Result<List> {
    crate::values::codec_arrow_frames(value)
}

/// The vector an inline frame of the cross-language format holding an Arrow array becomes
/// when it arrives out of band (tests: arrays written by Python).
#[extendr]
fn codec_arrow_read(frame: Raw) -> Result<Robj> {
    crate::values::codec_arrow_read(frame)
}

/// Unmaps the data segments kept mapped only for reuse (regions views still hold stay
/// mapped). Called when R exits, so that nothing of this process's outlives it.
#[extendr]
fn release_mappings() {
    crate::values::release_mappings()
}

/// Gives back now the data segments and mappings this process keeps only for reuse (they
/// would go after a few idle seconds).
#[extendr]
fn give_back_idle() {
    crate::values::give_back_idle()
}

/// The size of a value's payload (tests; nothing is shared).
#[extendr]
fn codec_size(value: Robj) -> Result<f64> {
    crate::values::codec_size(value)
}

/// Decodes arbitrary bytes as a payload (tests: malformed input gives an error).
#[extendr]
fn codec_decode(bytes: Raw) -> Result<Robj> {
    crate::values::codec_decode(bytes)
}

/// Whether `x` is a view whose elements are still the shared pages (not copied).
#[extendr]
fn view_is_shared(x: Robj) -> bool {
    crate::view::view_is_shared(x)
}

/// The data segment an unmodified view reads (its name), or NULL: what tests check to see
/// that a value crossed by reference.
#[extendr]
fn view_segment(x: Robj) -> Option<String> {
    crate::view::view_segment(x)
}

/// Where a view's shared pages are: `"<segment>+<region offset>"` (tests: two views of the
/// same region name the same place, two copies do not); NULL for anything else.
#[extendr]
fn view_region(x: Robj) -> Option<String> {
    crate::view::view_region(x)
}

/// Whether `x` is a mizu view.
#[extendr]
fn view_is_view(x: Robj) -> bool {
    crate::view::view_is_view(x)
}

/// Serves a pool as worker `slot` until it stops (see [`RExec`] for what runs each task); with
/// `max_tasks > 0` the worker leaves after that many tasks and the pool replaces it. `hands`
/// is `list(add, now)` (see [`handler_stack`]).
#[allow(clippy::too_many_arguments)]
#[extendr]
fn run_worker(
    token: &str,
    slot: i32,
    hands: Robj,
    dispatch: Function,
    failed: Function,
    with_warnings: Function,
    state: Robj,
    max_tasks: f64,
    xerror_parts: Function,
    xwarning_messages: Function,
) -> Result<()> {
    crate::worker::run_worker(
        token,
        slot,
        hands,
        dispatch,
        failed,
        with_warnings,
        state,
        max_tasks,
        xerror_parts,
        xwarning_messages,
    )
}

/// Called first by a starting worker: if the pool's owner dies before this worker joins
/// (while it loads the package or runs `init`), the worker exits instead of living on.
#[extendr]
fn exit_if_orphaned_while_starting() {
    crate::worker::exit_if_orphaned_while_starting()
}

/// Whether this process is running a task (inside a worker).
#[extendr]
fn in_task() -> bool {
    crate::worker::in_task()
}

/// The worker slot of this process while it runs a task (else NULL).
#[extendr]
fn worker_slot() -> Option<i32> {
    crate::worker::worker_slot()
}

/// `x` as the bytes of a cross-language value message (for the cross-language golden corpus).
#[extendr]
fn xlang_dumps(x: Robj) -> Result<Raw> {
    crate::xcall::xlang_dumps(x)
}

/// The R value of the bytes of a cross-language value message (as Python sends them); a
/// malformed one is an error.
#[extendr]
fn xlang_loads(b: Raw) -> Result<Robj> {
    crate::xcall::xlang_loads(b)
}

/// The bytes of a cross-language task calling `call` (over `elements`, a list, as a map
/// chunk; NULL for one task), for the fuzz harness.
#[extendr]
fn xlang_task_dumps(call: Robj, elements: Robj) -> Result<Raw> {
    crate::xcall::xlang_task_dumps(call, elements)
}

/// What an R worker makes of the bytes of a cross-language task (as Python sends them) —
/// the message it would dispatch — without running it; a malformed one is an error.
#[extendr]
fn xlang_task_loads(b: Raw) -> Result<Robj> {
    crate::xcall::xlang_task_loads(b)
}

/// The chunks of a map of `n` elements over `workers` workers (see `mizu_pool::chunks`):
/// `list(first, length, apart)`, 1-based firsts; `apart`: whether to submit the first round
/// before encoding the rest (`mizu_pool::chunks::first_round_apart`); `chunk_size` 0 for the
/// runtime's guided chunks.
#[extendr]
fn chunk_plan(n: f64, workers: f64, chunk_size: f64) -> List {
    let whole = |x: f64| {
        if x.is_finite() && x > 0.0 {
            x as u64
        } else {
            0
        }
    };
    let fixed = Some(whole(chunk_size)).filter(|&c| c > 0);
    let plan = mizu_pool::chunks::plan(whole(n), whole(workers), fixed);
    let first: Vec<f64> = plan.iter().map(|&(s, _)| (s + 1) as f64).collect();
    let len: Vec<f64> = plan.iter().map(|&(_, l)| l as f64).collect();
    let apart = mizu_pool::chunks::first_round_apart(whole(workers));
    List::from_values([Robj::from(first), Robj::from(len), Robj::from(apart)])
}

extendr_module! {
    mod entry;
    fn view_collections;
    fn view_live;
    fn channel_launch;
    fn channel_attach;
    fn channel_send_batch;
    fn channel_recv;
    fn channel_set_foreign;
    fn channel_close;
    fn channel_finish;
    fn channel_peer_pid;
    fn task_collect;
    fn task_done;
    fn task_collected;
    fn task_cancel;
    fn task_wait_any;
    fn tasks_wait_ahead;
    fn payload_bytes_written;
    fn native_routines;
    fn may_use_globals;
    fn init_native;
    fn is_compiled;
    fn prune;
    fn shm_names;
    fn line_round_trip_ns;
    fn pool_limits;
    fn out_new;
    fn out_write;
    fn out_view;
    fn pool_new;
    fn pool_nested;
    fn pool_info;
    fn pool_status;
    fn pool_stop;
    fn rng_enter;
    fn rng_exit;
    fn rng_stream;
    fn check_portable;
    fn pool_submit_xchunk;
    fn pool_submit;
    fn pool_submit_batch;
    fn live_tasks;
    fn codec_roundtrip;
    fn share_value;
    fn release_shared;
    fn codec_encode;
    fn codec_arrow_frames;
    fn codec_arrow_read;
    fn release_mappings;
    fn give_back_idle;
    fn codec_size;
    fn codec_decode;
    fn view_is_shared;
    fn view_segment;
    fn view_region;
    fn view_is_view;
    fn run_worker;
    fn exit_if_orphaned_while_starting;
    fn in_task;
    fn worker_slot;
    fn xlang_dumps;
    fn xlang_loads;
    fn xlang_task_dumps;
    fn xlang_task_loads;
    fn chunk_plan;
}
