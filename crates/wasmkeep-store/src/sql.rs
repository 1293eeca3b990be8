//! Guest SQL: plain value types, errors as values, and the authorizer that
//! keeps a guest inside its own tables.
//!
//! The authorizer is consulted by SQLite when a statement is prepared. It is
//! active only while guest SQL runs ([`Guard::guest`] true); the store's own
//! statements (BEGIN, COMMIT, the alarm table) run with it off and are never
//! put in the statement cache, so a guest cannot reuse one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use rusqlite::hooks::{AuthAction, AuthContext, Authorization, TransactionOperation};
use rusqlite::types::{ToSqlOutput, Value, ValueRef};

/// Names starting with this (any case) belong to the store.
pub const RESERVED_PREFIX: &str = "_wasmkeep";

pub use wasmkeep_types::sql::{SqlRows, SqlValue};

/// A parameter is a value.
pub type SqlParam = SqlValue;

/// A guest's SQL failed; `Display` is SQLite's message (or ours, naming the
/// rule, when the authorizer refused).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SqlError {
    pub message: String,
}

impl SqlError {
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

/// A value bound to a statement (`SqlValue` is the types crate's, so the
/// store binds it through this).
pub(crate) struct Param<'a>(pub(crate) &'a SqlValue);

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self.0 {
            SqlValue::Null => ToSqlOutput::Owned(Value::Null),
            SqlValue::Integer(i) => ToSqlOutput::Owned(Value::Integer(*i)),
            SqlValue::Real(r) => ToSqlOutput::Owned(Value::Real(*r)),
            SqlValue::Text(t) => ToSqlOutput::Borrowed(ValueRef::Text(t.as_bytes())),
            SqlValue::Blob(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
        })
    }
}

/// A column value as read from a row.
pub(crate) fn value_from_ref(v: ValueRef<'_>) -> SqlValue {
    match v {
        ValueRef::Null => SqlValue::Null,
        ValueRef::Integer(i) => SqlValue::Integer(i),
        ValueRef::Real(r) => SqlValue::Real(r),
        ValueRef::Text(t) => SqlValue::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => SqlValue::Blob(b.to_vec()),
    }
}

/// Bytes a value costs in a result (for the result size limit).
pub(crate) fn cost_bytes(value: &SqlValue) -> usize {
    16 + match value {
        SqlValue::Text(t) => t.len(),
        SqlValue::Blob(b) => b.len(),
        _ => 0,
    }
}

/// Shared between the store and its authorizer callback.
#[derive(Debug, Default)]
pub struct Guard {
    guest: AtomicBool,
    /// Why the last refusal happened (turned into the guest's error).
    refusal: Mutex<Option<String>>,
}

impl Guard {
    pub fn set_guest(&self, on: bool) {
        self.guest.store(on, Ordering::SeqCst);
        if on {
            *self.refusal.lock() = None;
        }
    }

    pub fn take_refusal(&self) -> Option<String> {
        self.refusal.lock().take()
    }
}

/// PRAGMAs a guest may run: they read the schema or change nothing durable.
const PRAGMAS_ALLOWED: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_key_check",
    "quick_check",
    "integrity_check",
    "page_count",
    "freelist_count",
    "data_version",
    "collation_list",
    "function_list",
    "compile_options",
    // Read only: foreign keys are always enforced.
    "foreign_keys",
];
/// PRAGMAs a guest may also set: stored in the database (so durable and
/// replicated like any page), or lasting only until the event's commit
/// (`defer_foreign_keys`), or writing statistics into it (`optimize`).
const PRAGMAS_SETTABLE: &[&str] = &[
    "user_version",
    "application_id",
    "defer_foreign_keys",
    "optimize",
];

fn reserved(name: &str) -> bool {
    name.len() >= RESERVED_PREFIX.len()
        && name.as_bytes()[..RESERVED_PREFIX.len()].eq_ignore_ascii_case(RESERVED_PREFIX.as_bytes())
}

