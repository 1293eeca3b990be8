//! One conformance suite, run against every backend: memory, folder and S3
//! (SeaweedFS started by `wasmkeep-testkit`). Each case is a generic async fn
//! in `cases`; `backend_suite!` instantiates every case for one backend.
//!
//! The folder backend's cross-process race re-executes this test binary as
//! child processes (see `folder_process_child`).

use std::any::Any;
use std::collections::BTreeSet;
use std::sync::Arc;

use anyhow::{Context, ensure};
use bytes::Bytes;
use futures::StreamExt;
use wasmkeep_bucket::{Bucket, Error, Etag, LIST_PAGE_OBJECTS_MAX, ObjectMeta, hinted};

/// A bucket, a prefix unique to one test, and whatever must live as long as
/// the test (a temporary folder).
pub struct Fixture {
    pub bucket: Arc<dyn Bucket>,
    pub prefix: String,
    pub _keep: Box<dyn Any + Send + Sync>,
}

impl Fixture {
    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }
}

/// Number of tasks in each race.
const RACERS: usize = 16;
/// Most writes in flight while filling a bucket for the pagination test.
const FILL_CONCURRENCY: usize = 32;

mod cases {
    use super::*;

    pub async fn get_returns_what_put_wrote(f: &Fixture) -> anyhow::Result<()> {
        let key = f.key("a/b");
        let written = f.bucket.put(&key, Bytes::from_static(b"hello")).await?;
        let object = f.bucket.get(&key).await?;
        ensure!(object.bytes == Bytes::from_static(b"hello"));
        ensure!(object.meta.key == key);
        ensure!(object.meta.size == 5);
        ensure!(
            object.meta.etag == written.etag,
            "get etag {:?} != put etag {:?}",
            object.meta.etag,
            written.etag
        );
        Ok(())
    }

    pub async fn head_reports_meta_without_body(f: &Fixture) -> anyhow::Result<()> {
        let key = f.key("h");
        let written = f.bucket.put(&key, Bytes::from_static(b"12345678")).await?;
        let meta = f.bucket.head(&key).await?;
        ensure!(meta.size == 8 && meta.etag == written.etag && meta.key == key);
        Ok(())
    }

    pub async fn missing_key_is_not_found(f: &Fixture) -> anyhow::Result<()> {
        let key = f.key("missing");
        ensure!(matches!(
            f.bucket.get(&key).await,
            Err(Error::NotFound { .. })
        ));
        ensure!(matches!(
            f.bucket.head(&key).await,
            Err(Error::NotFound { .. })
        ));
        let r = f
            .bucket
            .put_if_match(&key, Bytes::from_static(b"x"), &Etag("nope".into()))
            .await;
        ensure!(
            matches!(r, Err(Error::NotFound { .. })),
            "put_if_match on missing key: {r:?}"
        );
        ensure!(
            matches!(f.bucket.get(&key).await, Err(Error::NotFound { .. })),
            "put_if_match created the key"
        );
        f.bucket
            .delete(&key)
            .await
            .context("deleting a missing key is not an error")?;
        match f.bucket.delete_if_match(&key, &Etag("nope".into())).await {
            Err(Error::NotFound { .. }) | Err(Error::Unsupported(_)) => {}
            other => anyhow::bail!("delete_if_match on missing key: {other:?}"),
        }
        Ok(())
    }

    /// Each way to put-if-absent (a lone writer's too, ADR 0045) creates
    /// once and then conflicts, whichever way came first.
    pub async fn put_if_absent_conflicts_when_present(f: &Fixture) -> anyhow::Result<()> {
        for (first_alone, second_alone) in
            [(false, false), (true, true), (false, true), (true, false)]
        {
            let key = f.key(&format!("once-{first_alone}-{second_alone}"));
            let first = put_if_absent_as(f, &key, b"first", first_alone).await?;
            let r = put_if_absent_as(f, &key, b"second", second_alone).await;
            ensure!(
                matches!(r, Err(Error::Conflict { .. })),
                "second put_if_absent (alone {second_alone}): {r:?}"
            );
            let object = f.bucket.get(&key).await?;
            ensure!(object.bytes == Bytes::from_static(b"first") && object.meta.etag == first.etag);
        }
        Ok(())
    }

    async fn put_if_absent_as(
        f: &Fixture,
        key: &str,
        bytes: &'static [u8],
        alone: bool,
    ) -> Result<ObjectMeta, Error> {
        let bytes = Bytes::from_static(bytes);
        if alone {
            hinted::put_if_absent_alone(&*f.bucket, key, bytes).await
        } else {
            f.bucket.put_if_absent(key, bytes).await
        }
    }

    pub async fn put_if_match_needs_the_current_etag(f: &Fixture) -> anyhow::Result<()> {
        let key = f.key("cas");
        let v1 = f
            .bucket
            .put_if_absent(&key, Bytes::from_static(b"v1"))
            .await?;
        let v2 = f
            .bucket
            .put_if_match(&key, Bytes::from_static(b"v2"), &v1.etag)
            .await?;
        ensure!(v2.etag != v1.etag);
        let stale = f
            .bucket
            .put_if_match(&key, Bytes::from_static(b"v3"), &v1.etag)
            .await;
        ensure!(
            matches!(stale, Err(Error::Conflict { .. })),
            "stale etag: {stale:?}"
        );
        let object = f.bucket.get(&key).await?;
        ensure!(object.bytes == Bytes::from_static(b"v2") && object.meta.etag == v2.etag);
        Ok(())
    }

    pub async fn etag_changes_on_each_write(f: &Fixture) -> anyhow::Result<()> {
        let key = f.key("etags");
        let mut seen = BTreeSet::new();
        let mut meta = f
            .bucket
            .put_if_absent(&key, Bytes::from_static(b"0"))
            .await?;
        seen.insert(meta.etag.0.clone());
        for i in 1..5u32 {
            meta = if i % 2 == 0 {
                f.bucket.put(&key, Bytes::from(format!("body {i}"))).await?
            } else {
                f.bucket
                    .put_if_match(&key, Bytes::from(format!("body {i}")), &meta.etag)
                    .await?
            };
            ensure!(
                seen.insert(meta.etag.0.clone()),
                "etag {} repeated after write {i}",
                meta.etag
            );
            ensure!(f.bucket.head(&key).await?.etag == meta.etag);
        }
        Ok(())
    }

    pub async fn delete_removes_the_object(f: &Fixture) -> anyhow::Result<()> {
        let key = f.key("gone");
        f.bucket.put(&key, Bytes::from_static(b"x")).await?;
        f.bucket.delete(&key).await?;
        ensure!(matches!(
            f.bucket.get(&key).await,
            Err(Error::NotFound { .. })
        ));
        f.bucket
            .put_if_absent(&key, Bytes::from_static(b"again"))
            .await
            .context("key reusable after delete")?;
        Ok(())
    }

    /// A delete that need not be durable removes the objects just as well
    /// (only their survival of a crash is not promised), as one request
    /// where the backend can. Missing keys are fine; a bad key among them
    /// is refused before anything is deleted.
    pub async fn delete_all_not_durable_removes_every_key(f: &Fixture) -> anyhow::Result<()> {
        // More than one committer batch (the folder) and a missing key.
        let keys: Vec<String> = (0..300).map(|i| f.key(&format!("many/{i:04}"))).collect();
        for key in &keys[..299] {
            f.bucket.put(key, Bytes::from_static(b"x")).await?;
        }
        let kept = f.key("many-kept");
        f.bucket.put(&kept, Bytes::from_static(b"k")).await?;
        let mut with_bad = keys[..2].to_vec();
        with_bad.push(format!("{}../escape", f.prefix));
        let r = hinted::delete_all_not_durable(&*f.bucket, &with_bad).await;
        ensure!(
            matches!(r, Err(Error::InvalidKey { .. })),
            "a bad key among many: {r:?}"
        );
        ensure!(
            f.bucket.get(&keys[0]).await.is_ok(),
            "a refused call deleted a key"
        );
        hinted::delete_all_not_durable(&*f.bucket, &keys).await?;
        ensure!(
            f.bucket.list(&f.key("many/")).await?.is_empty(),
            "keys left after delete_all_not_durable"
        );
        ensure!(f.bucket.get(&kept).await.is_ok(), "a key not named went");
        hinted::delete_all_not_durable(&*f.bucket, &keys[..3]).await?;
        hinted::delete_all_not_durable(&*f.bucket, &[]).await?;
        Ok(())
    }

