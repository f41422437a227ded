//! Submitting: one task, a batch, a chunk of a cross-language map; under the runtime's policy
//! when a submission cannot go through at once (`mizu_pool::retry`), with this package's part
//! (moving finished outcomes out of their slots, a submit timeout, Ctrl-C).

use std::time::{Duration, Instant};

use extendr_api::Result;
use extendr_api::prelude::*;
use extendr_ffi::SEXP;
use mizu_pool::PoolError;
use mizu_pool::retry::{MakeRoom, retrying};

use crate::encode::Outgoing;
use crate::pool::{Drained, RPool, SLICE, failure, interrupted, pool_ref, submit_failure};
use crate::sendable::check_msg;
use crate::task::RTask;
use crate::worker::with_context;
use crate::{interrupt, rerr};

pub(crate) fn pool_submit_xchunk(
    pool: Robj,
    call: Robj,
    vars: Robj,
    elements: Robj,
    seed: Robj,
    first: f64,
) -> Result<Robj> {
    let p = pool_ref(&pool)?;
    let seed = if seed.is_null() { None } else { seed.as_real() };
    // SAFETY: R's main thread; the arguments are held by their Robjs for the call.
    let env = unsafe {
        crate::xcall::chunk_envelope(call.get(), vars.get(), elements.get(), seed, first)
    };
    submit_xenvelope(&pool, p, env)
}

/// Submits a cross-language payload to `p` (whose handle is `pool`): the task handle, or a
/// failure `c(class, message)` (`env`'s error says why the task cannot cross).
fn submit_xenvelope(
    pool: &Robj,
    p: &RPool,
    env: std::result::Result<mizu_pool::wire::envelope::Envelope, String>,
) -> Result<Robj> {
    let env = match env {
        Ok(env) => env,
        Err(why) => return Ok(failure("mizu_error_not_portable", why)),
    };
    // SAFETY: R's main thread; `pool` is the live handle of `p`; the new handle is protected
    // by the Robj from here on.
    Ok(match unsafe { submit_encoded(pool.get(), p, &env) }? {
        // SAFETY: as above.
        Ok(t) => unsafe { Robj::from_sexp(crate::batch::task_handle(pool.get(), &p.batch, t)) },
        Err(f) => f,
    })
}

pub(crate) fn pool_submit(pool: Robj, msg: Robj) -> Result<Robj> {
    let p = pool_ref(&pool)?;
    if let Err(u) = check_msg(&msg) {
        return Ok(u.failure());
    }
    // SAFETY: `msg` is protected by its handle for the call.
    let out = Outgoing::encode_task(unsafe { msg.get() }, p.repeats_key())?;
    // SAFETY: R's main thread; `pool` is the live handle of `p`.
    Ok(match unsafe { submit_encoded(pool.get(), p, &out) }? {
        // SAFETY: R's main thread; `pool` is the live handle of `p`; the new handle is
        // protected by the Robj from here on.
        Ok(t) => unsafe { Robj::from_sexp(crate::batch::task_handle(pool.get(), &p.batch, t)) },
        Err(f) => f,
    })
}

/// Submits an encoded task message: the task, or the failure for the R wrapper (`c(class,
/// message)`) when it cannot be submitted.
///
/// # Safety
/// R's main thread; `pool` is the live, protected handle of `p`.
pub(crate) unsafe fn submit_encoded(
    pool: SEXP,
    p: &RPool,
    out: &dyn mizu_pool::Fill,
) -> Result<std::result::Result<RTask, Robj>> {
    // A collection that views asked for runs here, before the task's handle exists, rather
    // than when its result is decoded: there the handle would survive the collection, be
    // promoted, and keep the result (a few MB of views of a data frame, say) alive until a
    // full collection, long after the program dropped both.
    crate::altrep::collect_garbage_if_due();
    check_nested(p)?;
    // A nested task goes through the same policy: a worker's own record has fewer slots, and
    // draining it waits for its tasks while running them.
    let mut room = Room::new(pool, p);
    let r = retrying(&mut room, |slice| {
        if p.nested {
            return with_context(|c| c.ok_or(PoolError::Stopped)?.submit_with(out));
        }
        let g = p.inner.borrow();
        let inner = g.as_ref().ok_or(PoolError::Stopped)?;
        inner.submit_with(out, Some(slice))
    });
    crate::spill::warn_if_spilled();
    Ok(r.map(RTask::new))
}

/// The R package's part in the submit policy (`mizu_pool::retry`): waits go in slices with
/// Ctrl-C checked between them, and end at the pool's submit timeout; a full set of slots is
/// drained into the task handles; a full `/dev/shm` runs R's garbage collector.
struct Room<'a> {
    /// The live, protected handle of `p`.
    pool: SEXP,
    p: &'a RPool,
    /// When the submission started and the pool's submit timeout (the clock is read only
    /// when there is a timeout to keep).
    start: Option<(Instant, Duration)>,
}

