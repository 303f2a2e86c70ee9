//! The response path of one routed request: relay every byte as it comes, watch a copy for the stream's end and
//! its usage, close a stream that ended without its terminal event, cut the usage chunk the gateway asked for on
//! the client's behalf, and sum up the outcome and the usage for the metrics and the access log.
//!
//! Nothing is held back, with one exception: while the gateway cuts the usage chunk it asked for, a chunk that
//! ends inside an event keeps that partial event until the next chunk completes it (see `StreamTracker::relay`),
//! so a usage chunk split across reads is still cut whole. A non-streamed JSON body is copied (up to 1 MiB) only
//! to read its usage at the end.

use llmroute_core::response_plan::Media;
use llmroute_core::stream::{self, usage, Outcome, StreamTracker, Usage};
use llmroute_core::Api;

use crate::host;

pub enum ResponseWatch {
    Stream { tracker: StreamTracker, eos: bool },
    Json { copy: Vec<u8>, eos: bool },
}

impl ResponseWatch {
    /// Starts watching a response of `media` (see `llmroute_core::response_plan`), for `api`.
    pub fn start(api: Api, media: Media, strip_usage_chunk: bool) -> ResponseWatch {
        match media {
            Media::EventStream => ResponseWatch::Stream {
                tracker: StreamTracker::new(api, strip_usage_chunk),
                eos: false,
            },
            Media::Json => ResponseWatch::Json {
                copy: Vec::new(),
                eos: false,
            },
        }
    }

    /// Watches one body callback; may cut bytes from the chunk or append the closing error event.
    pub fn on_body(&mut self, size: usize, end_of_stream: bool, request_id: Option<&str>) {
        match self {
            ResponseWatch::Stream { tracker, eos } => {
                let mut size = size;
                let chunk = match size {
                    0 => Vec::new(),
                    _ => host::response_body(size).unwrap_or_default(),
                };
                if let Some(kept) = tracker.relay(&chunk, end_of_stream) {
                    host::replace_response_body(size, &kept);
                    size = kept.len();
                }
                if end_of_stream {
                    *eos = true;
                    if let Some(tail) = tracker.closing_bytes(request_id) {
                        host::append_response_body(size, &tail);
                    }
                }
            }
            ResponseWatch::Json { copy, eos } => {
                if size > 0 && copy.len().saturating_add(size) <= usage::MAX_USAGE_DOC {
                    copy.extend(host::response_body(size).unwrap_or_default());
                }
                *eos |= end_of_stream;
            }
        }
    }

    /// The tokens the engine reported for a response that ended whole: prompt plus completion. `None` when the
    /// response was cut, or reported no prompt count.
    pub fn used_tokens(&self) -> Option<u64> {
        let usage = match self {
            ResponseWatch::Stream { tracker, eos: true } => tracker.usage(),
            ResponseWatch::Json { copy, eos: true } => {
                usage::from_value(&usage::parse_doc(std::str::from_utf8(copy).ok()?)?)
            }
            _ => return None,
        };
        Some(
            usage
                .prompt_tokens?
                .saturating_add(usage.completion_tokens.unwrap_or(0)),
        )
    }

    /// The stream's outcome (`None` for a JSON response) and the usage seen so far. `code_details` is Envoy's
    /// `response.code_details`, known only in the log phase; before it, pass "".
    pub fn summary(&self, code_details: &str) -> (Option<Outcome>, Usage) {
        match self {
            ResponseWatch::Stream { tracker, eos } => (
                Some(stream::outcome(*eos, tracker.verdict(), code_details)),
                tracker.usage(),
            ),
            ResponseWatch::Json { copy, eos: true } => (
                None,
                std::str::from_utf8(copy)
                    .ok()
                    .and_then(usage::parse_doc)
                    .map(|doc| usage::from_value(&doc))
                    .unwrap_or_default(),
            ),
            ResponseWatch::Json { .. } => (None, Usage::default()),
        }
    }
}