    pub async fn delete_if_match_needs_the_current_etag(f: &Fixture) -> anyhow::Result<()> {
        let key = f.key("del-cas");
        let v1 = f.bucket.put(&key, Bytes::from_static(b"v1")).await?;
        let v2 = f
            .bucket
            .put_if_match(&key, Bytes::from_static(b"v2"), &v1.etag)
            .await?;
        match f.bucket.delete_if_match(&key, &v1.etag).await {
            Err(Error::Unsupported(_)) => return Ok(()),
            Err(Error::Conflict { .. }) => {}
            other => anyhow::bail!("delete_if_match with a stale etag: {other:?}"),
        }
        ensure!(
            f.bucket.get(&key).await?.bytes == Bytes::from_static(b"v2"),
            "stale delete_if_match deleted"
        );
        f.bucket.delete_if_match(&key, &v2.etag).await?;
        ensure!(matches!(
            f.bucket.get(&key).await,
            Err(Error::NotFound { .. })
        ));
        Ok(())
    }

    pub async fn list_is_sorted_and_limited_to_the_prefix(f: &Fixture) -> anyhow::Result<()> {
        // No key is also a "folder" of others (`a` and `a/x`): the folder backend
        // cannot hold both (documented limitation).
        let names = ["b", "a-b", "a/x", "a.c", "a/y/z", "ab", "c/d"];
        for name in names {
            f.bucket
                .put(&f.key(&format!("in/{name}")), Bytes::from(name))
                .await?;
        }
        f.bucket
            .put(&f.key("inside"), Bytes::from_static(b"not under in/"))
            .await?;
        f.bucket
            .put(&f.key("i"), Bytes::from_static(b"not under in/"))
            .await?;
        let listed = listed_keys(&*f.bucket, &f.key("in/")).await?;
        let mut expected: Vec<String> = names.iter().map(|n| f.key(&format!("in/{n}"))).collect();
        expected.sort();
        ensure!(
            listed == expected,
            "listed {listed:?}\nexpected {expected:?}"
        );
        // Keys and sizes only: the same keys, each with its body's length.
        let keyed: Vec<(String, u64)> = hinted::list_keys(&*f.bucket, &f.key("in/"))
            .await?
            .into_iter()
            .map(|l| (l.key, l.size))
            .collect();
        let expected_keyed: Vec<(String, u64)> = expected
            .iter()
            .map(|k| (k.clone(), (k.len() - f.key("in/").len()) as u64))
            .collect();
        ensure!(
            keyed == expected_keyed,
            "list_keys {keyed:?}\nexpected {expected_keyed:?}"
        );
        let partial = listed_keys(&*f.bucket, &f.key("in/a")).await?;
        let expected_partial: Vec<String> = expected
            .iter()
            .filter(|k| k.starts_with(&f.key("in/a")))
            .cloned()
            .collect();
        ensure!(partial == expected_partial, "partial prefix: {partial:?}");
        // start_after at a key where every server agrees on what follows
        // (SeaweedFS lists a folder `a/` where `a` would sort, see s3.rs).
        let page = f
            .bucket
            .list_page(&f.key("in/"), Some(&f.key("in/ab")))
            .await?;
        let after: Vec<String> = page.objects.into_iter().map(|m| m.key).collect();
        ensure!(
            after == [f.key("in/b"), f.key("in/c/d")],
            "start_after: {after:?}"
        );
        ensure!(f.bucket.list(&f.key("nothing-here/")).await?.is_empty());
        let meta = f.bucket.list(&f.key("in/b")).await?;
        ensure!(
            meta.len() == 1
                && meta[0].size == 1
                && meta[0].etag == f.bucket.head(&f.key("in/b")).await?.etag
        );
        Ok(())
    }

    pub async fn list_pages_through_more_than_one_page(f: &Fixture) -> anyhow::Result<()> {
        let count = LIST_PAGE_OBJECTS_MAX + 7;
        let bucket = &f.bucket;
        let results: Vec<wasmkeep_bucket::Result<_>> = futures::stream::iter(0..count)
            .map(|i| {
                let key = f.key(&format!("many/{i:05}"));
                async move { bucket.put(&key, Bytes::from_static(b"x")).await }
            })
            .buffer_unordered(FILL_CONCURRENCY)
            .collect()
            .await;
        for r in results {
            r?;
        }
        let first = f.bucket.list_page(&f.key("many/"), None).await?;
        ensure!(
            first.objects.len() == LIST_PAGE_OBJECTS_MAX,
            "first page has {}",
            first.objects.len()
        );
        let next = first
            .next
            .clone()
            .context("a full page must say where to go on")?;
        let second = f.bucket.list_page(&f.key("many/"), Some(&next)).await?;
        ensure!(
            second.objects.len() == 7,
            "second page has {}",
            second.objects.len()
        );
        ensure!(second.next.is_none());
        let all = listed_keys(&*f.bucket, &f.key("many/")).await?;
        let expected: Vec<String> = (0..count).map(|i| f.key(&format!("many/{i:05}"))).collect();
        ensure!(all == expected);
        let keys: Vec<String> = hinted::list_keys(&*f.bucket, &f.key("many/"))
            .await?
            .into_iter()
            .map(|l| l.key)
            .collect();
        ensure!(keys == expected, "list_keys gave {} keys", keys.len());
        Ok(())
    }

    /// Settles a race of conditional writes on `key` in which racer `i`
    /// wrote `racer {i}`: at most one racer was answered `Ok`, and the
    /// object holds its bytes. A racer may also be answered `OutcomeUnknown`
    /// (the trait allows it: S3 gives up on a server that does not answer
    /// within its bound, and SeaweedFS answers the losers of a race on one
    /// key a second apart each); such a racer may be the winner only when
    /// none was answered `Ok`. With every outcome known, exactly one won.
    /// Returns the stored object.
    async fn one_winner(
        f: &Fixture,
        key: &str,
        answers: Vec<wasmkeep_bucket::Result<()>>,
    ) -> anyhow::Result<wasmkeep_bucket::Object> {
        let (mut won, mut unknown) = (Vec::new(), Vec::new());
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(()) => won.push(i),
                Err(Error::Conflict { .. }) => {}
                Err(Error::OutcomeUnknown { .. }) => unknown.push(i),
                Err(e) => anyhow::bail!("racer {i}: {e}"),
            }
        }
        ensure!(won.len() <= 1, "answered Ok: {won:?}");
        let object = f.bucket.get(key).await?;
        let stored = &object.bytes;
        let holder = (0..RACERS).find(|i| *stored == format!("racer {i}"));
        match (won.first(), holder) {
            (Some(&w), Some(h)) => {
                ensure!(w == h, "racer {w} was answered Ok; racer {h} is stored")
            }
            (None, Some(h)) => ensure!(
                unknown.contains(&h),
                "racer {h} is stored but was answered a conflict"
            ),
            (_, None) => anyhow::bail!("no racer's bytes are stored: {stored:?}"),
        }
        ensure!(!unknown.is_empty() || won.len() == 1, "no winner");
        Ok(object)
    }

    pub async fn racing_put_if_absent_has_one_winner(f: &Fixture) -> anyhow::Result<()> {
        let key = f.key("race-absent");
        let mut tasks = Vec::new();
        for i in 0..RACERS {
            let bucket = Arc::clone(&f.bucket);
            let key = key.clone();
            // Half of them as lone writers (ADR 0045).
            tasks.push(tokio::spawn(async move {
                let bytes = Bytes::from(format!("racer {i}"));
                if i % 2 == 0 {
                    hinted::put_if_absent_alone(&*bucket, &key, bytes).await
                } else {
                    bucket.put_if_absent(&key, bytes).await
                }
            }));
        }
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await?.map(|_| ()));
        }
        one_winner(f, &key, answers).await.map(|_| ())
    }

    pub async fn racing_put_if_match_has_one_winner(f: &Fixture) -> anyhow::Result<()> {
        let key = f.key("race-match");
        let base = f.bucket.put(&key, Bytes::from_static(b"base")).await?;
        let mut tasks = Vec::new();
        for i in 0..RACERS {
            let bucket = Arc::clone(&f.bucket);
            let key = key.clone();
            let etag = base.etag.clone();
            tasks.push(tokio::spawn(async move {
                bucket
                    .put_if_match(&key, Bytes::from(format!("racer {i}")), &etag)
                    .await
            }));
        }
        let mut answers = Vec::new();
        let mut etags = Vec::new();
        for task in tasks {
            let answer = task.await?;
            etags.push(answer.as_ref().ok().map(|meta| meta.etag.clone()));
            answers.push(answer.map(|_| ()));
        }
        let object = one_winner(f, &key, answers).await?;
        if let Some(etag) = etags.iter().flatten().next() {
            ensure!(
                object.meta.etag == *etag,
                "the winner's etag is the object's"
            );
        }
        Ok(())
    }

    pub async fn bad_keys_are_refused_and_nothing_is_written(f: &Fixture) -> anyhow::Result<()> {
        let bad = [
            format!("{}../escape", f.prefix),
            format!("{}a//b", f.prefix),
            format!("{}a\\b", f.prefix),
            format!("{}nul\0", f.prefix),
            "/absolute".to_owned(),
            String::new(),
        ];
        for key in &bad {
            let r = f.bucket.put(key, Bytes::from_static(b"x")).await;
            ensure!(
                matches!(r, Err(Error::InvalidKey { .. })),
                "put {key:?}: {r:?}"
            );
            let r = f.bucket.put_if_absent(key, Bytes::from_static(b"x")).await;
            ensure!(
                matches!(r, Err(Error::InvalidKey { .. })),
                "put_if_absent {key:?}: {r:?}"
            );
            let r = hinted::put_if_absent_alone(&*f.bucket, key, Bytes::from_static(b"x")).await;
            ensure!(
                matches!(r, Err(Error::InvalidKey { .. })),
                "put_if_absent_alone {key:?}: {r:?}"
            );
            ensure!(
                matches!(f.bucket.get(key).await, Err(Error::InvalidKey { .. })),
                "get {key:?}"
            );
        }
        ensure!(
            f.bucket.list(&f.prefix).await?.is_empty(),
            "a refused key left an object"
        );
        Ok(())
    }
}

