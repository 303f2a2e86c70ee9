//! A minimal, fast upstream for the overhead bench.
//!
//! The engine emulator (`crate::emulator`) records every request with its body, parses it as JSON and runs a
//! prefix-cache model: at thousands of 1 MiB requests per second that costs more CPU than the proxies under
//! test, and its memory grows without bound. The overhead bench measures proxies, so its upstream does the least
//! an engine must: it reads the request body to the end without keeping it, and answers every POST with the same
//! small, non-streamed chat completion (about 300 bytes). `GET /health`, `/v1/models` and any other GET get a
//! small JSON answer, enough for the peer routers' start-up and health checks.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::CONTENT_TYPE;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use axum::Router;
use futures_util::StreamExt;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The answer to every chat completion: a fixed non-streamed answer with its usage.
pub(crate) const COMPLETION: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"qwen3-0.6b","choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the bench upstream."},"finish_reason":"stop"}],"usage":{"prompt_tokens":16,"completion_tokens":6,"total_tokens":22}}"#;
const MODELS: &str = r#"{"object":"list","data":[{"id":"qwen3-0.6b","object":"model","owned_by":"bench"}]}"#;
const OK: &str = r#"{"status":"ok"}"#;

/// Running upstream servers on 127.0.0.1; stopped on drop.
pub struct Upstreams {
    addrs: Vec<SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
}

impl Upstreams {
    /// Starts `n` servers on kernel-picked loopback ports.
    pub async fn start(n: usize) -> io::Result<Upstreams> {
        let mut addrs = Vec::with_capacity(n);
        let mut tasks = Vec::with_capacity(n);
        for _ in 0..n {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
            addrs.push(listener.local_addr()?);
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let app = Router::new().fallback(serve);
            tasks.push(tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            }));
        }
        Ok(Upstreams { addrs, tasks })
    }

    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// `["127.0.0.1:P", ...]`
    pub fn endpoints(&self) -> Vec<String> {
        self.addrs.iter().map(SocketAddr::to_string).collect()
    }

    /// `["http://127.0.0.1:P", ...]`
    pub fn urls(&self) -> Vec<String> {
        self.addrs.iter().map(|a| format!("http://{a}")).collect()
    }
}

impl Drop for Upstreams {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn serve(request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let answer = match (&parts.method, parts.uri.path()) {
        (&Method::POST, _) => {
            drain(body).await;
            COMPLETION
        }
        (_, "/v1/models") => MODELS,
        _ => OK,
    };
    (StatusCode::OK, [(CONTENT_TYPE, "application/json")], answer).into_response()
}

/// Reads the body to its end, keeping nothing.
async fn drain(body: Body) {
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        if chunk.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_posts_with_a_completion_and_gets_with_json() {
        let up = Upstreams::start(2).await.unwrap();
        assert_eq!(up.addrs().len(), 2);
        let client = reqwest::Client::new();
        let url = &up.urls()[1];
        let chat = client
            .post(format!("{url}/v1/chat/completions"))
            .body(vec![b'x'; 300_000])
            .send()
            .await
            .unwrap();
        assert_eq!(chat.status(), 200);
        let answer: serde_json::Value = chat.json().await.unwrap();
        assert_eq!(answer["object"], "chat.completion");
        let models: serde_json::Value = client
            .get(format!("{url}/v1/models"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(models["data"][0]["id"], "qwen3-0.6b");
        let health = client.get(format!("{url}/health")).send().await.unwrap();
        assert_eq!(health.text().await.unwrap(), OK);
    }
}
