//! `Pool` and `Task`: the caller's side. Every wait releases the GIL and checks for signals
//! (Ctrl-C) in bounded slices.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{OnceLock, RwLock};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyTuple, PyType};

use mizu_pool::retry::{MakeRoom, retrying};
use mizu_pool::{Fill, Launcher, PoolConfig, PoolError};

use crate::cell::SLICE;
use crate::codec::Outgoing;
use crate::pool_class::{ExecutorHooks, Pool};
use crate::registry::Registry;
use crate::small::Args;
use crate::task::Task;
use crate::{SlotsFull, err, forked};

/// Payloads up to this size are submitted without releasing the GIL first (when a queue has
/// room): releasing and retaking it costs more than writing them.
const HOT_SUBMIT_MAX: usize = 64 << 10;

/// One worker in `Pool.status()`: (slot, pid, state, busy, tasks run, steals).
type WorkerRow = (usize, u32, String, bool, u64, u64);

pub(crate) fn submit_error(e: PoolError) -> PyErr {
    match e {
        PoolError::SlotsExhausted(_) => SlotsFull::new_err(e.to_string()),
        e => err(e),
    }
}

/// pymizu's part in the submit policy (`mizu_pool::retry`): waits go in slices with Ctrl-C
/// checked between them; a full set of slots is drained into the `Task` objects; a full
/// `/dev/shm` runs Python's garbage collector. A small payload is first tried with the GIL
/// held and no wait (`hot`).
struct Room<'py, 'a> {
    py: Python<'py>,
    tasks: &'a Registry,
    hot: bool,
}

impl MakeRoom for Room<'_, '_> {
    type Error = PyErr;

    fn slice(&mut self) -> Duration {
        if self.hot { Duration::ZERO } else { SLICE }
    }

    fn waited(&mut self) -> PyResult<()> {
        if std::mem::replace(&mut self.hot, false) {
            return Ok(());
        }
        self.py.check_signals()
    }

    fn drain(&mut self) -> PyResult<()> {
        let tasks = self.tasks;
        self.py.detach(|| tasks.drain());
        self.py.check_signals()
    }

    fn fail(&mut self, e: PoolError) -> PyErr {
        submit_error(e)
    }
}

/// Submits with `f(timeout)` under the submit policy ([`Room`]).
pub(crate) fn submit_draining(
    py: Python<'_>,
    tasks: &Registry,
    nested: bool,
    size: usize,
    f: impl Fn(Option<Duration>) -> mizu_pool::Result<mizu_pool::Task> + Sync,
) -> PyResult<Task> {
    let mut room = Room {
        py,
        tasks,
        hot: size <= HOT_SUBMIT_MAX,
    };
    let t = retrying(&mut room, |slice| {
        if slice.is_zero() {
            f(Some(slice))
        } else {
            py.detach(|| f(Some(slice)))
        }
    });
    crate::spill::warn_if_spilled(py);
    Ok(Task::new(t?, tasks, nested))
}

/// The pressure hook (`mizu_pool::set_pressure_hook`): `/dev/shm` is full even after the wait
/// for room, so the views Python's garbage still holds (results of earlier tasks kept by
/// reference cycles until the next full collection) are let go.
pub(crate) fn relieve_pressure() {
    Python::attach(collect_garbage);
}

pub(crate) fn collect_garbage(py: Python<'_>) {
    if let Err(e) = py.import("gc").and_then(|gc| gc.call_method0("collect")) {
        e.write_unraisable(py, None);
    }
}

