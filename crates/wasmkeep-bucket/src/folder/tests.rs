//! Tests of the folder bucket through its own fields: a lone writer's put
//! is committed on the writer's thread when nothing else is in flight
//! (ADR 0045), also behind a wrapper (ADR 0057), and queued otherwise. The
//! conformance suite (`tests/conformance.rs`) tests the bucket from outside.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::*;

/// A lone writer's put, with nothing else in flight, the committer
/// asleep and this process alone on the folder, is committed on the
/// writer's thread (ADR 0045), with the same outcome as through the
/// committer: the object is there, and a second put conflicts.
#[tokio::test]
async fn a_lone_writers_put_is_committed_on_its_own_thread() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let bucket = FolderBucket::open(dir.path()).expect("opened");
    committer_idle(&bucket).await;
    crate::hinted::put_if_absent_alone(&bucket, "a/1", Bytes::from_static(b"one"))
        .await
        .expect("put");
    assert_eq!(bucket.polling.led.load(Ordering::Relaxed), 1);
    let r = crate::hinted::put_if_absent_alone(&bucket, "a/1", Bytes::from_static(b"two")).await;
    assert!(matches!(r, Err(Error::Conflict { .. })), "{r:?}");
    assert_eq!(bucket.polling.led.load(Ordering::Relaxed), 2);
    let object = bucket.get("a/1").await.expect("read");
    assert_eq!(object.bytes, Bytes::from_static(b"one"));
    assert_eq!(bucket.polling.in_flight.load(Ordering::Acquire), 0);
}

/// A wrapper that passes every request on unchanged.
#[derive(Debug)]
struct Through(Arc<FolderBucket>);

impl crate::Around for Through {
    fn inner(&self) -> &dyn Bucket {
        &*self.0
    }

    async fn around<T: crate::Answer>(
        &self,
        _request: crate::Request<'_>,
        call: impl std::future::Future<Output = Result<T>> + Send,
    ) -> Result<T> {
        call.await
    }
}

/// Behind a wrapper (the server's counter) the folder still gets its
/// hints: a lone writer's put is led as without it, and the wrapper says
/// short-lived objects are cheap while the folder is alone.
#[tokio::test]
async fn a_wrapper_passes_the_hints_on_to_the_folder() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let bucket = Arc::new(FolderBucket::open(dir.path()).expect("opened"));
    committer_idle(&bucket).await;
    let wrapped = Through(Arc::clone(&bucket));
    assert!(crate::hinted::short_lived_objects_are_cheap(&wrapped));
    crate::hinted::put_if_absent_alone(&wrapped, "a/1", Bytes::from_static(b"one"))
        .await
        .expect("put");
    assert_eq!(bucket.polling.led.load(Ordering::Relaxed), 1);
}

/// Once the committer's thread has started (it holds the committer
/// while it reserves its first orders), committed a write and let go of
/// the committer: it waits for the next write.
async fn committer_idle(bucket: &FolderBucket) {
    bucket.adoption_finished().await;
    bucket
        .put("warm", Bytes::from_static(b"up"))
        .await
        .expect("put through the committer");
    drop(bucket.committer.lock());
    assert_eq!(bucket.polling.led.load(Ordering::Relaxed), 0);
}

/// With another write in flight, while the committer polls for writes,
/// or when other processes may share the folder, a lone writer's put
/// goes through the committer as any other.
#[tokio::test]
async fn a_lone_writers_put_is_queued_when_the_committer_has_other_work() {
    for case in [
        "another write in flight",
        "committer polls",
        "shared folder",
    ] {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let options = FolderOptions {
            never_solo: case == "shared folder",
            ..FolderOptions::default()
        };
        let bucket = FolderBucket::open_with(dir.path(), options).expect("opened");
        committer_idle(&bucket).await;
        let other = (case == "another write in flight").then(|| bucket.polling.write_sent());
        if case == "committer polls" {
            bucket.polling.quick.store(true, Ordering::Release);
        }
        crate::hinted::put_if_absent_alone(&bucket, "a/1", Bytes::from_static(b"one"))
            .await
            .expect("put");
        assert_eq!(bucket.polling.led.load(Ordering::Relaxed), 0, "{case}");
        let object = bucket.get("a/1").await.expect("read");
        assert_eq!(object.bytes, Bytes::from_static(b"one"), "{case}");
        drop(other);
    }
}
