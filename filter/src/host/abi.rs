//! The proxy-wasm ABI imports the filter uses, called directly rather than through `proxy_wasm::hostcalls`.
//!
//! The SDK's `hostcalls` functions `panic!` on any status they do not expect (`set_buffer`, `set_map_value`,
//! `send_http_response`, `get_current_time`, ...), and under `panic = "abort"` a panic traps the VM. Here every
//! import returns its status as a plain `u32`, so an unexpected status is a value ([`HostStatus::Other`]), never
//! a trap, and never an out-of-range enum. Memory the host hands back was allocated through the SDK's exported
//! `proxy_on_memory_allocate` (a boxed slice of exactly that size), so it is taken back as a `Vec` of that size.
//!
//! Map payloads (headers) are decoded with bounds checks: a malformed one is an error, not a panic.

use std::fmt;
use std::ptr::{null, null_mut};
use std::time::Duration;

use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType, Status};

use super::Host;

/// The real host: each [`Host`] call is the proxy-wasm import of the same name. No state, so no cost.
#[derive(Debug, Clone, Copy, Default)]
pub struct Abi;

impl Host for Abi {
    fn log(&self, level: LogLevel, message: &str) -> HostResult<()> {
        log(level as u32, message)
    }
    fn now_nanos(&self) -> HostResult<u64> {
        current_time_nanos()
    }
    fn set_tick_period_ms(&self, period: u32) -> HostResult<()> {
        set_tick_period_ms(period)
    }
    fn get_buffer(&self, buffer: BufferType, start: usize, max: usize) -> HostResult<Option<Vec<u8>>> {
        get_buffer(buffer as u32, start, max)
    }
    fn set_buffer(&self, buffer: BufferType, start: usize, size: usize, value: &[u8]) -> HostResult<()> {
        set_buffer(buffer as u32, start, size, value)
    }
    fn get_map(&self, map: MapType) -> HostResult<Vec<(String, Vec<u8>)>> {
        get_map_pairs(map as u32)
    }
    fn get_map_value(&self, map: MapType, key: &str) -> HostResult<Option<Vec<u8>>> {
        get_map_value(map as u32, key)
    }
    fn set_map_value(&self, map: MapType, key: &str, value: Option<&str>) -> HostResult<()> {
        set_map_value(map as u32, key, value)
    }
    fn get_property(&self, path: &[&str]) -> HostResult<Option<Vec<u8>>> {
        get_property(path)
    }
    fn set_property(&self, path: &[&str], value: &[u8]) -> HostResult<()> {
        set_property(path, value)
    }
    fn get_shared_data(&self, key: &str) -> HostResult<(Option<Vec<u8>>, Option<u32>)> {
        get_shared_data(key)
    }
    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> HostResult<()> {
        set_shared_data(key, value, cas)
    }
    fn send_local_response(&self, status: u32, headers: &[(&str, &str)], body: &[u8]) -> HostResult<()> {
        send_local_response(status, headers, body)
    }
    /// Through the SDK, whose dispatcher must know the token to deliver the answer (see the module doc of `host`).
    fn http_call(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> HostResult<u32> {
        proxy_wasm::hostcalls::dispatch_http_call(cluster, headers.to_vec(), body, Vec::new(), timeout).map_err(|s| {
            HostError {
                call: "http_call",
                status: match s {
                    Status::BadArgument => HostStatus::BadArgument,
                    Status::InternalFailure => HostStatus::InternalFailure,
                    other => HostStatus::Other(other as u32),
                },
            }
        })
    }
    fn define_metric(&self, kind: MetricType, name: &str) -> HostResult<u32> {
        define_metric(kind as u32, name)
    }
    fn increment_metric(&self, id: u32, by: i64) -> HostResult<()> {
        increment_metric(id, by)
    }
    fn record_metric(&self, id: u32, value: u64) -> HostResult<()> {
        record_metric(id, value)
    }
    fn get_metric(&self, id: u32) -> HostResult<u64> {
        get_metric(id)
    }
    fn set_effective_context(&self, context_id: u32) -> HostResult<()> {
        set_effective_context(context_id)
    }

    fn resume_request(&self) -> HostResult<()> {
        continue_stream(0)
    }
}

/// A host call's status other than success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostStatus {
    NotFound,
    BadArgument,
    SerializationFailure,
    ParseFailure,
    Empty,
    CasMismatch,
    InternalFailure,
    /// A status this ABI version does not define.
    Other(u32),
    /// The call succeeded, but what it returned could not be decoded.
    Malformed,
}

