//! A fake Envoy for the module's native tests: every `envoy_dynamic_module_callback_*` the module declares
//! (`abi.rs`), defined here so that a test binary links, over one stream's state per thread, counting each call.
//!
//! It keeps what a chat exchange needs: the four header maps, each body's buffered and received chunks (a hook
//! that answers "stop and buffer" has its received chunk buffered, as Envoy does), filter state, a response
//! code, and local replies. Configuration schedulers are refused (null), so no tick thread starts in a test.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::c_void;

use crate::abi::{
    EnvoyBuffer, EnvoyHeader, FilterConfigEnvoyPtr, FilterEnvoyPtr, ModuleBuffer, ModuleHeader, SchedulerPtr,
};

#[derive(Default)]
pub struct Stream {
    /// Request headers, request trailers, response headers, response trailers.
    pub headers: [Vec<(Vec<u8>, Vec<u8>)>; 4],
    /// Each body's chunks by `envoy_dynamic_module_type_http_body_type`: request received, request buffered,
    /// response received, response buffered.
    pub bodies: [Vec<u8>; 4],
    /// The most bytes of a body one chunk holds (0: each body is one chunk), as Envoy's buffers hold slices.
    pub chunk: usize,
    pub filter_state: Vec<(Vec<u8>, Vec<u8>)>,
    pub replies: Vec<u32>,
    pub continued: usize,
    /// Calls by name (without the `envoy_dynamic_module_callback_` prefix).
    pub calls: BTreeMap<&'static str, usize>,
    /// Buffers handed out in the running hook, alive until the next reset.
    handed: Vec<Vec<u8>>,
}

thread_local! {
    pub static ENVOY: RefCell<Stream> = RefCell::new(Stream::default());
}

fn with<T>(call: &'static str, f: impl FnOnce(&mut Stream) -> T) -> T {
    ENVOY.with(|e| {
        let mut e = e.borrow_mut();
        *e.calls.entry(call).or_insert(0) += 1;
        f(&mut e)
    })
}

/// The calls so far, and forgets them.
pub fn take_calls() -> BTreeMap<&'static str, usize> {
    ENVOY.with(|e| std::mem::take(&mut e.borrow_mut().calls))
}

/// A new chat request: no bodies, no replies, the request headers of a chat completion, each body held in slices
/// of `chunk` bytes (0: one slice).
pub fn chat_request(chunk: usize) {
    ENVOY.with(|e| {
        let mut e = e.borrow_mut();
        e.headers = Default::default();
        e.bodies = Default::default();
        e.replies.clear();
        e.chunk = chunk;
        let h = |k: &str, v: &str| (k.as_bytes().to_vec(), v.as_bytes().to_vec());
        e.headers[0] = vec![
            h(":method", "POST"),
            h(":path", "/v1/chat/completions"),
            h(":authority", "gw"),
            h("content-type", "application/json"),
            h("x-request-id", "req-0001"),
        ];
    });
}

/// The request body Envoy sends on when a body hook goes on: the buffered chunks, then the received one.
pub fn sent_request_body() -> Vec<u8> {
    ENVOY.with(|e| {
        let e = e.borrow();
        [e.bodies[1].as_slice(), e.bodies[0].as_slice()].concat()
    })
}

/// A body hook ended with "stop and buffer": the received chunk joins the buffered ones.
pub fn buffer_received(request: bool) {
    let (r, b) = if request { (0, 1) } else { (2, 3) };
    ENVOY.with(|e| {
        let mut e = e.borrow_mut();
        let received = std::mem::take(&mut e.bodies[r]);
        e.bodies[b].extend_from_slice(&received);
    });
}

/// # Safety
/// A module buffer: null, or valid for the call.
unsafe fn bytes(b: ModuleBuffer) -> Vec<u8> {
    if b.ptr.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(b.ptr, b.length) }.to_vec()
}

/// Keeps `v` alive for the hook and describes it.
fn hand(e: &mut Stream, v: Vec<u8>) -> EnvoyBuffer {
    e.handed.push(v);
    let v = e.handed.last().map_or(&[][..], Vec::as_slice);
    EnvoyBuffer {
        ptr: v.as_ptr(),
        length: v.len(),
    }
}

