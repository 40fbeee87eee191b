//! Thread priority: a leaf, so that any part of the node (and the benchmarks) may lower a
//! thread's priority without importing the node's start-up.

/// Lowers the calling thread's priority by `by` (Linux nice; nothing elsewhere). A thread may
/// always lower its own, and on Linux `setpriority` of a thread id changes that thread alone.
pub fn lower_this_threads_priority(by: i32) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let thread = Some(rustix::thread::gettid());
        rustix::process::getpriority_process(thread)
            .and_then(|nice| rustix::process::setpriority_process(thread, nice + by))?;
    }
    #[cfg(not(target_os = "linux"))]
    let _ = by;
    Ok(())
}
