//! What a submission does when it cannot go through at once: one policy for every submit path
//! of both bindings (a task, a batch, a map, a nested task).
//!
//! * Queue space does not appear within a slice (a worker is stuck in a long task): the
//!   binding may stop the wait (Ctrl-C, the caller's own deadline), else the attempt is made
//!   again. Waits go in slices so that a signal is seen while the wait lasts.
//! * Every task slot holds an outcome nobody has collected: the binding moves finished
//!   outcomes into their handles (or waits for one to finish), then tries again.
//! * The data segments are full: what the binding's language's garbage still holds (views of
//!   earlier results) is freed through the pressure hook ([`crate::pressure::relieve`]),
//!   once per submission, then it tries again.
//! * Anything else fails the submission.

use std::time::Duration;

use crate::error::{PoolError, Result};

/// A binding's part in [`retrying`].
pub trait MakeRoom {
    /// The binding's failure of a submission.
    type Error;
    /// How long the next attempt may wait for queue space.
    fn slice(&mut self) -> Duration;
    /// Queue space did not appear within the slice: `Err` stops the submission.
    fn waited(&mut self) -> std::result::Result<(), Self::Error>;
    /// Every task slot holds an uncollected outcome: make one free (or `Err`).
    fn drain(&mut self) -> std::result::Result<(), Self::Error>;
    /// The data segments are full: what the binding does before the pressure hook frees
    /// what garbage holds (called at most once; nothing by default).
    fn collect(&mut self) {}
    /// Any other failure, as the binding reports it.
    fn fail(&mut self, e: PoolError) -> Self::Error;
}

/// Calls `attempt` with the slice it may wait for queue space until it succeeds or `room`
/// gives up. For a batch, `attempt` submits what is left each time (tasks it submitted before
/// failing stay submitted).
pub fn retrying<T, R: MakeRoom>(
    room: &mut R,
    mut attempt: impl FnMut(Duration) -> Result<T>,
) -> std::result::Result<T, R::Error> {
    let mut collected = false;
    loop {
        let slice = room.slice();
        match attempt(slice) {
            Ok(t) => return Ok(t),
            Err(PoolError::SubmitTimeout(_)) => room.waited()?,
            Err(PoolError::SlotsExhausted(_)) => room.drain()?,
            Err(PoolError::Wire(w)) if w.is_no_space() && !collected => {
                collected = true;
                room.collect();
                crate::pressure::relieve();
            }
            Err(e) => return Err(room.fail(e)),
        }
    }
}

/// How many tasks behind the oldest pending one a full submitter waits for at most (see
/// [`drain`]).
pub const DRAIN_AHEAD: usize = 512;

