//! Where a guest statement runs (ADR 0063): on the caller's thread, which
//! in a node is one of tokio's few async workers, only when it cannot keep
//! that worker long; anything else off the workers, a bounded number at
//! once.
//!
//! - A write whose program cannot loop ([`is_bounded`]: no cursor loop, no
//!   jump back, no trigger program, no function call) runs inline: the
//!   common `INSERT ... VALUES`, `UPDATE ... WHERE id = ?` and upserts,
//!   which cost a few microseconds and would pay more than that to move.
//! - A read-only statement runs inline for at most [`INLINE_SLICE`]; one
//!   that needs longer is interrupted (a read leaves the transaction as it
//!   was) and run again off the workers, with the rest of its time.
//! - Every other write runs off the workers from its start: interrupting a
//!   write would roll back the event's whole transaction.
//!
//! Off the workers means [`tokio::task::block_in_place`]: the worker's
//! other tasks move to a new thread while this one runs the statement. At
//! most [`heavy_max`] statements of one tenant run so at once, and
//! [`HEAVY_TOTAL_PER_CPU`] per CPU of all tenants (the others wait for a
//! turn on their own threads, their time running). So however many actors
//! run heavy statements, the async workers keep serving every other actor,
//! and the node's lease renewals; a tenant's heavy statements wait for its
//! own. Outside a multi-threaded runtime (tests, the simulation)
//! everything runs inline.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use rusqlite::Connection;

/// Longest a read-only statement runs inline before it is run again off the
/// async workers.
pub const INLINE_SLICE: Duration = Duration::from_millis(2);

/// Statements classified per thread before the cache starts over.
const CLASSIFIED_MAX: usize = 1024;

/// VDBE opcodes that loop, call code of unbounded cost, or run a
/// sub-program (triggers).
const LOOPING_OPCODES: [&str; 11] = [
    "Next",
    "Prev",
    "SorterNext",
    "VNext",
    "VFilter",
    "Yield",
    "Program",
    "RowSetRead",
    "Function",
    "PureFunc",
    "AggStep",
];

static OFF_WORKER: AtomicU64 = AtomicU64::new(0);

/// Guest statements run off the async workers since the process started.
pub fn statements_off_worker_total() -> u64 {
    OFF_WORKER.load(Ordering::Relaxed)
}

/// Heavy statements of one tenant that run at once: half the CPUs, at
/// least one, so the rest stay with the async workers and other tenants.
pub fn heavy_max() -> usize {
    (cpus() / 2).max(1)
}

/// The CPUs this process may use (1 when it cannot tell), asked once.
fn cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS
        .get_or_init(|| std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get))
}

/// Whether a write statement's program is bounded: it runs each of its
/// instructions at most once or so (see the module). Asked once per
/// statement text and thread.
pub(crate) fn is_bounded(conn: &Connection, sql: &str) -> bool {
    thread_local! {
        static CLASSIFIED: RefCell<HashMap<Box<str>, bool>> = RefCell::new(HashMap::new());
    }
    if let Some(known) = CLASSIFIED.with(|c| c.borrow().get(sql).copied()) {
        return known;
    }
    let bounded = classify(conn, sql).unwrap_or(false);
    CLASSIFIED.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= CLASSIFIED_MAX {
            c.clear();
        }
        c.insert(sql.into(), bounded);
    });
    bounded
}

/// Reads the statement's program (`EXPLAIN`): bounded when no instruction
/// is one of [`LOOPING_OPCODES`] and no jump goes back, except the
/// prologue's jump to the program's start. A loop over an ephemeral table
/// (the rows a `RETURNING` hands back) is as bounded as what filled it:
/// filling it took a loop of its own, or a bounded number of rows.
fn classify(conn: &Connection, sql: &str) -> rusqlite::Result<bool> {
    let mut stmt = conn.prepare(&format!("EXPLAIN {sql}"))?;
    // Parameters stay unbound: the program does not depend on them.
    let mut rows = stmt.raw_query();
    // (address, opcode, p1, p2); the prologue, where ephemeral tables are
    // opened, comes last.
    let mut program = Vec::new();
    while let Some(row) = rows.next()? {
        program.push((
            row.get::<_, i64>(0)?,
            row.get::<_, String>(1)?,
            row.get::<_, i64>(2)?,
            row.get::<_, i64>(3)?,
        ));
    }
    let ephemeral: Vec<i64> = program
        .iter()
        .filter(|(_, opcode, ..)| opcode == "OpenEphemeral")
        .map(|(_, _, p1, _)| *p1)
        .collect();
    Ok(program.iter().all(|(addr, opcode, p1, p2)| {
        let over_ephemeral = matches!(opcode.as_str(), "Next" | "Prev") && ephemeral.contains(p1);
        let loops = LOOPING_OPCODES.contains(&opcode.as_str()) && !over_ephemeral;
        let jumps_back = opcode == "Goto" && p2 <= addr && *p2 != 1;
        !loops && !jumps_back
    }))
}

/// Runs `f` off the async workers when called on one (see the module),
/// after waiting for a turn of `tenant`'s ([`heavy_max`] per tenant,
/// [`HEAVY_TOTAL_PER_CPU`] per CPU in all); else inline.
pub(crate) fn off_worker<T>(tenant: &str, f: impl FnOnce() -> T) -> T {
    let on_worker = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if !on_worker {
        return f();
    }
    OFF_WORKER.fetch_add(1, Ordering::Relaxed);
    tokio::task::block_in_place(|| {
        let _turn = Turn::take(tenant);
        f()
    })
}

