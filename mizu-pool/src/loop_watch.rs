//! The watch an event loop runs itself: it looks for its tasks' outcomes once per round
//! between other work of its own, instead of [`crate::watch`]'s loop in a waiting thread, on
//! the same terms (a CPU free for it, one watcher per process, [`WATCH`] at the longest).

use std::sync::Arc;
use std::time::Instant;

use crate::submitter::{SubmitterCore, Task};
use crate::watch::{Crowding, Token, WATCH, room_to_watch};

impl Task {
    /// A watch over this task's outcome that the caller runs itself, looking now and then
    /// (see [`Watch`]); None when it should wait elsewhere.
    pub fn watch(&self) -> Option<Watch> {
        Watch::start(self.core())
    }
}

/// A watch whose caller polls between other work of its own (an event loop that looks once
/// per round): while it lives, no other thread of this process watches.
pub struct Watch {
    core: Arc<SubmitterCore>,
    token: Token,
    crowding: Crowding,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("end", &self.token.end)
            .finish()
    }
}

impl Watch {
    /// A watch for a task of `core`; None when the caller should wait elsewhere (no CPU free,
    /// another thread watches, or the tasks of late outlast a watch).
    pub(crate) fn start(core: &Arc<SubmitterCore>) -> Option<Watch> {
        let v = core.shared().view();
        if !core.watch_pays() || !room_to_watch(v) || crate::watch::worker_here(v) {
            return None;
        }
        Some(Watch {
            core: core.clone(),
            token: Token::take(WATCH)?,
            crowding: Crowding::default(),
        })
    }

    /// Whether the caller may look again: the watch has time left, and a CPU is free or has
    /// been taken for less than [`CROWDED`].
    pub fn go_on(&self) -> bool {
        let now = Instant::now();
        if now >= self.token.end {
            self.core.outlasted();
            return false;
        }
        let v = self.core.shared().view();
        !crate::watch::worker_here(v) && self.crowding.go_on(room_to_watch(v), now)
    }
}
