//! Placing rings and deques in segments: sizes, initialisation by the creator, validated
//! attachment by everyone else.

use mizu_shm::sync::AtomicU64;
use mizu_shm::{Layout, Segment};

use crate::deque::{Deque, DequeHeader};
use crate::error::QueueError;
use crate::ring::{Ring, RingHeader, check_geometry};

fn layout_err(seg: &Segment, why: impl Into<String>) -> QueueError {
    QueueError::Layout {
        segment: seg.token().to_owned(),
        why: why.into(),
    }
}

/// Adds a ring's two regions (header, slots) to `layout`; returns their extent indices.
pub fn add_ring(
    layout: &mut Layout,
    capacity: u64,
    slot_size: u64,
) -> Result<(usize, usize), QueueError> {
    check_geometry(capacity, slot_size).map_err(|why| QueueError::Layout {
        segment: "(new)".into(),
        why,
    })?;
    let h = layout.add(std::mem::size_of::<RingHeader>() as u64, 128)?;
    let s = layout.add(capacity * slot_size, 128)?;
    Ok((h, s))
}

/// Creator: initialises a ring of `capacity` slots of `slot_size` bytes at extents
/// `hdr`/`slots` of a segment nobody else uses yet.
///
/// # Safety
///
/// No other process or thread may use the ring at these extents while it is initialised, nor
/// hold a [`Ring`] of it from before: its header's plain fields are rewritten. Call it on a
/// segment this process created, before its token is handed out.
pub unsafe fn init_ring(
    seg: &Segment,
    hdr: usize,
    slots: usize,
    capacity: u64,
    slot_size: u64,
) -> Result<Ring<'_>, QueueError> {
    let (he, se) = (seg.extent(hdr)?, seg.extent(slots)?);
    check_geometry(capacity, slot_size).map_err(|w| layout_err(seg, w))?;
    if capacity.checked_mul(slot_size) != Some(se.len) {
        return Err(layout_err(
            seg,
            format!(
                "ring of {capacity}x{slot_size} does not fill its {}-byte extent",
                se.len
            ),
        ));
    }
    // SAFETY: nobody else uses the ring's extents (this function's contract).
    let header = unsafe { seg.init_at(he.offset, RingHeader::new(capacity, slot_size))? };
    Ring::new(header, seg.bytes(se, slot_size as usize)?).map_err(|w| layout_err(seg, w))
}

/// Everyone: attaches to an initialised ring, validating its header against its extents.
pub fn attach_ring(seg: &Segment, hdr: usize, slots: usize) -> Result<Ring<'_>, QueueError> {
    let (he, se) = (seg.extent(hdr)?, seg.extent(slots)?);
    let header: &RingHeader = seg.get(he.offset)?;
    let p = *header.params();
    check_geometry(p.capacity, p.slot_size).map_err(|w| layout_err(seg, w))?;
    if p.capacity.checked_mul(p.slot_size) != Some(se.len) {
        return Err(layout_err(
            seg,
            format!(
                "ring of {}x{} does not fill its {}-byte extent",
                p.capacity, p.slot_size, se.len
            ),
        ));
    }
    Ring::new(header, seg.bytes(se, p.slot_size as usize)?).map_err(|w| layout_err(seg, w))
}

/// Adds a deque's regions (header, items) to `layout`.
pub fn add_deque(layout: &mut Layout, capacity: u64) -> Result<(usize, usize), QueueError> {
    if !capacity.is_power_of_two() || capacity > 1 << 30 {
        return Err(QueueError::Layout {
            segment: "(new)".into(),
            why: format!("deque capacity {capacity} is not a power of two ≤ 2^30"),
        });
    }
    let h = layout.add(std::mem::size_of::<DequeHeader>() as u64, 128)?;
    let i = layout.add(capacity * 8, 128)?;
    Ok((h, i))
}

/// Creator: initialises a deque of `items`-extent capacity.
///
/// # Safety
///
/// As for [`init_ring`]: nobody else may use the deque at these extents, nor hold a [`Deque`]
/// of it from before.
pub unsafe fn init_deque(seg: &Segment, hdr: usize, items: usize) -> Result<Deque<'_>, QueueError> {
    let (he, ie) = (seg.extent(hdr)?, seg.extent(items)?);
    // SAFETY: nobody else uses the deque's extents (this function's contract).
    let header = unsafe { seg.init_at(he.offset, DequeHeader::new(ie.len / 8))? };
    let items: &[AtomicU64] = seg.get_slice(ie.offset, (ie.len / 8) as usize)?;
    Deque::new(header, items).map_err(|w| layout_err(seg, w))
}

/// Everyone: attaches to an initialised deque, validating it.
pub fn attach_deque(seg: &Segment, hdr: usize, items: usize) -> Result<Deque<'_>, QueueError> {
    let (he, ie) = (seg.extent(hdr)?, seg.extent(items)?);
    let header: &DequeHeader = seg.get(he.offset)?;
    let items: &[AtomicU64] = seg.get_slice(ie.offset, (ie.len / 8) as usize)?;
    Deque::new(header, items).map_err(|w| layout_err(seg, w))
}
