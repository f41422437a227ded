//! What every way a value travels shares: the cache of other processes' data segments that
//! received arrays and buffers view.

use std::sync::LazyLock;

use mizu_pool::wire::Mapper;

/// Maps the regions that arrays by reference live in (segments stay mapped while views of
/// them live).
pub(crate) static MAPPER: LazyLock<Mapper> = LazyLock::new(Mapper::new);
