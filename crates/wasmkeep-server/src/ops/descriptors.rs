//! The process's file descriptors: the open-file limit and the size of the
//! kernel's descriptor table, both set once at start, before any thread.
//!
//! Linux grows a process's descriptor table when a new descriptor does not
//! fit (64 slots at first, then doubling). In a process with more than one
//! thread, each growth waits for an RCU grace period (`expand_files` calls
//! `synchronize_rcu`), several milliseconds on these VMs, and the thread that
//! opened the descriptor waits with it. The folder bucket's first batch opens
//! its 256 stripe files at once (ADR 0035), and a busy node opens a socket
//! per client: measured, the first batch after a start spent 12 of its
//! 15-20 ms waiting for two such growths, and the first answer of a restarted
//! node waited for it. Grown once while the process has one thread, the
//! table needs no grace period.

/// Descriptor slots the table is grown to at start (or the open-file limit,
/// if lower). Each slot costs 8 bytes of kernel memory and a bit or two.
pub const TABLE_SLOTS: u64 = 4096;

/// What [`prepare`] did, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prepared {
    /// The soft open-file limit before (`RLIMIT_NOFILE`).
    pub limit_before: u64,
    /// The soft open-file limit now: raised to the hard limit.
    pub limit: u64,
    /// Slots the descriptor table was grown to (0: growing failed).
    pub table_slots: u64,
}

/// Raises the soft open-file limit to the hard one (a node's sockets must
/// not run out at the default 1,024; the peer dies there), then grows the
/// descriptor table to [`TABLE_SLOTS`] slots, or the limit if lower. Call it
/// first in `main`, while the process has one thread. Failures change
/// nothing and are reported in the result (a node still runs without).
pub fn prepare() -> Prepared {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Prepared {
            limit_before: 0,
            limit: 0,
            table_slots: 0,
        };
    }
    let limit_before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit from the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    let table_slots = grow_table(TABLE_SLOTS.min(limit.rlim_cur));
    Prepared {
        limit_before,
        limit: limit.rlim_cur,
        table_slots,
    }
}

/// Grows the descriptor table to hold descriptor `slots - 1`: duplicates a
/// descriptor to the lowest free number at or above it, and closes the copy.
/// Returns `slots`, or 0 when that failed.
fn grow_table(slots: u64) -> u64 {
    let Some(highest) = slots
        .checked_sub(1)
        .and_then(|h| libc::c_int::try_from(h).ok())
    else {
        return 0;
    };
    let Ok(root) = std::fs::File::open("/") else {
        return 0;
    };
    // SAFETY: F_DUPFD_CLOEXEC duplicates our open descriptor `root`; the copy
    // is closed right below and never used otherwise.
    let copy = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&root),
            libc::F_DUPFD_CLOEXEC,
            highest,
        )
    };
    if copy < 0 {
        return 0;
    }
    // SAFETY: `copy` is the descriptor fcntl just made for us; nothing else
    // knows it.
    unsafe { libc::close(copy) };
    slots
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots in this process's descriptor table now (`FDSize` in
    /// `/proc/self/status`).
    fn table_slots_now() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix("FDSize:"))
            .and_then(|value| value.trim().parse().ok())
    }

    #[test]
    fn prepare_raises_the_soft_limit_and_grows_the_table() {
        let prepared = prepare();
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into the struct we pass.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!(limit.rlim_cur, limit.rlim_max, "soft limit raised to hard");
        assert_eq!(prepared.limit, limit.rlim_cur);
        assert!(prepared.limit_before <= prepared.limit);
        let wanted = TABLE_SLOTS.min(limit.rlim_cur);
        assert_eq!(prepared.table_slots, wanted);
        let now = table_slots_now().expect("/proc/self/status has FDSize");
        assert!(
            now >= wanted,
            "the table holds {now} slots, wanted {wanted}"
        );
    }
}
