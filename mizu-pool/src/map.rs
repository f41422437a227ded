//! Maps: the inputs are staged once in a map segment; one runner task per worker pulls
//! adaptive chunks off a shared cursor and runs every element through the executor; results
//! come back in input order — or are written straight into a typed output area; a failure stops
//! every element after it, and the smallest failing index is reported (deterministically, as a
//! sequential run would). The map's segment and the runners' results: `map_segment`.

use std::sync::Arc;
use std::time::Duration;

use arrow_buffer::Buffer;
use mizu_shm::Segment;
use mizu_shm::sync::Ordering;

use crate::context::{Executor, TaskContext, execute_current};
use crate::error::{PoolError, TaskError};
use crate::layout::wstate;
use crate::map_segment::{self, MAP_KIND, MapInputs};
use crate::submitter::{CollectError, SubmitterCore, Task};

/// How often a waiting map asks its caller whether to stop.
const STOP_POLL: Duration = Duration::from_millis(20);
/// Payload prefix of a runner task (the runtime runs it; executors never see it).
pub const RUNNER_MAGIC: &[u8] = b"\x00mizu-map-runner\x00";

/// How a map runs.
#[derive(Debug, Clone, Default)]
pub struct MapOptions {
    /// A fixed chunk size; `None` chooses chunks adaptively (large first, smaller towards the
    /// end, so runners finish together).
    pub chunk: Option<usize>,
    /// Each result is exactly this many bytes and is written straight into one output buffer
    /// (returned as [`MapOutput::Typed`]).
    pub typed_output: Option<usize>,
    /// Give up waiting after this long (the runners are cancelled).
    pub timeout: Option<Duration>,
}

/// A map's results.
#[derive(Debug)]
pub enum MapOutput {
    /// One buffer per element, in input order.
    List(Vec<Buffer>),
    /// All results back to back (`n * typed_output` bytes), in input order, viewed in place.
    Typed(Buffer),
}

/// Why a map failed.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// Element `index` failed; the elements not yet started were skipped.
    #[error("element {index} failed: {error}")]
    Element {
        /// The element's input position.
        index: usize,
        /// What went wrong.
        error: TaskError,
    },
    /// The map could not run (no workers, storage, timeout, ...).
    #[error("map failed: {0}")]
    Pool(String),
    /// The caller asked to stop (`stop` returned true): elements not started were skipped.
    #[error("map stopped by the caller")]
    Stopped,
}

fn runner_payload(token: &str) -> Vec<u8> {
    let mut p = RUNNER_MAGIC.to_vec();
    p.extend_from_slice(token.as_bytes());
    p
}

/// Runs `f`'s elements over the pool's workers (see the module docs). `help` is called while
/// waiting (nested maps run other tasks meanwhile); `stop` every [`STOP_POLL`], and once it
/// returns true the elements not started yet are skipped and the map ends
/// with [`MapError::Stopped`].
pub(crate) fn map(
    core: &Arc<SubmitterCore>,
    inputs: &[&[u8]],
    opts: &MapOptions,
    help: &mut dyn FnMut() -> bool,
    stop: &mut dyn FnMut() -> bool,
) -> Result<MapOutput, MapError> {
    let pool_err = |e: &dyn std::fmt::Display| MapError::Pool(e.to_string());
    let n = inputs.len();
    if n == 0 {
        return Ok(match opts.typed_output {
            Some(_) => MapOutput::Typed(Buffer::from_vec(Vec::<u8>::new())),
            None => MapOutput::List(Vec::new()),
        });
    }
    let elem = opts.typed_output.unwrap_or(0);
    let v = core.shared().view();
    let live = (0..v.params.max_workers as usize)
        .filter(|&w| wstate::coming(v.worker(w).rec.state.load(Ordering::Acquire)))
        .count()
        .max(1);
    let runners = live.min(n);
    let seg = map_segment::stage(inputs, opts.chunk.unwrap_or(0) as u64, elem, runners)
        .map_err(|e| pool_err(&e))?;
    let ctl = map_segment::control(&seg).map_err(|e| pool_err(&e))?;
    let payload = runner_payload(seg.token());
    let mut tasks: Vec<Task> = (0..runners)
        .map(|_| core.submit(&payload, None))
        .collect::<Result<_, _>>()
        .map_err(|e| pool_err(&e))?;
    let mut results = Vec::with_capacity(runners);
    let mut failure: Option<MapError> = None;
    let mut stopped = false;
    let start = std::time::Instant::now();
    for t in &mut tasks {
        // Waits in slices, asking `stop` between them.
        let r = loop {
            let left = opts.timeout.map(|d| d.saturating_sub(start.elapsed()));
            let slice = left.map_or(STOP_POLL, |l| l.min(STOP_POLL));
            match t.result_helping(Some(slice), help) {
                Err(CollectError::Timeout) if left.is_none_or(|l| l > slice) => {
                    if !stopped && stop() {
                        stopped = true;
                        ctl.cancel();
                    }
                }
                other => break other,
            }
        };
        match r {
            Ok(b) => results.push(b),
            Err(e) => {
                ctl.cancel();
                if failure.is_none() {
                    failure = Some(match e {
                        CollectError::Task(te) => MapError::Element {
                            index: ctl.handed_out() as usize,
                            error: te,
                        },
                        other => MapError::Pool(other.to_string()),
                    });
                }
            }
        }
    }
    let _ = seg.unlink();
    if stopped {
        return Err(MapError::Stopped);
    }
    let read = map_segment::read_results(&results, n, elem).map_err(MapError::Pool)?;
    let (out, first) = (read.values, read.first_error);
    if let Some((index, bytes)) = first {
        return Err(MapError::Element {
            index,
            error: TaskError::Failed(bytes),
        });
    }
    if let Some(f) = failure {
        return Err(f);
    }
    match opts.typed_output {
        Some(_) => {
            let e3 = seg.extent(3).map_err(|e| pool_err(&e))?;
            let seg = Arc::new(seg);
            // SAFETY: the output extent lies inside the mapping, which the Arc keeps alive as
            // the buffer's owner; every runner has finished writing it.
            let ptr = std::ptr::NonNull::new(unsafe { seg.as_ptr().add(e3.offset as usize) })
                .expect("non-null");
            // SAFETY: as above; the bytes are not written again.
            let buf = unsafe { Buffer::from_custom_allocation(ptr, n * elem, seg) };
            Ok(MapOutput::Typed(buf))
        }
        None => out
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                b.ok_or_else(|| MapError::Pool(format!("element {i} produced no result")))
            })
            .collect::<Result<_, _>>()
            .map(MapOutput::List),
    }
}

