//! The proxy-wasm imports, answered `InternalFailure` (10), never called.
//!
//! The glue's contexts come from the proxy-wasm SDK crate, which exports its `proxy_on_*` entry points from any
//! library that links it, and those name the host's `proxy_*` imports. Envoy never calls the entry points of a
//! dynamic module, and the native host (`host.rs`) never reaches these imports, but the dynamic loader must still
//! resolve every symbol when Envoy loads the module: these definitions are what it finds.

macro_rules! unavailable {
    ($($name:ident)*) => {
        $(
            #[no_mangle]
            extern "C" fn $name() -> u32 {
                10
            }
        )*
    };
}

unavailable! {
    proxy_add_header_map_value
    proxy_call_foreign_function
    proxy_close_stream
    proxy_continue_stream
    proxy_dequeue_shared_queue
    proxy_done
    proxy_enqueue_shared_queue
    proxy_get_buffer_bytes
    proxy_get_current_time_nanoseconds
    proxy_get_header_map_pairs
    proxy_get_header_map_value
    proxy_get_property
    proxy_get_shared_data
    proxy_get_status
    proxy_grpc_call
    proxy_grpc_cancel
    proxy_grpc_close
    proxy_grpc_send
    proxy_grpc_stream
    proxy_http_call
    proxy_register_shared_queue
    proxy_remove_header_map_value
    proxy_replace_header_map_value
    proxy_resolve_shared_queue
    proxy_send_local_response
    proxy_set_buffer_bytes
    proxy_set_effective_context
    proxy_set_header_map_pairs
    proxy_set_property
    proxy_set_shared_data
    proxy_set_tick_period_milliseconds
}
