//! Operators' writes (`wasmkeep actor sql --write`, ADR 0065 amended):
//! each request's result is kept in the actor's own database, in the same
//! transaction as the statement's writes, so that a request carried out
//! again (its node stopped after the commit and before it reported) finds
//! its result instead of writing twice.

use rusqlite::OptionalExtension as _;

use super::ActorStore;
use super::connection::has_table;
use crate::Result;

/// Results kept per actor: the newest ones; a request older than this
/// many later ones would run again (requests expire long before).
pub const OPERATOR_RESULTS_KEPT: i64 = 256;

impl ActorStore {
    /// The result recorded for operator request `request`, if its
    /// statement ran and committed. Runs inside the event (a store
    /// statement: the guest authorizer is off).
    pub fn operator_result(&mut self, request: &str) -> Result<Option<String>> {
        self.begin_event()?;
        let conn = self.connection()?;
        if !has_table(conn, "_wasmkeep_operator")? {
            return Ok(None);
        }
        Ok(conn
            .query_row(
                "SELECT result FROM _wasmkeep_operator WHERE request = ?1",
                [request],
                |row| row.get(0),
            )
            .optional()?)
    }

    /// Records `result` for operator request `request` inside the event's
    /// transaction: it commits with the statement's writes or not at all.
    /// Keeps the newest [`OPERATOR_RESULTS_KEPT`].
    pub fn record_operator_result(&mut self, request: &str, result: &str) -> Result<()> {
        self.begin_event()?;
        let conn = self.connection()?;
        conn.execute(
            "CREATE TABLE IF NOT EXISTS _wasmkeep_operator (seq INTEGER PRIMARY KEY, \
             request TEXT NOT NULL UNIQUE, result TEXT NOT NULL)",
            [],
        )?;
        conn.execute(
            "INSERT INTO _wasmkeep_operator (request, result) VALUES (?1, ?2)",
            [request, result],
        )?;
        conn.execute(
            "DELETE FROM _wasmkeep_operator WHERE seq <= (SELECT max(seq) FROM _wasmkeep_operator) - ?1",
            [OPERATOR_RESULTS_KEPT],
        )?;
        Ok(())
    }
}
