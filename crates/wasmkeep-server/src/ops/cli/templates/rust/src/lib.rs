//! {{name}}: a wasmkeep actor, a counter to start from. Each actor
//! (`TENANT/{{name}}/NAME`) has its own SQLite database.
//!
//! - `POST /increment` adds one and answers the new count;
//! - `GET /value` answers the count (0 before the first increment).

use wasmkeep_sdk::{Actor, Params, Request, Response, Result, Router, params, sql};

fn increment() -> Result<i64> {
    sql::execute(
        "CREATE TABLE IF NOT EXISTS counter(id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
        params![],
    )?;
    sql::query_row::<(i64,)>(
        "INSERT INTO counter(id, n) VALUES (1, 1) ON CONFLICT(id) DO UPDATE SET n = n + 1 RETURNING n",
        params![],
    )
    .map(|(n,)| n)
}

fn value() -> Result<i64> {
    match sql::query_value::<i64>("SELECT n FROM counter WHERE id = 1", params![]) {
        Err(err) if err.is_missing_table() => Ok(0),
        other => other.map(|n| n.unwrap_or(0)),
    }
}

struct Counter {
    router: Router<Counter>,
}

impl Counter {
    fn increment(&self, _: &Request, _: &Params) -> Result<String> {
        increment().map(|n| n.to_string())
    }

    fn value(&self, _: &Request, _: &Params) -> Result<String> {
        value().map(|n| n.to_string())
    }
}

impl Actor for Counter {
    fn new() -> Self {
        let router = Router::new()
            .post("/increment", Counter::increment)
            .get("/value", Counter::value);
        Counter { router }
    }

    fn fetch(&self, request: Request) -> Response {
        self.router.handle(self, &request)
    }
}

wasmkeep_sdk::export_actor!(Counter);
