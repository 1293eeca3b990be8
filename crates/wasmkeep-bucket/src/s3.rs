//! The S3 backend (`s3://bucket/prefix`), on `object_store`'s Amazon S3
//! client configured from the standard `AWS_*` environment variables
//! (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_REGION`, `AWS_ALLOW_HTTP`, ...).
//!
//! Conditional writes use `If-None-Match: *` (`put_if_absent`) and
//! `If-Match: <etag>` (`put_if_match`). They go through a client with
//! retries switched off: a retried conditional write whose first attempt
//! applied would come back as a false `Conflict`. So a conditional write that
//! fails without an answer from the server (timeout, connection reset, 5xx)
//! reports [`Error::OutcomeUnknown`], and the caller re-reads. Reads and
//! unconditional writes use a client that retries [`RETRIES_MAX`] times
//! within [`RETRY_TIMEOUT`].
//!
//! Listing order: AWS S3 lists keys in byte order. SeaweedFS lists a
//! "folder" `a/` where `a` sorts, so `a/x` comes before `a-b` there (byte
//! order puts `-` and `.` before `/`). [`Bucket::list`] sorts its result, so
//! it is in byte order everywhere; [`Bucket::list_page`] gives the server's
//! order, which is byte order within one folder level (e.g. the zero-padded
//! sequence numbers of an actor log) on every server.
//!
//! A server that stops answering (hung, or its packets dropped) is given
//! up on after [`ANSWER_TIME_MAX`] for a request without a body or with a
//! small one, and a little longer per MiB of a larger body
//! ([`answer_time_max`]): a conditional write then reports `OutcomeUnknown`,
//! anything else `Unavailable`. A read's body gets the same time for its
//! size once its head has come. Without this bound a hung server held an
//! event's response for minutes (each of the store's attempts waited the
//! full 30 s); see ADR 0049. `object_store`'s own bound on a whole request
//! (`AWS_TIMEOUT`, 30 s by default) is raised to [`REQUEST_TIME_MAX`]
//! unless `AWS_TIMEOUT` is set: at 30 s it failed every transfer slower
//! than that, so a snapshot of a database larger than ~30 MiB per second
//! of bandwidth could never be written, nor one written in a faster hour
//! read back (ADR 0051).
//!
//! `delete_if_match` is [`Error::Unsupported`]: `object_store` 0.14 sends no
//! conditional delete. Callers fall back to a "released" body written with
//! `put_if_match` (see the trait).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path;
use object_store::{
    ClientConfigKey, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig,
    UpdateVersion,
};

use crate::key::{validate_key, validate_prefix};
use crate::{
    Bucket, Error, Etag, Hints, LIST_PAGE_OBJECTS_MAX, ListPage, Object, ObjectMeta, Result,
};

/// Retries of a read or an unconditional write.
pub const RETRIES_MAX: usize = 3;
/// No retry of a read or unconditional write starts later than this after
/// its first attempt (so that retries end within [`ANSWER_TIME_MAX`]).
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(4);

/// Longest wait for the server's answer to a request without a body or
/// with a body of at most [`UPLOAD_BYTES_PER_SECOND_MIN`] bytes; the
/// retrying client's retries count within it. Not less: SeaweedFS answers
/// the losers of sixteen conditional writes racing on one key after up to
/// 6 s (it retries its per-key lock once a second).
pub const ANSWER_TIME_MAX: Duration = Duration::from_secs(10);
/// The slowest upload [`answer_time_max`] allows for: one more second per
/// this many bytes of body.
pub const UPLOAD_BYTES_PER_SECOND_MIN: u64 = 1 << 20;