impl<'a> Room<'a> {
    fn new(pool: SEXP, p: &'a RPool) -> Room<'a> {
        Room {
            pool,
            p,
            start: p.submit_timeout.map(|t| (Instant::now(), t)),
        }
    }

    fn left(&self) -> Option<Duration> {
        self.start.map(|(s, t)| t.saturating_sub(s.elapsed()))
    }

    fn timed_out(&self) -> Robj {
        submit_failure(PoolError::SubmitTimeout(
            self.p.submit_timeout.unwrap_or_default(),
        ))
    }
}

impl MakeRoom for Room<'_> {
    type Error = Robj;

    fn slice(&mut self) -> Duration {
        self.left().map_or(SLICE, |l| l.min(SLICE))
    }

    fn waited(&mut self) -> std::result::Result<(), Robj> {
        if self.left().is_some_and(|l| l.is_zero()) {
            return Err(self.timed_out());
        }
        if interrupt::pending() {
            return Err(interrupted());
        }
        Ok(())
    }

    fn drain(&mut self) -> std::result::Result<(), Robj> {
        match self.p.drain(self.left()) {
            Drained::Freed => Ok(()),
            Drained::TimedOut => Err(self.timed_out()),
            Drained::Interrupted => Err(interrupted()),
        }
    }

    /// Views this session no longer uses may hold `/dev/shm` (and, through the workers, the
    /// memory of earlier sends). The outcomes of tasks whose handles were dropped uncollected
    /// hold their references until their whole batch of handles is garbage: the batch being
    /// filled is let go first, so that the collection can drop it.
    fn collect(&mut self) {
        // SAFETY: R's main thread; `pool` is the live handle of `p` (`Room::new`'s callers).
        unsafe { crate::batch::seal_batch(self.pool, &self.p.batch) };
    }

    fn fail(&mut self, e: PoolError) -> Robj {
        submit_failure(e)
    }
}

pub(crate) fn pool_submit_batch(pool: Robj, msgs: List) -> Result<List> {
    let p = pool_ref(&pool)?;
    // As in `submit_encoded`: before the handles exist.
    crate::altrep::collect_garbage_if_due();
    for m in msgs.values() {
        if let Err(u) = check_msg(&m) {
            return Ok(batch_list(Vec::new(), Some(u.failure())));
        }
    }
    let outs: Vec<Outgoing> = msgs
        .values()
        // SAFETY: each message is protected by `msgs` for the call.
        .map(|v| Outgoing::encode_task(unsafe { v.get() }, p.repeats_key()))
        .collect::<Result<_>>()?;
    let mut tasks = Vec::with_capacity(outs.len());
    // SAFETY: R's main thread; `pool` is the live handle of `p`, protected by the Robj for
    // the call.
    let fail = unsafe { submit_outs(pool.get(), p, &outs, |t| tasks.push(handle(&pool, p, t))) }?;
    Ok(batch_list(tasks, fail))
}

/// Submits `outs` to `p` (whose handle is `pool`) with one publication per worker queue, under
/// the submit policy; `each` is given every task submitted, in order, as soon as it is (it
/// makes the task's handle at once: `drain` finds tasks through their handles' batches). The
/// failure `c(class, message)` that stopped the batch, if one did (what was submitted before
/// it keeps running).
///
/// # Safety
/// R's main thread; `pool` is the live, protected handle of `p`.
pub(crate) unsafe fn submit_outs(
    pool: SEXP,
    p: &RPool,
    outs: &[Outgoing],
    mut each: impl FnMut(mizu_pool::Task),
) -> Result<Option<Robj>> {
    check_nested(p)?;
    if outs.is_empty() {
        return Ok(None);
    }
    let mut sent = 0;
    let mut room = Room::new(pool, p);
    let fail = retrying(&mut room, |slice| {
        let rest = outs[sent..].iter().map(|o| o as &dyn mizu_pool::Fill);
        let (ts, res) = if p.nested {
            with_context(|c| match c {
                Some(c) => c.submit_batch_with(rest),
                None => (Vec::new(), Err(PoolError::Stopped)),
            })
        } else {
            let g = p.inner.borrow();
            let inner = g.as_ref().ok_or(PoolError::Stopped)?;
            inner.submit_batch_with(rest, Some(slice))
        };
        sent += ts.len();
        ts.into_iter().for_each(&mut each);
        res
    })
    .err();
    crate::spill::warn_if_spilled();
    Ok(fail)
}

/// A nested pool handle (`mizu_current_pool()`) works only inside the task it was made in.
fn check_nested(p: &RPool) -> Result<()> {
    if p.nested && !with_context(|c| c.is_some()) {
        return Err(rerr("this pool handle only works inside its task"));
    }
    Ok(())
}

/// A new handle of `t`, submitted to `p` (whose handle is `pool`).
fn handle(pool: &Robj, p: &RPool, t: mizu_pool::Task) -> Robj {
    // SAFETY: R's main thread; `pool` is the live handle of `p`; the new handle is protected
    // by its Robj at once.
    unsafe {
        Robj::from_sexp(crate::batch::task_handle(
            pool.get(),
            &p.batch,
            RTask::new(t),
        ))
    }
}

fn batch_list(tasks: Vec<Robj>, fail: Option<Robj>) -> List {
    let fail = fail.unwrap_or_else(|| Robj::from(()));
    List::from_values([List::from_values(tasks).into(), fail])
}
