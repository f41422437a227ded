//! What this process knows good of bytes in shared regions: Arrow values it wrote itself
//! ([`written`]) and values it decoded and validated before ([`validated`]), so that neither
//! is validated again when it comes back by reference.

/// Arrow values this process wrote into a region it is filling, known good when the region
/// is committed: a value sent to another process and sent back by reference is then not
/// validated by the process that made it (it came from arrays this process held).
pub(crate) mod written {
    use std::cell::RefCell;

    /// Values written but not yet claimed by a commit: (address, length).
    const MAX: usize = 256;

    thread_local! {
        static PENDING: RefCell<Vec<(usize, usize)>> = const { RefCell::new(Vec::new()) };
    }

    /// `values` (offsets and lengths in the bytes at `base`) were just written.
    pub(crate) fn wrote(base: *const u8, values: &[(usize, usize)]) {
        if values.is_empty() {
            return;
        }
        PENDING.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() + values.len() > MAX {
                p.clear();
            }
            p.extend(values.iter().map(|&(at, len)| (base as usize + at, len)));
        });
    }

    /// A region is being allocated for filling: what was written before belongs to no region
    /// this thread fills from now on (a region that was dropped unfilled, say), and must not
    /// vouch for bytes that later take its place.
    pub(crate) fn forget() {
        PENDING.with(|p| p.borrow_mut().clear());
    }

    /// The region `desc`, whose payload is the `len` bytes at `start`, was committed: the
    /// values written inside it are known good, and the ones pending elsewhere are dropped
    /// (they went to buffers that are not regions).
    pub(crate) fn committed(region: super::Place<'_>, start: *const u8, len: usize) {
        let start = start as usize;
        let inside: Vec<(usize, usize)> = PENDING.with(|p| {
            p.borrow_mut()
                .drain(..)
                .filter(|&(a, l)| a >= start && a + l <= start + len)
                .collect()
        });
        for (a, l) in inside {
            super::validated::insert(super::validated::key(region, a - start, l));
        }
    }
}

/// Arrow values in shared memory this process has decoded and validated: a region's bytes
/// never change while it is referenced, and a segment's space is reused only in a new lap (a
/// new generation), so the same (segment, generation, region, offset, length) names the same
/// bytes — a value relayed back and forth is validated once per process, not per trip.
pub(crate) mod validated {
    use std::collections::{HashSet, VecDeque};
    use std::sync::Mutex;

    use super::Place;

    /// Segment name, generation, region offset in the segment, offset in the region, length,
    /// and which check the bytes passed (`ARROW`: decoded and validated as a value).
    pub(crate) type Key = (String, u64, u64, usize, usize, &'static str);

    /// The check of an encoded array or table value.
    pub(crate) const ARROW: &str = "arrow";

    const MAX: usize = 4096;

    type Seen = (Option<HashSet<Key>>, VecDeque<Key>);
    static SEEN: Mutex<Seen> = Mutex::new((None, VecDeque::new()));

    pub(crate) fn key(region: Place<'_>, at: usize, len: usize) -> Key {
        checked(region, at, len, ARROW)
    }

    pub(crate) fn checked(region: Place<'_>, at: usize, len: usize, check: &'static str) -> Key {
        (
            region.name.to_owned(),
            region.generation,
            region.offset,
            at,
            len,
            check,
        )
    }

    pub(crate) fn contains(k: &Key) -> bool {
        let g = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        g.0.as_ref().is_some_and(|s| s.contains(k))
    }

    pub(crate) fn insert(k: Key) {
        let mut g = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        let (set, order) = &mut *g;
        let set = set.get_or_insert_with(HashSet::new);
        if set.insert(k.clone()) {
            order.push_back(k);
            if order.len() > MAX
                && let Some(old) = order.pop_front()
            {
                set.remove(&old);
            }
        }
    }
}

/// Which allocation a range of shared bytes lies in: a region's segment name, generation and
/// offset (a region descriptor's fields).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place<'a> {
    pub(crate) name: &'a str,
    pub(crate) generation: u64,
    pub(crate) offset: u64,
}
