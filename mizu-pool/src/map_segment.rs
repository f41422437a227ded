//! A map's segment (kind `MAP1`) and its runners' results: what the submitter stages, what a
//! runner reads of it — validated first, since the bytes are another process's — and the
//! results a runner sends back, read by the submitter with every index and length checked.
//!
//! Extent 0 is the control block ([`MapControl`]), 1 the `n + 1` input offsets, 2 the input
//! bytes, 3 the typed output area (`n * elem` bytes). A runner result is a run of entries:
//! index `u64`, status `u8` (0 ok, 1 error), length `u32`, bytes.

use arrow_buffer::Buffer;
use mizu_shm::sync::{AtomicU64, Ordering, SharedBytes};
use mizu_shm::{CacheLine, Layout, Segment};

use crate::handout::MapControl;

/// Segment kind of a map.
pub const MAP_KIND: u32 = u32::from_le_bytes(*b"MAP1");

/// Stages `inputs` in a new map segment whose control block shares them out among `runners`
/// runners in chunks of `chunk` (0: adaptive), each result `elem` bytes written in place (0:
/// returned).
pub(crate) fn stage(
    inputs: &[&[u8]],
    chunk: u64,
    elem: usize,
    runners: usize,
) -> mizu_shm::Result<Segment> {
    let n = inputs.len();
    let total: usize = inputs.iter().map(|i| i.len()).sum();
    let output = n.checked_mul(elem).ok_or_else(|| {
        mizu_shm::ShmError::InvalidLayout(format!("{n} results of {elem} bytes overflow"))
    })?;
    let mut l = Layout::new(MAP_KIND);
    let sizes = [
        std::mem::size_of::<CacheLine<MapControl>>() as u64,
        8 * (n as u64 + 1),
        total.max(1) as u64,
        output.max(1) as u64,
    ];
    for s in sizes {
        l.add(s, 64)?;
    }
    let seg = Segment::create(&l, false)?;
    let ext = |i| seg.extent(i).expect("created with four extents");
    let offsets = seg.bytes(ext(1), 8)?;
    // The whole input extent as one granule.
    let data = seg.bytes(ext(2), ext(2).len as usize)?;
    let mut at = 0usize;
    for (i, inp) in inputs.iter().enumerate() {
        // SAFETY: the segment is private to this process until the runners get its token.
        unsafe {
            offsets.with_mut(i, |o| o.copy_from_slice(&(at as u64).to_le_bytes()));
            data.with_mut(0, |d| d[at..at + inp.len()].copy_from_slice(inp));
        }
        at += inp.len();
    }
    // SAFETY: as above.
    unsafe { offsets.with_mut(n, |o| o.copy_from_slice(&(at as u64).to_le_bytes())) };
    // SAFETY: as above.
    unsafe {
        seg.init_at(
            ext(0).offset,
            CacheLine(MapControl::new(
                n as u64,
                chunk,
                elem as u64,
                runners as u64,
            )),
        )?
    };
    Ok(seg)
}

/// The map control block of a segment [`stage`] made.
pub(crate) fn control(seg: &Segment) -> mizu_shm::Result<&MapControl> {
    Ok(&seg.get::<CacheLine<MapControl>>(seg.extent(0)?.offset)?.0)
}

/// What a runner reads of a map: its control block, and the inputs and output cells of
/// elements `0..n`, every one checked against the segment.
pub(crate) struct MapInputs<'s> {
    ctl: &'s MapControl,
    n: u64,
    elem: usize,
    offsets: &'s [AtomicU64],
    inputs: SharedBytes<'s>,
    input_len: u64,
    output: Option<SharedBytes<'s>>,
}

impl<'s> MapInputs<'s> {
    /// Validates the map in `seg`: the element count and result size against the extents
    /// that must hold them.
    pub(crate) fn open(seg: &'s Segment) -> Result<Self, String> {
        let err = |e: &dyn std::fmt::Display| format!("bad map segment: {e}");
        let ext = |i| seg.extent(i).map_err(|e| err(&e));
        let ctl = control(seg).map_err(|e| err(&e))?;
        let n = ctl.n.load(Ordering::Acquire);
        let elem = ctl.elem.load(Ordering::Relaxed);
        let count = n
            .checked_add(1)
            .and_then(|c| usize::try_from(c).ok())
            .ok_or_else(|| err(&format!("{n} elements")))?;
        let offsets_ext = ext(1)?;
        if (count as u64)
            .checked_mul(8)
            .is_none_or(|need| need > offsets_ext.len)
        {
            return Err(err(&format!(
                "{n} elements' offsets do not fit an offset area of {} bytes",
                offsets_ext.len
            )));
        }
        let offsets = seg
            .get_slice(offsets_ext.offset, count)
            .map_err(|e| err(&e))?;
        let input_ext = ext(2)?;
        let inputs = seg
            .bytes(input_ext, input_ext.len as usize)
            .map_err(|e| err(&e))?;
        let output = if elem > 0 {
            let out = ext(3)?;
            if n.checked_mul(elem).is_none_or(|need| need > out.len) {
                return Err(err(&format!(
                    "{n} results of {elem} bytes do not fit an output area of {}",
                    out.len
                )));
            }
            let granule = usize::try_from(elem).map_err(|e| err(&e))?;
            let cells = Segment::bytes(
                seg,
                mizu_shm::Extent {
                    len: n * elem,
                    ..out
                },
                granule,
            )
            .map_err(|e| err(&e))?;
            Some(cells)
        } else {
            None
        };
        Ok(MapInputs {
            ctl,
            n,
            elem: elem as usize,
            offsets,
            inputs,
            input_len: input_ext.len,
            output,
        })
    }

