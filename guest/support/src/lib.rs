//! What every timeshard policy guest needs to run without `std`, and so without importing any
//! WASI interface: a bump allocator, a panic handler that reports through the host's `log`
//! import and then traps, and parsers for setting values.
//!
//! A guest generates its bindings with `wit_bindgen::generate!` and then invokes
//! [`guest_runtime!`], which installs the allocator and the panic handler in the guest crate
//! (the panic handler calls the guest's own generated `host::log`).

#![no_std]

extern crate alloc;

use core::alloc::{GlobalAlloc, Layout};
use core::fmt::{self, Write};
use core::sync::atomic::{AtomicUsize, Ordering};

/// A WebAssembly page.
const PAGE: usize = 65_536;
/// Grow memory by at least this many pages at a time: each `memory.grow` is a call into the
/// host, and with the pooling allocator the pages cost nothing until touched.
const MIN_GROW_PAGES: usize = 16;

/// A bump allocator over the linear memory above `__heap_base`.
///
/// The host runs every call in a fresh instance and recycles its memory afterwards, so a
/// policy never needs to give memory back: freeing only rolls back the most recent
/// allocation, which makes `Vec` growth in place cheap. Memory grows with `memory.grow`; when
/// the host's memory cap refuses, allocation fails and the guest panics, which traps.
#[derive(Debug)]
pub struct Bump {
    next: AtomicUsize,
    end: AtomicUsize,
}

impl Bump {
    /// An allocator that starts at the first use.
    pub const fn new() -> Bump {
        Bump {
            next: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
        }
    }

    fn grow(&self, end: usize, need: usize) -> Option<usize> {
        let pages = (need - end).div_ceil(PAGE);
        for try_pages in [pages.max(MIN_GROW_PAGES), pages] {
            if core::arch::wasm32::memory_grow(0, try_pages) != usize::MAX {
                let end = end + try_pages * PAGE;
                self.end.store(end, Ordering::Relaxed);
                return Some(end);
            }
        }
        None
    }
}

impl Default for Bump {
    fn default() -> Self {
        Bump::new()
    }
}

// SAFETY: wasm32 guests here are single-threaded; the atomics are plain loads and stores.
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let mut next = self.next.load(Ordering::Relaxed);
        let mut end = self.end.load(Ordering::Relaxed);
        if next == 0 {
            // The linker puts the stack and static data below `__heap_base`; the rest of the
            // initial memory is free.
            unsafe extern "C" {
                static __heap_base: u8;
            }
            next = &raw const __heap_base as usize;
            end = core::arch::wasm32::memory_size(0) * PAGE;
            self.end.store(end, Ordering::Relaxed);
        }
        let start = (next + layout.align() - 1) & !(layout.align() - 1);
        let Some(new_next) = start.checked_add(layout.size()) else {
            return core::ptr::null_mut();
        };
        if new_next > end && self.grow(end, new_next).is_none() {
            return core::ptr::null_mut();
        }
        self.next.store(new_next, Ordering::Relaxed);
        start as *mut u8
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Only the most recent allocation can be given back.
        if ptr as usize + layout.size() == self.next.load(Ordering::Relaxed) {
            self.next.store(ptr as usize, Ordering::Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let next = self.next.load(Ordering::Relaxed);
        if ptr as usize + layout.size() == next {
            // The most recent allocation grows or shrinks in place.
            let new_next = ptr as usize + new_size;
            let end = self.end.load(Ordering::Relaxed);
            if new_next <= end || self.grow(end, new_next).is_some() {
                self.next.store(new_next, Ordering::Relaxed);
                return ptr;
            }
            return core::ptr::null_mut();
        }
        // SAFETY: the caller guarantees `layout` describes `ptr`; the new block is fresh.
        unsafe {
            let new = self.alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
            if !new.is_null() {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
            }
            new
        }
    }
}

/// The body of the `cabi_realloc` export: allocates, grows or shrinks a block, and panics
/// (so traps) when memory runs out, since the canonical ABI has no way to report it.
///
/// # Safety
/// `old_ptr` and `old_len` must describe a block from this allocator (or be 0 for a new one),
/// and `align` must be a power of two.
pub unsafe fn cabi_realloc(
    alloc: &Bump,
    old_ptr: *mut u8,
    old_len: usize,
    align: usize,
    new_len: usize,
) -> *mut u8 {
    if new_len == 0 {
        return align as *mut u8;
    }
    // SAFETY: the caller guarantees the layout is valid and describes `old_ptr`.
    unsafe {
        let layout = Layout::from_size_align_unchecked(new_len, align);
        let ptr = if old_len == 0 {
            alloc.alloc(layout)
        } else {
            alloc.realloc(
                old_ptr,
                Layout::from_size_align_unchecked(old_len, align),
                new_len,
            )
        };
        if ptr.is_null() {
            panic!("out of memory: cannot allocate {new_len} bytes for the canonical ABI");
        }
        ptr
    }
}

/// Compares `n` bytes. Volatile reads stop LLVM from turning the loop back into a call to
/// `memcmp`, which would recurse.
///
/// # Safety
/// `a` and `b` must each point to `n` readable bytes.
pub unsafe fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        // SAFETY: the caller guarantees `n` readable bytes at each pointer.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
    }
    0
}

/// A fixed buffer that formats a panic message without allocating (the panic may be an
/// allocation failure).
#[derive(Debug)]
pub struct MessageBuf {
    buf: [u8; 512],
    len: usize,
}

impl MessageBuf {
    pub const fn new() -> MessageBuf {
        MessageBuf {
            buf: [0; 512],
            len: 0,
        }
    }

