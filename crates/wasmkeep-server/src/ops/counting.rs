//! A bucket decorator that counts every call and its latency into the
//! node's metrics, by operation and outcome. It is an [`Around`], so the
//! hinted calls (ADR 0057) are counted too and still reach the bucket
//! inside as hints.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use wasmkeep_bucket::{Answer, Around, Bucket, Error, Request, Result};

use crate::ops::metrics::Metrics;

#[derive(Debug)]
pub struct CountingBucket {
    inner: Arc<dyn Bucket>,
    metrics: Arc<Metrics>,
}

impl CountingBucket {
    pub fn new(inner: Arc<dyn Bucket>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    fn record<T>(&self, op: &'static str, started: Instant, result: &Result<T>) {
        let outcome = match result {
            Ok(_) => "ok",
            Err(Error::Conflict { .. }) => "conflict",
            Err(Error::NotFound { .. }) => "not_found",
            Err(Error::Unavailable { .. }) => "unavailable",
            Err(Error::OutcomeUnknown { .. }) => "outcome_unknown",
            Err(Error::Unsupported(_)) => "unsupported",
            Err(_) => "error",
        };
        self.metrics.bucket_request(op, outcome, started.elapsed());
    }
}

/// Each request counted once under its operation's name; a put of any
/// haste counts as `put_if_absent`, a bulk delete as `delete_all`.
impl Around for CountingBucket {
    fn inner(&self) -> &dyn Bucket {
        &*self.inner
    }

    async fn around<T: Answer>(
        &self,
        request: Request<'_>,
        call: impl Future<Output = Result<T>> + Send,
    ) -> Result<T> {
        let op = match request {
            Request::PutIfAbsentUnhurried { .. } | Request::PutIfAbsentAlone { .. } => {
                "put_if_absent"
            }
            Request::DeleteAllNotDurable { .. } => "delete_all",
            other => other.op(),
        };
        let started = Instant::now();
        let result = call.await;
        self.record(op, started, &result);
        result
    }
}