macro_rules! backend_suite {
    ($backend:ident) => {
        mod $backend {
            macro_rules! case {
                ($case:ident) => {
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() -> anyhow::Result<()> {
                        if stringify!($backend) == "s3"
                            && wasmkeep_testkit::s3_tests_skipped(stringify!($case))
                        {
                            return Ok(());
                        }
                        let fixture = super::fixtures::$backend(stringify!($case)).await?;
                        super::cases::$case(&fixture).await
                    }
                };
            }
            case!(get_returns_what_put_wrote);
            case!(head_reports_meta_without_body);
            case!(missing_key_is_not_found);
            case!(put_if_absent_conflicts_when_present);
            case!(put_if_match_needs_the_current_etag);
            case!(etag_changes_on_each_write);
            case!(delete_removes_the_object);
            case!(delete_all_not_durable_removes_every_key);
            case!(delete_if_match_needs_the_current_etag);
            case!(list_is_sorted_and_limited_to_the_prefix);
            case!(list_pages_through_more_than_one_page);
            case!(racing_put_if_absent_has_one_winner);
            case!(racing_put_if_match_has_one_winner);
            case!(bad_keys_are_refused_and_nothing_is_written);
        }
    };
}

mod fixtures {
    use super::*;

    pub async fn memory(_test: &str) -> anyhow::Result<Fixture> {
        Ok(Fixture {
            bucket: Arc::new(wasmkeep_bucket::MemoryBucket::new()),
            prefix: "t/".to_owned(),
            _keep: Box::new(()),
        })
    }

    pub async fn folder(_test: &str) -> anyhow::Result<Fixture> {
        let dir = tempfile::tempdir()?;
        let bucket = wasmkeep_bucket::FolderBucket::open(dir.path())?;
        Ok(Fixture {
            bucket: Arc::new(bucket),
            prefix: "t/".to_owned(),
            _keep: Box::new(dir),
        })
    }

    fn folder_with(options: wasmkeep_bucket::FolderOptions) -> anyhow::Result<Fixture> {
        let dir = tempfile::tempdir()?;
        let bucket = wasmkeep_bucket::FolderBucket::open_with(dir.path(), options)?;
        Ok(Fixture {
            bucket: Arc::new(bucket),
            prefix: "t/".to_owned(),
            _keep: Box::new(dir),
        })
    }

    pub async fn folder_per_file(_test: &str) -> anyhow::Result<Fixture> {
        folder_with(wasmkeep_bucket::FolderOptions {
            sync_mode: wasmkeep_bucket::SyncMode::PerFile,
            ..Default::default()
        })
    }

    pub async fn folder_syncfs(_test: &str) -> anyhow::Result<Fixture> {
        folder_with(wasmkeep_bucket::FolderOptions {
            sync_mode: wasmkeep_bucket::SyncMode::Syncfs,
            ..Default::default()
        })
    }

    /// Replaced and deleted files are reused at once (no grace), so every
    /// case also runs on reused inodes (as files: never solo).
    pub async fn folder_reusing_inodes(_test: &str) -> anyhow::Result<Fixture> {
        folder_with(wasmkeep_bucket::FolderOptions {
            inode_reuse_grace: Some(std::time::Duration::ZERO),
            never_solo: true,
            ..Default::default()
        })
    }

    /// As if other processes shared the folder: every object is a file
    /// before it is answered (ADR 0034). `folder` is alone on its folder.
    pub async fn folder_shared(_test: &str) -> anyhow::Result<Fixture> {
        folder_with(wasmkeep_bucket::FolderOptions {
            never_solo: true,
            ..Default::default()
        })
    }

    /// Alone, with checkpoints as often as they can run: young objects are
    /// put in place while the cases read, list and write them.
    pub async fn folder_solo_checkpointing(_test: &str) -> anyhow::Result<Fixture> {
        folder_with(wasmkeep_bucket::FolderOptions {
            journal_checkpoint_interval: Some(std::time::Duration::from_millis(1)),
            ..Default::default()
        })
    }

    /// Every S3 test gets its own prefix in the binary's shared SeaweedFS.
    pub async fn s3(test: &str) -> anyhow::Result<Fixture> {
        let server = tokio::task::spawn_blocking(wasmkeep_testkit::SeaweedFs::shared).await??;
        let prefix = format!("conformance/{test}-{:016x}", rand::random::<u64>());
        let bucket =
            wasmkeep_bucket::S3Bucket::from_env_with(server.bucket(), &prefix, &server.env())?;
        Ok(Fixture {
            bucket: Arc::new(bucket),
            prefix: "t/".to_owned(),
            _keep: Box::new(()),
        })
    }
}

backend_suite!(memory);
backend_suite!(folder);
backend_suite!(folder_per_file);
backend_suite!(folder_syncfs);
backend_suite!(folder_reusing_inodes);
backend_suite!(folder_shared);
backend_suite!(folder_solo_checkpointing);
backend_suite!(s3);

/// Child processes of the folder tests find their job here.
const CHILD_ENV: &str = "WASMKEEP_BUCKET_TEST_CHILD";
const CHILD_ROOT_ENV: &str = "WASMKEEP_BUCKET_TEST_ROOT";
/// Processes racing in `folder_racing_processes_have_one_winner`.
const RACING_PROCESSES: usize = 6;

/// Not a test of its own: the body of a child process started by the folder
/// tests below (does nothing when run directly).
#[test]
fn folder_child_process() -> anyhow::Result<()> {
    let Ok(job) = std::env::var(CHILD_ENV) else {
        return Ok(());
    };
    let root = std::path::PathBuf::from(std::env::var(CHILD_ROOT_ENV)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let bucket = if job == "journal" {
            wasmkeep_bucket::FolderBucket::open_with(&root, crash_before_checkpoint(BOOT_ONE))?
        } else if job == "journal-deaf" {
            let options = wasmkeep_bucket::FolderOptions {
                deaf_to_knocks: true,
                ..crash_before_checkpoint(BOOT_ONE)
            };
            wasmkeep_bucket::FolderBucket::open_with(&root, options)?
        } else {
            wasmkeep_bucket::FolderBucket::open(&root)?
        };
        match job.as_str() {
            "race" => {
                let base = bucket.head("race/match").await?;
                eprintln!("READY");
                // Start together: the parent closes our stdin when all children run.
                tokio::task::spawn_blocking(|| {
                    std::io::copy(&mut std::io::stdin(), &mut std::io::sink())
                })
                .await??;
                let me = std::process::id();
                let absent = bucket
                    .put_if_absent("race/absent", Bytes::from(format!("{me}")))
                    .await;
                let matched = bucket
                    .put_if_match("race/match", Bytes::from(format!("{me}")), &base.etag)
                    .await;
                let word = |r: &wasmkeep_bucket::Result<_>| match r {
                    Ok(_) => "won".to_owned(),
                    Err(Error::Conflict { .. }) => "lost".to_owned(),
                    Err(e) => format!("error:{e}"),
                };
                eprintln!(
                    "RESULT {me} absent={} match={}",
                    word(&absent),
                    word(&matched)
                );
            }
            "overwrite" => {
                // Rewrite one object forever with self-checking bodies until killed.
                for i in 0u64.. {
                    let fill = (i % 251) as u8;
                    bucket
                        .put("torn/object", Bytes::from(vec![fill; 1 << 20]))
                        .await?;
                    eprintln!("WROTE {i}");
                }
            }
            "journal" | "journal-deaf" => {
                // One write per line of stdin (`put K V`, `big K`, `delete K`,
                // `forget K`: a delete that need not be durable),
                // answered `OK` once it returned; killed by the parent.
                let (lines_tx, mut lines) = tokio::sync::mpsc::channel::<String>(1);
                std::thread::spawn(move || {
                    use std::io::BufRead;
                    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
                        if lines_tx.blocking_send(line).is_err() {
                            return;
                        }
                    }
                });
                eprintln!("READY");
                while let Some(line) = lines.recv().await {
                    let words: Vec<&str> = line.split_whitespace().collect();
                    match words.as_slice() {
                        ["put", key, value] => {
                            bucket.put(key, Bytes::from(value.to_string())).await?;
                        }
                        ["big", key] => {
                            bucket.put(key, big_body(key)).await?;
                        }
                        ["delete", key] => bucket.delete(key).await?,
                        ["forget", key] => {
                            hinted::delete_all_not_durable(&bucket, &[(*key).to_owned()]).await?;
                        }
                        other => anyhow::bail!("unknown command {other:?}"),
                    }
                    eprintln!("OK");
                }
            }
            other => anyhow::bail!("unknown child job {other}"),
        }
        anyhow::Ok(())
    })
}