/// Submits every payload, with one publication per worker queue for each run of them, under
/// the submit policy ([`Room`]). Tasks submitted before a failure keep running; their handles
/// are dropped (abandoned).
pub(crate) fn submit_all_draining<T: Sync>(
    py: Python<'_>,
    tasks: &Registry,
    nested: bool,
    outs: &[T],
    f: impl Fn(&[T], Duration) -> (Vec<mizu_pool::Task>, mizu_pool::Result<()>) + Sync,
) -> PyResult<Vec<Task>> {
    let mut done = Vec::with_capacity(outs.len());
    if outs.is_empty() {
        return Ok(done);
    }
    let mut room = Room {
        py,
        tasks,
        hot: false,
    };
    let r = retrying(&mut room, |slice| {
        let (ts, r) = py.detach(|| f(&outs[done.len()..], slice));
        done.extend(ts.into_iter().map(|t| Task::new(t, tasks, nested)));
        r
    });
    crate::spill::warn_if_spilled(py);
    r?;
    Ok(done)
}

/// Calls of a batch published together (`submit_calls`).
const CALLS_PER_PUBLICATION: usize = 128;

/// One call of a batch, written natively or pickled.
enum CallFill<'a> {
    Small(&'a crate::small::Payload),
    Pickled(Outgoing<'a>),
}

impl Fill for CallFill<'_> {
    fn size(&self) -> usize {
        match self {
            CallFill::Small(p) => p.size(),
            CallFill::Pickled(o) => o.size(),
        }
    }

    fn fill(&self, out: &mut [u8]) {
        match self {
            CallFill::Small(p) => p.fill(out),
            CallFill::Pickled(o) => o.fill(out),
        }
    }
}

impl Pool {
    fn with<T>(&self, f: impl FnOnce(&mizu_pool::Pool) -> PyResult<T>) -> PyResult<T> {
        forked(self.origin)?;
        let g = self.inner.read().map_err(err)?;
        let pool = g
            .as_ref()
            .ok_or_else(|| crate::StoppedError::new_err("the pool is stopped"))?;
        f(pool)
    }
}

impl Pool {
    /// `submit_call` of arguments given as [`Args`].
    pub(crate) fn submit_call_of<'py>(
        slf: &Bound<'py, Self>,
        fn_: &Bound<'py, PyAny>,
        args: Args<'_, 'py>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, Task>> {
        let (py, this) = (slf.py(), slf.get());
        match crate::small::call_payload_of(fn_, args, kwargs, Some(this.id))? {
            crate::small::CallPayload::Small(payload) => this
                .with(|pool| {
                    submit_draining(py, &this.tasks, false, payload.len(), |t| {
                        pool.submit_with(&payload, t)
                    })
                })?
                .kept(slf.as_any())
                .untracked(py),
            crate::small::CallPayload::Pickled(call) => {
                Pool::submit_out(slf, &call.outgoing()?)?.untracked(py)
            }
        }
    }

    /// `PoolExecutor.submit` of arguments given as [`Args`]: the future is the executor's
    /// class, made without `__init__`, holding the task and the executor's state; a call that
    /// cannot be pickled gives an already failed future; a refused submission raises what the
    /// state's `refuse()` says.
    pub(crate) fn submit_future_of(
        slf: &Bound<'_, Self>,
        fn_: &Bound<'_, PyAny>,
        args: Args<'_, '_>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let h = slf
            .get()
            .executor
            .get()
            .ok_or_else(|| crate::MizuError::new_err("this pool serves no executor"))?;
        let st = h.state.bind(py);
        let accepting = || slf.get().accepting.load(Ordering::SeqCst);
        let refuse = || match st.call_method0(pyo3::intern!(py, "refuse")) {
            Ok(e) => PyErr::from_value(e),
            Err(e) => e,
        };
        if !accepting() {
            return Err(refuse());
        }
        let task = match Pool::submit_call_of(slf, fn_, args, kwargs) {
            Ok(t) => t,
            Err(e) if e.is_instance_of::<crate::MizuError>(py) => {
                if !st.getattr(pyo3::intern!(py, "broken"))?.is_none() {
                    return Err(refuse());
                }
                return Err(e);
            }
            // Not picklable: fails through its future, as with ProcessPoolExecutor (which
            // starts a worker for it all the same).
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyException>(py) => {
                slf.get().with(|p| {
                    p.submission_failed();
                    Ok(())
                })?;
                return h.failed.call1(py, (e.into_value(py),));
            }
            Err(e) => return Err(e),
        };
        // (A task refers to nothing that refers to the future: it stays untracked.)
        let fut = crate::future::make_future(h.cls.bind(py), task.as_any())?;
        // SAFETY: `bind_executor` stores a `PendingSet` there and nothing else.
        let pending = unsafe {
            h.pending
                .bind(py)
                .cast_unchecked::<crate::pending::PendingSet>()
        };
        pending.get().insert_of(&fut, task.get())?;
        // A shutdown that began meanwhile either saw the future (and settles it) or is seen
        // here (and the submission is withdrawn).
        if !accepting() {
            pending.get().remove_of(&fut, task.get());
            task.call_method0(pyo3::intern!(py, "cancel"))?;
            return Err(refuse());
        }
        Ok(fut.unbind())
    }