/// Decides one action of guest SQL; `Err` carries the reason.
fn judge(ctx: &AuthContext<'_>) -> Result<(), String> {
    use AuthAction as A;
    let table = |name: &str| {
        if reserved(name) {
            Err(format!(
                "{name} is reserved for wasmkeep (names starting with {RESERVED_PREFIX})"
            ))
        } else {
            Ok(())
        }
    };
    match ctx.action {
        A::Attach { .. } | A::Detach { .. } => Err("ATTACH and DETACH are not allowed: an actor has one database".into()),
        A::Transaction { operation } => match operation {
            TransactionOperation::Begin => Err(
                "BEGIN is not allowed: each event is one transaction (use SAVEPOINT inside it)".into(),
            ),
            TransactionOperation::Rollback => Err(
                "ROLLBACK is not allowed: an event that fails has its writes discarded (use ROLLBACK TO a savepoint)"
                    .into(),
            ),
            _ => Err("COMMIT is not allowed: an event's writes commit when it ends".into()),
        },
        A::Pragma {
            pragma_name,
            pragma_value,
        } => {
            let name = pragma_name.to_ascii_lowercase();
            if PRAGMAS_SETTABLE.contains(&name.as_str())
                || (PRAGMAS_ALLOWED.contains(&name.as_str())
                    && (pragma_value.is_none()
                        || !matches!(name.as_str(), "page_count" | "data_version" | "foreign_keys")))
            {
                Ok(())
            } else if PRAGMAS_ALLOWED.contains(&name.as_str()) {
                Err(format!("PRAGMA {pragma_name} may be read, not set"))
            } else {
                Err(format!(
                    "PRAGMA {pragma_name} is not allowed (it could change durability or the store); allowed: {}",
                    PRAGMAS_SETTABLE.iter().chain(PRAGMAS_ALLOWED).copied().collect::<Vec<_>>().join(", ")
                ))
            }
        }
        A::CreateTempIndex { .. }
        | A::CreateTempTable { .. }
        | A::CreateTempTrigger { .. }
        | A::CreateTempView { .. } => Err("temporary objects are not allowed: they would not survive a restore".into()),
        A::CreateVtable { module_name, .. } | A::DropVtable { module_name, .. } => {
            Err(format!("virtual tables ({module_name}) are not allowed"))
        }
        A::CreateIndex { index_name, table_name }
        | A::DropIndex { index_name, table_name }
        | A::CreateTrigger {
            trigger_name: index_name,
            table_name,
        }
        | A::DropTrigger {
            trigger_name: index_name,
            table_name,
        } => table(index_name).and(table(table_name)),
        A::CreateTable { table_name }
        | A::DropTable { table_name }
        | A::Delete { table_name }
        | A::Insert { table_name }
        | A::Read { table_name, .. }
        | A::Update { table_name, .. }
        | A::Analyze { table_name } => table(table_name),
        A::AlterTable { table_name, .. } => table(table_name),
        A::CreateView { view_name } | A::DropView { view_name } => table(view_name),
        A::Reindex { index_name } => table(index_name),
        A::Function { function_name } => {
            if function_name.eq_ignore_ascii_case("load_extension") {
                Err("load_extension is not allowed".into())
            } else {
                Ok(())
            }
        }
        A::Select | A::Recursive | A::Savepoint { .. } => Ok(()),
        // Anything SQLite adds later is refused until someone decides.
        _ => Err(format!("{:?} is not allowed", ctx.action)),
    }
}

/// Installs the authorizer on `conn`; it judges only while `guard.guest` is set.
pub fn install_authorizer(conn: &rusqlite::Connection, guard: Arc<Guard>) {
    conn.authorizer(Some(move |ctx: AuthContext<'_>| {
        if !guard.guest.load(Ordering::SeqCst) {
            return Authorization::Allow;
        }
        match judge(&ctx) {
            Ok(()) => Authorization::Allow,
            Err(reason) => {
                let mut refusal = guard.refusal.lock();
                if refusal.is_none() {
                    *refusal = Some(reason);
                }
                Authorization::Deny
            }
        }
    }));
}

/// Turns a rusqlite error into the guest's error, naming the authorizer's rule.
pub fn guest_error(err: rusqlite::Error, guard: &Guard) -> SqlError {
    if let Some(reason) = guard.take_refusal() {
        return SqlError::new(format!("not authorized: {reason}"));
    }
    match err {
        rusqlite::Error::SqliteFailure(_, Some(msg)) => SqlError::new(msg),
        rusqlite::Error::MultipleStatement => SqlError::new(
            "more than one statement: send one SQL statement per call (trailing SQL found)",
        ),
        rusqlite::Error::ExecuteReturnedResults => SqlError::new(
            "the statement returns rows (a SELECT, or a RETURNING clause): run it with query; \
             execute ran nothing",
        ),
        other => SqlError::new(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_names_match_any_case() {
        assert!(reserved("_wasmkeep_alarm"));
        assert!(reserved("_WasmKeep"));
        assert!(!reserved("_wasm"));
        assert!(!reserved("users"));
    }
}
