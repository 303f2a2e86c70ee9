//! Bodies as the glue sees them. proxy-wasm hands the filter the whole body buffered so far; Envoy's
//! dynamic-module ABI splits it into the chunks buffered earlier and the chunk just received. `Current` says
//! which to join: the buffered ones only while this filter is the one buffering (it answered "stop and buffer"
//! before), as Envoy's wasm host does, then the received ones. A write (the request's `model` edit) is applied to
//! the joined bytes and put back whole.

use proxy_wasm::types::BufferType;

use crate::abi::{self, EnvoyBuffer, FilterEnvoyPtr, ModuleBuffer};
use crate::current::current;

/// The body chunk types to join for `buffer`: (buffered, received), each when it applies now.
pub fn body_parts(buffer: BufferType) -> Option<(Option<u32>, Option<u32>, bool)> {
    let c = current();
    match buffer {
        BufferType::HttpRequestBody => Some((
            c.buffering_request.then_some(abi::BODY_BUFFERED_REQUEST),
            c.in_request_body.then_some(abi::BODY_RECEIVED_REQUEST),
            true,
        )),
        BufferType::HttpResponseBody => Some((
            c.buffering_response.then_some(abi::BODY_BUFFERED_RESPONSE),
            c.in_response_body.then_some(abi::BODY_RECEIVED_RESPONSE),
            false,
        )),
        _ => None,
    }
}

/// Appends the chunks of `body_type` to `out`.
fn read_chunks(filter: FilterEnvoyPtr, body_type: u32, out: &mut Vec<u8>) -> bool {
    // SAFETY: `filter` is the running hook's stream.
    let n = unsafe { abi::envoy_dynamic_module_callback_http_get_body_chunks_size(filter, body_type) };
    if n == 0 {
        return false;
    }
    let mut chunks = vec![EnvoyBuffer::NULL; n];
    // SAFETY: `chunks` has room for the `n` buffers Envoy reported.
    if !unsafe { abi::envoy_dynamic_module_callback_http_get_body_chunks(filter, body_type, chunks.as_mut_ptr()) } {
        return false;
    }
    for chunk in chunks {
        // SAFETY: filled by Envoy in this hook.
        if let Some(bytes) = unsafe { chunk.bytes() } {
            out.extend_from_slice(bytes);
        }
    }
    true
}

/// The whole body the glue sees for `buffer`: the buffered chunks (while buffering) then the received ones,
/// unless Envoy says the received chunk is the buffered body itself.
pub fn joined_body(filter: FilterEnvoyPtr, buffered: Option<u32>, received: Option<u32>, request: bool) -> Vec<u8> {
    let mut body = Vec::new();
    let same = match (buffered, received) {
        // SAFETY: `filter` is the running hook's stream.
        (Some(_), Some(_)) if request => unsafe {
            abi::envoy_dynamic_module_callback_http_received_buffered_request_body(filter)
        },
        // SAFETY: as above.
        (Some(_), Some(_)) => unsafe {
            abi::envoy_dynamic_module_callback_http_received_buffered_response_body(filter)
        },
        _ => false,
    };
    if let Some(t) = buffered {
        read_chunks(filter, t, &mut body);
    }
    if let Some(t) = received.filter(|_| !same) {
        read_chunks(filter, t, &mut body);
    }
    body
}

/// Replaces `start..start + size` of `body` with `value` (bounded to the body).
pub fn splice(body: &mut Vec<u8>, start: usize, size: usize, value: &[u8]) {
    let start = start.min(body.len());
    let end = start.saturating_add(size).min(body.len());
    body.splice(start..end, value.iter().copied());
}

/// Puts `body` back where Envoy continues from, after draining every chunk the glue saw: the received chunk
/// inside a body hook (Envoy moves it behind the buffered ones), else the buffered body. False when Envoy refused.
pub fn put_back(filter: FilterEnvoyPtr, buffered: bool, received: bool, request: bool, body: &[u8]) -> bool {
    let (buffered_type, received_type) = if request {
        (abi::BODY_BUFFERED_REQUEST, abi::BODY_RECEIVED_REQUEST)
    } else {
        (abi::BODY_BUFFERED_RESPONSE, abi::BODY_RECEIVED_RESPONSE)
    };
    // SAFETY: `filter` is the running hook's stream; the buffers live for each call.
    unsafe {
        if buffered {
            abi::envoy_dynamic_module_callback_http_drain_body(filter, buffered_type, usize::MAX);
        }
        if received {
            abi::envoy_dynamic_module_callback_http_drain_body(filter, received_type, usize::MAX);
        }
        let target = if received { received_type } else { buffered_type };
        abi::envoy_dynamic_module_callback_http_append_body(filter, target, ModuleBuffer::of(body))
    }
}
