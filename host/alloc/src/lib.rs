//! The allocator of timeshard's processes: mimalloc, told to give freed memory back to the
//! system at once. A binary gets it by linking this crate and calling [`configure`] first.
//!
//! Under sustained ingest glibc's malloc kept about 300 MB of freed memory (a node at 422 MB
//! resident held 119 MB after `malloc_trim`), and the node's resident memory is what its
//! memory budget is checked against. mimalloc with its defaults still held 230-350 MB; with
//! purging at once and arenas committed on demand the same load peaked at 160-210 MB.

use libmimalloc_sys::{mi_option_get, mi_option_set_default, mi_option_t};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_arena_eager_commit` in mimalloc 3's `mi_option_e` (not exported by the crate).
const ARENA_EAGER_COMMIT: mi_option_t = 4;
/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e`, milliseconds (default 1000).
const PURGE_DELAY: mi_option_t = 15;

/// Sets the options unless the environment (`MIMALLOC_PURGE_DELAY`, ...) already did.
#[allow(unsafe_code)]
pub fn configure() {
    // SAFETY: plain setters of mimalloc's option table; any value is valid for these two.
    unsafe {
        mi_option_set_default(PURGE_DELAY, 0);
        mi_option_set_default(ARENA_EAGER_COMMIT, 0);
    }
}

/// The two options as mimalloc sees them (purge delay, arena eager commit).
#[allow(unsafe_code)]
// `c_long` is i64 on x86_64 and aarch64 Linux but i32 on armv7.
#[allow(clippy::useless_conversion)]
pub fn options() -> (i64, i64) {
    // SAFETY: plain getters of mimalloc's option table.
    unsafe { (i64::from(mi_option_get(PURGE_DELAY)), i64::from(mi_option_get(ARENA_EAGER_COMMIT))) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_option_numbers_are_mimallocs() {
        // mimalloc's documented defaults sit at these numbers; another mimalloc version that
        // renumbered its options would fail here instead of setting something else.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none()
            && std::env::var_os("MIMALLOC_ARENA_EAGER_COMMIT").is_none()
        {
            assert_eq!(super::options(), (1000, 2));
        }
        super::configure();
        assert_eq!(super::options(), (0, 0));
    }
}
