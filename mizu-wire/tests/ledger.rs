//! The ledger of a process (alone in this binary: it is process-wide): references adopted while
//! it records are listed, given back exactly once, and only when the last guard drops.

use mizu_wire::{DataPool, Mapper, ledger};

fn ledgers_of_mine() -> usize {
    let me = format!("mizu_{:x}_", std::process::id());
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&me))
        .filter(|n| mizu_shm::Segment::open(n, ledger::LEDGER_KIND).is_ok())
        .count()
}

#[test]
fn references_are_given_back_once_and_only_by_the_last_guard() {
    let pool = DataPool::new(1 << 16);
    let mapper = Mapper::new();
    let sent = pool.store(&[1u8; 1000]).unwrap();
    let (a, b) = (ledger::enable(), ledger::enable());
    assert_eq!(ledgers_of_mine(), 1);
    let held = mapper.adopt(&sent.share()).unwrap();
    let dropped = mapper.adopt(&sent.share()).unwrap();
    drop(dropped); // given back by its holder: its entry is cleared first
    drop(sent);
    assert_eq!(pool.live_regions(), 1, "`held` keeps the region");
    drop(a); // another guard still records: nothing is given back
    assert_eq!(pool.live_regions(), 1);
    assert_eq!(held.bytes(), &[1u8; 1000][..]);
    drop(b); // the last guard: what is still recorded (`held`) is given back, the ledger goes
    assert_eq!(pool.live_regions(), 0);
    assert_eq!(ledgers_of_mine(), 0);
    // A new ledger records a new reference, at the place `held` had in the old one.
    let c = ledger::enable();
    let sent = pool.store(&[3u8; 1000]).unwrap();
    let later = mapper.adopt(&sent.share()).unwrap();
    drop(sent);
    assert_eq!(pool.live_regions(), 1);
    drop(held); // given back already: not again, and `later`'s entry is not its own
    assert_eq!(pool.live_regions(), 1);
    drop(c); // gives back `later`
    assert_eq!(pool.live_regions(), 0);
    drop(later);
    assert_eq!(pool.live_regions(), 0);
    // A region allocated again in the same space is not disturbed by stale holders.
    let again = pool.store(&[2u8; 1000]).unwrap();
    let other = mapper.adopt(&again.share()).unwrap();
    drop(again);
    assert_eq!(pool.live_regions(), 1);
    drop(other);
    assert_eq!(pool.live_regions(), 0);
}