fn spawn_child(job: &str, root: &std::path::Path) -> anyhow::Result<std::process::Child> {
    Ok(std::process::Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "folder_child_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, job)
        .env(CHILD_ROOT_ENV, root)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_racing_processes_have_one_winner() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let bucket = wasmkeep_bucket::FolderBucket::open(dir.path())?;
    bucket
        .put("race/match", Bytes::from_static(b"base"))
        .await?;
    let root = dir.path().to_owned();
    let outputs = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<String>> {
        use std::io::BufRead;
        let mut children = (0..RACING_PROCESSES)
            .map(|_| spawn_child("race", &root))
            .collect::<anyhow::Result<Vec<_>>>()?;
        // Every child has read the base etag before any of them races.
        let mut readers = Vec::new();
        for child in &mut children {
            let mut reader =
                std::io::BufReader::new(child.stderr.take().context("stderr")?).lines();
            loop {
                let line = reader.next().context("child ended before READY")??;
                if line == "READY" {
                    break;
                }
            }
            readers.push(reader);
        }
        for child in &mut children {
            drop(child.stdin.take()); // go
        }
        let mut lines = Vec::new();
        for (mut child, reader) in children.into_iter().zip(readers) {
            let rest: Vec<String> = reader.collect::<Result<_, _>>()?;
            ensure!(child.wait()?.success(), "child failed: {rest:?}");
            lines.extend(rest.into_iter().filter(|l| l.starts_with("RESULT ")));
        }
        Ok(lines)
    })
    .await??;
    ensure!(outputs.len() == RACING_PROCESSES, "results: {outputs:?}");
    for (what, key) in [("absent=won", "race/absent"), ("match=won", "race/match")] {
        let winners: Vec<&String> = outputs.iter().filter(|l| l.contains(what)).collect();
        ensure!(winners.len() == 1, "{what}: {outputs:?}");
        let pid = winners[0].split_whitespace().nth(1).context("pid")?;
        ensure!(
            bucket.get(key).await?.bytes == pid,
            "{key} holds another body"
        );
    }
    ensure!(outputs.iter().all(|l| !l.contains("error:")), "{outputs:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_object_is_whole_after_kill_9() -> anyhow::Result<()> {
    use std::io::BufRead;
    let dir = tempfile::tempdir()?;
    let root = dir.path().to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut child = spawn_child("overwrite", &root)?;
        let stderr = child.stderr.take().context("stderr")?;
        let mut lines = std::io::BufReader::new(stderr).lines();
        // Kill it mid-stream, after a few complete writes.
        let mut writes = 0;
        while writes < 3 {
            let line = lines.next().context("child ended early")??;
            if line.starts_with("WROTE ") {
                writes += 1;
            }
        }
        child.kill()?; // SIGKILL
        child.wait()?;
        Ok(())
    })
    .await??;
    let bucket = wasmkeep_bucket::FolderBucket::open(dir.path())?;
    let object = bucket.get("torn/object").await?;
    ensure!(
        object.bytes.len() == 1 << 20,
        "torn length {}",
        object.bytes.len()
    );
    let fill = object.bytes[0];
    ensure!(object.bytes.iter().all(|b| *b == fill), "torn body");
    Ok(())
}

/// The boot the journal tests' writers run in, and the one after "a reboot".
const BOOT_ONE: &str = "test-boot-one";
const BOOT_TWO: &str = "test-boot-two";

/// Folder options that never checkpoint on their own: what such a writer
/// leaves behind is what a crash before its next checkpoint leaves.
fn crash_before_checkpoint(boot: &str) -> wasmkeep_bucket::FolderOptions {
    wasmkeep_bucket::FolderOptions {
        journal_boot_id: Some(boot.to_owned()),
        journal_checkpoint_interval: Some(std::time::Duration::from_secs(3600)),
        ..Default::default()
    }
}

/// A new folder that a process of [`BOOT_ONE`] opened before (its writers
/// then recover on the same boot), and its path.
fn folder_of_boot_one() -> anyhow::Result<(tempfile::TempDir, std::path::PathBuf)> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().to_owned();
    std::fs::create_dir_all(root.join(".wal"))?;
    std::fs::write(root.join(".wal/boot"), BOOT_ONE)?;
    Ok((dir, root))
}

/// A body too large for the journal (written in place, with a marker).
fn big_body(key: &str) -> Bytes {
    let fill = key.bytes().last().unwrap_or(b'x');
    Bytes::from(vec![fill; wasmkeep_bucket::JOURNAL_BODY_MAX + 1])
}

/// A journal test writer: a child process driven one write at a time.
struct Writer {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStderr>>,
}

impl Writer {
    fn start(root: &std::path::Path) -> anyhow::Result<Writer> {
        Self::start_job("journal", root)
    }

    /// A writer alone on the folder that never answers a knock.
    fn start_deaf(root: &std::path::Path) -> anyhow::Result<Writer> {
        Self::start_job("journal-deaf", root)
    }

    fn start_job(job: &str, root: &std::path::Path) -> anyhow::Result<Writer> {
        use std::io::BufRead;
        let mut child = spawn_child(job, root)?;
        let stdin = child.stdin.take().context("stdin")?;
        let mut lines = std::io::BufReader::new(child.stderr.take().context("stderr")?).lines();
        while lines.next().context("child ended before READY")?? != "READY" {}
        Ok(Writer {
            child,
            stdin,
            lines,
        })
    }

    /// Sends one command and waits until the write returned.
    fn run(&mut self, command: &str) -> anyhow::Result<()> {
        use std::io::Write;
        writeln!(self.stdin, "{command}")?;
        loop {
            let line = self
                .lines
                .next()
                .with_context(|| format!("child ended during {command:?}"))??;
            if line == "OK" {
                return Ok(());
            }
        }
    }

    fn kill_9(mut self) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

/// The keys `bucket` lists under `prefix`, in order.
async fn listed_keys<B: Bucket + ?Sized>(bucket: &B, prefix: &str) -> anyhow::Result<Vec<String>> {
    Ok(bucket
        .list(prefix)
        .await?
        .into_iter()
        .map(|m| m.key)
        .collect())
}

/// Runs `commands` in a writer process of its own on `root`, then kills it
/// (kill -9).
async fn run_then_kill(root: &std::path::Path, commands: &[&str]) -> anyhow::Result<()> {
    let root = root.to_owned();
    let commands: Vec<String> = commands.iter().map(|c| (*c).to_owned()).collect();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut writer = Writer::start(&root)?;
        for command in &commands {
            writer.run(command)?;
        }
        writer.kill_9()
    })
    .await?
}

fn journals(root: &std::path::Path) -> anyhow::Result<usize> {
    Ok(std::fs::read_dir(root.join(".wal"))?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("j."))
        .count())
}

/// Two processes write interleaved, both die before a checkpoint and the
/// machine "reboots" losing what was not synced: the next open replays each
/// key's last journaled write, across both journals, and nothing older.
/// Each epoch's batches go to one of the journal's two regions (by parity);
/// the case runs once per region.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_journal_replays_the_last_write_of_each_key_after_a_reboot() -> anyhow::Result<()> {
    for epoch in [2u64, 3] {
        replay_after_reboot(epoch)
            .await
            .with_context(|| format!("writers in epoch {epoch}"))?;
    }
    Ok(())
}

