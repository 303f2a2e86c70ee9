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
//!   new head goes at the end of the part that goes first, the buffered body, which Envoy starts when there is
//!   none (only while it holds the request here: then it moves the received chunk behind it), and the edited
//!   prefix is drained in place. What the new head repeats of the old body from its start stays where it is when
//!   it covers the buffered part: then only the received bytes before the edit move (with the `model` value
//!   late in a large body, as the OpenAI SDKs send it, a part of the last chunk). A head that differs inside the
//!   buffered part rebuilds that part (its rest is copied and put back behind the new head), as does one put
//!   before a received chunk that Envoy may not put behind a new buffered body.
//! - the glue sends its `model` edit as two prepends in a row (the replacement, then the bytes before it, each
//!   borrowed from the body it read): `head_edit` keeps the first and gives Envoy both as one edit.
//!
//! No body is copied on any hook but the one that reads it: the request's last chunk (or its trailers), and each
//! response chunk the glue inspects.

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

    /// The stream whose body this is.
    pub fn filter(&self) -> FilterEnvoyPtr {
        self.filter
    }

    /// A request body (else a response body).
    pub fn is_request(&self) -> bool {
        self.request
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

    /// The glue's `set_buffer` anywhere but at offset 0 (see `head_edit`): bytes `start..start + size` become
    /// `value`. False when Envoy refused a call.
    pub fn write(&self, start: usize, size: usize, value: &[u8]) -> bool {
        let b = self.buffered.map_or(0, |t| self.part_len(t));
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
        let starts = self.buffered.is_none() && self.received.is_some() && self.may_start_buffered();
        self.prepend(total, &[&body], b, starts)
    }

    /// Drains the first `d` bytes of the body and puts `pieces` (in order) before the rest, keeping in place the
    /// longest run of the old body that the new head repeats where the parts allow it (see the module's doc).
    pub fn replace_head(&self, d: usize, pieces: &[&[u8]]) -> bool {
        let b = self.buffered.map_or(0, |t| self.part_len(t));
        let f = self.filter;
        let starts = self.buffered.is_none() && self.received.is_some() && self.may_start_buffered();
        if let Some(rt) = self.received.filter(|_| d >= b && (self.buffered.is_some() || starts)) {
            let parts: Vec<u32> = self.parts().collect();
            let (same, moved) = with_slices(f, &parts, |body| {
                let same = common_prefix(body, pieces, d);
                if same < b {
                    return (same, Vec::new());
                }
                // The buffered part and the received bytes before `same` stay as they are; what the received chunk
                // held before the edit moves behind the buffered part, followed by the new bytes.
                let mut moved = copy_range(body, b, same.saturating_sub(b));
                moved.extend_from_slice(&copy_range(pieces, same, usize::MAX));
                (same, moved)
            });
            if same >= b {
                let ok = append(f, self.buffered_type(), &moved) && drain(f, rt, d.saturating_sub(b));
                if ok && self.buffered.is_none() && !moved.is_empty() {
                    note_buffered(self.request);
                }
                return ok;
            }
        }
        self.prepend(d, pieces, b, starts)
    }

    /// Drains the first `d` bytes of the body (`b` of them buffered, then the received ones; all of it when
    /// shorter) and puts `pieces` before the rest; `starts` when they may start the buffered body (see
    /// [`View::may_start_buffered`]).
    fn prepend(&self, d: usize, pieces: &[&[u8]], b: usize, starts: bool) -> bool {
        let f = self.filter;
        let put = |t: u32| pieces.iter().all(|p| append(f, t, p));
        match (self.buffered, self.received) {
            (Some(bt), _) if d < b => {
                // The prefix ends inside the buffered body, which grows only at its end: its rest is copied and put
                // back behind the new head.
                let new = with_slices(f, &[bt], |s| behind(pieces, s, d));
                drain(f, bt, usize::MAX) && append(f, bt, &new)
            }
            (Some(bt), received) => {
                let ok = b == 0 || drain(f, bt, usize::MAX);
                let drained = received.is_none_or(|rt| drain(f, rt, d.saturating_sub(b)));
                ok && drained && put(bt)
            }
            (None, Some(rt)) if starts => {
                // Envoy holds the request here and buffers nothing yet: the new head starts the buffered body, and
                // the received chunk, drained of the prefix in place, goes behind it.
                let ok = drain(f, rt, d) && put(self.buffered_type());
                if ok && pieces.iter().any(|p| !p.is_empty()) {
                    note_buffered(self.request);
                }
                ok
            }
            (None, Some(rt)) if d >= self.part_len(rt) => drain(f, rt, usize::MAX) && put(rt),
            (None, Some(rt)) => {
                let new = with_slices(f, &[rt], |s| behind(pieces, s, d));
                drain(f, rt, usize::MAX) && append(f, rt, &new)
            }
            (None, None) => put(self.buffered_type()),
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

/// `pieces`, then the concatenation of `slices` from byte `from`: what a part becomes when a prefix of it is
/// replaced, built in one allocation, to be appended in one call.
fn behind(pieces: &[&[u8]], slices: &[&[u8]], from: usize) -> Vec<u8> {
    let rest = copy_range(slices, from, usize::MAX);
    let head = pieces.iter().fold(0usize, |n, p| n.saturating_add(p.len()));
    if head == 0 {
        return rest;
    }
    let mut out = Vec::with_capacity(head.saturating_add(rest.len()));
    for p in pieces {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(&rest);
    out
}

/// How many bytes the concatenations of `xs` and `ys` share from their start, up to `limit`: compared run by run,
/// nothing copied.
pub fn common_prefix(xs: &[&[u8]], ys: &[&[u8]], limit: usize) -> usize {
    let (mut xs, mut ys) = (xs.iter().copied(), ys.iter().copied());
    let (mut x, mut y): (&[u8], &[u8]) = (&[], &[]);
    let mut n = 0usize;
    while n < limit {
        if x.is_empty() {
            match xs.next() {
                Some(next) => x = next,
                None => break,
            }
            continue;
        }
        if y.is_empty() {
            match ys.next() {
                Some(next) => y = next,
                None => break,
            }
            continue;
        }
        let m = x.len().min(y.len()).min(limit.saturating_sub(n));
        let (a, rest_x) = x.split_at(m);
        let (b, rest_y) = y.split_at(m);
        if a != b {
            return n.saturating_add(a.iter().zip(b).position(|(p, q)| p != q).unwrap_or(m));
        }
        n = n.saturating_add(m);
        (x, y) = (rest_x, rest_y);
    }
    n
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