impl HostStatus {
    fn from_code(code: u32) -> Result<(), HostStatus> {
        Err(match code {
            0 => return Ok(()),
            1 => HostStatus::NotFound,
            2 => HostStatus::BadArgument,
            3 => HostStatus::SerializationFailure,
            4 => HostStatus::ParseFailure,
            7 => HostStatus::Empty,
            8 => HostStatus::CasMismatch,
            10 => HostStatus::InternalFailure,
            other => HostStatus::Other(other),
        })
    }
}

/// A failed host call: which call, and what the host said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostError {
    pub call: &'static str,
    pub status: HostStatus,
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            HostStatus::Other(code) => write!(f, "host call {} failed with unknown status {code}", self.call),
            s => write!(f, "host call {} failed: {s:?}", self.call),
        }
    }
}

pub type HostResult<T> = Result<T, HostError>;

fn check(call: &'static str, code: u32) -> HostResult<()> {
    HostStatus::from_code(code).map_err(|status| HostError { call, status })
}

#[allow(improper_ctypes)]
#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(buffer_type: u32, start: usize, size: usize, data: *const u8, data_size: usize) -> u32;
    fn proxy_get_header_map_pairs(map_type: u32, return_data: *mut *mut u8, return_size: *mut usize) -> u32;
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_set_property(path_data: *const u8, path_size: usize, value_data: *const u8, value_size: usize) -> u32;
    fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        details_data: *const u8,
        details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_define_metric(metric_type: u32, name_data: *const u8, name_size: usize, return_id: *mut u32) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    fn proxy_get_metric(metric_id: u32, return_value: *mut u64) -> u32;
    fn proxy_continue_stream(stream_type: u32) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
}

/// Takes ownership of `size` bytes the host allocated through `proxy_on_memory_allocate`.
///
/// # Safety
/// `data` is null, or was returned by `proxy_on_memory_allocate(size)` and is not used elsewhere.
unsafe fn take(data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if data.is_null() {
        return None;
    }
    // SAFETY: the allocator exports a boxed slice of exactly `size` bytes (capacity == length, align 1).
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

pub fn log(level: u32, message: &str) -> HostResult<()> {
    // SAFETY: the pointer and length describe `message`, alive for the call.
    check("log", unsafe { proxy_log(level, message.as_ptr(), message.len()) })
}

pub fn current_time_nanos() -> HostResult<u64> {
    let mut t = 0u64;
    // SAFETY: `t` outlives the call.
    check("get_current_time", unsafe {
        proxy_get_current_time_nanoseconds(&mut t)
    })?;
    Ok(t)
}

pub fn set_tick_period_ms(period: u32) -> HostResult<()> {
    // SAFETY: no pointers.
    check("set_tick_period", unsafe { proxy_set_tick_period_milliseconds(period) })
}

/// Bytes `start..start + max` of a buffer; `None` when the buffer is absent.
pub fn get_buffer(buffer: u32, start: usize, max: usize) -> HostResult<Option<Vec<u8>>> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: the out-pointers outlive the call; the host fills them with its allocation.
    let code = unsafe { proxy_get_buffer_bytes(buffer, start, max, &mut data, &mut size) };
    match HostStatus::from_code(code) {
        // SAFETY: on success, `data` is the host's allocation of `size` bytes, or null.
        Ok(()) => Ok(unsafe { take(data, size) }),
        Err(HostStatus::NotFound) => Ok(None),
        Err(status) => Err(HostError {
            call: "get_buffer",
            status,
        }),
    }
}

