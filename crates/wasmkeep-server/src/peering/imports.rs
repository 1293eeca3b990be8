//! Importing a database into an actor (`wasmkeep actor import`, ADR 0069).
//! The command checks the file and writes
//! `control/import/<tenant>/<class>/<name hex>/<request>` (a line saying
//! whether data already there may be replaced, then the file); once per
//! heartbeat period every node looks at those keys (in its one listing of
//! `control/`). The import is carried out like a delete (ADR 0055), by the
//! node that holds the actor, whose mailbox hands it over first
//! ([`Job::Replace`]), or by the node that acquires the unheld actor's
//! record, and while that record names the node: the data is read (every
//! record of it landed), the file checked again against the class's
//! database maximum, and [`wasmkeep_store::replace`] puts it in place. The
//! node writes how it ended to `results/import/...` and removes the request.
//!
//! The import's id goes into the imported database, so a request carried
//! out again (its node stopped after the replacement and before it
//! reported) finds its own data and does not replace what the actor wrote
//! since.
//!
//! [`Job::Replace`]: crate::actor::orders::Job::Replace

use std::sync::{Arc, Weak};

use bytes::Bytes;
use wasmkeep_bucket::ObjectMeta;
use wasmkeep_store::{Image, Imported};
use wasmkeep_types::ActorId;

use crate::actor::erase::replace_data;
use crate::actor::orders::ReplaceOrder;
use crate::node::Node;
use crate::peering::control::spawn_once;
use crate::peering::deletes::{replace_unheld, requested, send_or_keep};
use crate::{Error, Result};

/// The first line of a request's body, before the mode.
const HEADER: &str = "wasmkeep-import 1";

/// The body of an import request: the header line with its mode (`replace`
/// when data already there may be replaced, else `empty`), then the file.
pub fn request_body(replace: bool, file: &[u8]) -> Bytes {
    let mode = if replace { "replace" } else { "empty" };
    let mut body = format!("{HEADER} {mode}\n").into_bytes();
    body.extend_from_slice(file);
    Bytes::from(body)
}

/// The mode (whether data may be replaced) and the file of a request body.
fn parse_body(body: &Bytes) -> std::result::Result<(bool, Bytes), String> {
    let line_end = body
        .iter()
        .take(HEADER.len() + 16)
        .position(|&b| b == b'\n')
        .ok_or("the request has no header line")?;
    let replace = match &body[..line_end] {
        line if line == format!("{HEADER} replace").as_bytes() => true,
        line if line == format!("{HEADER} empty").as_bytes() => false,
        _ => return Err("the request's header line is not an import's".into()),
    };
    Ok((replace, body.slice(line_end + 1..)))
}

/// The pass over the import keys, when the delete pass runs
/// ([`crate::peering::deletes::wanted`]): `listed` is the
/// heartbeat's listing under [`Keys::imports_prefix`]. Each request is
/// carried out in a task of its own (a large file takes a while); the pass
/// does not wait for them.
///
/// [`Keys::imports_prefix`]: wasmkeep_types::Keys::imports_prefix
pub(crate) async fn check(node: &Arc<Node>, listed: Vec<ObjectMeta>) {
    for item in listed {
        let (actor, request) = match node.keys.parse_import_key(&item.key) {
            Ok(parsed) => parsed,
            Err(e) => {
                crate::peering::control::remove_unparsed(node, &item.key, &e).await;
                continue;
            }
        };
        // A node that does not serve the class leaves it to one that does.
        if !node.classes.serves(&actor.class) {
            continue;
        }
        let key = item.key.clone();
        spawn_once(node, item.key, |node| async move {
            let order = ImportKey {
                node: Arc::downgrade(&node),
                key,
                request,
            };
            if let Some(order) = send_or_keep(&node, &actor, order).await
                && let Err(e) = replace_unheld(&node, &actor, &order).await
            {
                tracing::warn!(%actor, error = %e, "an import was not carried out; the next pass tries again");
            }
        });
    }
}

