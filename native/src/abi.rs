//! Envoy's dynamic-module ABI, the part this module uses, declared by hand from Envoy's
//! `source/extensions/dynamic_modules/abi/abi.h` (Envoy 1.40).
//!
//! Types are `envoy_dynamic_module_type_*`, the callbacks Envoy implements are `envoy_dynamic_module_callback_*`
//! (resolved by the dynamic loader against the Envoy binary's exported symbols when Envoy loads the module), and
//! the event hooks this module exports are in `hooks.rs`. Enums are passed as C `int`s, so they are plain `u32`
//! constants here: a value Envoy adds later can never be an invalid Rust enum.

use std::ffi::c_void;

/// The ABI version this module was written against, returned by `envoy_dynamic_module_on_program_init`. Envoy
/// loads a module whatever it returns, and logs a warning naming it when it differs from its own.
pub const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// Bytes owned by Envoy, valid until the end of the current event hook.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl EnvoyBuffer {
    pub const NULL: EnvoyBuffer = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    /// The bytes, or `None` for a null buffer.
    ///
    /// # Safety
    /// Envoy filled the buffer in the current event hook and nothing changed it since.
    pub unsafe fn bytes<'a>(self) -> Option<&'a [u8]> {
        if self.ptr.is_null() {
            return None;
        }
        // SAFETY: Envoy's pointer and length, alive until the end of the hook (the caller's contract).
        Some(unsafe { std::slice::from_raw_parts(self.ptr, self.length) })
    }
}

/// Bytes owned by the module, read by Envoy during the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ModuleBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl ModuleBuffer {
    pub const NULL: ModuleBuffer = ModuleBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    pub fn of(bytes: &[u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: bytes.as_ptr(),
            length: bytes.len(),
        }
    }
}

/// A header owned by Envoy.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EnvoyHeader {
    pub key_ptr: *const u8,
    pub key_length: usize,
    pub value_ptr: *const u8,
    pub value_length: usize,
}

impl EnvoyHeader {
    pub const NULL: EnvoyHeader = EnvoyHeader {
        key_ptr: std::ptr::null(),
        key_length: 0,
        value_ptr: std::ptr::null(),
        value_length: 0,
    };

    /// The name and value.
    ///
    /// # Safety
    /// As [`EnvoyBuffer::bytes`].
    pub unsafe fn pair<'a>(self) -> (&'a [u8], &'a [u8]) {
        let key = EnvoyBuffer {
            ptr: self.key_ptr,
            length: self.key_length,
        };
        let value = EnvoyBuffer {
            ptr: self.value_ptr,
            length: self.value_length,
        };
        // SAFETY: the caller's contract.
        unsafe { (key.bytes().unwrap_or_default(), value.bytes().unwrap_or_default()) }
    }
}

/// A header owned by the module.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ModuleHeader {
    pub key_ptr: *const u8,
    pub key_length: usize,
    pub value_ptr: *const u8,
    pub value_length: usize,
}

impl ModuleHeader {
    pub fn of(key: &str, value: &str) -> ModuleHeader {
        ModuleHeader {
            key_ptr: key.as_ptr(),
            key_length: key.len(),
            value_ptr: value.as_ptr(),
            value_length: value.len(),
        }
    }
}

pub type FilterEnvoyPtr = *mut c_void;
pub type FilterConfigEnvoyPtr = *mut c_void;
pub type FilterConfigModulePtr = *const c_void;
/// A scheduler Envoy made for a filter configuration (events run on the main thread) or for a stream (events run
/// on the stream's worker). Committing an event is safe from any thread.
pub type SchedulerPtr = *mut c_void;

// envoy_dynamic_module_type_http_header_type
pub const HEADER_REQUEST: u32 = 0;
pub const HEADER_REQUEST_TRAILER: u32 = 1;
pub const HEADER_RESPONSE: u32 = 2;
pub const HEADER_RESPONSE_TRAILER: u32 = 3;

// envoy_dynamic_module_type_http_body_type
pub const BODY_RECEIVED_REQUEST: u32 = 0;
pub const BODY_BUFFERED_REQUEST: u32 = 1;
pub const BODY_RECEIVED_RESPONSE: u32 = 2;
pub const BODY_BUFFERED_RESPONSE: u32 = 3;

// The statuses the hooks return: request and response headers (FilterHeadersStatus), bodies (FilterDataStatus),
// trailers (FilterTrailersStatus).
pub const HEADERS_CONTINUE: u32 = 0;
pub const HEADERS_STOP_ITERATION: u32 = 1;
pub const BODY_CONTINUE: u32 = 0;
pub const BODY_STOP_ITERATION_AND_BUFFER: u32 = 1;
pub const BODY_STOP_ITERATION_NO_BUFFER: u32 = 3;
pub const TRAILERS_CONTINUE: u32 = 0;
pub const TRAILERS_STOP_ITERATION: u32 = 1;

// envoy_dynamic_module_type_http_callout_init_result
pub const CALLOUT_INIT_SUCCESS: u32 = 0;
// envoy_dynamic_module_type_http_callout_result
pub const CALLOUT_SUCCESS: u32 = 0;

