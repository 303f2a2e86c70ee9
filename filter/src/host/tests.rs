//! Native tests of the host wrappers against a fake host: the proxy-wasm imports are defined here, and answer
//! with whatever status the test sets. A host that refuses every call, even with a status no ABI version
//! defines, must make the wrappers return `None`, `false` or nothing, never panic.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use super::abi::{self, decode_map, encode_map, HostStatus};
use super::*;

/// The status every fake import answers with.
static STATUS: AtomicU32 = AtomicU32::new(0);
/// The map `proxy_get_header_map_pairs` hands out when it succeeds.
static MAP: Mutex<Vec<u8>> = Mutex::new(Vec::new());
/// Tests share the fake host, so they take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn status() -> u32 {
    STATUS.load(Ordering::SeqCst)
}

/// Hands `bytes` to the guest the way the host does: in memory the guest allocator could have given.
unsafe fn give(bytes: &[u8], data: *mut *mut u8, size: *mut usize) {
    let boxed: Box<[u8]> = bytes.to_vec().into_boxed_slice();
    unsafe {
        *size = boxed.len();
        *data = Box::into_raw(boxed).cast::<u8>();
    }
}

#[no_mangle]
extern "C" fn proxy_log(_: u32, _: *const u8, _: usize) -> u32 {
    status()
}
#[no_mangle]
extern "C" fn proxy_get_current_time_nanoseconds(t: *mut u64) -> u32 {
    unsafe { *t = 5_000_000 };
    status()
}
#[no_mangle]
extern "C" fn proxy_set_tick_period_milliseconds(_: u32) -> u32 {
    status()
}
#[no_mangle]
extern "C" fn proxy_set_effective_context(_: u32) -> u32 {
    status()
}
#[no_mangle]
extern "C" fn proxy_get_buffer_bytes(_: u32, _: usize, _: usize, data: *mut *mut u8, size: *mut usize) -> u32 {
    if status() == 0 {
        unsafe { give(b"body", data, size) };
    }
    status()
}
#[no_mangle]
extern "C" fn proxy_set_buffer_bytes(_: u32, _: usize, _: usize, _: *const u8, _: usize) -> u32 {
    status()
}
#[no_mangle]
extern "C" fn proxy_get_header_map_pairs(_: u32, data: *mut *mut u8, size: *mut usize) -> u32 {
    if status() == 0 {
        unsafe { give(&MAP.lock().unwrap(), data, size) };
    }
    status()
}
#[no_mangle]
extern "C" fn proxy_get_header_map_value(_: u32, _: *const u8, _: usize, _: *mut *mut u8, _: *mut usize) -> u32 {
    status()
}
#[no_mangle]
extern "C" fn proxy_replace_header_map_value(_: u32, _: *const u8, _: usize, _: *const u8, _: usize) -> u32 {
    status()
}
#[no_mangle]
extern "C" fn proxy_remove_header_map_value(_: u32, _: *const u8, _: usize) -> u32 {
    status()
}
#[no_mangle]
extern "C" fn proxy_get_property(_: *const u8, _: usize, _: *mut *mut u8, _: *mut usize) -> u32 {
    status()
}
#[no_mangle]
extern "C" fn proxy_get_shared_data(_: *const u8, _: usize, _: *mut *mut u8, _: *mut usize, _: *mut u32) -> u32 {
    status()
}
#[no_mangle]
extern "C" fn proxy_set_shared_data(_: *const u8, _: usize, _: *const u8, _: usize, _: u32) -> u32 {
    status()
}
#[no_mangle]
#[allow(clippy::too_many_arguments)]
extern "C" fn proxy_send_local_response(
    _: u32,
    _: *const u8,
    _: usize,
    _: *const u8,
    _: usize,
    _: *const u8,
    _: usize,
    _: i32,
) -> u32 {
    status()
}
#[no_mangle]
extern "C" fn proxy_define_metric(_: u32, _: *const u8, _: usize, id: *mut u32) -> u32 {
    unsafe { *id = 7 };
    status()
}
#[no_mangle]
extern "C" fn proxy_increment_metric(_: u32, _: i64) -> u32 {
    status()
}
#[no_mangle]
extern "C" fn proxy_record_metric(_: u32, _: u64) -> u32 {
    status()
}
#[no_mangle]
extern "C" fn proxy_get_metric(_: u32, v: *mut u64) -> u32 {
    unsafe { *v = 3 };
    status()
}
/// The SDK's `dispatch_http_call` reads this status as its `Status` enum, and panics on any it does not expect
/// (Envoy returns only these), so the fake answers success or `InternalFailure`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
extern "C" fn proxy_http_call(
    _: *const u8,
    _: usize,
    _: *const u8,
    _: usize,
    _: *const u8,
    _: usize,
    _: *const u8,
    _: usize,
    _: u32,
    token: *mut u32,
) -> u32 {
    unsafe { *token = 9 };
    if status() == 0 {
        0
    } else {
        10
    }
}
#[no_mangle]
extern "C" fn proxy_set_property(_: *const u8, _: usize, _: *const u8, _: usize) -> u32 {
    status()
}