    /// Submits a payload, giving the task before Python sees it.
    fn submit_out(slf: &Bound<'_, Self>, out: &Outgoing<'_>) -> PyResult<Task> {
        let py = slf.py();
        let this = slf.get();
        this.with(|pool| {
            submit_draining(py, &this.tasks, false, out.size(), |t| {
                pool.submit_with(out, t)
            })
        })
        .map(|t| t.kept(slf.as_any()))
    }

    /// Submits a pickled call (`pymizu._codec.dumps_call`'s `(pickle, buffers, head)`),
    /// returning the runtime's handle (the chunk that replaces a cancelled one, see
    /// `Task::cancel`).
    pub(crate) fn submit_handle(
        slf: &Bound<'_, Self>,
        call: &crate::small::PickledCall<'_>,
    ) -> PyResult<mizu_pool::Task> {
        Pool::submit_out(slf, &call.outgoing()?)?
            .into_handle()
            .ok_or_else(|| crate::MizuError::new_err("pymizu: the chunk could not be resubmitted"))
    }
}

#[pymethods]
impl Pool {
    /// `start`: the workers started now, the others (up to `workers`) as work needs them
    /// (`PoolConfig::on_demand`); `None` starts them all now.
    #[new]
    #[pyo3(signature = (workers, python, args, exec_timeout=None, slots=4096, spin_us=None, start=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        workers: usize,
        python: String,
        args: Vec<String>,
        exec_timeout: Option<f64>,
        slots: u32,
        spin_us: Option<u64>,
        start: Option<usize>,
    ) -> PyResult<Self> {
        let exec_timeout = exec_timeout
            .map(Duration::try_from_secs_f64)
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("exec_timeout: {e}")))?;
        let start = start.unwrap_or(workers).clamp(1, workers.max(1));
        let mut cfg = PoolConfig {
            workers: start,
            max_workers: workers,
            on_demand: start < workers,
            slots,
            exec_timeout,
            ..Default::default()
        };
        // Python tasks take tens of microseconds on each side: spin long enough to bridge one
        // (the runtime's default suits native tasks). Spinning idle workers are capped at the
        // CPU count minus one by the runtime.
        cfg.spin = Duration::from_micros(spin_us.unwrap_or(250));
        cfg.validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let launcher = Launcher::new(python, args);
        // Workers import the caller's script, which can take seconds: Ctrl-C meanwhile stops
        // them and raises here.
        let mut signal = None;
        let pool = py.detach(|| {
            mizu_pool::Pool::new_interruptible(cfg, launcher, &mut || {
                signal = Python::attach(|py| py.check_signals().err());
                signal.is_none()
            })
        });
        let pool = match (pool, signal) {
            (Err(PoolError::Interrupted), Some(e)) => return Err(e),
            (p, _) => p.map_err(err)?,
        };
        Ok(Pool {
            id: pool.id(),
            inner: RwLock::new(Some(pool)),
            origin: mizu_pool::Origin::here(),
            tasks: Registry::default(),
            executor: OnceLock::new(),
            accepting: AtomicBool::new(true),
        })
    }

    /// Submits a pickled call and its out-of-band buffers (copied once, into shared memory):
    /// `pymizu._codec.dumps_call`'s `(pickle, buffers, head)`. When every task slot holds an
    /// uncollected task, finished outcomes are moved into their `Task` objects to make room
    /// (or it waits for a task to finish).
    #[pyo3(signature = (pickle, buffers=None, head=None))]
    fn submit<'py>(
        slf: &Bound<'py, Self>,
        pickle: &[u8],
        buffers: Option<&Bound<'py, PyAny>>,
        head: Option<&[u8]>,
    ) -> PyResult<Bound<'py, Task>> {
        let py = slf.py();
        let none = py.None().into_bound(py);
        let bufs = buffers.unwrap_or(&none);
        let out = match head {
            Some(h) => Outgoing::call(py, h, pickle, bufs)?,
            None => Outgoing::new(py, pickle, bufs)?,
        };
        Pool::submit_out(slf, &out)?.untracked(py)
    }

    /// Submits a call of the function pickled as `head` (`fn_ref`) when every argument
    /// is a small value, written natively (no pickle). Returns None, submitting nothing, when
    /// an argument is not small.
    #[pyo3(signature = (head, args, kwargs=None))]
    fn submit_small<'py>(
        slf: &Bound<'py, Self>,
        head: &[u8],
        args: &Bound<'_, PyTuple>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<Bound<'py, Task>>> {
        let (py, this) = (slf.py(), slf.get());
        let Some(payload) = crate::small::encode_call(head, args, kwargs, Some(this.id)) else {
            return Ok(None);
        };
        this.with(|pool| {
            submit_draining(py, &this.tasks, false, payload.len(), |t| {
                pool.submit_with(&payload, t)
            })
        })?
        .kept(slf.as_any())
        .untracked(py)
        .map(Some)
    }

    /// Runs `fn(*args, **kwargs)` in a worker; returns its `Task` (`pymizu.Pool.submit`).
    /// Arguments are pickled here (an unpicklable one raises now) unless they are small values
    /// of a module-level function's call, which are written natively; large buffers cross
    /// through shared memory. When every task slot holds an uncollected task, finished
    /// outcomes move into their `Task` objects to make room (or it waits for one).
    #[pyo3(signature = (fn_, /, *args, **kwargs))]
    fn submit_call<'py>(
        slf: &Bound<'py, Self>,
        fn_: &Bound<'py, PyAny>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, Task>> {
        Pool::submit_call_of(slf, fn_, Args::Tuple(args), kwargs)
    }

    /// `submit_call` (`kind` "task") or the executor's submit ("future", `submit_future_of`)
    /// as a function bound to this pool that reads its arguments in place: what `Pool.submit`
    /// and `PoolExecutor.submit` are.
    fn submit_function<'py>(slf: &Bound<'py, Self>, kind: &str) -> PyResult<Bound<'py, PyAny>> {
        let kind = match kind {
            "task" => crate::fastcall::Kind::Task,
            "future" => crate::fastcall::Kind::Future,
            _ => return Err(PyValueError::new_err("kind must be 'task' or 'future'")),
        };
        crate::fastcall::bound(slf, kind)
    }

    /// Makes this pool serve a `PoolExecutor` through `submit_future`: its future class
    /// `cls`, its shared `state` (with `accepting`, `broken`, `pending` and `refuse()`) and
    /// `failed(exc)`, which returns a future that already failed with `exc`.
    fn bind_executor(
        &self,
        cls: Bound<'_, PyType>,
        state: &Bound<'_, PyAny>,
        failed: Py<PyAny>,
    ) -> PyResult<()> {
        if !crate::future::is_future_class(&cls)? {
            return Err(PyValueError::new_err(
                "an executor's future class must subclass the installed future class",
            ));
        }
        let hooks = ExecutorHooks {
            cls: cls.unbind(),
            pending: state
                .getattr("pending")?
                .cast_into::<crate::pending::PendingSet>()?
                .into_any()
                .unbind(),
            state: state.clone().unbind(),
            failed,
        };
        self.executor
            .set(hooks)
            .map_err(|_| crate::MizuError::new_err("this pool already serves an executor"))
    }

    /// Sets whether the executor this pool serves accepts submissions (its `accepting`).
    fn set_accepting(&self, accepting: bool) {
        self.accepting.store(accepting, Ordering::SeqCst);
    }

    /// Submits a cross-language task: `call` (a `pymizu.wire.Call`).
    fn submit_xcall(slf: &Bound<'_, Self>, call: &Bound<'_, PyAny>) -> PyResult<Task> {
        let (py, this) = (slf.py(), slf.get());
        let env = crate::xlang::task_envelope(call)?;
        this.with(|pool| {
            submit_draining(py, &this.tasks, false, env.len(), |t| {
                pool.submit_with(&env, t)
            })
        })
        .map(|t| t.kept(slf.as_any()))
    }

    /// Submits a cross-language map of `call` over `items`, `chunksize` elements a task (each
    /// appended to `call`'s arguments, or its items when `spread`; element `i` under the
    /// stream `(seed, offset + i)`), with one publication per worker queue.
    #[pyo3(signature = (call, items, spread, seed, offset, chunksize))]
    fn submit_xmap(
        slf: &Bound<'_, Self>,
        call: &Bound<'_, PyAny>,
        items: Vec<Bound<'_, PyAny>>,
        spread: bool,
        seed: Option<u64>,
        offset: u64,
        chunksize: usize,
    ) -> PyResult<Vec<Task>> {
        let envs = crate::xlang::chunk_envelopes(call, &items, spread, seed, offset, chunksize)?;
        let (py, this) = (slf.py(), slf.get());
        this.with(|pool| {
            submit_all_draining(py, &this.tasks, false, &envs, |rest, slice| {
                pool.submit_batch_with(rest.iter().map(|e| e as &dyn Fill), Some(slice))
            })
        })
        .map(|ts| ts.into_iter().map(|t| t.kept(slf.as_any())).collect())
    }

    /// Submits several pickled calls (`[(pickle, buffers, head), ...]`) with one publication
    /// per worker queue, making room as `submit` does.
    fn submit_batch<'py>(
        slf: &Bound<'py, Self>,
        calls: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<Bound<'py, Task>>> {
        let (py, this) = (slf.py(), slf.get());
        let calls = pickled_calls(&calls)?;
        let outs = outgoing(&calls)?;
        this.with(|pool| {
            submit_all_draining(py, &this.tasks, false, &outs, |rest, slice| {
                pool.submit_batch_with(rest.iter().map(|o| o as &dyn Fill), Some(slice))
            })
        })
        .and_then(|ts| {
            Task::untracked_all(py, ts.into_iter().map(|t| t.kept(slf.as_any())).collect())
        })
    }

    /// Submits `fn_(*args)` for every tuple of `argss` (`pymizu.Pool.submit_batch`) with one
    /// publication per worker queue: calls whose arguments are small values are written
    /// natively (as `submit_call` writes them), the others pickled.
    fn submit_calls<'py>(
        slf: &Bound<'py, Self>,
        fn_: &Bound<'py, PyAny>,
        argss: &Bound<'py, PyAny>,
    ) -> PyResult<Vec<Bound<'py, Task>>> {
        let (py, this) = (slf.py(), slf.get());
        let mut tasks = Vec::new();
        let mut calls = Vec::with_capacity(CALLS_PER_PUBLICATION);
        let mut items = argss.try_iter()?.peekable();
        while items.peek().is_some() {
            // A run of calls is written and published before the next is encoded: the
            // workers start on the first while this thread encodes the rest.
            calls.clear();
            for args in items.by_ref().take(CALLS_PER_PUBLICATION) {
                let args = args?;
                let args = match args.cast::<PyTuple>() {
                    Ok(t) => t.clone(),
                    Err(_) => PyTuple::new(py, args.try_iter()?.collect::<PyResult<Vec<_>>>()?)?,
                };
                calls.push(crate::small::call_payload(fn_, &args, None, Some(this.id))?);
            }
            let outs = calls
                .iter()
                .map(|c| {
                    Ok(match c {
                        crate::small::CallPayload::Small(p) => CallFill::Small(p),
                        crate::small::CallPayload::Pickled(call) => {
                            CallFill::Pickled(call.outgoing()?)
                        }
                    })
                })
                .collect::<PyResult<Vec<_>>>()?;
            let run = this.with(|pool| {
                submit_all_draining(py, &this.tasks, false, &outs, |rest, slice| {
                    pool.submit_batch_with(rest.iter().map(|o| o as &dyn Fill), Some(slice))
                })
            })?;
            tasks.extend(run.into_iter().map(|t| t.kept(slf.as_any())));
        }
        Task::untracked_all(py, tasks)
    }

    /// `pymizu.Pool.submit_batch` (which documents it): `fn_(*args)` for every tuple of
    /// `argss`, in chunks of `chunksize` calls, or the runtime's batch chunks
    /// (`mizu_pool::chunks::batch`) when None. A chunk is one task, the call of
    /// `_pool._run_batch_ref` over its calls (written natively when they are small values);
    /// its calls are its member tasks. A chunk of one call is a task of its own.
    #[pyo3(signature = (fn_, argss, chunksize, workers))]
    fn submit_chunks<'py>(
        slf: &Bound<'py, Self>,
        fn_: &Bound<'py, PyAny>,
        argss: &Bound<'py, PyAny>,
        chunksize: Option<usize>,
        workers: usize,
    ) -> PyResult<Vec<Bound<'py, Task>>> {
        static RUN_REF: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        static PAYLOAD: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        let (py, this) = (slf.py(), slf.get());
        let calls = argss
            .try_iter()?
            .map(|a| {
                let a = a?;
                Ok(match a.cast_into::<PyTuple>() {
                    Ok(t) => t.into_any(),
                    Err(e) => {
                        let a = e.into_inner();
                        PyTuple::new(py, a.try_iter()?.collect::<PyResult<Vec<_>>>()?)?.into_any()
                    }
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        let head = crate::small::fn_head(fn_)?;
        let run_ref = RUN_REF.import(py, "pymizu._batches", "_run_batch_ref")?;
        let run_head = crate::small::fn_head(run_ref)?;
        let no_skip = PyTuple::empty(py);
        let mut out = Vec::with_capacity(calls.len());
        let plan = mizu_pool::chunks::batch(
            calls.len() as u64,
            workers as u64,
            chunksize.map(|c| c as u64),
        );
        for (s, k) in plan {
            let (s, k) = (s as usize, k as usize);
            let part = &calls[s..s + k];
            let payload = if k == 1 {
                let args = part[0].cast::<PyTuple>()?;
                crate::small::call_payload(fn_, args, None, Some(this.id))?
            } else if let Some(h) = &head {
                let small = run_head.as_ref().and_then(|r| {
                    crate::small::encode_chunk_call(r.as_bytes(), h, part, Some(this.id))
                });
                match small {
                    Some(p) => crate::small::CallPayload::Small(p),
                    None => {
                        let args = (h, PyList::new(py, part)?, &no_skip).into_pyobject(py)?;
                        crate::small::call_payload(run_ref, &args, None, Some(this.id))?
                    }
                }
            } else {
                crate::small::CallPayload::Pickled(crate::small::PickledCall::from_python(
                    &PAYLOAD
                        .import(py, "pymizu._batches", "_batch_payload")?
                        .call1((fn_, PyList::new(py, part)?, &no_skip))?,
                )?)
            };
            let fill = match &payload {
                crate::small::CallPayload::Small(p) => CallFill::Small(p),
                crate::small::CallPayload::Pickled(call) => CallFill::Pickled(call.outgoing()?),
            };
            let task = this
                .with(|pool| {
                    submit_draining(py, &this.tasks, false, fill.size(), |t| {
                        pool.submit_with(&fill, t)
                    })
                })?
                .kept(slf.as_any());
            if k == 1 {
                out.push(task.untracked(py)?);
            } else {
                let fn_ = fn_.clone().unbind();
                let part = part.iter().map(|c| c.clone().unbind()).collect();
                out.extend(Task::untracked_all(py, Task::members(py, task, fn_, part))?);
            }
        }
        Ok(out)
    }

    /// Per worker: (slot, pid, state, busy, tasks, steals).
    fn status(&self) -> PyResult<Vec<WorkerRow>> {
        forked(self.origin)?;
        let g = self.inner.read().map_err(err)?;
        let Some(pool) = g.as_ref() else {
            return Ok(Vec::new());
        };
        Ok(pool
            .status()
            .workers
            .into_iter()
            .map(|w| {
                (
                    w.slot,
                    w.pid,
                    w.state.to_string(),
                    w.busy,
                    w.tasks,
                    w.steals,
                )
            })
            .collect())
    }

    /// `(watched, parks)`: this process's waits for outcomes that ended while it watched for
    /// them, and the times such waits slept (0, 0 once the pool stopped).
    fn waits(&self) -> PyResult<(u64, u64)> {
        forked(self.origin)?;
        let g = self.inner.read().map_err(err)?;
        Ok(g.as_ref().map_or((0, 0), |p| {
            let st = p.status();
            (st.watched, st.parks)
        }))
    }

    /// How many tasks this process submitted are queued or running (0 once the pool
    /// stopped): what `join()` waits to see reach 0.
    fn unfinished(&self) -> PyResult<usize> {
        forked(self.origin)?;
        let g = self.inner.read().map_err(err)?;
        Ok(g.as_ref().map_or(0, |p| {
            p.status()
                .submitters
                .iter()
                .find(|s| s.index == 0)
                .map_or(0, |s| s.queued + s.running)
        }))
    }

    /// How many workers died on their own so far (not retired, recycled, timed out or
    /// stopped); 0 once the pool stopped.
    fn deaths(&self) -> PyResult<u64> {
        forked(self.origin)?;
        let g = self.inner.read().map_err(err)?;
        Ok(g.as_ref().map_or(0, |p| p.deaths()))
    }

    /// Stops the pool (queued tasks are cancelled, running ones fail, results not collected
    /// yet are dropped); idempotent. What the pool's workers left in shared memory is removed.
    #[pyo3(signature = (grace=5.0))]
    fn stop(&self, py: Python<'_>, grace: f64) -> PyResult<()> {
        forked(self.origin)?;
        let grace = crate::bounded_secs(grace, "grace")?;
        // Taken with the GIL released: a reader may be waiting for the GIL.
        let pool = py.detach(|| self.inner.write().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(mut p) = pool {
            py.detach(|| {
                p.stop(grace);
                drop(p);
            });
        }
        Ok(())
    }
}

/// Python's pickled calls (`(pickle, buffers, head)` each).
pub(crate) fn pickled_calls<'py>(
    calls: &[Bound<'py, PyAny>],
) -> PyResult<Vec<crate::small::PickledCall<'py>>> {
    calls
        .iter()
        .map(crate::small::PickledCall::from_python)
        .collect()
}

/// The payloads of pickled calls.
pub(crate) fn outgoing<'a>(
    calls: &'a [crate::small::PickledCall<'_>],
) -> PyResult<Vec<Outgoing<'a>>> {
    calls.iter().map(|c| c.outgoing()).collect()
}
