//! A bucket decorator that counts every call and its latency into the
//! node's metrics, by operation and outcome.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use wasmkeep_bucket::{Bucket, Error, Etag, ListPage, Listed, Object, ObjectMeta, Result};

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

macro_rules! counted {
    ($self:ident, $op:literal, $call:expr) => {{
        let started = Instant::now();
        let result = $call.await;
        $self.record($op, started, &result);
        result
    }};
}

#[async_trait]
impl Bucket for CountingBucket {
    async fn get(&self, key: &str) -> Result<Object> {
        counted!(self, "get", self.inner.get(key))
    }
    async fn head(&self, key: &str) -> Result<ObjectMeta> {
        counted!(self, "head", self.inner.head(key))
    }
    async fn put_if_absent(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        counted!(self, "put_if_absent", self.inner.put_if_absent(key, bytes))
    }
    async fn put_if_absent_unhurried(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        counted!(
            self,
            "put_if_absent",
            self.inner.put_if_absent_unhurried(key, bytes)
        )
    }
    async fn put_if_absent_alone(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        counted!(
            self,
            "put_if_absent",
            self.inner.put_if_absent_alone(key, bytes)
        )
    }
    async fn put_if_match(&self, key: &str, bytes: Bytes, etag: &Etag) -> Result<ObjectMeta> {
        counted!(
            self,
            "put_if_match",
            self.inner.put_if_match(key, bytes, etag)
        )
    }
    async fn put(&self, key: &str, bytes: Bytes) -> Result<ObjectMeta> {
        counted!(self, "put", self.inner.put(key, bytes))
    }
    async fn delete(&self, key: &str) -> Result<()> {
        counted!(self, "delete", self.inner.delete(key))
    }
    async fn delete_all_not_durable(&self, keys: &[String]) -> Result<()> {
        counted!(self, "delete_all", self.inner.delete_all_not_durable(keys))
    }
    fn short_lived_objects_are_cheap(&self) -> bool {
        self.inner.short_lived_objects_are_cheap()
    }
    async fn delete_if_match(&self, key: &str, etag: &Etag) -> Result<()> {
        counted!(
            self,
            "delete_if_match",
            self.inner.delete_if_match(key, etag)
        )
    }
    async fn list_page(&self, prefix: &str, start_after: Option<&str>) -> Result<ListPage> {
        counted!(self, "list_page", self.inner.list_page(prefix, start_after))
    }
    async fn list_keys(&self, prefix: &str) -> Result<Vec<Listed>> {
        counted!(self, "list_keys", self.inner.list_keys(prefix))
    }
}
