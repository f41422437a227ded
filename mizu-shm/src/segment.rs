//! Named shared-memory segments: create, open, typed access, unlink.

use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};
use rustix::fd::OwnedFd;
use rustix::fs::{FallocateFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::error::{Result, ShmError};
use crate::header::{EXTENT_ALIGN, Extent, HEADER_RESERVED, MAX_EXTENTS, SegmentHeader};
use crate::liveness::{self, Identity, ProcessId};
use crate::name::SegmentName;
use crate::sync::SharedBytes;

/// Types that may be viewed in place inside a segment through a shared reference.
///
/// # Safety
/// Implementors are `#[repr(C)]` or `#[repr(transparent)]`, valid when every byte is zero,
/// hold no pointers or process-local handles, and are mutated only through atomics (plain
/// fields are written once, before the segment is shared, and never again).
pub unsafe trait ShmSafe: Sync {}

// SAFETY: atomics are repr(transparent) over integers, zero is valid, mutation is atomic.
unsafe impl ShmSafe for std::sync::atomic::AtomicU32 {}
// SAFETY: as above.
unsafe impl ShmSafe for std::sync::atomic::AtomicU64 {}
// SAFETY: as above.
unsafe impl ShmSafe for std::sync::atomic::AtomicI64 {}
// SAFETY: a CacheLine only adds alignment around a ShmSafe value.
unsafe impl<T: ShmSafe> ShmSafe for crate::line::CacheLine<T> {}
// SAFETY: a slice of ShmSafe values is as safe as each one.
unsafe impl<T: ShmSafe, const N: usize> ShmSafe for [T; N] {}

/// The regions of a segment to be created, laid out after the header.
#[derive(Clone, Debug)]
pub struct Layout {
    kind: u32,
    extents: Vec<Extent>,
    end: u64,
}

impl Layout {
    /// An empty layout of the given kind (a tag the opener must expect).
    pub fn new(kind: u32) -> Self {
        Layout {
            kind,
            extents: Vec::new(),
            end: HEADER_RESERVED,
        }
    }

    /// Appends a region of `len` bytes aligned to `align` (a power of two; at least 64 is
    /// used); returns its index.
    pub fn add(&mut self, len: u64, align: u64) -> Result<usize> {
        if !align.is_power_of_two() {
            return Err(ShmError::InvalidLayout(format!(
                "alignment {align} is not a power of two"
            )));
        }
        if self.extents.len() == MAX_EXTENTS {
            return Err(ShmError::InvalidLayout(format!(
                "more than {MAX_EXTENTS} extents"
            )));
        }
        let align = align.max(EXTENT_ALIGN);
        let offset = self
            .end
            .checked_next_multiple_of(align)
            .ok_or_else(|| ShmError::InvalidLayout("offset overflows".into()))?;
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= i64::MAX as u64)
            .ok_or_else(|| ShmError::InvalidLayout(format!("a region of {len} bytes overflows")))?;
        self.extents.push(Extent { offset, len });
        self.end = end;
        Ok(self.extents.len() - 1)
    }

    /// The regions so far.
    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }

    /// The size of the segment: the end of the last region, rounded up to a page.
    pub fn total_size(&self) -> u64 {
        let page = rustix::param::page_size() as u64;
        self.end.next_multiple_of(page)
    }
}

/// A mapped segment. The creator's handle unlinks the name when dropped (unless told not
/// to); mappings stay valid in every process that has the segment open.
pub struct Segment {
    map: MmapRaw,
    name: SegmentName,
    header: SegmentHeader,
    unlink_on_drop: AtomicBool,
    identity: Arc<Identity>,
}

/// How many names of segments this process has removed so far ([`names_removed`]).
static NAMES_REMOVED: AtomicU64 = AtomicU64::new(0);

/// A count that grows whenever this process removes a segment's name: a caller that saw a
/// name of this process's own making present at one count knows it is still there while the
/// count has not moved (no other process removes a living process's names, unless the
/// caller's protocol lets it).
pub fn names_removed() -> u64 {
    NAMES_REMOVED.load(Ordering::Acquire)
}

