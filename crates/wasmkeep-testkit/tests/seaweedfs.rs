//! The SeaweedFS harness starts a working S3 server and stops it.

use object_store::ObjectStoreExt;
use object_store::aws::AmazonS3Builder;
use wasmkeep_testkit::{SeaweedFs, s3_tests_skipped};

#[test]
fn free_port_is_bindable() -> anyhow::Result<()> {
    let port = wasmkeep_testkit::free_port()?;
    std::net::TcpListener::bind(("127.0.0.1", port))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_server_serves_its_bucket_and_stops_on_drop() -> anyhow::Result<()> {
    if s3_tests_skipped("started_server_serves_its_bucket_and_stops_on_drop") {
        return Ok(());
    }
    let server = tokio::task::spawn_blocking(SeaweedFs::start).await??;
    let mut builder = AmazonS3Builder::new().with_bucket_name(server.bucket());
    for (key, value) in server.env() {
        builder = builder.with_config(key.to_ascii_lowercase().parse()?, value);
    }
    let store = builder.build()?;
    let path = object_store::path::Path::from("probe/object");
    store
        .put(&path, bytes::Bytes::from_static(b"hello").into())
        .await?;
    anyhow::ensure!(store.get(&path).await?.bytes().await? == bytes::Bytes::from_static(b"hello"));
    anyhow::ensure!(server.bucket_url("p/") == format!("s3://{}/p", server.bucket()));
    let pid = libc::pid_t::try_from(server.pid())?;
    let dir = server.dir().to_owned();
    tokio::task::spawn_blocking(move || drop(server)).await?;
    // SAFETY: signal 0 only checks whether the pid exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    anyhow::ensure!(!alive, "weed still running after drop");
    anyhow::ensure!(!dir.exists(), "data folder left behind");
    Ok(())
}