/// One import request as a mailbox or a pass carries it out. Holds its
/// node weakly: a job left in a mailbox must not keep a stopped node alive.
struct ImportKey {
    node: Weak<Node>,
    /// The request's key, as listed.
    key: String,
    request: String,
}

#[async_trait::async_trait]
impl ReplaceOrder for ImportKey {
    async fn stands(&self, actor: &ActorId) -> bool {
        match self.node.upgrade() {
            Some(node) => requested(&node, actor, &self.key).await,
            None => false,
        }
    }

    fn reads_data(&self) -> bool {
        true
    }

    fn close_reason(&self) -> &'static str {
        "actor imported"
    }

    async fn carry_out(&self, actor: &ActorId) -> Result<bool> {
        let Some(node) = self.node.upgrade() else {
            return Ok(false);
        };
        let body = match node.bucket.get(&self.key).await {
            Ok(object) => object.bytes,
            // Carried out and removed since.
            Err(wasmkeep_bucket::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let (replaced, result) = match parse_body(&body) {
            Err(why) => (false, refusal(why)),
            Ok((replace, file)) => self.import(&node, actor, replace, file).await?,
        };
        node.bucket
            .put(
                &node.keys.import_result_key(actor, &self.request)?,
                Bytes::from(result.to_string()),
            )
            .await?;
        if let Err(e) = node.bucket.delete(&self.key).await {
            tracing::warn!(%actor, error = %e, "removing the import key failed; the next pass finds the import done");
        }
        Ok(replaced)
    }
}

impl ImportKey {
    /// Checks the actor's data and the file, and replaces the data when
    /// both allow: whether it did, and the result to report.
    async fn import(
        &self,
        node: &Node,
        actor: &ActorId,
        replace: bool,
        file: Bytes,
    ) -> Result<(bool, serde_json::Value)> {
        let store_error = |e: wasmkeep_store::Error| Error::Store(e.to_string());
        let before = wasmkeep_store::imported(&*node.bucket, &node.keys, actor, &self.request)
            .await
            .map_err(store_error)?;
        match before {
            Imported::ThisOne => {
                return Ok((
                    false,
                    serde_json::json!({ "imported": true, "earlier": true }),
                ));
            }
            Imported::Other if !replace => {
                return Ok((
                    false,
                    refusal(format!(
                        "actor {actor} has data; --replace puts the file in its place"
                    )),
                ));
            }
            Imported::Other | Imported::Empty => {}
        }
        let bytes_max = node.classes.limits(&actor.class).database_bytes_max;
        let request = self.request.clone();
        // The integrity check reads every page: off the async workers.
        let image =
            tokio::task::spawn_blocking(move || Image::from_file(&file, bytes_max, Some(&request)))
                .await
                .map_err(|e| Error::Store(format!("checking the file: {e}")))?;
        let image = match image {
            Ok(image) => image,
            Err(wasmkeep_store::Error::BadImage(why)) => return Ok((false, refusal(why))),
            Err(e) => return Err(store_error(e)),
        };
        replace_data(node, actor, &image).await?;
        tracing::info!(%actor, bytes = image.bytes(), replaced = before == Imported::Other, "actor imported");
        Ok((
            true,
            serde_json::json!({
                "imported": true,
                "bytes": image.bytes(),
                "alarm_ms": image.alarm_ms(),
                "replaced": before == Imported::Other,
            }),
        ))
    }
}

/// A result saying the import was refused, and why; nothing was written.
fn refusal(why: impl Into<String>) -> serde_json::Value {
    serde_json::json!({ "error": why.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_body_carries_its_mode_then_the_file() {
        let file = b"SQLite format 3\0\nrest";
        assert_eq!(
            parse_body(&request_body(true, file)),
            Ok((true, Bytes::from_static(file)))
        );
        assert_eq!(
            parse_body(&request_body(false, file)),
            Ok((false, Bytes::from_static(file)))
        );
        for bad in [
            &b""[..],
            b"wasmkeep-import 1 maybe\nx",
            b"wasmkeep-import 2 replace\nx",
            b"SQLite format 3\0",
        ] {
            assert!(parse_body(&Bytes::copy_from_slice(bad)).is_err(), "{bad:?}");
        }
    }
}