/// Removes the segment name at `path`, counting it for [`names_removed`].
pub(crate) fn remove_name(path: &std::path::Path) -> rustix::io::Result<()> {
    let r = rustix::fs::unlink(path);
    NAMES_REMOVED.fetch_add(1, Ordering::AcqRel);
    r
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("name", &self.name)
            .field("len", &self.len())
            .finish()
    }
}

impl Segment {
    /// Creates, sizes (with `fallocate`), maps and initialises a new segment. With
    /// `prefault`, every page is faulted in now so first touches cost nothing later.
    pub fn create(layout: &Layout, prefault: bool) -> Result<Self> {
        Self::create_in(layout, prefault, false)
    }

    /// [`Segment::create`] in the spill directory ([`crate::place::spill_dir`]): a file
    /// there, created `O_EXCL` and `0600`, its space reserved with `fallocate` (a full disk is
    /// [`ShmError::SpillFull`], never a `SIGBUS`), mapped shared; its name ends in `s`, so
    /// readers and `prune` find it there. An error when spilling is off.
    pub fn create_spilled(layout: &Layout, prefault: bool) -> Result<Self> {
        if crate::place::spill_dir().is_none() {
            return Err(ShmError::Config(match crate::place::spill_problem() {
                Some(why) => why.to_owned(),
                None => "spilling is off (MIZU_SPILL_DIR=none)".to_owned(),
            }));
        }
        Self::create_in(layout, prefault, true)
    }

    fn create_in(layout: &Layout, prefault: bool, spilled: bool) -> Result<Self> {
        let identity = liveness::current()?;
        let size = layout.total_size();
        let (name, fd) = loop {
            let name = SegmentName::generate_in(identity.id(), spilled)?;
            // What `shm_open` does on Linux, in the configured directory (`place`).
            match rustix::fs::open(
                name.path(),
                OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::RUSR | Mode::WUSR,
            ) {
                Ok(fd) => break (name, fd),
                Err(Errno::EXIST) => continue,
                Err(e) if spilled => {
                    let what = format!(
                        "{} in the spill directory (MIZU_SPILL_DIR chooses another)",
                        name.path().display()
                    );
                    return Err(ShmError::io("open(O_CREAT|O_EXCL)", what, e));
                }
                Err(e) => return Err(ShmError::io("open(O_CREAT|O_EXCL)", name.as_str(), e)),
            }
        };
        // From here on every failure must unlink what we created.
        let fail = |e: ShmError| {
            let _ = remove_name(&name.path());
            e
        };
        reserve(&fd, &name, size).map_err(fail)?;
        let mut opts = MmapOptions::new();
        opts.len(size as usize);
        if prefault {
            opts.populate();
        }
        let map = opts
            .map_raw(fd.as_raw_fd())
            .map_err(|e| fail(ShmError::io("mmap", name.as_str(), e)))?;
        let header = SegmentHeader::new(layout.kind, size, identity.id(), layout.extents());
        // SAFETY: the mapping is at least HEADER_RESERVED bytes (total_size >= 256), page
        // aligned, freshly created and not yet known to any other process.
        unsafe { std::ptr::write(map.as_mut_ptr() as *mut SegmentHeader, header) };
        Ok(Segment {
            map,
            name,
            header,
            unlink_on_drop: AtomicBool::new(true),
            identity,
        })
    }