/// A worker's executor as the pool runs it: a map's runner tasks are run here, element by
/// element through the binding's executor; every other task goes to that executor as it is.
pub(crate) struct Runner<'e>(pub(crate) &'e dyn Executor);

impl Executor for Runner<'_> {
    fn execute(&self, ctx: &TaskContext<'_>, input: &[u8]) -> Result<Vec<u8>, Vec<u8>> {
        let Some(token) = input.strip_prefix(RUNNER_MAGIC) else {
            return self.0.execute(ctx, input);
        };
        // The elements' outcomes travel in the runner's result: none writes it in place.
        ctx.slot.set(None);
        ctx.input.borrow_mut().take();
        run_runner(self.0, ctx, token)
    }

    fn idle(&self) {
        self.0.idle();
    }

    fn stream_start(&self) {
        self.0.stream_start();
    }

    fn stream_end(&self) {
        self.0.stream_end();
    }
}

impl TaskContext<'_> {
    /// Runs a nested map over the pool from inside a task, helping while it waits.
    pub fn map(&self, inputs: &[&[u8]], opts: &MapOptions) -> Result<MapOutput, MapError> {
        map(self.sub, inputs, opts, &mut || (self.help)(), &mut || false)
    }
}

/// Runs a map runner task inside a worker (see the module docs).
fn run_runner(
    exec: &dyn Executor,
    ctx: &TaskContext<'_>,
    token: &[u8],
) -> Result<Vec<u8>, Vec<u8>> {
    let token = std::str::from_utf8(token).map_err(|_| b"mizu: bad map token".to_vec())?;
    let seg = Segment::open(token, MAP_KIND)
        .map_err(|e| format!("mizu: cannot open map: {e}").into_bytes())?;
    let map = MapInputs::open(&seg).map_err(|e| format!("mizu: {e}").into_bytes())?;
    let ctl = map.control();
    let mut out = Vec::new();
    'chunks: while let Some(chunk) = ctl.next_chunk() {
        for i in chunk {
            if !ctl.may_run(i) {
                break 'chunks;
            }
            let input = map
                .input(i)
                .map_err(|e| format!("mizu: {e}").into_bytes())?;
            ctx.set_element(Some(i));
            let r = execute_current(exec, ctx, &input);
            ctx.set_element(None);
            match r {
                Ok(res) if map.elem() > 0 => {
                    if let Err(e) = map.write_output(i, &res) {
                        ctl.fail(i);
                        map_segment::push_result(
                            &mut out,
                            i,
                            false,
                            format!("mizu: {e}").as_bytes(),
                        );
                        break 'chunks;
                    }
                }
                Ok(res) => map_segment::push_result(&mut out, i, true, &res),
                Err(e) => {
                    ctl.fail(i);
                    map_segment::push_result(&mut out, i, false, &e);
                    break 'chunks;
                }
            }
        }
    }
    Ok(out)
}

impl From<PoolError> for MapError {
    fn from(e: PoolError) -> Self {
        MapError::Pool(e.to_string())
    }
}
