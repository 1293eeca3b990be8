//! A TCP proxy on loopback that makes a fast server look like one behind a
//! slow or stuck link: each connection's bytes are paced to a rate in both
//! directions, and the server's answer may stop after some bytes (the
//! connection then stays open and silent, as a hung server's would).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::{Result, io_error};

/// How the proxy shapes each connection.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    /// Bytes per second in each direction, per connection.
    pub bytes_per_second: u64,
    /// After this many bytes from the server on one connection, forward
    /// nothing more from it (the client sees a stalled answer).
    pub answer_bytes_max: Option<u64>,
}

/// A running proxy; stops (and drops its connections) when dropped.
pub struct SlowProxy {
    addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl SlowProxy {
    /// Listens on a free 127.0.0.1 port and forwards every connection to
    /// `upstream`, shaped by `link`. Must be called within a tokio runtime.
    pub async fn start(upstream: SocketAddr, link: Link) -> Result<SlowProxy> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(io_error("bind the proxy on 127.0.0.1:0"))?;
        let addr = listener
            .local_addr()
            .map_err(io_error("the proxy's address"))?;
        let accept = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                connections.spawn(forward(client, upstream, link));
            }
        });
        Ok(SlowProxy { addr, accept })
    }

    /// `http://127.0.0.1:PORT`, for `AWS_ENDPOINT_URL`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        // Its connection tasks live in the accept task's set: aborting it
        // drops them all.
        self.accept.abort();
    }
}

async fn forward(client: TcpStream, upstream: SocketAddr, link: Link) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let rate = link.bytes_per_second.max(1);
    // Either direction ending ends the connection.
    tokio::select! {
        _ = paced(client_read, server_write, rate, None) => {}
        _ = paced(server_read, client_write, rate, link.answer_bytes_max) => {}
    }
}

/// Copies `from` to `to` at no more than `rate` bytes per second; after
/// `bytes_max` bytes it keeps the connection open and forwards nothing.
async fn paced(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    rate: u64,
    bytes_max: Option<u64>,
) {
    let chunk_max = usize::try_from((rate / 20).clamp(1, 64 << 10)).unwrap_or(64 << 10);
    let mut buf = vec![0u8; chunk_max];
    let started = tokio::time::Instant::now();
    let mut sent = 0u64;
    loop {
        let room = bytes_max.map_or(chunk_max as u64, |max| {
            max.saturating_sub(sent).min(chunk_max as u64)
        });
        if room == 0 {
            std::future::pending::<()>().await;
        }
        let room = usize::try_from(room).expect("at most chunk_max");
        let n = match from.read(&mut buf[..room]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        sent += n as u64;
        // Not before the time the bytes so far take at the rate.
        let due = Duration::from_secs_f64(sent as f64 / rate as f64);
        tokio::time::sleep_until(started + due).await;
    }
}