async fn replay_after_reboot(epoch: u64) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().to_owned();
    // The folder as a clean earlier run in this boot left it, at `epoch`.
    std::fs::create_dir_all(root.join(".wal"))?;
    std::fs::write(root.join(".wal/epoch"), epoch.to_le_bytes())?;
    std::fs::write(root.join(".wal/boot"), BOOT_ONE)?;
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut a = Writer::start(&root)?;
        let mut b = Writer::start(&root)?;
        a.run("put j/x a1")?;
        b.run("put j/x b1")?; // the newer write, in the other journal
        b.run("put j/y b1")?;
        a.run("put j/y a2")?;
        a.run("put j/z z1")?;
        a.run("delete j/z")?;
        a.run("big j/w")?;
        b.run("put j/w small")?; // a journaled write after one synced in place
        a.run("put j/v old")?;
        b.run("big j/v")?; // synced in place after a journaled one: its marker wins
        a.run("put j/t t1")?;
        a.kill_9()?;
        b.kill_9()?;
        ensure!(journals(&root)? == 2, "both journals stay after kill -9");
        // The power cut: what was renamed but not synced is gone or torn.
        for key in ["j/x", "j/y", "j/w"] {
            std::fs::remove_file(root.join(key))?;
        }
        std::fs::write(root.join("j/z"), "z1")?; // the delete was lost
        std::fs::write(root.join("j/t"), "t")?; // torn
        Ok(())
    })
    .await??;

    let bucket =
        wasmkeep_bucket::FolderBucket::open_with(dir.path(), crash_before_checkpoint(BOOT_TWO))?;
    let body = |key: &'static str| {
        let bucket = &bucket;
        async move { bucket.get(key).await.map(|o| o.bytes) }
    };
    ensure!(
        body("j/x").await? == "b1",
        "x: the newer write across journals"
    );
    ensure!(
        body("j/y").await? == "a2",
        "y: the newer write across journals"
    );
    ensure!(
        matches!(body("j/z").await, Err(Error::NotFound { .. })),
        "z: the delete is replayed"
    );
    ensure!(
        body("j/w").await? == "small",
        "w: the journaled write after the big one"
    );
    ensure!(
        body("j/v").await? == big_body("j/v"),
        "v: the big write's marker wins"
    );
    ensure!(
        body("j/t").await? == "t1",
        "t: the torn object is whole again"
    );
    ensure!(
        journals(dir.path())? == 1,
        "the dead journals are gone, ours stays"
    );
    Ok(())
}

/// A writer killed without a reboot: its objects stand (the page cache holds
/// them) at the next open, whose first checkpoint (here: its clean close)
/// makes them durable and removes the dead journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_journal_of_a_killed_process_is_checkpointed_by_the_next_one() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let root = dir.path().to_owned();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut a = Writer::start(&root)?;
        a.run("put k/one 1")?;
        a.run("delete k/one")?;
        a.run("put k/two 2")?;
        a.kill_9()
    })
    .await??;
    ensure!(journals(dir.path())? == 1);
    let bucket =
        wasmkeep_bucket::FolderBucket::open_with(dir.path(), crash_before_checkpoint(BOOT_ONE))?;
    ensure!(
        journals(dir.path())? == 2,
        "the dead journal stays until our first checkpoint, ours created"
    );
    ensure!(matches!(
        bucket.get("k/one").await,
        Err(Error::NotFound { .. })
    ));
    ensure!(bucket.get("k/two").await?.bytes == "2");
    drop(bucket);
    ensure!(
        journals(dir.path())? == 0,
        "the clean close checkpointed and removed both"
    );
    Ok(())
}

/// A writer killed, and the next one in the same boot killed too before its
/// first checkpoint; then the power cut. The first's journal was still there
/// (the second's open does not checkpoint), so the reboot replays both: the
/// key only the first wrote, and the newer write of the key both wrote. Each
/// was alone on the folder, so their batches took no stripe lock (ADR 0035):
/// the second's orders come from a block reserved past every order the
/// first used, although the first wrote the key more often.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_journal_of_a_killed_process_survives_a_reboot_before_the_next_checkpoint()
-> anyhow::Result<()> {
    let (dir, root) = folder_of_boot_one()?;
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut a = Writer::start(&root)?;
        a.run("put r/a a1")?;
        for value in ["a1", "a2", "a3", "a4"] {
            a.run(&format!("put r/b {value}"))?;
        }
        a.kill_9()?;
        let mut b = Writer::start(&root)?;
        ensure!(
            journals(&root)? == 2,
            "the killed writer's journal stays until a checkpoint"
        );
        b.run("put r/b b1")?;
        b.kill_9()?;
        // The power cut: what was renamed but not synced is gone (the second
        // writer adopted the first's young objects, ADR 0040: it made no
        // files of them either).
        for key in ["r/a", "r/b"] {
            match std::fs::remove_file(root.join(key)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    })
    .await??;
    let bucket =
        wasmkeep_bucket::FolderBucket::open_with(dir.path(), crash_before_checkpoint(BOOT_TWO))?;
    ensure!(
        bucket.get("r/a").await?.bytes == "a1",
        "a: only in the first journal"
    );
    ensure!(
        bucket.get("r/b").await?.bytes == "b1",
        "b: the newer write, in the second journal"
    );
    ensure!(
        journals(dir.path())? == 1,
        "the dead journals are gone, ours stays"
    );
    Ok(())
}

/// Writers alone on the folder die one after the other before any
/// checkpoint, all in one boot, each after writing the same key: every
/// dead journal stays until a checkpoint, so the last opener finds them
/// all, and it must apply each key's last young entry across all of them
/// (by batch order), not journal by journal in the folder's listing order.
/// Journal by journal, the newest write loses unless its journal happens
/// to come last in the listing (one chance in eight here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_journals_of_writers_killed_in_turn_keep_the_newest_write() -> anyhow::Result<()> {
    const WRITERS: usize = 8;
    let (dir, root) = folder_of_boot_one()?;
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        for writer in 0..WRITERS {
            let mut w = Writer::start(&root)?;
            w.run(&format!("put r/shared w{writer}"))?;
            w.run(&format!("put r/own-{writer} w{writer}"))?;
            w.kill_9()?;
        }
        ensure!(
            journals(&root)? == WRITERS,
            "every killed writer's journal stays until a checkpoint"
        );
        Ok(())
    })
    .await??;
    let bucket =
        wasmkeep_bucket::FolderBucket::open_with(dir.path(), crash_before_checkpoint(BOOT_ONE))?;
    let newest = format!("w{}", WRITERS - 1);
    let shared = bucket.get("r/shared").await?.bytes;
    ensure!(
        shared == newest.as_bytes(),
        "r/shared holds {:?}, not the last writer's {newest:?}",
        String::from_utf8_lossy(&shared)
    );
    for writer in 0..WRITERS {
        ensure!(bucket.get(&format!("r/own-{writer}")).await?.bytes == format!("w{writer}"));
    }
    Ok(())
}

/// More journaled bytes than the journal holds: the committer checkpoints
/// and starts over, and every write stays readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_journal_that_fills_starts_over() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let bucket =
        wasmkeep_bucket::FolderBucket::open_with(dir.path(), crash_before_checkpoint(BOOT_ONE))?;
    let body = Bytes::from(vec![7u8; wasmkeep_bucket::JOURNAL_BODY_MAX - 4096]);
    let writes = 2 * wasmkeep_bucket::JOURNAL_BYTES_MAX as usize / body.len();
    for i in 0..writes {
        bucket.put(&format!("fill/{i:04}"), body.clone()).await?;
    }
    for i in 0..writes {
        ensure!(bucket.get(&format!("fill/{i:04}")).await?.bytes == body);
    }
    let wal = std::fs::read_dir(dir.path().join(".wal"))?
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("j."))
        .context("our journal")?;
    ensure!(wal.metadata()?.len() <= wasmkeep_bucket::JOURNAL_BYTES_MAX);
    Ok(())
}

/// The inode number of the object `key` under `root`.
fn inode(root: &std::path::Path, key: &str) -> anyhow::Result<u64> {
    use std::os::unix::fs::MetadataExt as _;
    Ok(std::fs::metadata(root.join(key))?.ino())
}