pub fn set_buffer(buffer: u32, start: usize, size: usize, value: &[u8]) -> HostResult<()> {
    // SAFETY: the pointer and length describe `value`, alive for the call.
    check("set_buffer", unsafe {
        proxy_set_buffer_bytes(buffer, start, size, value.as_ptr(), value.len())
    })
}

pub fn get_map_pairs(map: u32) -> HostResult<Vec<(String, Vec<u8>)>> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: as in `get_buffer`.
    check("get_map", unsafe {
        proxy_get_header_map_pairs(map, &mut data, &mut size)
    })?;
    // SAFETY: on success, `data` is the host's allocation of `size` bytes, or null.
    let bytes = unsafe { take(data, size) }.unwrap_or_default();
    decode_map(&bytes).ok_or(HostError {
        call: "get_map",
        status: HostStatus::Malformed,
    })
}

pub fn get_map_value(map: u32, key: &str) -> HostResult<Option<Vec<u8>>> {
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: `key` is alive for the call; the out-pointers outlive it.
    let code = unsafe { proxy_get_header_map_value(map, key.as_ptr(), key.len(), &mut data, &mut size) };
    match HostStatus::from_code(code) {
        // SAFETY: as in `get_buffer`.
        Ok(()) => Ok(unsafe { take(data, size) }),
        Err(HostStatus::NotFound) => Ok(None),
        Err(status) => Err(HostError {
            call: "get_map_value",
            status,
        }),
    }
}

/// Sets `key` to `value`, or removes it when `value` is `None`.
pub fn set_map_value(map: u32, key: &str, value: Option<&str>) -> HostResult<()> {
    // SAFETY: `key` and `value` are alive for the call.
    let code = unsafe {
        match value {
            Some(v) => proxy_replace_header_map_value(map, key.as_ptr(), key.len(), v.as_ptr(), v.len()),
            None => proxy_remove_header_map_value(map, key.as_ptr(), key.len()),
        }
    };
    check(
        if value.is_some() {
            "set_map_value"
        } else {
            "remove_map_value"
        },
        code,
    )
}

pub fn get_property(path: &[&str]) -> HostResult<Option<Vec<u8>>> {
    let encoded = path.join("\0");
    let (mut data, mut size) = (null_mut(), 0usize);
    // SAFETY: `encoded` is alive for the call; the out-pointers outlive it.
    let code = unsafe { proxy_get_property(encoded.as_ptr(), encoded.len(), &mut data, &mut size) };
    match HostStatus::from_code(code) {
        // SAFETY: as in `get_buffer`.
        Ok(()) => Ok(unsafe { take(data, size) }),
        Err(HostStatus::NotFound) => Ok(None),
        Err(status) => Err(HostError {
            call: "get_property",
            status,
        }),
    }
}

/// Sets a property; a path Envoy does not know becomes filter state `wasm.<path>` for the rest of the request.
pub fn set_property(path: &[&str], value: &[u8]) -> HostResult<()> {
    let encoded = path.join("\0");
    // SAFETY: `encoded` and `value` are alive for the call.
    check("set_property", unsafe {
        proxy_set_property(encoded.as_ptr(), encoded.len(), value.as_ptr(), value.len())
    })
}

/// A shared-data value and its compare-and-swap token (`None` when the key is absent).
pub fn get_shared_data(key: &str) -> HostResult<(Option<Vec<u8>>, Option<u32>)> {
    let (mut data, mut size, mut cas) = (null_mut(), 0usize, 0u32);
    // SAFETY: `key` is alive for the call; the out-pointers outlive it.
    let code = unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
    match HostStatus::from_code(code) {
        // SAFETY: as in `get_buffer`.
        Ok(()) => Ok((unsafe { take(data, size) }, (cas != 0).then_some(cas))),
        Err(HostStatus::NotFound) => Ok((None, None)),
        Err(status) => Err(HostError {
            call: "get_shared_data",
            status,
        }),
    }
}

pub fn set_shared_data(key: &str, value: &[u8], cas: Option<u32>) -> HostResult<()> {
    // SAFETY: `key` and `value` are alive for the call.
    check("set_shared_data", unsafe {
        proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas.unwrap_or(0))
    })
}

