//! Bodies as the glue sees them, read where Envoy keeps them.
//!
//! proxy-wasm hands the filter the whole body buffered so far; Envoy's dynamic-module ABI splits it into the
//! chunks buffered earlier and the chunk just received. [`View`] says which of them the glue sees: the buffered
//! ones only while this filter is the one buffering (it answered "stop and buffer" before), as Envoy's wasm host
//! does, then the received ones, unless Envoy says the received chunk is the buffered body itself.
//!
//! What each operation costs:
//! - the size is the sum of the parts' lengths (`get_body_size`): no byte is read, so a body hook that only counts
//!   (every request chunk before the last) copies nothing;
//! - a read borrows Envoy's slices for the duration of the call and copies the asked range once into the `Vec`
//!   the glue takes (the core parses one contiguous, owned body);
//! - a write is the glue's `set_buffer` at offset 0 ("drain the first `size` bytes, prepend `value`": the head
//!   edit of `model`, or a whole new body) or at the end (an append). Envoy's ABI grows a body only at its end and
//!   shrinks it only at its front, and after the hook it sends the buffered part, then the received one. So a
//!   prepend drains the edited prefix in place and appends `value` to the part that goes first: the buffered body,
//!   which Envoy starts when there is none (only while it holds the request here: then it moves the received
//!   chunk behind it). Only a prefix that ends inside a part that cannot be preceded (the buffered body, or a
//!   received chunk Envoy may not put behind a new buffered one) has that part's rest copied and put back behind
//!   `value`.

use proxy_wasm::types::BufferType;

use crate::abi::{self, EnvoyBuffer, FilterEnvoyPtr, ModuleBuffer};
use crate::current::{current, note_buffered};

/// The parts of one body the glue sees now.
#[derive(Clone, Copy)]
pub struct View {
    filter: FilterEnvoyPtr,
    /// The buffered body, while this filter buffers.
    buffered: Option<u32>,
    /// The chunk just received, inside a body hook (unless it is the buffered body itself).
    received: Option<u32>,
    request: bool,
}

impl View {
    /// The running hook's view of `buffer` (a request or response body), or `None` for another buffer.
    pub fn of(filter: FilterEnvoyPtr, buffer: BufferType) -> Option<View> {
        let c = current();
        let (buffered, received, request) = match buffer {
            BufferType::HttpRequestBody => (
                c.buffering_request.then_some(abi::BODY_BUFFERED_REQUEST),
                c.in_request_body.then_some(abi::BODY_RECEIVED_REQUEST),
                true,
            ),
            BufferType::HttpResponseBody => (
                c.buffering_response.then_some(abi::BODY_BUFFERED_RESPONSE),
                c.in_response_body.then_some(abi::BODY_RECEIVED_RESPONSE),
                false,
            ),
            _ => return None,
        };
        let mut view = View {
            filter,
            buffered,
            received,
            request,
        };
        if buffered.is_some() && received.is_some() && view.received_is_buffered() {
            view.received = None;
        }
        Some(view)
    }

    /// Envoy's received chunk is its buffered body (a filter before this one buffered it and went on).
    fn received_is_buffered(&self) -> bool {
        // SAFETY: `filter` is the running hook's stream.
        unsafe {
            if self.request {
                abi::envoy_dynamic_module_callback_http_received_buffered_request_body(self.filter)
            } else {
                abi::envoy_dynamic_module_callback_http_received_buffered_response_body(self.filter)
            }
        }
    }

    fn buffered_type(&self) -> u32 {
        if self.request {
            abi::BODY_BUFFERED_REQUEST
        } else {
            abi::BODY_BUFFERED_RESPONSE
        }
    }

    /// The parts, in the order Envoy sends them.
    fn parts(&self) -> impl Iterator<Item = u32> {
        self.buffered.into_iter().chain(self.received)
    }

    fn part_len(&self, body_type: u32) -> usize {
        // SAFETY: `filter` is the running hook's stream.
        unsafe { abi::envoy_dynamic_module_callback_http_get_body_size(self.filter, body_type) }
    }

    /// The body's length, from its parts' lengths: nothing is copied.
    pub fn len(&self) -> usize {
        self.parts().fold(0, |n, t| n.saturating_add(self.part_len(t)))
    }

    /// Bytes `start..start + max` of the body (bounded to it), copied once from Envoy's slices.
    pub fn read(&self, start: usize, max: usize) -> Vec<u8> {
        let parts: Vec<u32> = self.parts().collect();
        with_slices(self.filter, &parts, |slices| copy_range(slices, start, max))
    }

    /// The glue's `set_buffer`: bytes `start..start + size` become `value`. False when Envoy refused a call.
    pub fn write(&self, start: usize, size: usize, value: &[u8]) -> bool {
        let b = self.buffered.map_or(0, |t| self.part_len(t));
        if start == 0 {
            return self.prepend(size, value, b);
        }
        let total = b.saturating_add(self.received.map_or(0, |t| self.part_len(t)));
        if start >= total {
            let last = self.received.or(self.buffered).unwrap_or(self.buffered_type());
            return append(self.filter, last, value);
        }
        // Not asked by the glue today: an edit inside the body. Build the new body and put it in place of the old.
        let mut body = self.read(0, total);
        let from = start.min(body.len());
        let to = start.saturating_add(size).clamp(from, body.len());
        body.splice(from..to, value.iter().copied());
        self.prepend(total, &body, b)
    }

