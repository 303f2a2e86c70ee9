//! A minimal, fast upstream for the overhead bench.
//!
//! The engine emulator (`crate::emulator`) records every request with its body, parses it as JSON and runs a
//! prefix-cache model: at thousands of 1 MiB requests per second that costs more CPU than the proxies under
//! test, and its memory grows without bound. The overhead bench measures proxies, so its upstream does the least
//! an engine must: it reads the request body to the end without keeping it, and answers every POST with the same
//! small, non-streamed chat completion (about 300 bytes), or, when the request asks for one with
//! [`STREAM_EVENTS_HEADER`], a streamed chat answer whose chunks come 1 ms apart (`llmroute-bench ab
//! --stream-events`). `GET /health`, `/v1/models` and any other GET get a small JSON answer, enough for the peer
//! routers' start-up and health checks.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

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

/// A request with this header (a count of content deltas) is answered with a stream (see [`streamed`]).
pub const STREAM_EVENTS_HEADER: &str = "x-bench-stream-events";
/// The pause after each chunk of a streamed answer, so each reaches the proxy as its own read, as an engine's
/// tokens do.
const STREAM_GAP: Duration = Duration::from_millis(1);

async fn serve(request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let deltas = parts
        .headers
        .get(STREAM_EVENTS_HEADER)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let answer = match (&parts.method, parts.uri.path(), deltas) {
        (&Method::POST, _, Some(n)) => {
            drain(body).await;
            return streamed(n);
        }
        (&Method::POST, _, None) => {
            drain(body).await;
            COMPLETION
        }
        (_, "/v1/models", _) => MODELS,
        _ => OK,
    };
    (StatusCode::OK, [(CONTENT_TYPE, "application/json")], answer).into_response()
}

/// A streamed chat answer of `deltas` content deltas ([`sse_chunks`]), each chunk written on its own after a
/// pause.
fn streamed(deltas: usize) -> Response {
    let chunks = futures_util::stream::iter(sse_chunks(deltas)).then(|chunk| async move {
        tokio::time::sleep(STREAM_GAP).await;
        Ok::<_, std::convert::Infallible>(chunk)
    });
    (
        StatusCode::OK,
        [(CONTENT_TYPE, "text/event-stream")],
        Body::from_stream(chunks),
    )
        .into_response()
}

/// A streamed chat answer as vLLM writes it: `deltas` chunks of one content delta each, the usage chunk a client
/// asked for with `stream_options.include_usage`, and `[DONE]`.
pub fn sse_chunks(deltas: usize) -> Vec<String> {
    let head = r#"{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"qwen3-0.6b","#;
    let mut chunks: Vec<String> = (0..deltas)
        .map(|i| {
            let finish = if i + 1 == deltas { r#""stop""# } else { "null" };
            format!(
                "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" word{i}\"}},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n"
            )
        })
        .collect();
    chunks.push(format!(
        "data: {head}\"choices\":[],\"usage\":{{\"prompt_tokens\":16,\"completion_tokens\":{deltas},\"total_tokens\":{}}}}}\n\n",
        16 + deltas
    ));
    chunks.push("data: [DONE]\n\n".to_string());
    chunks
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

    #[test]
    fn a_streamed_answer_is_its_deltas_the_usage_chunk_and_done() {
        let chunks = sse_chunks(2);
        assert_eq!(chunks.len(), 4);
        for c in &chunks[..3] {
            let data = c.strip_prefix("data: ").and_then(|d| d.strip_suffix("\n\n")).unwrap();
            serde_json::from_str::<serde_json::Value>(data).unwrap();
        }
        assert!(chunks[1].contains(r#""finish_reason":"stop""#));
        assert!(chunks[2].contains(r#""usage":{"prompt_tokens":16,"completion_tokens":2,"total_tokens":18}"#));
        assert_eq!(chunks[3], "data: [DONE]\n\n");
    }

    #[tokio::test]
    async fn a_post_asking_for_a_stream_gets_the_chunks_as_events() {
        let up = Upstreams::start(1).await.unwrap();
        let answer = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", up.urls()[0]))
            .header(STREAM_EVENTS_HEADER, "3")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(answer.headers()[CONTENT_TYPE], "text/event-stream");
        assert_eq!(answer.text().await.unwrap(), sse_chunks(3).concat());
    }

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
