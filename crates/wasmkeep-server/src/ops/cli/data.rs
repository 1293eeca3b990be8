//! An actor's data, read from the bucket (ADR 0065): `actor sql` runs one
//! read-only statement on the actor's state as the bucket holds it and
//! prints the rows; `actor export` writes the database to a file the
//! sqlite3 shell opens. Both restore the actor in this process with a
//! store that writes nothing, so they need no node, and whoever holds the
//! actor keeps serving it.

use std::io::Write as _;
use std::path::Path;

use anyhow::Context;
use wasmkeep_store::ActorStore;
use wasmkeep_types::ActorId;

use super::args::ViewArgs;
use super::dev::write_stdout;
use super::views::{json_text, open_view, table};
use crate::ops::survey;

/// Opens the actor's state for reading; an actor with nothing in the
/// bucket is an error.
async fn restore(actor: &str, view: &ViewArgs) -> anyhow::Result<(ActorId, ActorStore)> {
    let actor = ActorId::parse(actor)
        .with_context(|| format!("{actor:?} is not an actor id (TENANT/CLASS/NAME)"))?;
    let (bucket, keys, _) = open_view(view).await?;
    let store = survey::open_reader(bucket, keys, &actor)
        .await
        .with_context(|| format!("restoring actor {actor}"))?
        .ok_or_else(|| anyhow::anyhow!("actor {actor} has nothing in the bucket"))?;
    Ok((actor, store))
}

pub(super) async fn actor_sql(actor: &str, statement: &str, view: ViewArgs) -> anyhow::Result<()> {
    let (actor, mut store) = restore(actor, &view).await?;
    let rows = store
        .query(statement, &[])
        .map_err(|e| anyhow::anyhow!("actor {actor}: {}", e.message))?;
    store.rollback_event();
    if view.json {
        write_stdout(&json_text(&survey::json_rows(&rows))?);
        return Ok(());
    }
    let header: Vec<&str> = rows.columns.iter().map(String::as_str).collect();
    let cells: Vec<Vec<String>> = rows
        .rows
        .iter()
        .map(|row| row.iter().map(survey::text_value).collect())
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
