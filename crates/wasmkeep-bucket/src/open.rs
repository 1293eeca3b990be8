//! Turns a bucket URL into a backend.
//!
//! - `memory://` — a new, empty in-process bucket (tests).
//! - `file:///abs/path` (or `file://localhost/abs/path`) — a folder; created if
//!   missing. Relative paths are refused (`file://./x` would parse `.` as a host
//!   name): callers such as `wasmkeep dev` resolve a relative folder against
//!   the working directory themselves and pass an absolute path.
//! - `s3://bucket` or `s3://bucket/prefix` — S3 via the `AWS_*` variables.

use std::sync::Arc;

use crate::{Bucket, Error, FolderBucket, MemoryBucket, Result, S3Bucket};

/// [`open`] for a bucket that must exist already: a `file://` folder that
/// is missing is an error, not created (a mistyped path given to a command
/// that only reads would otherwise leave an empty bucket behind and report
/// that it holds nothing).
pub async fn open_existing(url: &str) -> Result<Arc<dyn Bucket>> {
    if let Ok(parsed) = url::Url::parse(url)
        && parsed.scheme() == "file"
        && let Ok(path) = parsed.to_file_path()
        && !path.is_dir()
    {
        return Err(Error::Config(format!(
            "bucket URL {url:?}: the folder {} does not exist (`wasmkeep dev`, `serve` and `deploy` create a folder bucket)",
            path.display()
        )));
    }
    open(url).await
}

/// Opens the bucket named by `url` (see the module docs for the forms).
pub async fn open(url: &str) -> Result<Arc<dyn Bucket>> {
    let bad = |why: &str| Error::Config(format!("bucket URL {url:?}: {why}"));
    let parsed = url::Url::parse(url).map_err(|e| {
        bad(&format!(
            "not a URL ({e}); expected file:///abs/path, s3://bucket/prefix or memory://"
        ))
    })?;
    match parsed.scheme() {
        "memory" => {
            if parsed.host_str().is_some_and(|h| !h.is_empty())
                || !matches!(parsed.path(), "" | "/")
                || parsed.query().is_some()
            {
                return Err(bad("memory:// takes no host, path or query"));
            }
            Ok(Arc::new(MemoryBucket::new()))
        }
        "file" => {
            if parsed.query().is_some() || parsed.fragment().is_some() {
                return Err(bad("a file URL takes no query or fragment"));
            }
            // `file:relative` parses as `/relative`: demand the explicit forms.
            if !(url.starts_with("file:///") || url.starts_with("file://localhost/")) {
                return Err(bad(
                    "expected file:///abs/path (relative paths are not accepted)",
                ));
            }
            let path = parsed.to_file_path().map_err(|()| {
                bad("expected an absolute path, file:///abs/path (relative paths are not accepted)")
            })?;
            let bucket = tokio::task::spawn_blocking(move || FolderBucket::open(&path))
                .await
                .map_err(|e| bad(&format!("opening the folder failed: {e}")))??;
            Ok(Arc::new(bucket))
        }
        "s3" => {
            let bucket = parsed
                .host_str()
                .filter(|h| !h.is_empty())
                .ok_or_else(|| bad("expected s3://bucket/prefix"))?;
            if parsed.query().is_some() || parsed.fragment().is_some() || parsed.port().is_some() {
                return Err(bad(
                    "an s3 URL takes no port, query or fragment; set AWS_ENDPOINT_URL for the endpoint",
                ));
            }
            let prefix = percent_encoding::percent_decode_str(parsed.path())
                .decode_utf8()
                .map_err(|_| bad("the prefix is not UTF-8"))?;
            Ok(Arc::new(S3Bucket::from_env(bucket, &prefix)?))
        }
        other => Err(bad(&format!(
            "unknown scheme {other:?}; expected file, s3 or memory"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_urls_are_config_errors() {
        for url in [
            "",
            "folder",
            "./x",
            "file://./x",
            "file:relative",
            "http://x",
            "s3://",
            "s3:///prefix",
            "memory://x",
            "file:///tmp?x=1",
        ] {
            match open(url).await {
                Err(Error::Config(message)) => assert!(message.contains("bucket URL"), "{message}"),
                other => panic!("{url:?}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_missing_folder_is_opened_only_when_it_may_be_created() -> Result<()> {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("typo");
        let url = format!("file://{}", missing.display());
        match open_existing(&url).await {
            Err(Error::Config(message)) => assert!(message.contains("does not exist"), "{message}"),
            other => panic!("{other:?}"),
        }
        assert!(!missing.exists(), "the refused open created the folder");
        open(&url).await?;
        open_existing(&url).await?;
        Ok(())
    }

    #[tokio::test]
    async fn memory_and_file_urls_open() -> Result<()> {
        open("memory://").await?;
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("file://{}", dir.path().display());
        let bucket = open(&url).await?;
        bucket.put("k", bytes::Bytes::from_static(b"v")).await?;
        // Alone on the folder, the object is a file by the bucket's last
        // checkpoint at the latest (ADR 0034).
        drop(bucket);
        assert!(dir.path().join("k").is_file());
        Ok(())
    }
}