    /// Opens a segment by name or join token, checking that it holds layout `kind`. The
    /// header is validated before anything else in the segment is read.
    pub fn open(token: &str, kind: u32) -> Result<Self> {
        let name = SegmentName::parse(token)?;
        let identity = liveness::current()?;
        let fd = rustix::fs::open(
            name.path(),
            OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::NOENT => ShmError::NotFound(name.to_string()),
            e => ShmError::io("open", name.as_str(), e),
        })?;
        let size = rustix::fs::fstat(&fd)
            .map_err(|e| ShmError::io("fstat", name.as_str(), e))?
            .st_size as u64;
        if size < HEADER_RESERVED {
            return Err(ShmError::Truncated {
                name: name.to_string(),
                actual: size,
                needed: HEADER_RESERVED,
            });
        }
        let map = MmapOptions::new()
            .len(size as usize)
            .map_raw(fd.as_raw_fd())
            .map_err(|e| ShmError::io("mmap", name.as_str(), e))?;
        // SAFETY: the mapping is at least HEADER_RESERVED bytes; the header is plain integers
        // written before the name was shared, so a byte copy of it is a valid value. A volatile
        // read keeps the compiler from assuming anything about memory another process owns.
        let header = unsafe { std::ptr::read_volatile(map.as_ptr() as *const SegmentHeader) };
        header
            .validate(size, kind)
            .map_err(|fault| ShmError::BadHeader {
                name: name.to_string(),
                fault,
            })?;
        Ok(Segment {
            map,
            name,
            header,
            unlink_on_drop: AtomicBool::new(false),
            identity,
        })
    }

    /// The segment's name.
    pub fn name(&self) -> &SegmentName {
        &self.name
    }

    /// The string another process passes to [`Segment::open`].
    pub fn token(&self) -> &str {
        self.name.as_str()
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Always false: a segment holds at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The base address of the mapping (for views whose bounds the caller checked against
    /// [`Segment::len`]).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// The validated header (a private copy).
    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    /// Whether this process made the segment (a forked child's copy of the handle did not).
    pub fn created_here(&self) -> bool {
        let me = self.identity.id();
        self.name.creator() == me && me.pid == crate::current_pid()
    }

    /// This process's identity, held alive by this handle.
    pub fn me(&self) -> ProcessId {
        self.identity.id()
    }

    /// Region `i` of the layout.
    pub fn extent(&self, i: usize) -> Result<Extent> {
        self.header.extents().get(i).copied().ok_or_else(|| {
            ShmError::InvalidLayout(format!(
                "segment {} has {} extents, asked for #{i}",
                self.name,
                self.header.extents().len()
            ))
        })
    }

    fn check(&self, offset: u64, len: u64, align: u64) -> Result<NonNull<u8>> {
        let bad = |why| ShmError::BadAccess {
            name: self.name.to_string(),
            offset,
            len,
            size: self.len(),
            why,
        };
        let end = offset
            .checked_add(len)
            .ok_or_else(|| bad("out of bounds"))?;
        if end > self.len() {
            return Err(bad("out of bounds"));
        }
        if !offset.is_multiple_of(align) {
            return Err(bad("misaligned"));
        }
        // SAFETY: offset <= len of the mapping, so the pointer stays inside (or one past) it.
        let p = unsafe { self.map.as_mut_ptr().add(offset as usize) };
        Ok(NonNull::new(p).expect("mapping is non-null"))
    }

    /// A shared reference to a `T` at byte `offset`, bounds- and alignment-checked.
    pub fn get<T: ShmSafe>(&self, offset: u64) -> Result<&T> {
        let p = self.check(
            offset,
            std::mem::size_of::<T>() as u64,
            std::mem::align_of::<T>() as u64,
        )?;
        // SAFETY: in bounds and aligned (checked); T: ShmSafe is valid for any bytes the
        // protocol leaves there and is mutated only through atomics, so a shared reference
        // never aliases a non-atomic write. The reference lives no longer than the mapping.
        Ok(unsafe { &*(p.as_ptr() as *const T) })
    }

    /// Writes `value` at byte `offset` (bounds- and alignment-checked) and returns a shared
    /// reference to it.
    ///
    /// # Safety
    /// No other process or thread may access that range yet: use it to initialise a layout
    /// before its token is handed out (or on memory the protocol reserves to the caller).
    pub unsafe fn init_at<T: ShmSafe>(&self, offset: u64, value: T) -> Result<&T> {
        let p = self.check(
            offset,
            std::mem::size_of::<T>() as u64,
            std::mem::align_of::<T>() as u64,
        )?;
        // SAFETY: in bounds and aligned; exclusive by the caller's contract.
        unsafe { std::ptr::write(p.as_ptr() as *mut T, value) };
        self.get(offset)
    }

    /// A slice of `n` `T`s starting at byte `offset`, bounds- and alignment-checked.
    pub fn get_slice<T: ShmSafe>(&self, offset: u64, n: usize) -> Result<&[T]> {
        let len = (std::mem::size_of::<T>() as u64)
            .checked_mul(n as u64)
            .ok_or_else(|| ShmError::InvalidLayout(format!("{n} elements overflow")))?;
        let p = self.check(offset, len, std::mem::align_of::<T>() as u64)?;
        // SAFETY: as for `get`, for each of the n elements, all inside the checked range.
        Ok(unsafe { std::slice::from_raw_parts(p.as_ptr() as *const T, n) })
    }

    /// The bytes of `extent` viewed as granules of `granule` bytes (the extent length must be
    /// a multiple of it).
    pub fn bytes(&self, extent: Extent, granule: usize) -> Result<SharedBytes<'_>> {
        let p = self.check(extent.offset, extent.len, 8)?;
        if granule == 0 || !extent.len.is_multiple_of(granule as u64) {
            return Err(ShmError::InvalidLayout(format!(
                "extent of {} bytes is not a whole number of {granule}-byte granules",
                extent.len
            )));
        }
        // SAFETY: the range is inside the mapping, which lives as long as &self.
        Ok(unsafe { SharedBytes::from_raw(p, (extent.len / granule as u64) as usize, granule) })
    }

    /// Removes the name now. Mappings stay valid; nobody new can open the segment. Once every
    /// peer has attached this makes leaking impossible, even on `kill -9`.
    pub fn unlink(&self) -> Result<()> {
        self.unlink_on_drop.store(false, Ordering::Relaxed);
        match remove_name(&self.name.path()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(ShmError::io("unlink", self.name.as_str(), e)),
        }
    }

    /// Whether dropping this handle unlinks the name (true for the creator by default).
    pub fn set_unlink_on_drop(&self, yes: bool) {
        self.unlink_on_drop.store(yes, Ordering::Relaxed);
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        let me = rustix::process::getpid().as_raw_nonzero().get() as u32;
        // A forked child must not unlink what its parent still uses.
        if self.unlink_on_drop.load(Ordering::Relaxed) && me == self.identity.id().pid {
            let _ = remove_name(&self.name.path());
        }
    }
}

