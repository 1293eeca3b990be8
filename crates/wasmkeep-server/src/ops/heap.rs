//! Gives freed heap memory back to the system. Actors that unload their
//! instance, park their database or hibernate free many small allocations
//! spread over the heap; glibc keeps such memory for reuse and the process's
//! resident size stays at its peak. Once per heartbeat period, when actors
//! were unloaded or hibernated since the last time, `malloc_trim(0)` returns
//! the free pages (a few milliseconds for a heap of hundreds of MiB).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::ops::metrics::Metrics;

/// Remembers the unload and hibernation counts at the last trim.
#[derive(Debug, Default)]
pub struct HeapTrim {
    seen: AtomicU64,
}

impl HeapTrim {
    /// Trims when actors were unloaded or hibernated since the last call.
    pub fn after_unloads(&self, metrics: &Metrics) {
        let now = metrics.unloads_and_hibernations();
        if self.seen.swap(now, Ordering::Relaxed) != now {
            release_free_memory();
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_memory() {
    // SAFETY: malloc_trim only returns free memory to the system; it takes
    // no pointer and is thread-safe in glibc.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_memory() {}