/// Heavy statements of all tenants at once, per CPU: each holds a thread
/// and up to `statement_memory_max`.
pub const HEAVY_TOTAL_PER_CPU: usize = 4;

fn heavy_total() -> usize {
    cpus().saturating_mul(HEAVY_TOTAL_PER_CPU)
}

/// The heavy statements running, per tenant (their sum: all of them).
static TURNS: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
static TURN_FREED: Condvar = Condvar::new();

/// One tenant's turn to run a heavy statement: a tenant waits only for its
/// own heavy statements (or for all of them together at the total cap), so
/// one tenant's heavy statements never queue another's.
struct Turn {
    tenant: String,
}

impl Turn {
    fn take(tenant: &str) -> Self {
        let mut turns = TURNS.lock();
        loop {
            let mine = turns.get(tenant).copied().unwrap_or(0);
            if mine < heavy_max() && turns.values().sum::<usize>() < heavy_total() {
                *turns.entry(tenant.to_owned()).or_insert(0) += 1;
                return Turn {
                    tenant: tenant.to_owned(),
                };
            }
            TURN_FREED.wait(&mut turns);
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut turns = TURNS.lock();
        if let Some(mine) = turns.get_mut(&self.tenant) {
            *mine -= 1;
            if *mine == 0 {
                turns.remove(&self.tenant);
            }
        }
        drop(turns);
        TURN_FREED.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_that_cannot_loop_are_bounded_and_the_others_not() {
        let conn = Connection::open_in_memory().expect("memory db");
        conn.execute_batch(
            "CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL);
             CREATE TABLE t (a, b);
             CREATE TABLE log (id INTEGER PRIMARY KEY, at INTEGER);
             CREATE TRIGGER logged AFTER INSERT ON log BEGIN DELETE FROM t; END;",
        )
        .expect("schema");
        let bounded = [
            "INSERT INTO counter (id, n) VALUES (1, 1) ON CONFLICT (id) DO UPDATE SET n = n + 1",
            "INSERT INTO counter(id, n) VALUES (?, 1) ON CONFLICT(id) DO UPDATE SET n = n + 1 RETURNING n",
            "UPDATE counter SET n = n + 1 WHERE id = 1",
            "INSERT INTO t (a, b) VALUES (?1, ?2)",
            "DELETE FROM counter WHERE id = ?1",
            "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
        ];
        let unbounded = [
            "UPDATE t SET b = 1 WHERE a = 2",
            "UPDATE t SET b = 1 WHERE a = 2 RETURNING b",
            "DELETE FROM t RETURNING a",
            "DELETE FROM t WHERE a > 1",
            "INSERT INTO t SELECT a, b FROM t",
            "INSERT INTO t (a) WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c",
            "INSERT INTO t (a, b) VALUES (1, 2), (3, 4)",
            "INSERT INTO t (a) VALUES (hex(randomblob(1000000)))",
            "INSERT INTO log (id, at) VALUES (1, 2)",
            "CREATE INDEX ta ON t (a)",
            "not sql at all",
        ];
        for sql in bounded {
            assert!(
                classify(&conn, sql).expect(sql),
                "{sql}: {}",
                program(&conn, sql)
            );
        }
        for sql in unbounded {
            assert!(!is_bounded(&conn, sql), "{sql}: {}", program(&conn, sql));
        }
    }

    fn program(conn: &Connection, sql: &str) -> String {
        let Ok(mut stmt) = conn.prepare(&format!("EXPLAIN {sql}")) else {
            return "does not prepare".into();
        };
        let mut rows = stmt.raw_query();
        let mut lines = Vec::new();
        while let Ok(Some(r)) = rows.next() {
            lines.push(format!(
                "{} {} p2={}",
                r.get::<_, i64>(0).unwrap_or(-1),
                r.get::<_, String>(1).unwrap_or_default(),
                r.get::<_, i64>(3).unwrap_or(-1)
            ));
        }
        lines.join("; ")
    }

    /// `block_in_place` panics on a current-thread runtime: answering there
    /// shows the statement ran inline. (The process-wide count is not
    /// compared: the other tests of this binary run beside this one.)
    #[test]
    fn off_a_multi_threaded_runtime_a_statement_runs_inline() {
        assert_eq!(off_worker("t", || 7), 7);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        assert_eq!(rt.block_on(async { off_worker("t", || 8) }), 8);
    }

    #[test]
    fn on_a_worker_a_statement_runs_off_it_and_other_tasks_go_on() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let before = statements_off_worker_total();
        rt.block_on(async {
            // One worker: while the heavy statement holds its thread, the
            // other task runs only if the worker moved to another thread.
            let (started_tx, started_rx) = tokio::sync::oneshot::channel();
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            let heavy = tokio::spawn(async move {
                off_worker("t", move || {
                    started_tx.send(()).expect("the test waits");
                    // A guard against a hang, not a timing.
                    rx.recv_timeout(Duration::from_secs(60)).is_ok()
                })
            });
            started_rx.await.expect("the heavy statement started");
            tokio::spawn(async move { tx.send(()).expect("heavy waits") });
            assert!(heavy.await.expect("the heavy statement ended"));
        });
        assert!(statements_off_worker_total() > before);
    }
}
