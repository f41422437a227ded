//! What every way a value travels shares: the size from which a vector goes out of band (and
//! arrives as a view), and the cache of other processes' data segments that received views
//! read.

use mizu_pool::wire::Mapper;

/// Vectors of at least this many bytes travel out of band (and arrive as views).
pub const FLOOR: usize = 4096;

/// Maps the regions that payloads refer to (segments stay mapped while views of them live).
pub(crate) static MAPPER: std::sync::LazyLock<Mapper> = std::sync::LazyLock::new(Mapper::new);