    /// Drains the first `d` bytes of the body (`b` of them buffered, then the received ones; all of it when
    /// shorter) and puts `value` before the rest.
    fn prepend(&self, d: usize, value: &[u8], b: usize) -> bool {
        let f = self.filter;
        match (self.buffered, self.received) {
            (Some(bt), _) if d < b => {
                // The prefix ends inside the buffered body, which grows only at its end: its rest is copied and put
                // back behind `value`.
                let new = with_slices(f, &[bt], |s| behind(value, s, d));
                drain(f, bt, usize::MAX) && append(f, bt, &new)
            }
            (Some(bt), received) => {
                let ok = b == 0 || drain(f, bt, usize::MAX);
                let drained = received.is_none_or(|rt| drain(f, rt, d.saturating_sub(b)));
                ok && drained && append(f, bt, value)
            }
            (None, Some(rt)) if self.may_start_buffered() => {
                // Envoy holds the request here and buffers nothing yet: `value` starts the buffered body, and the
                // received chunk, drained of the prefix in place, goes behind it.
                let ok = drain(f, rt, d) && append(f, self.buffered_type(), value);
                if ok && !value.is_empty() {
                    note_buffered(self.request);
                }
                ok
            }
            (None, Some(rt)) => {
                let new = with_slices(f, &[rt], |s| behind(value, s, d));
                drain(f, rt, usize::MAX) && append(f, rt, &new)
            }
            (None, None) => append(f, self.buffered_type(), value),
        }
    }

    /// Whether bytes appended to the buffered body go before the received chunk: only on the request path, while
    /// Envoy holds the request at this filter (it then moves the received chunk behind the buffered body when the
    /// hook goes on, or buffers it there when it stops), and when the received chunk is not the buffered body.
    fn may_start_buffered(&self) -> bool {
        self.request && crate::streams::held(current().context) && !self.received_is_buffered()
    }
}

/// Runs `f` over the slices of the body parts `parts`, in order, borrowed in place from Envoy.
fn with_slices<T>(filter: FilterEnvoyPtr, parts: &[u32], f: impl for<'s> FnOnce(&[&'s [u8]]) -> T) -> T {
    let mut chunks: Vec<EnvoyBuffer> = Vec::new();
    for &t in parts {
        // SAFETY: `filter` is the running hook's stream.
        let n = unsafe { abi::envoy_dynamic_module_callback_http_get_body_chunks_size(filter, t) };
        let at = chunks.len();
        chunks.resize(at.saturating_add(n), EnvoyBuffer::NULL);
        let Some(room) = chunks.get_mut(at..).filter(|room| !room.is_empty()) else {
            continue;
        };
        // SAFETY: `room` has space for the `n` buffers Envoy reported.
        if !unsafe { abi::envoy_dynamic_module_callback_http_get_body_chunks(filter, t, room.as_mut_ptr()) } {
            chunks.truncate(at);
        }
    }
    // SAFETY: Envoy filled each buffer in this hook; a chunk stays valid until the hook ends or the body is changed
    // (`append_body`, `drain_body`). The slices live only inside this call, which makes no callback, and `f` cannot
    // keep them (its result cannot borrow `'s`) nor reach Envoy through them: every caller copies out of them, and
    // no body is changed before `f` returns.
    let slices: Vec<&[u8]> = chunks.iter().filter_map(|c| unsafe { c.bytes() }).collect();
    f(&slices)
}

/// Bytes `start..start + max` of the concatenation of `slices` (bounded to it), in one allocation of their size.
pub fn copy_range(slices: &[&[u8]], start: usize, max: usize) -> Vec<u8> {
    let total = slices.iter().fold(0usize, |n, s| n.saturating_add(s.len()));
    let from = start.min(total);
    let mut out = Vec::with_capacity(max.min(total.saturating_sub(from)));
    let (mut skip, mut left) = (from, max);
    for s in slices {
        if left == 0 {
            break;
        }
        let Some(tail) = s.get(skip..) else {
            skip = skip.saturating_sub(s.len());
            continue;
        };
        skip = 0;
        let take = tail.get(..left.min(tail.len())).unwrap_or_default();
        out.extend_from_slice(take);
        left = left.saturating_sub(take.len());
    }
    out
}

/// `value`, then the concatenation of `slices` from byte `from`: what a part becomes when a prefix of it is
/// replaced, built in one allocation, to be appended in one call.
fn behind(value: &[u8], slices: &[&[u8]], from: usize) -> Vec<u8> {
    let rest = copy_range(slices, from, usize::MAX);
    if value.is_empty() {
        return rest;
    }
    let mut out = Vec::with_capacity(value.len().saturating_add(rest.len()));
    out.extend_from_slice(value);
    out.extend_from_slice(&rest);
    out
}

/// Appends `bytes` to body part `t` (nothing to do when empty).
fn append(filter: FilterEnvoyPtr, t: u32, bytes: &[u8]) -> bool {
    // SAFETY: `filter` is the running hook's stream; Envoy copies `bytes` during the call.
    bytes.is_empty()
        || unsafe { abi::envoy_dynamic_module_callback_http_append_body(filter, t, ModuleBuffer::of(bytes)) }
}

/// Drains the first `n` bytes of body part `t` (all of it, when shorter; nothing to do for 0).
fn drain(filter: FilterEnvoyPtr, t: u32, n: usize) -> bool {
    // SAFETY: `filter` is the running hook's stream.
    n == 0 || unsafe { abi::envoy_dynamic_module_callback_http_drain_body(filter, t, n) }
}