// envoy_dynamic_module_type_metrics_result
pub const METRICS_SUCCESS: u32 = 0;

// envoy_dynamic_module_type_metadata_source
pub const METADATA_HOST: u32 = 3;

// envoy_dynamic_module_type_attribute_id (the position in Envoy's enum)
pub const ATTRIBUTE_RESPONSE_CODE: u32 = 15;
pub const ATTRIBUTE_RESPONSE_CODE_DETAILS: u32 = 16;
pub const ATTRIBUTE_UPSTREAM_ADDRESS: u32 = 41;

extern "C" {
    pub fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);

    pub fn envoy_dynamic_module_callback_http_get_headers_size(filter: FilterEnvoyPtr, header_type: u32) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_headers(
        filter: FilterEnvoyPtr,
        header_type: u32,
        result_headers: *mut EnvoyHeader,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_get_header(
        filter: FilterEnvoyPtr,
        header_type: u32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_set_header(
        filter: FilterEnvoyPtr,
        header_type: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterEnvoyPtr,
        status_code: u32,
        headers: *const ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );

    /// The body's length in bytes: the sum of its chunks' lengths, read without touching the bytes (0 when the
    /// body is absent).
    pub fn envoy_dynamic_module_callback_http_get_body_size(filter: FilterEnvoyPtr, body_type: u32) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(filter: FilterEnvoyPtr, body_type: u32) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: FilterEnvoyPtr,
        body_type: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    // A body changes only at its ends: `append_body` adds at the end (to the buffered body, when there is none yet,
    // Envoy buffers the bytes, then moves the received chunk behind them), `drain_body` takes from the front.
    // Either invalidates the chunks read before it. There is no prepend and no cut of the tail.
    pub fn envoy_dynamic_module_callback_http_append_body(
        filter: FilterEnvoyPtr,
        body_type: u32,
        data: ModuleBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_drain_body(
        filter: FilterEnvoyPtr,
        body_type: u32,
        number_of_bytes: usize,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_received_buffered_request_body(filter: FilterEnvoyPtr) -> bool;
    pub fn envoy_dynamic_module_callback_http_received_buffered_response_body(filter: FilterEnvoyPtr) -> bool;

    pub fn envoy_dynamic_module_callback_http_get_metadata_string(
        filter: FilterEnvoyPtr,
        source: u32,
        ns: ModuleBuffer,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter: FilterEnvoyPtr,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: FilterEnvoyPtr,
        attribute: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_int(
        filter: FilterEnvoyPtr,
        attribute: u32,
        result: *mut u64,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_filter_http_callout(
        filter: FilterEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *const ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> u32;
    pub fn envoy_dynamic_module_callback_http_filter_continue_decoding(filter: FilterEnvoyPtr);

    // A filter configuration's own callout, made and answered on the main thread
    // (`envoy_dynamic_module_on_http_filter_config_http_callout_done`).
    pub fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        config: FilterConfigEnvoyPtr,
        callout_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *const ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_milliseconds: u64,
    ) -> u32;

    // Schedulers: an event committed runs `envoy_dynamic_module_on_http_filter_config_scheduled` on the main
    // thread, or `envoy_dynamic_module_on_http_filter_scheduled` on the stream's worker (never after the stream
    // is gone).
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(config: FilterConfigEnvoyPtr)
        -> SchedulerPtr;
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(scheduler: SchedulerPtr, event_id: u64);
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(scheduler: SchedulerPtr);
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_new(filter: FilterEnvoyPtr) -> SchedulerPtr;
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_commit(scheduler: SchedulerPtr, event_id: u64);
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: SchedulerPtr);
    pub fn envoy_dynamic_module_callback_http_clear_route_cache(filter: FilterEnvoyPtr);
}

/// Declares Envoy's stat callbacks of one shape each.
macro_rules! stat_callbacks {
    (define: $($define:ident)*; update: $($update:ident)*;) => {
        extern "C" {
            $(
                pub fn $define(
                    config: FilterConfigEnvoyPtr,
                    name: ModuleBuffer,
                    label_names: *const ModuleBuffer,
                    label_names_length: usize,
                    id_out: *mut usize,
                ) -> u32;
            )*
            $(
                pub fn $update(
                    config: FilterConfigEnvoyPtr,
                    id: usize,
                    label_values: *const ModuleBuffer,
                    label_values_length: usize,
                    value: u64,
                ) -> u32;
            )*
        }
    };
}

// Stats: defined by a configuration while Envoy creates it (`config_new`), each with label names (none for a plain
// stat); updated from any thread with the label values, in the same order. Ids start at 1.
stat_callbacks! {
    define:
        envoy_dynamic_module_callback_http_filter_config_define_counter
        envoy_dynamic_module_callback_http_filter_config_define_gauge
        envoy_dynamic_module_callback_http_filter_config_define_histogram;
    update:
        envoy_dynamic_module_callback_http_filter_config_increment_counter
        envoy_dynamic_module_callback_http_filter_config_increment_gauge
        envoy_dynamic_module_callback_http_filter_config_decrement_gauge
        envoy_dynamic_module_callback_http_filter_config_set_gauge
        envoy_dynamic_module_callback_http_filter_config_record_histogram_value;
}