/// Runs `f` with every fake import answering `code`.
fn with_status(code: u32, f: impl FnOnce()) {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    STATUS.store(code, Ordering::SeqCst);
    f();
    STATUS.store(0, Ordering::SeqCst);
}

#[test]
fn a_host_that_refuses_every_call_never_makes_a_wrapper_panic() {
    // InternalFailure, BadArgument, and statuses no ABI version defines.
    for code in [10, 2, 6, 77, u32::MAX] {
        with_status(code, || {
            init_logging(log::LevelFilter::Trace, fake::log_sink);
            let abi = Envoy::abi();
            log::error!("a log line the host refuses");
            assert_eq!(abi.request_headers(), None);
            abi.set_request_header("x-a", Some("1"));
            abi.set_request_header("x-a", None);
            abi.set_response_header("x-a", "1");
            abi.remove_response_header("x-a");
            assert_eq!(abi.request_header("x-a"), None);
            let refused = ResponseHeaders::new(&abi);
            assert_eq!((refused.get(":status"), refused.get("x-a")), (None, None));
            assert_eq!(abi.request_body(4), None);
            assert!(!abi.replace_request_body(4, b"new"));
            assert_eq!(abi.response_body(4), None);
            abi.replace_response_body(4, b"new");
            abi.append_response_body(4, b"tail");
            assert_eq!(abi.plugin_configuration(), None);
            assert_eq!(abi.property_string(&["upstream", "address"]), None);
            assert_eq!(abi.upstream_backend(), None);
            abi.send_reply(503, &[("content-type", "application/json")], b"{}");
            assert_eq!(abi.now_ms(), 0);
            assert!(abi.fresh_request_id(1).starts_with("llmroute-"));
            assert!(!abi.set_tick_period(1000));
            assert!(!abi.set_effective_context(3));
            assert_eq!(abi.http_call_status(), None);
            assert_eq!(abi.http_call_body(4), None);
            assert_eq!(abi.shared_data("k"), (None, None));
            assert!(!abi.set_shared_data("k", b"v", Some(1)));
            assert_eq!(abi.define_counter("c"), None);
            abi.increment(Some(1));
            abi.set_gauge(Some(1), 5);
            assert_eq!(abi.define_metric(MetricType::Histogram, "h"), None);
            abi.set_log_field("llmroute.alias", "a");
            assert_eq!(abi.response_code(), None);
            assert_eq!(abi.metric_value(Some(1)), None);
            assert_eq!(abi.dispatch_get("c", "/", 100), None);
        });
    }
}

#[test]
fn a_host_error_names_the_call_and_the_status() {
    with_status(77, || {
        let e = abi::set_buffer(1, 0, 0, b"").unwrap_err();
        assert_eq!(e.status, HostStatus::Other(77));
        assert_eq!(e.to_string(), "host call set_buffer failed with unknown status 77");
    });
    with_status(8, || {
        let e = abi::set_shared_data("k", b"v", Some(3)).unwrap_err();
        assert_eq!((e.call, e.status), ("set_shared_data", HostStatus::CasMismatch));
    });
    with_status(1, || {
        // NotFound is an absent value, not an error.
        assert_eq!(abi::get_buffer(0, 0, 4), Ok(None));
        assert_eq!(abi::get_property(&["a"]), Ok(None));
    });
}

#[test]
fn a_host_that_answers_is_read() {
    *MAP.lock().unwrap() = encode_map(&[(":path", "/v1/chat/completions"), ("x-b", "")]);
    let abi = Envoy::abi();
    with_status(0, || {
        assert_eq!(
            abi.request_headers().unwrap(),
            vec![
                (":path".to_string(), b"/v1/chat/completions".to_vec()),
                ("x-b".to_string(), Vec::new()),
            ]
        );
        assert_eq!(abi.request_body(4), Some(b"body".to_vec()));
        assert_eq!(abi.now_ms(), 5);
        assert_eq!(abi.define_counter("c"), Some(7));
        assert_eq!(abi.define_metric(MetricType::Histogram, "h"), Some(7));
        assert_eq!(abi.metric_value(Some(1)), Some(3));
        assert_eq!(abi.dispatch_get("c", "/", 100), Some(9));
        abi.set_log_field("llmroute.alias", "a");
    });
}

#[test]
fn a_malformed_header_map_is_an_error_not_a_panic() {
    let good = encode_map(&[("a", "1"), ("bb", "22")]);
    assert_eq!(
        decode_map(&good),
        Some(vec![("a".into(), b"1".to_vec()), ("bb".into(), b"22".to_vec())])
    );
    assert_eq!(decode_map(&[]), Some(Vec::new()));
    for cut in 1..good.len() {
        assert_eq!(decode_map(&good[..cut]), None, "cut at {cut}");
    }
    let mut huge = good.clone();
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(decode_map(&huge), None);
    let mut long_key = good.clone();
    long_key[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(decode_map(&long_key), None);

    *MAP.lock().unwrap() = good[..good.len() - 3].to_vec();
    with_status(0, || assert_eq!(Envoy::abi().request_headers(), None));
}
