//! Plays a planned stream (see [`StreamPlan`]) out as an HTTP response: `200`, `text/event-stream`, then the
//! frames, each after its pause, one body chunk each.
//!
//! The body ends the way the plan says: cleanly, by failing (hyper then drops the connection: a chunked body
//! lacks its last chunk), or never (a stall, which fails only when the emulator stops). A close-delimited
//! response is sent as `HTTP/1.0` with `connection: close` and no length, the only way hyper frames a body by
//! closing the connection; a failing body then also looks like a clean end to the client.

use std::collections::VecDeque;
use std::io;
use std::time::Duration;

use axum::body::Body;
use axum::http::header::{CACHE_CONTROL, CONNECTION, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use tokio::sync::watch;

use super::dialect::{End, Frame, StreamPlan};
use super::{pause, stop_signal, InflightGuard};

/// Pause before aborting a stream, so what precedes the cut is flushed.
const FLUSH_BEFORE_ABORT: Duration = Duration::from_millis(5);

/// The response that plays `plan`; `guard` counts the request as in flight until the body ends.
pub(super) fn stream_response(
    plan: StreamPlan,
    close_delimited: bool,
    stopped: watch::Receiver<bool>,
    guard: InflightGuard,
) -> Response {
    let frames = SseFrames {
        frames: plan.frames.into(),
        end: Some(plan.end),
        stopped,
        guard: Some(guard),
    };
    let body = futures_util::stream::unfold(frames, |mut frames| async move {
        let item = frames.next().await?;
        Some((item, frames))
    });
    let headers = [(CONTENT_TYPE, "text/event-stream"), (CACHE_CONTROL, "no-cache")];
    let mut response = (StatusCode::OK, headers, Body::from_stream(body)).into_response();
    if close_delimited {
        *response.version_mut() = Version::HTTP_10;
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The body items of a plan.
///
/// The inflight guard is released as the last item is handed out (or when the body is dropped early), so a
/// client that has read the whole stream already sees the request as finished.
struct SseFrames {
    frames: VecDeque<Frame>,
    /// How the body ends; `None` once it has.
    end: Option<End>,
    stopped: watch::Receiver<bool>,
    guard: Option<InflightGuard>,
}

impl SseFrames {
    async fn next(&mut self) -> Option<Result<Bytes, io::Error>> {
        let Some(frame) = self.frames.pop_front() else {
            return self.end().await;
        };
        if !pause(&self.stopped, frame.delay).await {
            self.frames.clear();
            self.end = Some(End::Abort);
            return self.end().await;
        }
        if self.frames.is_empty() && self.end == Some(End::Finish) {
            self.guard = None;
        }
        Some(Ok(frame.bytes))
    }

    /// The end of the body, once: nothing, or the error that aborts the connection.
    ///
    /// An abort waits a moment first: hyper flushes what it has buffered while the body is pending, so the head
    /// and the frames before the cut reach the client before the connection drops. A stall is pending until
    /// the emulator stops.
    async fn end(&mut self) -> Option<Result<Bytes, io::Error>> {
        let end = self.end.take();
        if end == Some(End::Stall) {
            stop_signal(self.stopped.clone()).await;
        }
        self.guard = None;
        match end? {
            End::Finish => None,
            End::Abort => {
                tokio::time::sleep(FLUSH_BEFORE_ABORT).await;
                Some(Err(io::Error::other("emulated stream cut")))
            }
            End::Stall => Some(Err(io::Error::other("emulator stopped"))),
        }
    }
}
