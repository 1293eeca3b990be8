//! [`run`]: deep host work of a guest's call (SQLite) runs on a stack of the
//! worker thread instead of the instance's fiber stack.
//!
//! A guest runs on a fiber stack from wasmtime's pool, and its store keeps
//! that stack, with every page an event ever touched, while the instance is
//! loaded. The guest's own frames take less than a page; what went deeper
//! was SQLite called from the `sql` imports: compiling a statement (parser,
//! name resolution, code generation) took the counter's stack to 16 KiB,
//! four pages held by each busy actor. One stack per thread serves the calls
//! of all actors that thread runs, so those pages are touched once per
//! thread (docs/adr/0037-memory-of-busy-actors.md).
//!
//! The host stack is a private mapping with a guard page below it, made at a
//! thread's first call. A call made while the thread is already on it (none
//! today) runs where it is.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::ptr::NonNull;

/// Usable bytes of each thread's host stack: as much as wasmtime gives a
/// fiber (its default `async_stack_size`), so no statement that ran on the
/// fiber runs out here. Only touched pages take memory.
const STACK_BYTES: usize = 2 << 20;

/// The guard page below the stack: an overflow faults instead of writing
/// into whatever lies below.
const GUARD_BYTES: usize = 4096;

thread_local! {
    /// This thread's host stack, made at its first use.
    static STACK: HostStack = const { HostStack { base: Cell::new(None), busy: Cell::new(false), failed: Cell::new(false) } };
}

struct HostStack {
    /// The lowest usable byte (just above the guard page).
    base: Cell<Option<NonNull<u8>>>,
    /// Whether this thread is running on the stack now.
    busy: Cell<bool>,
    /// Whether making the mapping failed (then every call runs in place).
    failed: Cell<bool>,
}

impl HostStack {
    /// The stack's base, mapping it at the first call.
    fn base(&self) -> Option<NonNull<u8>> {
        if let Some(base) = self.base.get() {
            return Some(base);
        }
        if self.failed.get() {
            return None;
        }
        let base = map_stack();
        if base.is_none() {
            self.failed.set(true);
            tracing::warn!("could not map a host stack: SQLite runs on the guests' fiber stacks");
        }
        self.base.set(base);
        base
    }
}

impl Drop for HostStack {
    fn drop(&mut self) {
        if let Some(base) = self.base.get() {
            // SAFETY: the mapping was made by `map_stack` with this size and
            // the thread is exiting, so nothing runs on it.
            unsafe {
                libc::munmap(
                    base.as_ptr().sub(GUARD_BYTES).cast(),
                    STACK_BYTES + GUARD_BYTES,
                );
            }
        }
    }
}

/// Maps a stack with a guard page below it; `None` if the system refuses.
fn map_stack() -> Option<NonNull<u8>> {
    // SAFETY: a fresh anonymous mapping, aliasing nothing; on failure nothing
    // is mapped (or the partial mapping is unmapped).
    unsafe {
        let bytes = STACK_BYTES + GUARD_BYTES;
        let ptr = libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_STACK,
            -1,
            0,
        );
        if ptr == libc::MAP_FAILED {
            return None;
        }
        if libc::mprotect(ptr, GUARD_BYTES, libc::PROT_NONE) != 0 {
            libc::munmap(ptr, bytes);
            return None;
        }
        NonNull::new(ptr.cast::<u8>().add(GUARD_BYTES))
    }
}

/// Runs `work` on this thread's host stack (in place if the thread is
/// already on it or has none), and returns its result; a panic in `work`
/// resumes here, after the switch back.
pub(crate) fn run<R>(work: impl FnOnce() -> R) -> R {
    STACK.with(|stack| {
        if stack.busy.get() {
            return work();
        }
        let Some(base) = stack.base() else {
            return work();
        };
        stack.busy.set(true);
        // SAFETY: `base` is page-aligned with STACK_BYTES usable bytes and a
        // guard page below; no other frame uses it (`busy`); the callback
        // cannot unwind past the switch (it catches panics) and returns
        // normally.
        let outcome = unsafe {
            psm::on_stack(base.as_ptr(), STACK_BYTES, move || {
                catch_unwind(AssertUnwindSafe(work))
            })
        };
        stack.busy.set(false);
        match outcome {
            Ok(value) => value,
            Err(panic) => resume_unwind(panic),
        }
    })
}

/// Whether the caller runs on its thread's host stack: true inside the
/// [`ActorHost`](crate::ActorHost) methods of the `sql` imports.
#[inline(never)]
pub fn on_host_stack() -> bool {
    let local = 0u8;
    let here = std::ptr::addr_of!(local) as usize;
    STACK.with(|stack| {
        stack.base.get().is_some_and(|base| {
            let base = base.as_ptr() as usize;
            (base..base + STACK_BYTES).contains(&here)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The address of a local of the calling frame.
    #[inline(never)]
    fn frame_address() -> usize {
        let local = 0u8;
        std::ptr::addr_of!(local) as usize
    }

    #[test]
    fn work_runs_on_the_threads_host_stack_and_returns_its_value() {
        let outside = frame_address();
        assert!(!on_host_stack());
        let (inside, value) = run(|| (frame_address(), 42));
        assert_eq!(value, 42);
        assert!(run(on_host_stack));
        let base = STACK
            .with(|stack| stack.base.get())
            .expect("mapped")
            .as_ptr() as usize;
        assert!(
            (base..base + STACK_BYTES).contains(&inside),
            "{inside:#x} is not on the host stack at {base:#x}"
        );
        assert!(!(base..base + STACK_BYTES).contains(&outside));
        // The same stack serves the next call.
        let again = run(frame_address);
        assert!((base..base + STACK_BYTES).contains(&again));
    }

    #[test]
    fn a_nested_call_runs_in_place() {
        let (outer, inner) = run(|| (frame_address(), run(frame_address)));
        let base = STACK
            .with(|stack| stack.base.get())
            .expect("mapped")
            .as_ptr() as usize;
        assert!((base..base + STACK_BYTES).contains(&outer));
        assert!((base..base + STACK_BYTES).contains(&inner));
        // In place: at or below its caller's frame (the nested call may be
        // inlined into it), never on a fresh stack top.
        assert!(inner <= outer, "the nested call did not run in place");
    }

    #[test]
    fn a_panic_resumes_after_switching_back_and_the_stack_stays_usable() {
        let caught = std::panic::catch_unwind(|| run(|| panic!("in the host stack")));
        let message = caught.expect_err("the panic reaches the caller");
        assert_eq!(message.downcast_ref::<&str>(), Some(&"in the host stack"));
        assert!(!STACK.with(|stack| stack.busy.get()));
        assert_eq!(run(|| 7), 7);
    }
}
