//! An actor's data, read from the bucket (ADR 0065): `actor sql` runs one
//! read-only statement on the actor's state as the bucket holds it and
//! prints the rows; `actor export` writes the database to a file the
//! sqlite3 shell opens. Both restore the actor in this process with a
//! store that writes nothing, so they need no node, and whoever holds the
//! actor keeps serving it.

use std::io::Write as _;
use std::path::Path;

use anyhow::{Context, bail};
use wasmkeep_store::{ActorStore, SqlValue, StoreConfig};
use wasmkeep_types::ActorId;

use super::args::ViewArgs;
use super::dev::write_stdout;
use super::views::{json_text, open_view, table};

/// Opens the actor's state for reading; an actor with nothing in the
/// bucket is an error.
async fn restore(actor: &str, view: &ViewArgs) -> anyhow::Result<(ActorId, ActorStore)> {
    let actor = ActorId::parse(actor)
        .with_context(|| format!("{actor:?} is not an actor id (TENANT/CLASS/NAME)"))?;
    let (bucket, keys, _) = open_view(view).await?;
    if !ActorStore::exists(&*bucket, &keys, &actor).await? {
        bail!("actor {actor} has nothing in the bucket");
    }
    let config = StoreConfig {
        // Whatever its class allows: this only reads what is there.
        database_bytes_max: u64::MAX / 2,
        ..StoreConfig::default()
    };
    let store = ActorStore::open_reader(bucket, keys, actor.clone(), config)
        .await
        .with_context(|| format!("restoring actor {actor}"))?;
    Ok((actor, store))
}

pub(super) async fn actor_sql(actor: &str, statement: &str, view: ViewArgs) -> anyhow::Result<()> {
    let (actor, mut store) = restore(actor, &view).await?;
    let rows = store
        .query(statement, &[])
        .map_err(|e| anyhow::anyhow!("actor {actor}: {}", e.message))?;
    store.rollback_event();
    if view.json {
        let values: Vec<Vec<serde_json::Value>> = rows
            .rows
            .iter()
            .map(|row| row.iter().map(json_value).collect())
            .collect();
        write_stdout(&json_text(&serde_json::json!({
            "columns": rows.columns,
            "rows": values,
        }))?);
        return Ok(());
    }
    let header: Vec<&str> = rows.columns.iter().map(String::as_str).collect();
    let cells: Vec<Vec<String>> = rows
        .rows
        .iter()
        .map(|row| row.iter().map(text_value).collect())
        .collect();
    write_stdout(&table(&header, &cells));
    Ok(())
}

pub(super) async fn actor_export(actor: &str, file: &Path, view: ViewArgs) -> anyhow::Result<()> {
    let (actor, store) = restore(actor, &view).await?;
    let image = store.database_image();
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(file)
        .with_context(|| {
            format!(
                "creating {} (an existing file is left alone)",
                file.display()
            )
        })?;
    out.write_all(&image)
        .and_then(|()| out.sync_all())
        .with_context(|| format!("writing {}", file.display()))?;
    eprintln!(
        "actor {actor}: {} bytes written to {}",
        image.len(),
        file.display()
    );
    Ok(())
}

/// A value as a table cell: text as it is, a blob as `x'…'` (SQL's
/// literal), NULL as `NULL`.
fn text_value(value: &SqlValue) -> String {
    match value {
        SqlValue::Null => "NULL".into(),
        SqlValue::Integer(i) => i.to_string(),
        SqlValue::Real(r) => r.to_string(),
        SqlValue::Text(t) => t.clone(),
        SqlValue::Blob(b) => format!("x'{}'", hex::encode(b)),
    }
}

/// A value in JSON: numbers and text as themselves, a blob as
/// `{"hex": "…"}`.
fn json_value(value: &SqlValue) -> serde_json::Value {
    match value {
        SqlValue::Null => serde_json::Value::Null,
        SqlValue::Integer(i) => (*i).into(),
        SqlValue::Real(r) => serde_json::Number::from_f64(*r)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        SqlValue::Text(t) => t.clone().into(),
        SqlValue::Blob(b) => serde_json::json!({ "hex": hex::encode(b) }),
    }
}