/// `object_store`'s bound on a whole request unless `AWS_TIMEOUT` says
/// otherwise: only a backstop, above what [`answer_time_max`] gives any
/// object an actor has (a database is at most 1 GiB by default).
pub const REQUEST_TIME_MAX: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a request with a body of `bytes` may wait for its answer (and a
/// read of `bytes` for its body).
pub fn answer_time_max(bytes: u64) -> Duration {
    ANSWER_TIME_MAX + Duration::from_secs(bytes / UPLOAD_BYTES_PER_SECOND_MIN)
}

/// Runs one request for `key` within `limit`, its error mapped
/// ([`map_error`]); without an answer in time a conditional write reports
/// `OutcomeUnknown` and anything else `Unavailable`.
async fn answered<T>(
    key: &str,
    limit: Duration,
    conditional_write: bool,
    request: impl std::future::Future<Output = object_store::Result<T>>,
) -> Result<T> {
    let Ok(answer) = tokio::time::timeout(limit, request).await else {
        let reason = format!("no answer from the S3 server within {limit:?}");
        let key = key.to_owned();
        return Err(if conditional_write {
            Error::OutcomeUnknown { key, reason }
        } else {
            Error::Unavailable { key, reason }
        });
    };
    answer.map_err(|e| map_error(key, e, conditional_write))
}

/// The `s3://` bucket.
pub struct S3Bucket {
    bucket: String,
    /// "" or ending in '/'; prepended to every key.
    prefix: String,
    retrying: Arc<AmazonS3>,
    once: Arc<AmazonS3>,
}

impl std::fmt::Debug for S3Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Bucket")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl S3Bucket {
    /// A client of `bucket`, keys under `prefix` (may be empty; a trailing
    /// `/` is added), configured from the `AWS_*` environment variables.
    pub fn from_env(bucket: &str, prefix: &str) -> Result<Self> {
        Self::from_env_with(bucket, prefix, &[])
    }

    /// Like [`S3Bucket::from_env`], with `AWS_*` variables given as pairs that
    /// override the environment (tests use this instead of changing the
    /// process environment). Unknown names are a `Config` error.
    pub fn from_env_with(
        bucket: &str,
        prefix: &str,
        overrides: &[(String, String)],
    ) -> Result<Self> {
        let mut config = Vec::with_capacity(overrides.len() + 1);
        let timeout = AmazonS3ConfigKey::Client(ClientConfigKey::Timeout);
        let timeout_set = std::env::var_os("AWS_TIMEOUT").is_some()
            || overrides
                .iter()
                .any(|(name, _)| name.eq_ignore_ascii_case("AWS_TIMEOUT"));
        if !timeout_set {
            let secs = REQUEST_TIME_MAX.as_secs();
            config.push((timeout, format!("{secs}s")));
        }
        for (name, value) in overrides {
            let key: AmazonS3ConfigKey = name
                .to_ascii_lowercase()
                .parse()
                .map_err(|e| Error::Config(format!("s3 setting {name}: {e}")))?;
            config.push((key, value.clone()));
        }
        if bucket.is_empty() {
            return Err(Error::Config("s3 bucket name is empty".to_owned()));
        }
        let prefix = prefix.trim_matches('/');
        if !prefix.is_empty() {
            validate_prefix(prefix)
                .map_err(|e| Error::Config(format!("s3 prefix {prefix:?}: {e}")))?;
        }
        let build = |retry: RetryConfig| {
            let mut builder = AmazonS3Builder::from_env();
            for (key, value) in &config {
                builder = builder.with_config(*key, value);
            }
            builder
                .with_bucket_name(bucket)
                .with_retry(retry)
                .build()
                .map(Arc::new)
                .map_err(|e| Error::Config(format!("s3 bucket {bucket}: {e}")))
        };
        let retrying = build(RetryConfig {
            max_retries: RETRIES_MAX,
            retry_timeout: RETRY_TIMEOUT,
            ..RetryConfig::default()
        })?;
        let once = build(RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        })?;
        let prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        Ok(S3Bucket {
            bucket: bucket.to_owned(),
            prefix,
            retrying,
            once,
        })
    }

    fn path(&self, key: &str) -> Result<Path> {
        validate_key(key)?;
        Path::parse(format!("{}{key}", self.prefix)).map_err(|_| Error::InvalidKey {
            key: key.to_owned(),
            reason: "not a valid object path",
        })
    }

    fn meta(&self, meta: object_store::ObjectMeta) -> ObjectMeta {
        let full = meta.location.to_string();
        ObjectMeta {
            key: full.strip_prefix(&self.prefix).unwrap_or(&full).to_owned(),
            etag: Etag(meta.e_tag.unwrap_or_default()),
            last_modified: meta.last_modified.into(),
            size: meta.size,
        }
    }

    async fn put_mode(&self, key: &str, bytes: Bytes, mode: PutMode) -> Result<ObjectMeta> {
        let path = self.path(key)?;
        let conditional = !matches!(mode, PutMode::Overwrite);
        let store = if conditional {
            &self.once
        } else {
            &self.retrying
        };
        let size = bytes.len() as u64;
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        let put = store.put_opts(&path, PutPayload::from_bytes(bytes), options);
        let result = answered(key, answer_time_max(size), conditional, put).await?;
        Ok(ObjectMeta {
            key: key.to_owned(),
            etag: Etag(result.e_tag.unwrap_or_default()),
            // S3 returns no date on PUT; the local clock is close enough
            // for the one use of this field (display).
            last_modified: std::time::SystemTime::now(),
            size,
        })
    }
}

/// Maps an `object_store` error. A conditional write that got no definite
/// answer may have applied: `OutcomeUnknown`.
fn map_error(key: &str, e: object_store::Error, conditional_write: bool) -> Error {
    match e {
        object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
            Error::Conflict {
                key: key.to_owned(),
            }
        }
        object_store::Error::NotFound { .. } => Error::NotFound {
            key: key.to_owned(),
        },
        object_store::Error::InvalidPath { .. } => Error::InvalidKey {
            key: key.to_owned(),
            reason: "not a valid object path",
        },
        // Refused (401/403): nothing applied, a conditional write included.
        // Retrying helps only once the credentials or the policy change.
        other @ (object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. }) => Error::Unavailable {
            key: key.to_owned(),
            reason: format!(
                "the S3 server refused the request (check AWS_ACCESS_KEY_ID, \
                 AWS_SECRET_ACCESS_KEY and the bucket's policy): {other}"
            ),
        },
        other if conditional_write => Error::OutcomeUnknown {
            key: key.to_owned(),
            reason: other.to_string(),
        },
        other => Error::Unavailable {
            key: key.to_owned(),
            reason: other.to_string(),
        },
    }
}

