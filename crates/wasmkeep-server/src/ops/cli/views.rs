//! The read-only operator views: `node list`, `class list`, `actor list`,
//! `actor inspect`, as tables or JSON, and what they share with the operator
//! commands (opening an existing bucket for a view, telling a deleted
//! actor from a live one). It never writes to the bucket.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use wasmkeep_bucket::Bucket;
use wasmkeep_types::{AppName, Keys};

use super::args::{ViewArgs, parse_actor, parse_duration};
use super::dev::write_stdout;
use crate::ops::survey;

/// Parsed view flags: the bucket, keys and lease TTL.
pub(super) async fn open_view(
    view: &ViewArgs,
) -> anyhow::Result<(Arc<dyn Bucket>, Keys, Duration)> {
    let app = AppName::new(view.app.clone())?;
    let lease_ttl = parse_duration(&view.lease_ttl).context("--lease-ttl")?;
    // The views and operator commands never create a bucket.
    let bucket = wasmkeep_bucket::open_existing(&view.bucket).await?;
    Ok((bucket, Keys::new(&app), lease_ttl))
}

pub(super) fn json_text<T: serde::Serialize>(value: &T) -> anyhow::Result<String> {
    Ok(format!("{}\n", serde_json::to_string_pretty(value)?))
}

/// Lays out rows as columns separated by two spaces.
pub(super) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let text: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(text.join("  ").trim_end());
        out.push('\n');
    };
    line(header.iter().map(|h| (*h).to_owned()).collect(), &mut out);
    for row in rows {
        line(row.clone(), &mut out);
    }
    out
}

pub(super) async fn node_list(view: ViewArgs) -> anyhow::Result<()> {
    let (bucket, keys, lease_ttl) = open_view(&view).await?;
    let rows = wasmkeep_cluster::inspect::list_nodes(&*bucket, &keys, lease_ttl).await?;
    if view.json {
        write_stdout(&json_text(&rows)?);
        return Ok(());
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.node.clone(),
                r.address.clone(),
                if r.stale {
                    format!("{} (stale)", r.state)
                } else {
                    r.state.to_owned()
                },
                match (
                    r.drain_requested && r.drain == "none",
                    r.sockets_closing,
                    r.releases_failed,
                ) {
                    (true, _, _) => "requested".to_owned(),
                    // Hand-over progress (heartbeat line 13), shown while there is any.
                    (false, 0, 0) => r.drain.to_owned(),
                    (false, closing, failed) => format!(
                        "{} ({closing} sockets closing, {failed} failed releases)",
                        r.drain
                    ),
                },
                if r.capabilities.is_empty() {
                    "-".to_owned()
                } else {
                    r.capabilities.join(" ")
                },
                r.resident_actors.to_string(),
                format!("{:.1}s", r.heartbeat_age_s),
            ]
        })
        .collect();
    write_stdout(&table(
        &[
            "NODE",
            "ADDRESS",
            "STATE",
            "DRAIN",
            "CAPABILITIES",
            "ACTORS",
            "HEARTBEAT AGE",
        ],
        &cells,
    ));
    Ok(())
}

pub(super) async fn class_list(view: ViewArgs) -> anyhow::Result<()> {
    let (bucket, keys, _) = open_view(&view).await?;
    let rows = survey::class_rows(&*bucket, &keys).await?;
    if view.json {
        write_stdout(&json_text(&rows)?);
        return Ok(());
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| match (&r.digest, &r.error) {
            (Some(digest), _) => vec![
                r.class.clone(),
                digest.chars().take(12).collect(),
                r.database_bytes_max
                    .map_or_else(String::new, |b| b.to_string()),
                if r.allow_outbound.is_empty() {
                    "(nothing)".to_owned()
                } else {
                    r.allow_outbound.join(" ")
                },
            ],
            (None, error) => vec![
                r.class.clone(),
                format!("unreadable record: {}", error.as_deref().unwrap_or("")),
                String::new(),
                String::new(),
            ],
        })
        .collect();
    write_stdout(&table(
        &["CLASS", "VERSION", "DATABASE MAX", "OUTBOUND"],
        &cells,
    ));
    Ok(())
}

fn actor_cells(r: &wasmkeep_cluster::inspect::ActorRow) -> Vec<String> {
    vec![
        r.actor.clone(),
        match (&r.owner, r.hold_valid) {
            (Some(owner), true) => owner.clone(),
            (Some(owner), false) => format!("{owner} (expired)"),
            (None, _) => "-".to_owned(),
        },
        r.alarm_ms
            .map_or_else(|| "-".to_owned(), |ms| ms.to_string()),
        r.database_bytes.to_string(),
        r.log_records.to_string(),
    ]
}

const ACTOR_HEADER: [&str; 5] = ["ACTOR", "OWNER", "ALARM MS", "DB BYTES", "LOG RECORDS"];

pub(super) async fn actor_list(prefix: Option<&str>, view: ViewArgs) -> anyhow::Result<()> {
    let (bucket, keys, lease_ttl) = open_view(&view).await?;
    let (rows, _) =
        survey::actor_page(&*bucket, &keys, lease_ttl, prefix, None, usize::MAX).await?;
    if view.json {
        write_stdout(&json_text(&rows)?);
    } else {
        let cells: Vec<Vec<String>> = rows.iter().map(actor_cells).collect();
        write_stdout(&table(&ACTOR_HEADER, &cells));
    }
    Ok(())
}

pub(super) async fn actor_inspect(actor: &str, view: ViewArgs) -> anyhow::Result<()> {
    let actor = parse_actor(actor)?;
    let (bucket, keys, lease_ttl) = open_view(&view).await?;
    let Some(row) =
        wasmkeep_cluster::inspect::inspect_actor(&*bucket, &keys, lease_ttl, &actor).await?
    else {
        bail!("actor {actor} has nothing in the bucket");
    };
    if survey::is_erased(&*bucket, &keys, &row).await? {
        bail!(
            "actor {actor} has nothing in the bucket (it was deleted; what stays is the empty \
             record that fences its former holders)"
        );
    }
    if view.json {
        write_stdout(&json_text(&row)?);
    } else {
        write_stdout(&table(&ACTOR_HEADER, &[actor_cells(&row)]));
    }
    Ok(())
}
