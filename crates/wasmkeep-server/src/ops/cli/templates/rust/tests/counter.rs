//! The actor on a real node, with the `wasmkeep-test` harness: builds it
//! (`wasmkeep build`), starts `wasmkeep dev --test-routes` on a memory
//! bucket and a free loopback port, asks it over HTTP, reads its database
//! and hibernates it. Finds `wasmkeep` on PATH, or in $WASMKEEP_BIN.

use wasmkeep_test::{Result, TestNode};

#[tokio::test]
async fn increments_are_counted_and_kept_across_hibernation() -> Result<()> {
    let component = wasmkeep_test::build_project(env!("CARGO_MANIFEST_DIR"))?;
    let node = TestNode::start().await?;
    node.deploy_file("{{name}}", &component).await?;
    let actor = node.actor("demo/{{name}}/first")?;

    assert_eq!(actor.get("/value").await?.text()?, "0");
    assert_eq!(actor.post("/increment", b"").await?.text()?, "1");
    assert_eq!(actor.post("/increment", b"").await?.text()?, "2");
    // The actor's own database, as the bucket holds it.
    let rows = actor.sql("SELECT n FROM counter").await?;
    assert_eq!(rows.single_integer()?, 2);
    // Out of memory and back: the count is kept.
    actor.hibernate().await?;
    assert_eq!(actor.get("/value").await?.text()?, "2");
    node.stop().await;
    Ok(())
}
