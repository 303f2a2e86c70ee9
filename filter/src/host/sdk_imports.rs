//! Native tests only: the proxy-wasm imports that the filter never calls but the SDK's default trait methods
//! name (gRPC, shared queues, streams, foreign functions), so that a test binary which holds the contexts as
//! `dyn HttpContext` and `dyn RootContext` links. Each answers `InternalFailure` (10). The imports the filter
//! does call are faked in `host/tests.rs` (`proxy_continue_stream`, which no test reaches through the ABI, here);
//! the request path itself runs on `host::fake`.

#[no_mangle]
extern "C" fn proxy_add_header_map_value() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_call_foreign_function() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_close_stream() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_dequeue_shared_queue() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_done() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_enqueue_shared_queue() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_get_status() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_grpc_call() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_grpc_cancel() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_grpc_close() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_grpc_send() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_grpc_stream() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_register_shared_queue() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_resolve_shared_queue() -> u32 {
    10
}
#[no_mangle]
extern "C" fn proxy_set_header_map_pairs() -> u32 {
    10
}

/// `Abi::resume_request` calls the ABI directly (the SDK has no fallible wrapper for it); native tests resume
/// through the fake host, so nothing reaches this import but the check that it answers `InternalFailure` (10).
#[no_mangle]
extern "C" fn proxy_continue_stream(_stream_type: u32) -> u32 {
    10
}