    /// The control block (the shared cursor).
    pub(crate) fn control(&self) -> &'s MapControl {
        self.ctl
    }

    /// Bytes per typed result; 0 when results are returned.
    pub(crate) fn elem(&self) -> usize {
        self.elem
    }

    /// A copy of element `i`'s input (no reference into shared memory is held while user code
    /// runs).
    pub(crate) fn input(&self, i: u64) -> Result<Vec<u8>, String> {
        if i >= self.n {
            return Err(format!("map element {i} of {}", self.n));
        }
        let (a, b) = (
            self.offsets[i as usize].load(Ordering::Relaxed),
            self.offsets[i as usize + 1].load(Ordering::Relaxed),
        );
        if a > b || b > self.input_len {
            return Err("corrupt map offsets".into());
        }
        // SAFETY: nobody writes the input extent after staging.
        Ok(unsafe { self.inputs.with(0, |d| d[a as usize..b as usize].to_vec()) })
    }

    /// Writes element `i`'s typed result in place; an error when `res` is not exactly one
    /// result's size (or there is no typed output).
    pub(crate) fn write_output(&self, i: u64, res: &[u8]) -> Result<(), String> {
        match &self.output {
            Some(o) if res.len() == self.elem && i < self.n => {
                // SAFETY: element i's output cell is written only by the runner that claimed i
                // through the cursor; i < n, and n cells fit (checked on open).
                unsafe { o.with_mut(i as usize, |d| d.copy_from_slice(res)) };
                Ok(())
            }
            _ => Err(format!(
                "result of {} bytes, the typed output takes {}",
                res.len(),
                self.elem
            )),
        }
    }
}

/// Appends one entry to a runner's result.
pub(crate) fn push_result(out: &mut Vec<u8>, i: u64, ok: bool, bytes: &[u8]) {
    out.extend_from_slice(&i.to_le_bytes());
    out.push(u8::from(!ok));
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// The runners' results of a map of `n` elements, read back: each element's result (views of
/// the runners' buffers; none when results were written in place, `elem > 0`) and the
/// smallest failing element with its error.
#[derive(Debug)]
pub(crate) struct Results {
    pub(crate) values: Vec<Option<Buffer>>,
    pub(crate) first_error: Option<(usize, Vec<u8>)>,
}

/// Reads the runners' `results`; an entry naming an element outside `0..n` or running past
/// its buffer makes the whole read an error.
pub(crate) fn read_results(results: &[Buffer], n: usize, elem: usize) -> Result<Results, String> {
    let mut values: Vec<Option<Buffer>> = vec![None; if elem == 0 { n } else { 0 }];
    let mut first_error: Option<(usize, Vec<u8>)> = None;
    let malformed = || "malformed runner result".to_string();
    for r in results {
        let b = r.as_slice();
        let mut p = 0;
        while p < b.len() {
            let head = b.get(p..p + 13).ok_or_else(malformed)?;
            let idx = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
            let status = head[8];
            let len = u32::from_le_bytes(head[9..].try_into().expect("4 bytes")) as usize;
            p += 13;
            let end = p.checked_add(len).filter(|&e| e <= b.len());
            let idx = usize::try_from(idx).ok().filter(|&i| i < n);
            let (Some(end), Some(idx)) = (end, idx) else {
                return Err(malformed());
            };
            match status {
                0 if elem == 0 => values[idx] = Some(r.slice_with_length(p, len)),
                0 => return Err(malformed()),
                1 => {
                    if first_error.as_ref().is_none_or(|(i, _)| idx < *i) {
                        first_error = Some((idx, b[p..end].to_vec()));
                    }
                }
                _ => return Err(malformed()),
            }
            p = end;
        }
    }
    Ok(Results {
        values,
        first_error,
    })
}
