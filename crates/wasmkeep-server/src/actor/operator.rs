//! Operators' statements (`wasmkeep actor sql --write`, ADR 0065
//! amended) as events of the actor's mailbox.

use wasmkeep_runtime::Response;
use wasmkeep_store::ActorStore;

use crate::{Error, Result};

/// An operator's statement as an event (ADR 0065, amended): the result
/// recorded for `request` if it ran before (a node that ran it stopped
/// before it reported), else the statement's rows and the rows it changed,
/// recorded in the same transaction. The statement runs as a guest's does
/// (the authorizer keeps it out of the store's tables; the guest's limits).
pub(crate) fn run(store: &mut ActorStore, request: &str, statement: &str) -> Result<Response> {
    let store_error = |e: wasmkeep_store::Error| Error::Store(e.to_string());
    let result = match store.operator_result(request).map_err(store_error)? {
        Some(result) => result,
        None => {
            let changes = |store: &mut ActorStore| -> Result<i64> {
                match store.query("SELECT total_changes()", &[]) {
                    Ok(rows) => match rows.rows.first().and_then(|r| r.first()) {
                        Some(wasmkeep_store::SqlValue::Integer(n)) => Ok(*n),
                        _ => Err(Error::Store("total_changes() gave no number".into())),
                    },
                    Err(e) => Err(Error::Store(e.message)),
                }
            };
            let before = changes(store)?;
            let rows = store
                .query(statement, &[])
                .map_err(|e| Error::BadRequest(e.message))?;
            let changed = changes(store)? - before;
            let mut result = crate::ops::survey::json_rows(&rows);
            result["changes"] = changed.into();
            let result = result.to_string();
            store
                .record_operator_result(request, &result)
                .map_err(store_error)?;
            result
        }
    };
    Ok(Response {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: result.into_bytes(),
    })
}