/// A replaced or deleted object's file is reused for a later write (once the
/// grace is over: zero here) instead of being freed, and every object reads
/// back whole; with the default grace nothing is reused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_reuses_the_files_of_replaced_and_deleted_objects() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().canonicalize()?;
    // Files are reused as files are made: not alone (ADR 0034).
    let options = wasmkeep_bucket::FolderOptions {
        inode_reuse_grace: Some(std::time::Duration::ZERO),
        never_solo: true,
        ..Default::default()
    };
    let bucket = wasmkeep_bucket::FolderBucket::open_with(&root, options)?;
    bucket.put("k/a", Bytes::from_static(b"first")).await?;
    let first = inode(&root, "k/a")?;
    // Held open, a file freed by the backend keeps its inode number from
    // any new file: the same number below means the file itself was reused.
    let _held = std::fs::File::open(root.join("k/a"))?;
    // Replaced: its file goes to the pool, and the next new file is it.
    bucket.put("k/a", Bytes::from_static(b"second")).await?;
    ensure!(inode(&root, "k/a")? != first, "a put replaces the file");
    bucket
        .put("k/b", Bytes::from_static(b"b, longer than the old body"))
        .await?;
    ensure!(
        inode(&root, "k/b")? == first,
        "the replaced file was not reused"
    );
    ensure!(bucket.get("k/b").await?.bytes == Bytes::from_static(b"b, longer than the old body"));
    ensure!(bucket.get("k/a").await?.bytes == Bytes::from_static(b"second"));
    // Deleted: the same.
    let deleted = inode(&root, "k/a")?;
    let _held_too = std::fs::File::open(root.join("k/a"))?;
    bucket.delete("k/a").await?;
    ensure!(matches!(
        bucket.get("k/a").await,
        Err(Error::NotFound { .. })
    ));
    bucket.put("k/c", Bytes::from_static(b"c")).await?;
    ensure!(
        inode(&root, "k/c")? == deleted,
        "the deleted file was not reused"
    );
    ensure!(bucket.get("k/c").await?.bytes == Bytes::from_static(b"c"));
    let listed = listed_keys(&bucket, "k/").await?;
    ensure!(listed == ["k/b", "k/c"], "listed {listed:?}");
    drop(bucket);

    // The default grace: a replaced file is not reused by the next write.
    let dir = tempfile::tempdir()?;
    let root = dir.path().canonicalize()?;
    let options = wasmkeep_bucket::FolderOptions {
        never_solo: true,
        ..Default::default()
    };
    let bucket = wasmkeep_bucket::FolderBucket::open_with(&root, options)?;
    bucket.put("k/a", Bytes::from_static(b"first")).await?;
    let first = inode(&root, "k/a")?;
    let _held = std::fs::File::open(root.join("k/a"))?;
    bucket.put("k/a", Bytes::from_static(b"second")).await?;
    bucket.put("k/b", Bytes::from_static(b"b")).await?;
    ensure!(
        inode(&root, "k/b")? != first,
        "a file was reused within the grace"
    );
    Ok(())
}

/// At open, the temporary files of processes that are gone (their lock file
/// is not held) join the new process's pool (their lock then held by it)
/// and are reused; a gone process's lock with no files left is removed; a
/// live process's files are kept, however old (a pooled file keeps its
/// object's old time); files without a lock file go by age alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_open_adopts_only_the_temporary_files_of_processes_that_are_gone()
-> anyhow::Result<()> {
    use std::os::fd::AsRawFd as _;
    let dir = tempfile::tempdir()?;
    let root = dir.path().canonicalize()?;
    let running = wasmkeep_bucket::FolderBucket::open(&root)?;
    running.put("k/a", Bytes::from_static(b"a")).await?;
    let tmp = root.join(".tmp");
    let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    let file = |name: &str, len: usize, old: bool| -> anyhow::Result<()> {
        std::fs::write(tmp.join(name), vec![b'x'; len])?;
        if old {
            std::fs::File::options()
                .write(true)
                .open(tmp.join(name))?
                .set_modified(two_hours_ago)?;
        }
        Ok(())
    };
    // SAFETY: flock on descriptors this test owns.
    let try_lock = |f: &std::fs::File| unsafe {
        libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0
    };
    // Gone: a lock file nobody holds, and its files.
    file("1.dead.lock", 0, false)?;
    file("1.dead.1", 10, true)?;
    // Gone, with nothing left.
    file("5.empty.lock", 0, false)?;
    // Live: its lock held (a separate open file description, as another
    // process would hold it), its file old.
    file("2.live.lock", 0, false)?;
    let live_lock = std::fs::File::open(tmp.join("2.live.lock"))?;
    ensure!(try_lock(&live_lock));
    file("2.live.7", 10, true)?;
    // No lock file: by age.
    file("3.old.1", 10, true)?;
    file("4.new.1", 10, false)?;
    let adopted_inode = inode(&tmp, "1.dead.1")?;
    let _pinned = std::fs::File::open(tmp.join("1.dead.1"))?;

    let options = wasmkeep_bucket::FolderOptions {
        inode_reuse_grace: Some(std::time::Duration::ZERO),
        ..Default::default()
    };
    let second = wasmkeep_bucket::FolderBucket::open_with(&root, options)?;
    // Adoption runs beside the opening, so as not to delay a start.
    second.adoption_finished().await;
    let left: BTreeSet<String> = std::fs::read_dir(&tmp)?
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect();
    for gone in ["5.empty.lock", "3.old.1"] {
        ensure!(!left.contains(gone), "{gone} was kept: {left:?}");
    }
    for kept in [
        "1.dead.lock",
        "1.dead.1",
        "2.live.lock",
        "2.live.7",
        "4.new.1",
    ] {
        ensure!(left.contains(kept), "{kept} was removed: {left:?}");
    }
    // The adopted process's lock is held by the second bucket now.
    let dead_lock = std::fs::File::open(tmp.join("1.dead.lock"))?;
    ensure!(!try_lock(&dead_lock), "the adopted lock is not held");
    // Both running buckets kept their own lock files, and still write; the
    // second one's first new file is the adopted one.
    let locks = left.iter().filter(|n| n.ends_with(".lock")).count();
    ensure!(locks == 4, "lock files left: {left:?}");
    second.put("k/b", Bytes::from_static(b"b")).await?;
    ensure!(
        inode(&root, "k/b")? == adopted_inode,
        "the adopted file was not reused"
    );
    ensure!(second.get("k/b").await?.bytes == Bytes::from_static(b"b"));
    running.put("k/a", Bytes::from_static(b"a2")).await?;
    ensure!(second.get("k/a").await?.bytes == Bytes::from_static(b"a2"));
    drop(live_lock);
    Ok(())
}

/// Buckets opening one folder at the same moment all start: a process
/// looking for the pools of gone processes must never take a live one's
/// lock between its creation and its `flock` (seen in CI as "create the
/// temporary files' lock: Resource temporarily unavailable").
#[test]
fn buckets_opening_one_folder_at_once_all_start() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().to_path_buf();
    for round in 0..500 {
        let opened: Vec<_> = (0..4)
            .map(|_| {
                let root = root.clone();
                std::thread::spawn(move || wasmkeep_bucket::FolderBucket::open(&root))
            })
            .collect();
        let mut buckets = Vec::new();
        for handle in opened {
            let bucket = handle
                .join()
                .map_err(|_| anyhow::anyhow!("an opening thread panicked"))?
                .map_err(|e| anyhow::anyhow!("round {round}: {e}"))?;
            buckets.push(bucket);
        }
    }
    Ok(())
}

/// Alone on its folder (ADR 0034), a bucket keeps young objects in its
/// journal: its reads and listings see them, the folder does not, until
/// another opener knocks. That opener starts only once every object is a
/// file, and from then on both make files before they answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_alone_keeps_young_objects_in_its_journal_until_another_opener_knocks()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().canonicalize()?;
    // No checkpoint on its own: only the knock puts objects in place.
    let first = wasmkeep_bucket::FolderBucket::open_with(&root, crash_before_checkpoint(BOOT_ONE))?;
    first.put("y/a", Bytes::from_static(b"a")).await?;
    first.put("y/b/c", Bytes::from_static(b"c")).await?;
    first.put("y/gone", Bytes::from_static(b"x")).await?;
    first.delete("y/gone").await?;
    ensure!(
        !root.join("y/a").exists() && !root.join("y/b/c").exists(),
        "young objects are not files yet"
    );
    ensure!(first.get("y/a").await?.bytes == "a");
    ensure!(first.head("y/b/c").await?.etag == wasmkeep_bucket::content_etag(b"c"));
    let listed = listed_keys(&first, "y/").await?;
    ensure!(listed == ["y/a", "y/b/c"], "listed {listed:?}");

    let opener_root = root.clone();
    let second = tokio::task::spawn_blocking(move || {
        wasmkeep_bucket::FolderBucket::open_with(&opener_root, crash_before_checkpoint(BOOT_ONE))
    })
    .await??;
    ensure!(std::fs::read(root.join("y/a"))? == b"a");
    ensure!(std::fs::read(root.join("y/b/c"))? == b"c");
    ensure!(
        !root.join("y/gone").exists(),
        "a young object deleted never became a file"
    );
    ensure!(second.get("y/b/c").await?.bytes == "c");

    first.put("y/d", Bytes::from_static(b"d")).await?;
    ensure!(
        root.join("y/d").is_file(),
        "after the knock, a write is a file"
    );
    ensure!(second.get("y/d").await?.bytes == "d");
    second.put("y/e", Bytes::from_static(b"e")).await?;
    ensure!(first.get("y/e").await?.bytes == "e");
    Ok(())
}

