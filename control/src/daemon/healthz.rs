//! flanneld's health endpoints (spec §9.2): `GET /healthz` → 200
//! `flanneld is running`; `GET /readyz` → 503 `flanneld is not ready yet`
//! until the node is ready, then 200 `flanneld is ready`. Ready is real
//! state, read from the published [`view::DaemonView`] at the time of
//! asking: the lease is held (not expired), subnet.env is written (flannel's
//! only condition) and the dataplane is programmed for the latest lease
//! snapshot (after a start, a watch gap or a rebuild), like flannel's newer
//! `/readyz`.
//!
//! `GET /metrics` serves weft's Prometheus metrics (see [`crate::metrics`])
//! and `GET /status` the node's [`view::Status`] as one JSON object (what
//! `weft status --http ADDR` reads; 503 until the backend is set up). Both
//! show only what the leases already publish (subnets, public addresses)
//! and counters: no keys.
//!
//! Every answer comes from the latest snapshots ([`view::Observer`]), never
//! from weftd's main loop: the endpoints answer within milliseconds whatever
//! the loop or the backend is doing.
//!
//! A deliberately tiny HTTP/1.x responder: one request per connection, no
//! bodies read, bounded header size, a short read timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::metrics::DaemonMetrics;
use crate::view;

/// Binds the listener (so bind errors surface at start) and serves forever.
pub async fn serve(
    addr: SocketAddr,
    view: view::Observer,
    metrics: Arc<DaemonMetrics>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!("Start healthz server on {addr}");
    Ok(tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((conn, _)) => {
                    let (view, metrics) = (view.clone(), metrics.clone());
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(
                            Duration::from_secs(5),
                            handle(conn, view, metrics),
                        )
                        .await;
                    });
                }
                Err(e) => {
                    tracing::warn!("healthz accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }))
}

async fn handle(
    mut conn: TcpStream,
    view: view::Observer,
    metrics: Arc<DaemonMetrics>,
) -> std::io::Result<()> {
    let mut buf = [0u8; 2048];
    let mut n = 0;
    while n < buf.len() {
        let m = conn.read(&mut buf[n..]).await?;
        if m == 0 {
            break;
        }
        n += m;
        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n")
            || buf[..n].windows(2).any(|w| w == b"\n\n")
        {
            break;
        }
    }
    let (status, body, ctype) = match get_path(&buf[..n]) {
        Some(b"/metrics") => {
            let v = view.clone();
            let status = tokio::task::spawn_blocking(move || v.status())
                .await
                .ok()
                .flatten();
            (
                "200 OK",
                metrics.encode(status.as_ref()),
                crate::metrics::CONTENT_TYPE,
            )
        }
        Some(b"/status") => match crate::status::server::status_json(&view).await {
            Some(Ok(j)) => ("200 OK", j + "\n", "application/json"),
            _ => (
                "503 Service Unavailable",
                "weftd has not published its state yet\n".to_string(),
                "text/plain; charset=utf-8",
            ),
        },
        _ => {
            let (s, b) = respond(&buf[..n], view.unready().is_none());
            (s, b.to_string(), "text/plain; charset=utf-8")
        }
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(resp.as_bytes()).await?;
    conn.shutdown().await
}

/// The path of a raw `GET` request (query dropped); `None` for other methods.
fn get_path(req: &[u8]) -> Option<&[u8]> {
    let line = req.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let method = parts.next().unwrap_or_default();
    let path = parts.next().unwrap_or_default();
    (method == b"GET").then(|| path.split(|&b| b == b'?').next().unwrap_or_default())
}

/// The status line and body for a raw request.
pub fn respond(req: &[u8], ready: bool) -> (&'static str, &'static str) {
    let line = req.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let method = parts.next().unwrap_or_default();
    let path = parts.next().unwrap_or_default();
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    if method != b"GET" && method != b"HEAD" {
        return ("405 Method Not Allowed", "method not allowed\n");
    }
    match path {
        b"/healthz" => ("200 OK", "flanneld is running"),
        b"/readyz" if ready => ("200 OK", "flanneld is ready"),
        b"/readyz" => ("503 Service Unavailable", "flanneld is not ready yet"),
        _ => ("404 Not Found", "404 page not found\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            respond(b"GET /healthz HTTP/1.1\r\n\r\n", false),
            ("200 OK", "flanneld is running")
        );
        assert_eq!(
            respond(b"GET /readyz HTTP/1.1\r\n\r\n", false).0,
            "503 Service Unavailable"
        );
        assert_eq!(
            respond(b"GET /readyz?x=1 HTTP/1.1\r\n\r\n", true),
            ("200 OK", "flanneld is ready")
        );
        assert_eq!(
            respond(b"POST /healthz HTTP/1.1\r\n\r\n", true).0,
            "405 Method Not Allowed"
        );
        assert_eq!(respond(b"", true).0, "405 Method Not Allowed");
        assert_eq!(respond(b"GET /x HTTP/1.1\r\n\r\n", true).0, "404 Not Found");
        assert_eq!(
            get_path(b"GET /status?x HTTP/1.1\r\n\r\n"),
            Some(&b"/status"[..])
        );
        assert_eq!(get_path(b"HEAD /status HTTP/1.1\r\n\r\n"), None);
    }

    #[tokio::test]
    async fn serves_over_tcp() {
        let publisher = view::Publisher::new();
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        drop(l);
        let metrics = Arc::new(DaemonMetrics::new());
        let _h = serve(addr, publisher.observer(), metrics)
            .await
            .expect("serve");
        let get = |path: &'static str| async move {
            let mut c = TcpStream::connect(addr).await.expect("connect");
            c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .expect("write");
            let mut s = String::new();
            c.read_to_string(&mut s).await.expect("read");
            s
        };
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        assert!(get("/status").await.starts_with("HTTP/1.1 503"));
        let lease = crate::lease::Lease {
            subnet: Some("10.244.1.0/24".parse().expect("net")),
            ipv6_subnet: None,
            attrs: crate::lease::LeaseAttrs::default(),
            expiration: None,
        };
        publisher.daemon(|d| {
            d.lease = Some(lease);
            d.subnet_env = true;
        });
        assert!(
            get("/readyz").await.starts_with("HTTP/1.1 503"),
            "not ready before the first snapshot is programmed"
        );
        publisher.daemon(|d| d.synced = true);
        let r = get("/readyz").await;
        assert!(
            r.starts_with("HTTP/1.1 200") && r.ends_with("flanneld is ready"),
            "{r}"
        );
    }
}