fn body_index(body_type: u32) -> usize {
    body_type as usize
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_log(_level: u32, _message: ModuleBuffer) {}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_headers_size(_f: FilterEnvoyPtr, t: u32) -> usize {
    with("http_get_headers_size", |e| e.headers[t as usize].len())
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_headers(
    _f: FilterEnvoyPtr,
    t: u32,
    out: *mut EnvoyHeader,
) -> bool {
    with("http_get_headers", |e| {
        let pairs = e.headers[t as usize].clone();
        for (i, (k, v)) in pairs.into_iter().enumerate() {
            let k = hand(e, k);
            let v = hand(e, v);
            let h = EnvoyHeader {
                key_ptr: k.ptr,
                key_length: k.length,
                value_ptr: v.ptr,
                value_length: v.length,
            };
            // SAFETY: the module sized `out` by `get_headers_size`.
            unsafe { out.add(i).write(h) };
        }
        true
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_header(
    _f: FilterEnvoyPtr,
    t: u32,
    key: ModuleBuffer,
    out: *mut EnvoyBuffer,
    _index: usize,
    _size: *mut usize,
) -> bool {
    // SAFETY: the module's buffer.
    let key = unsafe { bytes(key) };
    with("http_get_header", |e| {
        let found = e.headers[t as usize]
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.clone());
        match found {
            Some(v) => {
                let b = hand(e, v);
                // SAFETY: the module's out parameter.
                unsafe { out.write(b) };
                true
            }
            None => false,
        }
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_set_header(
    _f: FilterEnvoyPtr,
    t: u32,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    // SAFETY: the module's buffers.
    let (key, remove, value) = unsafe { (bytes(key), value.ptr.is_null(), bytes(value)) };
    with("http_set_header", |e| {
        let map = &mut e.headers[t as usize];
        map.retain(|(k, _)| *k != key);
        if !remove {
            map.push((key, value));
        }
        true
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_send_response(
    _f: FilterEnvoyPtr,
    status: u32,
    _headers: *const ModuleHeader,
    _n: usize,
    _body: ModuleBuffer,
    _details: ModuleBuffer,
) {
    with("http_send_response", |e| e.replies.push(status));
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_body_size(_f: FilterEnvoyPtr, t: u32) -> usize {
    with("http_get_body_size", |e| e.bodies[body_index(t)].len())
}

/// A body's chunks: `chunk` bytes each (the last one shorter), or the whole body.
fn chunks(e: &Stream, t: u32) -> Vec<Vec<u8>> {
    let body = &e.bodies[body_index(t)];
    if body.is_empty() {
        return Vec::new();
    }
    let size = if e.chunk == 0 { body.len() } else { e.chunk };
    body.chunks(size).map(<[u8]>::to_vec).collect()
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks_size(_f: FilterEnvoyPtr, t: u32) -> usize {
    with("http_get_body_chunks_size", |e| chunks(e, t).len())
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks(
    _f: FilterEnvoyPtr,
    t: u32,
    out: *mut EnvoyBuffer,
) -> bool {
    with("http_get_body_chunks", |e| {
        for (i, chunk) in chunks(e, t).into_iter().enumerate() {
            let b = hand(e, chunk);
            // SAFETY: the module sized `out` by `get_body_chunks_size`.
            unsafe { out.add(i).write(b) };
        }
        true
    })
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_append_body(
    _f: FilterEnvoyPtr,
    t: u32,
    data: ModuleBuffer,
) -> bool {
    // SAFETY: the module's buffer.
    let data = unsafe { bytes(data) };
    with("http_append_body", |e| e.bodies[body_index(t)].extend_from_slice(&data));
    true
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_drain_body(_f: FilterEnvoyPtr, t: u32, n: usize) -> bool {
    with("http_drain_body", |e| {
        let body = &mut e.bodies[body_index(t)];
        body.drain(..n.min(body.len()));
    });
    true
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_received_buffered_request_body(_f: FilterEnvoyPtr) -> bool {
    with("http_received_buffered_request_body", |_| false)
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_received_buffered_response_body(_f: FilterEnvoyPtr) -> bool {
    with("http_received_buffered_response_body", |_| false)
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_get_metadata_string(
    _f: FilterEnvoyPtr,
    _source: u32,
    _ns: ModuleBuffer,
    _key: ModuleBuffer,
    _out: *mut EnvoyBuffer,
) -> bool {
    with("http_get_metadata_string", |_| false)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
    _f: FilterEnvoyPtr,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    // SAFETY: the module's buffers.
    let (key, value) = unsafe { (bytes(key), bytes(value)) };
    with("http_set_filter_state_bytes", |e| e.filter_state.push((key, value)));
    true
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
    _f: FilterEnvoyPtr,
    _id: u32,
    _out: *mut EnvoyBuffer,
) -> bool {
    with("http_filter_get_attribute_string", |_| false)
}

#[no_mangle]
unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_get_attribute_int(
    _f: FilterEnvoyPtr,
    _id: u32,
    out: *mut u64,
) -> bool {
    // SAFETY: the module's out parameter.
    with("http_filter_get_attribute_int", |_| unsafe { out.write(200) });
    true
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_http_callout(
    _f: FilterEnvoyPtr,
    _id: *mut u64,
    _cluster: ModuleBuffer,
    _headers: *const ModuleHeader,
    _n: usize,
    _body: ModuleBuffer,
    _timeout: u64,
) -> u32 {
    with("http_filter_http_callout", |_| 2)
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_continue_decoding(_f: FilterEnvoyPtr) {
    with("http_filter_continue_decoding", |e| e.continued += 1);
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_clear_route_cache(_f: FilterEnvoyPtr) {
    with("http_clear_route_cache", |_| ());
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_http_callout(
    _c: FilterConfigEnvoyPtr,
    _id: *mut u64,
    _cluster: ModuleBuffer,
    _headers: *const ModuleHeader,
    _n: usize,
    _body: ModuleBuffer,
    _timeout: u64,
) -> u32 {
    with("http_filter_config_http_callout", |_| 2)
}

/// Metric definitions: ids from 1, per thread.
macro_rules! define {
    ($($name:ident)*) => {$(
        #[no_mangle]
        unsafe extern "C" fn $name(_c: FilterConfigEnvoyPtr, _name: ModuleBuffer, _l: *const ModuleBuffer, _n: usize, id: *mut usize) -> u32 {
            let next = with(stringify!($name), |e| e.calls.values().sum::<usize>());
            // SAFETY: the module's out parameter.
            unsafe { id.write(next) };
            0
        }
    )*};
}

define! {
    envoy_dynamic_module_callback_http_filter_config_define_counter
    envoy_dynamic_module_callback_http_filter_config_define_gauge
    envoy_dynamic_module_callback_http_filter_config_define_histogram
}

/// Metric updates, counted under their short names.
macro_rules! update {
    ($($name:ident $short:literal)*) => {$(
        #[no_mangle]
        extern "C" fn $name(_c: FilterConfigEnvoyPtr, _id: usize, _l: *const ModuleBuffer, _n: usize, _v: u64) -> u32 {
            with($short, |_| 0)
        }
    )*};
}

update! {
    envoy_dynamic_module_callback_http_filter_config_increment_counter "http_filter_config_increment_counter"
    envoy_dynamic_module_callback_http_filter_config_increment_gauge "http_filter_config_increment_gauge"
    envoy_dynamic_module_callback_http_filter_config_decrement_gauge "http_filter_config_decrement_gauge"
    envoy_dynamic_module_callback_http_filter_config_set_gauge "http_filter_config_set_gauge"
    envoy_dynamic_module_callback_http_filter_config_record_histogram_value "http_filter_config_record_histogram_value"
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(_c: FilterConfigEnvoyPtr) -> SchedulerPtr {
    std::ptr::null_mut()
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(_s: SchedulerPtr, _event: u64) {}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(_s: SchedulerPtr) {}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_new(_f: FilterEnvoyPtr) -> SchedulerPtr {
    with("http_filter_scheduler_new", |_| {
        std::ptr::NonNull::<c_void>::dangling().as_ptr()
    })
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_commit(_s: SchedulerPtr, _event: u64) {
    with("http_filter_scheduler_commit", |_| ());
}

#[no_mangle]
extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_delete(_s: SchedulerPtr) {
    with("http_filter_scheduler_delete", |_| ());
}
