//! What operators run and read: the command line (`wasmkeep dev`, `serve`,
//! `deploy`, the node and actor views and commands), the admin routes,
//! the metrics, the bucket's request counters, the open-file limit and the
//! heap trim. Never on an event's path except to count it.

pub mod admin;
pub mod backup;
pub mod cli;
pub mod console;
pub mod counting;
pub mod descriptors;
pub mod heap;
pub mod metrics;
pub mod survey;
pub mod telemetry;