/// What a full `/dev/shm` error adds when values cannot spill because the spill setting is
/// unusable (spilling turned off on purpose adds nothing).
fn unspilled() -> String {
    crate::place::spill_problem().map_or_else(String::new, |why| {
        format!("; values cannot spill to files instead: {why}")
    })
}

/// Reserves the pages now so a full /dev/shm is an error here, never a SIGBUS later.
fn reserve(fd: &OwnedFd, name: &SegmentName, size: u64) -> Result<()> {
    if let Some(available) = crate::space::left_under_limit().filter(|_| !name.is_spilled())
        && available < size
    {
        return Err(ShmError::NoSpace {
            name: name.to_string(),
            requested: size,
            available,
            unspilled: unspilled(),
        });
    }
    loop {
        match rustix::fs::fallocate(fd, FallocateFlags::empty(), 0, size) {
            Ok(()) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(Errno::NOSPC) | Err(Errno::FBIG) => {
                let dir = match crate::place::spill_dir() {
                    Some(d) if name.is_spilled() => d,
                    _ => crate::place::here().dir(),
                };
                let available = rustix::fs::statvfs(dir)
                    .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
                    .unwrap_or(0);
                if name.is_spilled() {
                    return Err(ShmError::SpillFull {
                        dir: dir.display().to_string(),
                        requested: size,
                        available,
                    });
                }
                return Err(ShmError::NoSpace {
                    name: name.to_string(),
                    requested: size,
                    available,
                    unspilled: unspilled(),
                });
            }
            Err(e) => return Err(ShmError::io("fallocate", name.as_str(), e)),
        }
    }
}
