//! The glue's `model` edit, given to Envoy as one edit.
//!
//! The glue sends the edit as two `set_buffer` calls at offset 0 in a row (`BodyPatch::head_edit`: drain up to the
//! end of `model`'s value and prepend the replacement, then prepend the bytes before the value), which the wasm
//! host applies one by one. Here the first is kept, and the second completes it: Envoy is given the whole new head
//! at once, and what it repeats of the old body stays in place (`body::View::replace_head`). A kept edit is applied
//! before anything else reaches Envoy that could run another hook or read the body (a read, a reply, a resume, a
//! callout, a switch of context) and at the end of every hook (`hooks::run`, `hooks::guarded`); a hook that fails
//! forgets it.

use std::cell::RefCell;

use proxy_wasm::types::BufferType;

use crate::abi::FilterEnvoyPtr;
use crate::body::View;
use crate::current::current;

/// A head edit the glue asked for (`set_buffer` at offset 0: drain `drain` bytes, prepend `value`) and Envoy has
/// not been given yet.
struct Pending {
    view: View,
    drain: usize,
    value: Vec<u8>,
}

thread_local! {
    static PENDING: RefCell<Option<Pending>> = const { RefCell::new(None) };
}

/// The glue's `set_buffer` at offset 0 on a body: drain `drain` bytes, then prepend `value`. The glue sends its
/// `model` edit as two of these in a row (`BodyPatch::head_edit`: the replacement, then the bytes before the
/// span), which the wasm host applies one by one; here the first is kept and the second completes it, so Envoy is
/// given the whole new head at once and what it repeats of the old body stays in place. A kept edit is applied by
/// [`flush`] before anything else reaches Envoy (and at the end of the hook). False when `buffer` is no body or
/// Envoy refused a call.
pub fn set_prefix(filter: FilterEnvoyPtr, buffer: BufferType, drain: usize, value: &[u8]) -> bool {
    let request = match buffer {
        BufferType::HttpRequestBody => true,
        BufferType::HttpResponseBody => false,
        _ => return false,
    };
    let first = PENDING.with(|p| {
        p.try_borrow_mut()
            .ok()
            .and_then(|mut p| p.take_if(|q| q.view.filter() == filter && q.view.is_request() == request))
    });
    if let Some(first) = first {
        // This edit applies to the body the first one left: `first.value` then the body after `first.drain`.
        let v1 = first.value.as_slice();
        return match v1.get(drain..) {
            Some(rest) => first.view.replace_head(first.drain, &[value, rest]),
            None => {
                let more = drain.saturating_sub(v1.len());
                first.view.replace_head(first.drain.saturating_add(more), &[value])
            }
        };
    }
    if !flush() {
        return false;
    }
    let Some(view) = View::of(filter, buffer) else {
        return false;
    };
    let pending = Pending {
        view,
        drain,
        value: value.to_vec(),
    };
    PENDING
        .with(|p| p.try_borrow_mut().map(|mut p| *p = Some(pending)))
        .is_ok()
}

/// Applies the head edit kept by [`set_prefix`], if any, to the running hook's stream. False when Envoy refused a
/// call; an edit kept for another stream (it cannot be, as every hook flushes before it ends) is dropped.
pub fn flush() -> bool {
    let Some(p) = PENDING.with(|p| p.try_borrow_mut().ok().and_then(|mut p| p.take())) else {
        return true;
    };
    if p.view.filter() != current().filter {
        return false;
    }
    p.view.replace_head(p.drain, &[&p.value])
}

/// Forgets a kept head edit (the hook failed).
pub fn discard() {
    PENDING
        .with(|p| p.try_borrow_mut().map(|mut p| *p = None))
        .unwrap_or_default();
}