/// A young object is not a file, so the folder cannot refuse a key below it
/// (or above it) by itself: the bucket does, either way round and within
/// one batch, and the refused write changes nothing. Every object that was
/// answered goes in place at the last checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_alone_refuses_a_key_below_or_above_a_young_object() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().canonicalize()?;
    let bucket =
        wasmkeep_bucket::FolderBucket::open_with(&root, crash_before_checkpoint(BOOT_ONE))?;
    let refused = |r: &wasmkeep_bucket::Result<_>| matches!(r, Err(Error::InvalidKey { .. }));
    bucket.put("p/a", Bytes::from_static(b"1")).await?;
    let below = bucket.put("p/a/b", Bytes::from_static(b"2")).await;
    ensure!(refused(&below), "below a young object: {below:?}");
    bucket.put("q/x/y", Bytes::from_static(b"3")).await?;
    let above = bucket.put("q/x", Bytes::from_static(b"4")).await;
    ensure!(refused(&above), "above a young object: {above:?}");
    // At once: in one batch or two, exactly one of them is answered.
    let (upper, lower) = tokio::join!(
        bucket.put("r/a", Bytes::from_static(b"5")),
        bucket.put("r/a/b", Bytes::from_static(b"6"))
    );
    ensure!(
        upper.is_ok() != lower.is_ok() && (refused(&upper) || refused(&lower)),
        "{upper:?} {lower:?}"
    );
    drop(bucket);
    ensure!(std::fs::read(root.join("p/a"))? == b"1");
    ensure!(std::fs::read(root.join("q/x/y"))? == b"3");
    if upper.is_ok() {
        ensure!(std::fs::read(root.join("r/a"))? == b"5");
    } else {
        ensure!(std::fs::read(root.join("r/a/b"))? == b"6");
    }
    Ok(())
}

/// A listing over files and young objects, several pages long: every key
/// once and in order, a key's young version over its older file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_alone_lists_young_objects_and_files_page_by_page() -> anyhow::Result<()> {
    const KEYS: usize = 3200;
    let dir = tempfile::tempdir()?;
    let root = dir.path().canonicalize()?;
    let key = |i: usize| format!("l/{i:04}");
    let files = Arc::new(wasmkeep_bucket::FolderBucket::open_with(
        &root,
        wasmkeep_bucket::FolderOptions {
            never_solo: true,
            ..Default::default()
        },
    )?);
    put_all(&files, (0..KEYS).step_by(2).map(key), "old").await?;
    drop(files);
    let bucket = Arc::new(wasmkeep_bucket::FolderBucket::open_with(
        &root,
        crash_before_checkpoint(BOOT_ONE),
    )?);
    put_all(&bucket, (0..KEYS).step_by(3).map(key), "new").await?;
    ensure!(!root.join(key(3)).exists(), "the new objects are young");

    let expected: Vec<(String, &str)> = (0..KEYS)
        .filter(|i| i % 2 == 0 || i % 3 == 0)
        .map(|i| (key(i), if i % 3 == 0 { "new" } else { "old" }))
        .collect();
    ensure!(expected.len() > 2 * LIST_PAGE_OBJECTS_MAX);
    let listed: Vec<(String, Etag)> = bucket
        .list("l/")
        .await?
        .into_iter()
        .map(|m| (m.key, m.etag))
        .collect();
    let want: Vec<(String, Etag)> = expected
        .iter()
        .map(|(k, body)| (k.clone(), wasmkeep_bucket::content_etag(body.as_bytes())))
        .collect();
    ensure!(
        listed == want,
        "{} listed, {} expected",
        listed.len(),
        want.len()
    );
    let keys: Vec<String> = hinted::list_keys(&*bucket, "l/")
        .await?
        .into_iter()
        .map(|l| l.key)
        .collect();
    ensure!(keys == expected.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>());
    Ok(())
}

/// Puts `body` under each key, 64 at a time.
async fn put_all(
    bucket: &Arc<wasmkeep_bucket::FolderBucket>,
    keys: impl Iterator<Item = String>,
    body: &'static str,
) -> anyhow::Result<()> {
    let puts = futures::stream::iter(keys.map(|k| {
        let bucket = Arc::clone(bucket);
        async move { bucket.put(&k, Bytes::from_static(body.as_bytes())).await }
    }))
    .buffer_unordered(64)
    .collect::<Vec<_>>()
    .await;
    for put in puts {
        put?;
    }
    Ok(())
}

/// Waits until a checkpoint put `path` in place as a file (at most 10 s).
async fn placed(path: &std::path::Path) -> anyhow::Result<()> {
    for _ in 0..10_000 {
        if path.is_file() {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    anyhow::bail!("{} was not put in place", path.display())
}

/// Alone on its folder, the committer answers "absent" from the names it
/// knows its folders hold instead of asking the disk (ADR 0036). Every
/// way a name comes into a folder still counts: a file from before the
/// process opened, a young object a checkpoint put in place, the folder
/// made for a key below; and a key deleted is absent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_alone_knows_the_names_in_its_folders() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().canonicalize()?;
    let earlier = wasmkeep_bucket::FolderBucket::open(&root)?;
    earlier.put("n/old", Bytes::from_static(b"0")).await?;
    drop(earlier);
    let bucket = wasmkeep_bucket::FolderBucket::open_with(
        &root,
        wasmkeep_bucket::FolderOptions {
            journal_checkpoint_interval: Some(std::time::Duration::from_millis(1)),
            ..Default::default()
        },
    )?;
    let conflict = |r: &wasmkeep_bucket::Result<_>| matches!(r, Err(Error::Conflict { .. }));
    let refused = |r: &wasmkeep_bucket::Result<_>| matches!(r, Err(Error::InvalidKey { .. }));
    let one = || Bytes::from_static(b"1");
    // The first key of folder `n` lists it.
    bucket.put_if_absent("n/first", one()).await?;
    let old = bucket.put_if_absent("n/old", one()).await;
    ensure!(conflict(&old), "a file from before: {old:?}");
    bucket.put("n/sub/leaf", one()).await?;
    placed(&root.join("n/first")).await?;
    placed(&root.join("n/sub/leaf")).await?;
    let again = bucket.put_if_absent("n/first", one()).await;
    ensure!(conflict(&again), "a young object put in place: {again:?}");
    let above = bucket.put_if_absent("n/sub", one()).await;
    ensure!(
        refused(&above),
        "the folder of a key put in place: {above:?}"
    );
    bucket.delete("n/first").await?;
    bucket
        .put_if_absent("n/first", Bytes::from_static(b"2"))
        .await?;
    let twice = bucket.put_if_absent("n/first", one()).await;
    ensure!(conflict(&twice), "written again once only: {twice:?}");
    ensure!(bucket.get("n/first").await?.bytes == "2");
    Ok(())
}

/// A key that has a file from before (an earlier process wrote it) and then
/// a young version: deleting it removes the file too, so nothing comes back
/// after the next open. A young object that never had a file leaves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_alone_deletes_the_older_file_under_a_young_object() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().canonicalize()?;
    let first = wasmkeep_bucket::FolderBucket::open(&root)?;
    first.put("d/k", Bytes::from_static(b"old")).await?;
    drop(first);
    ensure!(
        std::fs::read(root.join("d/k"))? == b"old",
        "in place at close"
    );

    let second =
        wasmkeep_bucket::FolderBucket::open_with(&root, crash_before_checkpoint(BOOT_ONE))?;
    second.put("d/k", Bytes::from_static(b"new")).await?;
    ensure!(second.get("d/k").await?.bytes == "new");
    second.put("d/fresh", Bytes::from_static(b"x")).await?;
    second.delete("d/k").await?;
    second.delete("d/fresh").await?;
    ensure!(
        !root.join("d/k").exists(),
        "the older file went with the delete"
    );
    ensure!(matches!(
        second.get("d/k").await,
        Err(Error::NotFound { .. })
    ));
    drop(second);

    let third = wasmkeep_bucket::FolderBucket::open(&root)?;
    for key in ["d/k", "d/fresh"] {
        ensure!(
            matches!(third.get(key).await, Err(Error::NotFound { .. })),
            "{key}"
        );
    }
    ensure!(third.list("d/").await?.is_empty());
    Ok(())
}