pub fn send_local_response(status: u32, headers: &[(&str, &str)], body: &[u8]) -> HostResult<()> {
    let encoded = encode_map(headers);
    // SAFETY: `body` and `encoded` are alive for the call; no details string is passed.
    check("send_local_response", unsafe {
        proxy_send_local_response(
            status,
            null(),
            0,
            body.as_ptr(),
            body.len(),
            encoded.as_ptr(),
            encoded.len(),
            -1,
        )
    })
}

pub fn define_metric(kind: u32, name: &str) -> HostResult<u32> {
    let mut id = 0u32;
    // SAFETY: `name` is alive for the call; `id` outlives it.
    check("define_metric", unsafe {
        proxy_define_metric(kind, name.as_ptr(), name.len(), &mut id)
    })?;
    Ok(id)
}

pub fn increment_metric(id: u32, by: i64) -> HostResult<()> {
    // SAFETY: no pointers.
    check("increment_metric", unsafe { proxy_increment_metric(id, by) })
}

pub fn record_metric(id: u32, value: u64) -> HostResult<()> {
    // SAFETY: no pointers.
    check("record_metric", unsafe { proxy_record_metric(id, value) })
}

/// Resumes a stream the filter paused (`0`: the request, as the ABI numbers streams).
pub fn continue_stream(stream: u32) -> HostResult<()> {
    // SAFETY: no pointers.
    check("continue_stream", unsafe { proxy_continue_stream(stream) })
}

/// Makes the calls that follow act on the context `context_id`.
pub fn set_effective_context(context_id: u32) -> HostResult<()> {
    // SAFETY: no pointers.
    check("set_effective_context", unsafe {
        proxy_set_effective_context(context_id)
    })
}

pub fn get_metric(id: u32) -> HostResult<u64> {
    let mut v = 0u64;
    // SAFETY: `v` outlives the call.
    check("get_metric", unsafe { proxy_get_metric(id, &mut v) })?;
    Ok(v)
}

/// The ABI's map encoding: a `u32` count, a `u32` key length and value length per pair, then each key and value
/// followed by a NUL. All integers little-endian.
pub fn encode_map(pairs: &[(&str, &str)]) -> Vec<u8> {
    // A capacity hint: saturating keeps absurd sizes from wrapping to a small one.
    let data = pairs.iter().fold(0usize, |n, (k, v)| {
        n.saturating_add(k.len()).saturating_add(v.len()).saturating_add(2)
    });
    let mut out = Vec::with_capacity(pairs.len().saturating_mul(8).saturating_add(4).saturating_add(data));
    let len32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    out.extend_from_slice(&len32(pairs.len()));
    for (k, v) in pairs {
        out.extend_from_slice(&len32(k.len()));
        out.extend_from_slice(&len32(v.len()));
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

/// Decodes [`encode_map`]'s format; `None` when a length points outside the bytes. An empty payload is an empty
/// map. Names that are not UTF-8 are kept lossily.
pub fn decode_map(bytes: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let u32_at = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at.checked_add(4)?)?;
        usize::try_from(u32::from_le_bytes(b.try_into().ok()?)).ok()
    };
    let count = u32_at(0)?;
    let mut data = count.checked_mul(8)?.checked_add(4)?;
    if data > bytes.len() {
        return None;
    }
    let mut pairs = Vec::with_capacity(count);
    // Each key and value, then the NUL that must follow it.
    let mut field = |len: usize| -> Option<&[u8]> {
        let end = data.checked_add(len)?;
        let f = bytes.get(data..end)?;
        (bytes.get(end) == Some(&0)).then_some(())?;
        data = end.checked_add(1)?;
        Some(f)
    };
    for i in 0..count {
        let at = i.checked_mul(8)?.checked_add(4)?;
        let (key_len, value_len) = (u32_at(at)?, u32_at(at.checked_add(4)?)?);
        let key = String::from_utf8_lossy(field(key_len)?).into_owned();
        pairs.push((key, field(value_len)?.to_vec()));
    }
    Some(pairs)
}
