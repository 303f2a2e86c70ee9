//! The response path of one routed request: relay every byte as it comes, watch a copy for the stream's end and
//! its usage, close a stream that ended without its terminal event, cut the usage chunk the gateway asked for on
//! the client's behalf, and sum up the outcome and the usage for the metrics and the access log.
//!
//! Nothing is held back, with one exception: while the gateway cuts the usage chunk it asked for, a chunk that
//! ends inside an event keeps that partial event until the next chunk completes it (see `StreamTracker::relay`),
//! so a usage chunk split across reads is still cut whole. A non-streamed JSON body is copied (up to 1 MiB, and
//! only while no chunk was left out: see `stream::JsonCopy`) to read its usage, once, at its end.
//!
//! The other exception is a stream the gateway asked for on the client's behalf (`stream_upstream: always`):
//! the response headers wait, each chunk is read into the core's `Assembler` and dropped from Envoy's buffer
//! (so Envoy holds nothing), and at the end the client gets the rebuilt JSON answer, or a 502 in the API's
//! envelope when there is none (see `stream::assemble`).

use llmroute_core::headers;
use llmroute_core::request_plan::{LocalReply, JSON};
use llmroute_core::response_plan::Media;
use llmroute_core::stream::{self, assemble, Assembler, JsonCopy, Outcome, StreamTracker, Usage, Verdict};
use llmroute_core::Api;

use crate::host::Envoy;

pub enum ResponseWatch {
    Stream {
        tracker: StreamTracker,
        eos: bool,
    },
    /// A JSON answer: copied while it comes, then read for its usage once, at its end (`read`).
    Json {
        copy: JsonCopy,
        read: Option<Usage>,
    },
    /// A stream being rebuilt into one JSON answer; `verdict` is set once it ended.
    Assemble {
        asm: Option<Assembler>,
        usage: Usage,
        verdict: Option<Verdict>,
        eos: bool,
        /// Bytes at the start of Envoy's buffer that were already fed (a drop the host refused): never fed twice.
        held: usize,
    },
}

/// What the filter does with a response body callback.
pub enum Hold {
    /// Let the bytes (as they now are) through.
    Relay,
    /// Keep the headers and body back: the answer is not complete yet.
    Wait,
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
                copy: JsonCopy::new(),
                read: None,
            },
        }
    }

    /// Starts rebuilding a stream into one answer of at most `limit` bytes; the caller holds the headers back
    /// (the response plan already made them JSON's, without a length).
    pub fn assemble(api: Api, limit: usize) -> ResponseWatch {
        ResponseWatch::Assemble {
            asm: Some(Assembler::new(api, limit)),
            usage: Usage::default(),
            verdict: None,
            eos: false,
            held: 0,
        }
    }

    /// Watches one body callback; may cut bytes from the chunk, append the closing error event, or (when
    /// assembling) hold everything back and replace it with the answer at the end.
    pub fn on_body(&mut self, envoy: &Envoy, size: usize, end_of_stream: bool, request_id: Option<&str>) -> Hold {
        match self {
            ResponseWatch::Assemble {
                asm,
                usage,
                verdict,
                eos,
                held,
            } => {
                let chunk = match size {
                    0 => Vec::new(),
                    _ => envoy.response_body(size).unwrap_or_default(),
                };
                let Some(a) = asm.as_mut() else {
                    return Hold::Relay;
                };
                // The buffer still starts with bytes fed before when the host refused to drop them.
                a.feed(chunk.get(*held..).unwrap_or_default());
                *usage = a.usage();
                if !end_of_stream && a.failed().is_none() {
                    // Envoy keeps nothing: the assembler has what it needs of these bytes.
                    *held = match envoy.replace_response_body(size, &[]) {
                        true => 0,
                        false => chunk.len(),
                    };
                    return Hold::Wait;
                }
                *eos = end_of_stream;
                let (body, v) = match asm.take().map(Assembler::finish) {
                    Some(Ok(body)) => (body, Verdict::Complete),
                    Some(Err(f)) => {
                        log::debug!("llmroute: no answer from the stream: {}", f.code());
                        let v = match f {
                            assemble::Failure::UpstreamError => Verdict::UpstreamError,
                            _ => Verdict::MissingTerminal,
                        };
                        *verdict = Some(v);
                        let body = assemble::failure_body(f, request_id);
                        if !end_of_stream {
                            // Settled before the stream ended (over the bound): answer now, and Envoy drops the
                            // upstream stream.
                            let headers = [JSON, (headers::ERROR, f.code())];
                            let reply = LocalReply::new(assemble::Failure::STATUS, &headers, body, request_id, None);
                            envoy.send_local_reply(&reply);
                            return Hold::Wait;
                        }
                        envoy.set_response_header(":status", &assemble::Failure::STATUS.to_string());
                        envoy.set_response_header(headers::ERROR, f.code());
                        (body, v)
                    }
                    None => return Hold::Relay,
                };
                *verdict = Some(v);
                envoy.set_response_header("content-length", &body.len().to_string());
                envoy.replace_response_body(size, &body);
                Hold::Relay
            }
            ResponseWatch::Stream { tracker, eos } => {
                let mut size = size;
                let chunk = match size {
                    0 => Vec::new(),
                    _ => envoy.response_body(size).unwrap_or_default(),
                };
                if let Some(kept) = tracker.relay(&chunk, end_of_stream) {
                    envoy.replace_response_body(size, &kept);
                    size = kept.len();
                }
                if end_of_stream {
                    *eos = true;
                    if let Some(tail) = tracker.closing_bytes(request_id) {
                        envoy.append_response_body(size, &tail);
                    }
                }
                Hold::Relay
            }
            ResponseWatch::Json { copy, read } => {
                if read.is_some() {
                    return Hold::Relay;
                }
                copy.push(size, |n| envoy.response_body(n));
                if end_of_stream {
                    // Read once: the access-log fields, the token limits and the metrics all take this figure.
                    *read = Some(copy.finish());
                }
                Hold::Relay
            }
        }
    }

    /// The tokens the engine reported for a response that ended whole: prompt plus completion. `None` when the
    /// response was cut, or reported no prompt count.
    pub fn used_tokens(&self) -> Option<u64> {
        let usage = match self {
            ResponseWatch::Stream { tracker, eos: true } => tracker.usage(),
            ResponseWatch::Json { read: Some(u), .. } => *u,
            ResponseWatch::Assemble {
                usage,
                verdict: Some(Verdict::Complete),
                ..
            } => *usage,
            _ => return None,
        };
        Some(
            usage
                .prompt_tokens?
                .saturating_add(usage.completion_tokens.unwrap_or(0)),
        )
    }

    /// The stream's outcome (`None` for a JSON response) and the usage seen so far. `code_details` reads Envoy's
    /// `response.code_details`, known only in the log phase (before it, give `String::new`); it is called only
    /// for a stream, whose outcome needs it, so a JSON answer costs no host call for it.
    pub fn summary(&self, code_details: impl FnOnce() -> String) -> (Option<Outcome>, Usage) {
        match self {
            ResponseWatch::Stream { tracker, eos } => (
                Some(stream::outcome(*eos, tracker.verdict(), &code_details())),
                tracker.usage(),
            ),
            ResponseWatch::Json { read, .. } => (None, read.unwrap_or_default()),
            ResponseWatch::Assemble {
                usage, verdict, eos, ..
            } => {
                let v = verdict.unwrap_or(Verdict::MissingTerminal);
                (Some(stream::outcome(*eos, v, &code_details())), *usage)
            }
        }
    }
}