    /// The text written so far, cut at a character boundary.
    pub fn as_str(&self) -> &str {
        match core::str::from_utf8(&self.buf[..self.len]) {
            Ok(s) => s,
            Err(e) => core::str::from_utf8(&self.buf[..e.valid_up_to()]).unwrap_or(""),
        }
    }
}

impl Default for MessageBuf {
    fn default() -> Self {
        MessageBuf::new()
    }
}

impl Write for MessageBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Formats a panic for the host's log.
pub fn panic_message(info: &core::panic::PanicInfo<'_>) -> MessageBuf {
    let mut buf = MessageBuf::new();
    let _ = write!(buf, "guest panicked: {}", info.message());
    if let Some(loc) = info.location() {
        let _ = write!(buf, " at {}:{}", loc.file(), loc.line());
    }
    buf
}

/// Installs the allocator and the panic handler in a guest crate. Invoke it after
/// `wit_bindgen::generate!`, at the crate root, in a `#![no_std]` crate with `extern crate
/// alloc`.
#[macro_export]
macro_rules! guest_runtime {
    () => {
        #[global_allocator]
        static ALLOCATOR: $crate::Bump = $crate::Bump::new();

        /// The canonical ABI's allocator export, which `std` would provide on wasm32-wasip2:
        /// the host calls it to place arguments (the batch) in guest memory.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn cabi_realloc(
            old_ptr: *mut u8,
            old_len: usize,
            align: usize,
            new_len: usize,
        ) -> *mut u8 {
            $crate::cabi_realloc(&ALLOCATOR, old_ptr, old_len, align, new_len)
        }

        /// Byte comparison, which `std` would take from wasi-libc (string `==` needs it).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
            // SAFETY: the compiler calls this with two readable blocks of `n` bytes.
            unsafe { $crate::memcmp(a, b, n) }
        }

        /// Byte equality, which LLVM may call instead of `memcmp`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
            // SAFETY: as for `memcmp`.
            unsafe { $crate::memcmp(a, b, n) }
        }

        #[panic_handler]
        fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
            static PANICKING: core::sync::atomic::AtomicBool =
                core::sync::atomic::AtomicBool::new(false);
            // A panic while reporting a panic must not recurse.
            if !PANICKING.swap(true, core::sync::atomic::Ordering::Relaxed) {
                let msg = $crate::panic_message(info);
                crate::timeshard::policy::host::log(
                    crate::timeshard::policy::host::Level::Error,
                    msg.as_str(),
                );
            }
            core::arch::wasm32::unreachable()
        }
    };
}

/// The value of setting `name`, if present (the last one wins).
pub fn find<'a>(
    settings: impl IntoIterator<Item = (&'a str, &'a str)>,
    name: &str,
) -> Option<&'a str> {
    settings
        .into_iter()
        .filter(|(n, _)| *n == name)
        .map(|(_, v)| v)
        .last()
}

/// Parses setting `name` as a finite number, with `default` when it is absent.
pub fn number(
    name: &'static str, value: Option<&str>, default: Option<f64>) -> Result<f64, SettingError> {
    match (value, default) {
        (None, Some(d)) => Ok(d),
        (None, None) => Err(SettingError::Missing(name)),
        (Some(v), _) => match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(x),
            _ => Err(SettingError::NotANumber(name)),
        },
    }
}

/// A setting that is missing or malformed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SettingError {
    Missing(&'static str),
    NotANumber(&'static str),
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingError::Missing(n) => {
                write!(f, "setting {n:?} is required; add it to the policy's config")
            }
            SettingError::NotANumber(n) => {
                write!(f, "setting {n:?} must be a finite number, e.g. 0.5")
            }
        }
    }
}

/// Square root without `std` (core has none on stable): Newton's method from the exponent
/// halved, exact to the last bit or two for finite positive inputs.
pub fn sqrt(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 || x.is_infinite() {
        return x;
    }
    let mut y = f64::from_bits((x.to_bits() >> 1) + 0x1FF8_0000_0000_0000);
    for _ in 0..6 {
        y = 0.5 * (y + x / y);
    }
    y
}

/// One point, for policies that sort or reorder (batches arrive as columns).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    pub ts: i64,
    pub value: f64,
    pub event: u64,
}

impl Row {
    /// The identity order of the store: time, event id, value bits.
    pub fn key(&self) -> (i64, u64, u64) {
        (self.ts, self.event, self.value.to_bits())
    }
}

/// Columns as rows.
pub fn rows(ts: &[i64], value: &[f64], event: &[u64]) -> alloc::vec::Vec<Row> {
    ts.iter()
        .zip(value)
        .zip(event)
        .map(|((&ts, &value), &event)| Row { ts, value, event })
        .collect()
}

/// Rows as columns `(ts, value, event)`.
pub fn columns(
    rows: &[Row],
) -> (
    alloc::vec::Vec<i64>,
    alloc::vec::Vec<f64>,
    alloc::vec::Vec<u64>,
) {
    (
        rows.iter().map(|r| r.ts).collect(),
        rows.iter().map(|r| r.value).collect(),
        rows.iter().map(|r| r.event).collect(),
    )
}

/// Whether the columns are strictly increasing in identity order (sorted, no duplicates): the
/// common case of a batch from one device, which then needs no sort.
pub fn strictly_sorted(ts: &[i64], value: &[f64], event: &[u64]) -> bool {
    (1..ts.len()).all(|i| {
        (ts[i - 1], event[i - 1], value[i - 1].to_bits()) < (ts[i], event[i], value[i].to_bits())
    })
}
