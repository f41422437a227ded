//! Payload storage: data segments holding regions that other processes read in place.
//!
//! A data segment (kind `DAT1`) has a control line and an arena. The owning process allocates
//! regions from the arena with a bump pointer; each region is a 64-byte header (magic,
//! reference count, length, generation — all atomics) followed by the payload, 64-byte
//! aligned. The control line counts live regions and says whether the owner is still attached.
//!
//! Lifetime:
//! * a region starts with one reference (the allocator's handle); sending it adds one that the
//!   frame carries and the receiver adopts; re-sending a received region adds one more — the
//!   bytes never move;
//! * dropping the last reference of a region decrements the segment's live count;
//! * the owner resets a segment whose live count is zero and reuses it (no `shm_open` per send);
//! * the name is unlinked by whoever sees "live == 0 and owner detached" last — the owner
//!   detaching or a receiver releasing — and by `mizu_shm::prune` once the owner is dead
//!   (`kill -9`). Mappings stay valid after the unlink, so a received view outlives its sender.

pub(crate) mod mapper;
pub(crate) mod pool;
pub(crate) mod region;
pub(crate) mod segment;
pub(crate) mod spill;

pub use mapper::Mapper;
pub use pool::{DataPool, ROOM_WAIT, give_back_idle_now, with_room};
pub use region::{Region, RegionDesc, RegionMut};
pub use segment::{ALIGN, DATA_KIND, DEFAULT_SEGMENT_BYTES, DataSegment, IDLE_RELEASE};
pub use spill::take_spill_notice;
