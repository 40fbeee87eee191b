//! The allocator of timeshard's processes: mimalloc, told to give freed memory back to the
//! system at once. A binary gets it by linking this crate and calling [`configure`] first.
//!
//! Under sustained ingest glibc's malloc kept about 300 MB of freed memory (a node at 422 MB
//! resident held 119 MB after `malloc_trim`), and the node's resident memory is what its
//! memory budget is checked against. mimalloc with its defaults still held 230-350 MB; with
//! purging at once and arenas committed on demand the same load peaked at 160-210 MB.
//!
//! Transparent huge pages are off for the process: on a kernel that grants them on `madvise`,
//! as Debian's does, mimalloc asks for them, and memory goes back only when a whole 2 MiB of it
//! is free. Four streamed reads of 250,000 points (25,000 blocks) left a node at 290-330 MB
//! resident with them, 64 MB without, its heap peaking near 50 MB either way (heaptrack, glibc
//! build). mimalloc reads its option when it starts, before [`configure`] runs, so the option
//! is forced and the kernel told too (`PR_SET_THP_DISABLE`); libmimalloc-sys's `no_thp` feature
//! does not reach mimalloc 3. `MIMALLOC_ALLOW_THP=1` leaves them on.

use libmimalloc_sys::{mi_option_get, mi_option_set, mi_option_set_default, mi_option_t};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_arena_eager_commit` in mimalloc 3's `mi_option_e` (not exported by the crate).
const ARENA_EAGER_COMMIT: mi_option_t = 4;
/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e`, milliseconds (default 1000).
const PURGE_DELAY: mi_option_t = 15;
/// `mi_option_allow_thp` in mimalloc 3's `mi_option_e` (default 1).
const ALLOW_THP: mi_option_t = 43;

/// Sets the options unless the environment (`MIMALLOC_PURGE_DELAY`, ...) already did.
#[allow(unsafe_code)]
pub fn configure() {
    // SAFETY: plain setters of mimalloc's option table; any value is valid for these two.
    unsafe {
        mi_option_set_default(PURGE_DELAY, 0);
        mi_option_set_default(ARENA_EAGER_COMMIT, 0);
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: a plain setter of mimalloc's option table; 0 is valid.
        unsafe { mi_option_set(ALLOW_THP, 0) };
        // Huge pages already granted stay; none are given from here on.
        #[cfg(target_os = "linux")]
        let _ = nix::sys::prctl::set_thp_disable(true);
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
    #[allow(unsafe_code)]
    fn the_option_numbers_are_mimallocs_and_huge_pages_are_off() {
        // mimalloc's documented defaults sit at these numbers; another mimalloc version that
        // renumbered its options would fail here instead of setting something else.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none()
            && std::env::var_os("MIMALLOC_ARENA_EAGER_COMMIT").is_none()
        {
            assert_eq!(super::options(), (1000, 2));
        }
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
            // SAFETY: a plain getter of mimalloc's option table.
            assert_eq!(unsafe { libmimalloc_sys::mi_option_get(super::ALLOW_THP) }, 1, "allow_thp's default");
        }
        super::configure();
        assert_eq!(super::options(), (0, 0));
        // One test: the defaults above hold only before `configure` runs in this process.
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
            // SAFETY: a plain getter of mimalloc's option table.
            assert_eq!(unsafe { libmimalloc_sys::mi_option_get(super::ALLOW_THP) }, 0);
            #[cfg(target_os = "linux")]
            assert_eq!(nix::sys::prctl::get_thp_disable(), Ok(true));
        }
    }
}