/// How a binding makes room when every task slot of a submitter is taken
/// ([`MakeRoom::drain`]), given the tasks it holds that may still have a slot, oldest first:
///
/// * every finished outcome is moved out of its slot into its task (`settle`: true when it
///   moved one);
/// * when none was finished, it waits (`wait`, one slice at most) for the task an eighth of the
///   way along those still `pending` (at most [`DRAIN_AHEAD`] in), then settles again. Workers
///   take tasks in order, so the ones before it are done by then too: one sweep makes room for
///   the next several submissions, instead of a sweep of every held task per submission.
///
/// True when some slot was freed. (Slots of tasks the binding no longer holds free themselves
/// when those finish, which the next attempt sees.)
pub fn drain<T>(
    held: &[T],
    settle: impl Fn(&T) -> bool,
    pending: impl Fn(&T) -> bool,
    wait: impl FnOnce(&T),
) -> bool {
    let sweep = || held.iter().fold(false, |moved, t| settle(t) | moved);
    if sweep() {
        return true;
    }
    let waiting: Vec<&T> = held.iter().filter(|t| pending(t)).collect();
    let Some(&target) = waiting.get((waiting.len() / 8).clamp(1, DRAIN_AHEAD) - 1) else {
        return false;
    };
    wait(target);
    sweep()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what the policy asked of the binding.
    #[derive(Default)]
    struct Log {
        asked: Vec<&'static str>,
        stop_waiting: bool,
    }

    impl MakeRoom for Log {
        type Error = String;
        fn slice(&mut self) -> Duration {
            Duration::from_millis(5)
        }
        fn waited(&mut self) -> std::result::Result<(), String> {
            self.asked.push("waited");
            if self.stop_waiting {
                Err("interrupted".into())
            } else {
                Ok(())
            }
        }
        fn drain(&mut self) -> std::result::Result<(), String> {
            self.asked.push("drain");
            Ok(())
        }
        fn collect(&mut self) {
            self.asked.push("collect");
        }
        fn fail(&mut self, e: PoolError) -> String {
            self.asked.push("fail");
            e.to_string()
        }
    }

    fn no_space() -> PoolError {
        PoolError::Wire(mizu_wire::WireError::Shm(mizu_shm::ShmError::NoSpace {
            name: "test".into(),
            requested: 1,
            available: 0,
            unspilled: String::new(),
        }))
    }

    #[test]
    fn each_obstacle_gets_its_remedy_and_full_segments_are_collected_once() {
        let mut log = Log::default();
        let mut errors = vec![
            no_space(),
            PoolError::SlotsExhausted(4),
            PoolError::SubmitTimeout(Duration::from_millis(5)),
        ];
        let got = retrying(&mut log, |slice| {
            assert_eq!(slice, Duration::from_millis(5));
            errors.pop().map_or(Ok(7), Err)
        });
        assert_eq!(got, Ok(7));
        assert_eq!(log.asked, ["waited", "drain", "collect"]);
        // A second full `/dev/shm` in the same submission fails it.
        let mut log = Log::default();
        let got: std::result::Result<(), _> = retrying(&mut log, |_| Err(no_space()));
        assert!(got.is_err());
        assert_eq!(log.asked, ["collect", "fail"]);
    }

    #[test]
    fn a_drain_settles_what_finished_else_waits_an_eighth_of_the_way_along() {
        use std::cell::Cell;
        // (finished, settled) per task, oldest first.
        let tasks: Vec<(Cell<bool>, Cell<bool>)> = (0..40)
            .map(|_| (Cell::new(false), Cell::new(false)))
            .collect();
        let settle = |t: &(Cell<bool>, Cell<bool>)| t.0.get() && !t.1.replace(true);
        let pending = |t: &(Cell<bool>, Cell<bool>)| !t.0.get();
        // Finished tasks are settled without a wait.
        tasks[3].0.set(true);
        tasks[7].0.set(true);
        assert!(drain(&tasks, settle, pending, |_| panic!("no wait")));
        assert!(tasks[3].1.get() && tasks[7].1.get());
        // None finished: the wait is for the fourth of the 38 pending ones (38 / 8 = 4; task 3
        // is settled already), and what finished meanwhile is settled.
        let index =
            |t: &(Cell<bool>, Cell<bool>)| tasks.iter().position(|u| std::ptr::eq(u, t)).unwrap();
        let waited = Cell::new(None);
        let freed = drain(&tasks, settle, pending, |t| {
            waited.set(Some(index(t)));
            for u in &tasks[..=index(t)] {
                u.0.set(true);
            }
        });
        assert!(freed);
        assert_eq!(waited.get(), Some(4));
        assert!(tasks[..=4].iter().all(|t| t.1.get()) && !tasks[5].1.get());
        // A wait that ends with nothing finished frees nothing; nothing pending, no wait.
        assert!(!drain(&tasks, settle, pending, |_| {}));
        let done: Vec<(Cell<bool>, Cell<bool>)> = Vec::new();
        assert!(!drain(&done, settle, pending, |_| panic!("no wait")));
    }

    #[test]
    fn the_binding_can_stop_a_wait_and_other_errors_fail_at_once() {
        let mut log = Log {
            stop_waiting: true,
            ..Log::default()
        };
        let got: std::result::Result<(), _> =
            retrying(&mut log, |_| Err(PoolError::SubmitTimeout(Duration::ZERO)));
        assert_eq!(got, Err("interrupted".to_string()));
        let mut log = Log::default();
        let got: std::result::Result<(), _> = retrying(&mut log, |_| Err(PoolError::Stopped));
        assert!(got.is_err());
        assert_eq!(log.asked, ["fail"]);
    }
}