#[async_trait]
impl Bucket for S3Bucket {
    async fn get(&self, key: &str) -> Result<Object> {
        let path = self.path(key)?;
        // The answer's head within the limit, then its body within the
        // time its size is given (a snapshot may be large).
        let result = answered(key, ANSWER_TIME_MAX, false, self.retrying.get(&path)).await?;
        let meta = self.meta(result.meta.clone());
        let bytes = answered(key, answer_time_max(meta.size), false, result.bytes()).await?;
        Ok(Object { bytes, meta })
    }

    async fn head(&self, key: &str) -> Result<ObjectMeta> {
        let path = self.path(key)?;
        let meta = answered(key, ANSWER_TIME_MAX, false, self.retrying.head(&path)).await?;
        Ok(self.meta(meta))
    }

    async fn put_if_absent(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        self.put_mode(key, bytes, PutMode::Create).await
    }

    async fn put_if_match(&self, key: &str, bytes: Bytes, etag: &Etag) -> Result<ObjectMeta> {
        let version = UpdateVersion {
            e_tag: Some(etag.0.clone()),
            version: None,
        };
        match self.put_mode(key, bytes, PutMode::Update(version)).await {
            // S3 answers a failed If-Match on a missing key with 412 too (or
            // 404 on some servers): tell the two apart with a HEAD.
            Err(Error::Conflict { .. }) => match self.head(key).await {
                Err(Error::NotFound { .. }) => Err(Error::NotFound {
                    key: key.to_owned(),
                }),
                _ => Err(Error::Conflict {
                    key: key.to_owned(),
                }),
            },
            other => other,
        }
    }

    async fn put(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        self.put_mode(key, bytes, PutMode::Overwrite).await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        match answered(key, ANSWER_TIME_MAX, false, self.retrying.delete(&path)).await {
            Ok(()) | Err(Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn delete_if_match(&self, key: &str, _etag: &Etag) -> Result<()> {
        validate_key(key)?;
        Err(Error::Unsupported(
            "conditional delete on S3 (object_store 0.14 sends none)",
        ))
    }

    async fn list_page(&self, prefix: &str, start_after: Option<&str>) -> Result<ListPage> {
        validate_prefix(prefix)?;
        // object_store lists whole path segments: list the folder part of the
        // prefix and filter the partial last segment here.
        let full_prefix = format!("{}{prefix}", self.prefix);
        let dir = match full_prefix.rfind('/') {
            Some(i) => &full_prefix[..i],
            None => "",
        };
        let dir_path = if dir.is_empty() {
            None
        } else {
            Some(Path::parse(dir).map_err(|_| Error::InvalidKey {
                key: prefix.to_owned(),
                reason: "not a valid object path",
            })?)
        };
        let mut stream = match start_after {
            Some(after) if after >= prefix => {
                let offset = Path::parse(format!("{}{after}", self.prefix)).map_err(|_| {
                    Error::InvalidKey {
                        key: after.to_owned(),
                        reason: "not a valid object path",
                    }
                })?;
                self.retrying.list_with_offset(dir_path.as_ref(), &offset)
            }
            _ => self.retrying.list(dir_path.as_ref()),
        };
        let mut objects = Vec::new();
        let mut more = false;
        loop {
            let next = stream.next().map(Option::transpose);
            let Some(item) = answered(prefix, ANSWER_TIME_MAX, false, next).await? else {
                break;
            };
            let meta = self.meta(item);
            if !meta.key.starts_with(prefix) {
                // Sorted listing: past the prefix means done.
                if meta.key.as_str() > prefix {
                    break;
                }
                continue;
            }
            if objects.len() == LIST_PAGE_OBJECTS_MAX {
                more = true;
                break;
            }
            objects.push(meta);
        }
        let next = if more {
            objects.last().map(|m: &ObjectMeta| m.key.clone())
        } else {
            None
        };
        Ok(ListPage { objects, next })
    }

    /// The bulk delete only: see [`Hints`] below.
    fn hints(&self) -> Option<&dyn Hints> {
        Some(self)
    }
}

/// S3 has a bulk delete; the other hints fall back to the core operations
/// (no flush to share, no thread to skip, listings carry etags anyway).
#[async_trait]
impl Hints for S3Bucket {
    /// One `DeleteObjects` per 1,000 keys (S3 reports a missing key as
    /// deleted), instead of a request per key.
    async fn delete_all_not_durable(&self, keys: &[String]) -> Result<()> {
        let Some(first) = keys.first() else {
            return Ok(());
        };
        let paths = keys
            .iter()
            .map(|key| self.path(key).map(Ok::<_, object_store::Error>))
            .collect::<Result<Vec<_>>>()?;
        let mut deleted = self
            .retrying
            .delete_stream(futures::stream::iter(paths).boxed());
        loop {
            // A failure names its key in its message; the first key stands
            // for the call.
            let next = deleted.next().map(Option::transpose);
            match answered(first, ANSWER_TIME_MAX, false, next).await {
                Ok(None) => break,
                Ok(Some(_)) | Err(Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