/// A process alone on its folder, killed: the next open (same boot) puts its
/// young objects in place, and not the ones it deleted, not even with a
/// delete that need not be durable (else every record compacted since the
/// last checkpoint would come back as a file, and the restart would write
/// them all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_alone_killed_leaves_its_young_objects_and_not_the_deleted_ones()
-> anyhow::Result<()> {
    let (dir, root) = folder_of_boot_one()?;
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let mut a = Writer::start(&root)?;
        a.run("put k/kept 1")?;
        a.run("put k/forgotten 2")?;
        a.run("put k/deleted 3")?;
        a.run("forget k/forgotten")?;
        a.run("delete k/deleted")?;
        a.run("put k/placed 4")?;
        a.run("delete k/placed")?;
        // Enough deletes in one folder that the recovery lists it.
        for i in 0..20 {
            a.run(&format!("put k/many/{i} {i}"))?;
            a.run(&format!("delete k/many/{i}"))?;
        }
        a.kill_9()
    })
    .await??;
    let root = dir.path();
    ensure!(
        !root.join("k/kept").exists(),
        "young objects were only in the journal"
    );
    // As a checkpoint leaves it that placed the object before the process
    // died, its delete journaled but the file not yet removed: the
    // recovery finds the name and removes it.
    std::fs::create_dir_all(root.join("k/many"))?;
    std::fs::write(root.join("k/placed"), "4")?;
    std::fs::write(root.join("k/many/7"), "7")?;
    let bucket = wasmkeep_bucket::FolderBucket::open_with(root, crash_before_checkpoint(BOOT_ONE))?;
    ensure!(bucket.get("k/kept").await?.bytes == "1");
    for key in ["k/forgotten", "k/deleted", "k/placed", "k/many/7"] {
        ensure!(!root.join(key).exists(), "{key} came back as a file");
        ensure!(
            matches!(bucket.get(key).await, Err(Error::NotFound { .. })),
            "{key}"
        );
    }
    Ok(())
}

/// A process alone on its folder, killed: the next process alone there
/// adopts its young objects (ADR 0040). It serves them from its own journal
/// at once, without making them files first (a restart after a crash under
/// load otherwise created ~1,000 files before its first answer), and its
/// first checkpoint (here: the clean close) puts them in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_alone_killed_its_young_objects_are_adopted_then_placed() -> anyhow::Result<()> {
    let (dir, root) = folder_of_boot_one()?;
    run_then_kill(&root, &["put k/a a1", "put k/b b1", "put k/b b2"]).await?;
    let root = dir.path();
    let bucket = wasmkeep_bucket::FolderBucket::open_with(root, crash_before_checkpoint(BOOT_ONE))?;
    ensure!(bucket.get("k/a").await?.bytes == "a1");
    ensure!(bucket.get("k/b").await?.bytes == "b2");
    let listed = listed_keys(&bucket, "k/").await?;
    ensure!(listed == ["k/a", "k/b"], "listed {listed:?}");
    for key in ["k/a", "k/b"] {
        ensure!(
            !root.join(key).exists(),
            "{key} was written as a file before the first checkpoint"
        );
    }
    ensure!(
        journals(root)? == 2,
        "the dead journal stays until the first checkpoint"
    );
    // An adopted object is young like any other: overwritten, deleted.
    bucket.put("k/a", Bytes::from_static(b"a2")).await?;
    bucket.put("k/c", Bytes::from_static(b"c1")).await?;
    bucket.delete("k/b").await?;
    ensure!(bucket.get("k/a").await?.bytes == "a2");
    ensure!(matches!(
        bucket.get("k/b").await,
        Err(Error::NotFound { .. })
    ));
    drop(bucket);
    ensure!(std::fs::read(root.join("k/a"))? == b"a2");
    ensure!(std::fs::read(root.join("k/c"))? == b"c1");
    ensure!(!root.join("k/b").exists(), "the deleted adopted object");
    ensure!(journals(root)? == 0, "the close removed both journals");
    Ok(())
}

/// Adopted young objects live only in journals until a checkpoint: a
/// process that adopted them and wrote over one of them, killed before its
/// first checkpoint, leaves two journals that the next open reads together,
/// on the same boot (adopting again) and after a power cut (replaying).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_adopted_young_objects_survive_a_second_crash_and_a_reboot() -> anyhow::Result<()> {
    for boot in [BOOT_ONE, BOOT_TWO] {
        let (dir, root) = folder_of_boot_one()?;
        run_then_kill(&root, &["put r/x a1", "put r/y a1", "put r/z a1"]).await?;
        run_then_kill(&root, &["put r/x b1", "delete r/z"]).await?;
        ensure!(
            !root.join("r/y").exists(),
            "the second writer adopted r/y, it made no file"
        );
        ensure!(journals(&root)? == 2, "both journals stay");
        let bucket =
            wasmkeep_bucket::FolderBucket::open_with(dir.path(), crash_before_checkpoint(boot))?;
        ensure!(bucket.get("r/x").await?.bytes == "b1", "{boot}: r/x");
        ensure!(
            bucket.get("r/y").await?.bytes == "a1",
            "{boot}: r/y, adopted"
        );
        ensure!(
            matches!(bucket.get("r/z").await, Err(Error::NotFound { .. })),
            "{boot}: r/z, deleted after its adoption"
        );
        drop(bucket);
        ensure!(std::fs::read(dir.path().join("r/y"))? == b"a1", "{boot}");
    }
    Ok(())
}

/// An opener waits at the knock for a process alone on the folder, and that
/// process dies instead of making room, with young objects only in its
/// journal. The opener's own recovery ran while that process lived, so it
/// must recover again before it takes the place: else it would serve
/// without those objects (and its checkpoints would later call their epoch
/// durable, losing them for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_opener_outliving_the_solo_process_it_waits_for_keeps_its_young_objects()
-> anyhow::Result<()> {
    let (dir, root) = folder_of_boot_one()?;
    let writer = {
        let root = root.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<Writer> {
            let mut a = Writer::start_deaf(&root)?;
            a.run("put k/a a1")?;
            Ok(a)
        })
        .await??
    };
    let opener = {
        let root = root.clone();
        tokio::task::spawn_blocking(move || {
            wasmkeep_bucket::FolderBucket::open_with(&root, crash_before_checkpoint(BOOT_ONE))
        })
    };
    // The opener is past its recovery once its journal is there; it then
    // knocks, unanswered, until the writer is gone.
    let knock = root.join(".wal/knock");
    let before = std::fs::metadata(&knock).and_then(|m| m.modified()).ok();
    while journals(&root)? < 2
        || std::fs::metadata(&knock).and_then(|m| m.modified()).ok() == before
    {
        tokio::task::yield_now().await;
    }
    tokio::task::spawn_blocking(move || writer.kill_9()).await??;
    let bucket = opener.await??;
    ensure!(
        bucket.get("k/a").await?.bytes == "a1",
        "the dead writer's young object"
    );
    drop(bucket);
    ensure!(std::fs::read(dir.path().join("k/a"))? == b"a1");
    Ok(())
}

/// A process that opens a folder never to be alone on it adopts nothing: a
/// gone solo process's young objects are files before it serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_opened_shared_puts_young_objects_of_the_dead_in_place() -> anyhow::Result<()> {
    let (dir, root) = folder_of_boot_one()?;
    run_then_kill(&root, &["put k/a a1"]).await?;
    let options = wasmkeep_bucket::FolderOptions {
        never_solo: true,
        ..crash_before_checkpoint(BOOT_ONE)
    };
    let bucket = wasmkeep_bucket::FolderBucket::open_with(dir.path(), options)?;
    ensure!(std::fs::read(dir.path().join("k/a"))? == b"a1");
    ensure!(bucket.get("k/a").await?.bytes == "a1");
    Ok(())
}

/// A process alone on the folder reserves batch orders in blocks: after its
/// first batch, further batches write no stripe counter (ADR 0035), and
/// every counter is past the orders it may use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folder_alone_batches_leave_the_stripe_counters_alone() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let bucket =
        wasmkeep_bucket::FolderBucket::open_with(dir.path(), crash_before_checkpoint(BOOT_ONE))?;
    let counters = || -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(dir.path().join(".locks"))? {
            let entry = entry?;
            all.push((
                entry.file_name().to_string_lossy().into_owned(),
                std::fs::read(entry.path())?,
            ));
        }
        all.sort();
        Ok(all)
    };
    bucket.put("c/first", Bytes::from_static(b"1")).await?;
    let after_first = counters()?;
    ensure!(
        after_first.len() == wasmkeep_bucket::LOCK_STRIPES,
        "every stripe has its counter: {}",
        after_first.len()
    );
    let reserved = &after_first[0].1;
    ensure!(
        after_first.iter().all(|(_, counter)| counter == reserved) && reserved.len() == 8,
        "the block's end is in every counter"
    );
    for i in 0..64 {
        bucket
            .put(&format!("c/{i}"), Bytes::from(i.to_string()))
            .await?;
    }
    bucket.delete("c/first").await?;
    ensure!(counters()? == after_first, "a batch alone wrote a counter");
    Ok(())
}
