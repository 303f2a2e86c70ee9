//! Host calls the filter makes, wrapped so that a host error is a value, never a trap.
//!
//! Every host call goes through here. The glue calls the free functions below (`host::request_body`,
//! `host::set_shared_data`, ...), which log a failure and return `None`, `false` or nothing; they reach the host
//! through the small [`Host`] trait: the operations the glue needs (headers, bodies, shared data with its
//! compare-and-swap version, local replies, HTTP callouts, properties, the clock, logs, metrics), each returning
//! a typed [`HostResult`].
//!
//! - In the filter, [`host()`] is [`abi::Abi`], a unit struct over the proxy-wasm imports, called directly rather
//!   than through the SDK: the SDK's context convenience methods unwrap, and its `hostcalls` functions `panic!`
//!   on any status they do not expect; under `panic = "abort"` either kills the VM for every request on that
//!   worker. The dispatch is static and the struct has no state, so the trait costs nothing on wasm.
//! - In native tests (`cfg(test)`), [`host()`] is the [`fake::FakeHost`] the test installed on its thread (an
//!   in-memory Envoy: header maps, bodies, shared data with versions, a clock, recorded replies and callouts, and
//!   error injection), or the ABI when none is (whose imports `host/tests.rs` defines). The contexts then run
//!   natively, unchanged: `filter/src/tests/` drives them the way Envoy would.
//!
//! The one SDK call left is `dispatch_http_call` (in [`abi::Abi`]'s `http_call`): the SDK's dispatcher must
//! register the call's token to deliver its answer, and that function maps every status Envoy's
//! `proxy_http_call` returns (`BadArgument`, `InternalFailure`) to an error.
//!
//! Logging goes through [`Logger`], which drops a message the host refuses instead of unwrapping.

// The native build (feature `native`) reaches Envoy through the host it installs, not through these imports.
#[cfg_attr(feature = "native", allow(dead_code))]
mod abi;
#[cfg(test)]
pub mod fake;

pub use abi::{HostError, HostResult, HostStatus};
use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType};
use std::time::Duration;

/// What the glue asks of the host. Each call returns the host's status as a [`HostError`]; an absent value
/// (the host's `NotFound`) is `Ok(None)`.
pub trait Host {
    fn log(&self, level: LogLevel, message: &str) -> HostResult<()>;
    fn now_nanos(&self) -> HostResult<u64>;
    fn set_tick_period_ms(&self, period: u32) -> HostResult<()>;
    /// Bytes `start..start + max` of a buffer; `None` when the buffer is absent.
    fn get_buffer(&self, buffer: BufferType, start: usize, max: usize) -> HostResult<Option<Vec<u8>>>;
    /// Replaces bytes `start..start + size` of a buffer with `value` (`size` 0 at the end appends).
    fn set_buffer(&self, buffer: BufferType, start: usize, size: usize, value: &[u8]) -> HostResult<()>;
    fn get_map(&self, map: MapType) -> HostResult<Vec<(String, Vec<u8>)>>;
    fn get_map_value(&self, map: MapType, key: &str) -> HostResult<Option<Vec<u8>>>;
    /// Sets `key` to `value`, or removes it when `value` is `None`.
    fn set_map_value(&self, map: MapType, key: &str, value: Option<&str>) -> HostResult<()>;
    fn get_property(&self, path: &[&str]) -> HostResult<Option<Vec<u8>>>;
    /// Sets a property; a path Envoy does not know becomes filter state `wasm.<path>` for the rest of the request.
    fn set_property(&self, path: &[&str], value: &[u8]) -> HostResult<()>;
    /// A shared-data value and its compare-and-swap version (`None` when the key is absent).
    fn get_shared_data(&self, key: &str) -> HostResult<(Option<Vec<u8>>, Option<u32>)>;
    /// Writes shared data; with `cas`, only if the version is still `cas` (else `CasMismatch`).
    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> HostResult<()>;
    fn send_local_response(&self, status: u32, headers: &[(&str, &str)], body: &[u8]) -> HostResult<()>;
    /// Starts an HTTP call to an Envoy cluster, with an optional body; the answer comes to the calling context
    /// with the token.
    fn http_call(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> HostResult<u32>;
    fn define_metric(&self, kind: MetricType, name: &str) -> HostResult<u32>;
    fn increment_metric(&self, id: u32, by: i64) -> HostResult<()>;
    fn record_metric(&self, id: u32, value: u64) -> HostResult<()>;
    fn get_metric(&self, id: u32) -> HostResult<u64>;
    /// Makes the calls that follow act on the request context `context_id` (the root context resumes or answers a
    /// request it holds no callback of: see `fair_queue`).
    fn set_effective_context(&self, context_id: u32) -> HostResult<()>;
    /// Resumes the request the filter paused (after an HTTP callout answered).
    fn resume_request(&self) -> HostResult<()>;
}

/// The host every wrapper below calls in the native build (feature `native`): the one the native crate
/// installed with [`install`] when Envoy loaded it, else [`Unavailable`].
#[cfg(all(not(test), feature = "native"))]
#[inline(always)]
fn host() -> &'static dyn Host {
    match NATIVE.get() {
        Some(h) => *h,
        None => &Unavailable,
    }
}

#[cfg(feature = "native")]
static NATIVE: std::sync::OnceLock<&'static (dyn Host + Sync)> = std::sync::OnceLock::new();

/// Native build: makes `host` the host of every wrapper in this module, once per process. False when one was
/// already installed.
#[cfg(feature = "native")]
pub fn install(host: &'static (dyn Host + Sync)) -> bool {
    NATIVE.set(host).is_ok()
}

/// The native build's host before one is installed: every call fails with `InternalFailure`.
#[cfg(all(not(test), feature = "native"))]
pub struct Unavailable;

#[cfg(all(not(test), feature = "native"))]
impl Unavailable {
    fn fail<T>(call: &'static str) -> HostResult<T> {
        Err(HostError {
            call,
            status: HostStatus::InternalFailure,
        })
    }
}

#[cfg(all(not(test), feature = "native"))]
impl Host for Unavailable {
    fn log(&self, _: LogLevel, _: &str) -> HostResult<()> {
        Self::fail("log")
    }
    fn now_nanos(&self) -> HostResult<u64> {
        Self::fail("now")
    }
    fn set_tick_period_ms(&self, _: u32) -> HostResult<()> {
        Self::fail("set_tick_period")
    }
    fn get_buffer(&self, _: BufferType, _: usize, _: usize) -> HostResult<Option<Vec<u8>>> {
        Self::fail("get_buffer")
    }
    fn set_buffer(&self, _: BufferType, _: usize, _: usize, _: &[u8]) -> HostResult<()> {
        Self::fail("set_buffer")
    }
    fn get_map(&self, _: MapType) -> HostResult<Vec<(String, Vec<u8>)>> {
        Self::fail("get_map")
    }
    fn get_map_value(&self, _: MapType, _: &str) -> HostResult<Option<Vec<u8>>> {
        Self::fail("get_map_value")
    }
    fn set_map_value(&self, _: MapType, _: &str, _: Option<&str>) -> HostResult<()> {
        Self::fail("set_map_value")
    }
    fn get_property(&self, _: &[&str]) -> HostResult<Option<Vec<u8>>> {
        Self::fail("get_property")
    }
    fn set_property(&self, _: &[&str], _: &[u8]) -> HostResult<()> {
        Self::fail("set_property")
    }
    fn get_shared_data(&self, _: &str) -> HostResult<(Option<Vec<u8>>, Option<u32>)> {
        Self::fail("get_shared_data")
    }
    fn set_shared_data(&self, _: &str, _: &[u8], _: Option<u32>) -> HostResult<()> {
        Self::fail("set_shared_data")
    }
    fn send_local_response(&self, _: u32, _: &[(&str, &str)], _: &[u8]) -> HostResult<()> {
        Self::fail("send_local_response")
    }
    fn http_call(&self, _: &str, _: &[(&str, &str)], _: Option<&[u8]>, _: Duration) -> HostResult<u32> {
        Self::fail("http_call")
    }
    fn define_metric(&self, _: MetricType, _: &str) -> HostResult<u32> {
        Self::fail("define_metric")
    }
    fn increment_metric(&self, _: u32, _: i64) -> HostResult<()> {
        Self::fail("increment_metric")
    }
    fn record_metric(&self, _: u32, _: u64) -> HostResult<()> {
        Self::fail("record_metric")
    }
    fn get_metric(&self, _: u32) -> HostResult<u64> {
        Self::fail("get_metric")
    }
    fn resume_request(&self) -> HostResult<()> {
        Self::fail("resume_request")
    }
    fn set_effective_context(&self, _: u32) -> HostResult<()> {
        Self::fail("set_effective_context")
    }
}

/// The host every wrapper below calls: Envoy, through the ABI.
#[cfg(all(not(test), not(feature = "native")))]
#[inline(always)]
fn host() -> abi::Abi {
    abi::Abi
}

/// The host every wrapper below calls, in native tests: the fake installed on this thread, else the ABI.
#[cfg(test)]
fn host() -> std::rc::Rc<dyn Host> {
    fake::installed()
}

/// The `log` crate's sink: `proxy_log`, errors ignored (there is nowhere else to report them).
struct Logger;

static LOGGER: Logger = Logger;

impl log::Log for Logger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        let _ = host().log(level, &record.args().to_string());
    }

    fn flush(&self) {}
}

/// Installs the logger at `level`, and a panic hook that logs at critical level without unwrapping. Once per VM.
pub fn init_logging(level: log::LevelFilter) {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level);
    }
    // Native tests keep the default hook's report too, or a failed assertion would only reach the host's log.
    #[cfg(test)]
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let _ = host().log(
            LogLevel::Critical,
            &format!("llmroute: panic, this worker's VM is lost: {info}"),
        );
        #[cfg(test)]
        previous(info);
    }));
}

/// Logs a failed call at warning level and turns it into an `Option`.
fn logged<T>(r: HostResult<T>, what: impl std::fmt::Display) -> Option<T> {
    r.map_err(|e| log::warn!("llmroute: {what}: {e}")).ok()
}

/// All request headers, lower-case names, values as bytes; `None` when the host cannot say (Envoy always has
/// `:method` and `:path`, so an empty map would be refused as an unknown path: a host error must be a 503).
pub fn request_headers() -> Option<Vec<(String, Vec<u8>)>> {
    let all = logged(host().get_map(MapType::HttpRequestHeaders), "reading request headers")?;
    #[cfg(feature = "test-trap")]
    crate::trap::maybe_trap(&all);
    Some(all)
}

pub fn set_request_header(name: &str, value: Option<&str>) {
    logged(
        host().set_map_value(MapType::HttpRequestHeaders, name, value),
        format_args!("setting request header {name}"),
    );
}

pub fn set_response_header(name: &str, value: &str) {
    logged(
        host().set_map_value(MapType::HttpResponseHeaders, name, Some(value)),
        format_args!("setting response header {name}"),
    );
}

pub fn remove_response_header(name: &str) {
    logged(
        host().set_map_value(MapType::HttpResponseHeaders, name, None),
        format_args!("removing response header {name}"),
    );
}

/// The response headers, read whole on the first lookup: one host call however many names the response-header
/// plan looks up (a read per name made two or three). A failed read is logged once and reads as no headers.
#[derive(Default)]
pub struct ResponseHeaders(std::cell::OnceCell<Vec<(String, Vec<u8>)>>);

impl ResponseHeaders {
    /// The first value of `name` (lower-case), as text.
    pub fn get(&self, name: &str) -> Option<String> {
        let all = self.0.get_or_init(|| {
            logged(host().get_map(MapType::HttpResponseHeaders), "reading response headers").unwrap_or_default()
        });
        let (_, value) = all.iter().find(|(n, _)| n == name)?;
        String::from_utf8(value.clone()).ok()
    }
}

/// One request header, as text.
pub fn request_header(name: &str) -> Option<String> {
    header(MapType::HttpRequestHeaders, name)
}

fn header(map: MapType, name: &str) -> Option<String> {
    let bytes = logged(host().get_map_value(map, name), format_args!("reading header {name}"))??;
    String::from_utf8(bytes).ok()
}

/// The first `size` bytes of the buffered request body.
pub fn request_body(size: usize) -> Option<Vec<u8>> {
    let body = host().get_buffer(BufferType::HttpRequestBody, 0, size);
    logged(body, "reading the request body").map(Option::unwrap_or_default)
}

/// Replaces the first `size` bytes of the buffered request body with `body` (Envoy drains them and prepends
/// `body`): the whole body when `size` is its current length.
pub fn replace_request_body(size: usize, body: &[u8]) -> bool {
    let r = host().set_buffer(BufferType::HttpRequestBody, 0, size, body);
    logged(r, "replacing the request body").is_some()
}

/// The first `size` bytes of the response body buffer (the chunk being delivered).
pub fn response_body(size: usize) -> Option<Vec<u8>> {
    let body = host().get_buffer(BufferType::HttpResponseBody, 0, size);
    logged(body, "reading the response body").map(Option::unwrap_or_default)
}

/// Replaces the whole buffered response body (`size` is its current length). False when the host refused.
pub fn replace_response_body(size: usize, body: &[u8]) -> bool {
    let r = host().set_buffer(BufferType::HttpResponseBody, 0, size, body);
    logged(r, "replacing the response body").is_some()
}

/// Appends bytes at the end of the response body buffer.
pub fn append_response_body(size: usize, bytes: &[u8]) {
    let r = host().set_buffer(BufferType::HttpResponseBody, size, 0, bytes);
    logged(r, "appending to the response body");
}

pub fn plugin_configuration() -> Option<Vec<u8>> {
    host()
        .get_buffer(BufferType::PluginConfiguration, 0, usize::MAX)
        .map_err(|e| log::error!("llmroute: reading the plugin configuration: {e}"))
        .ok()
        .flatten()
}

/// The VM configuration (`vm_config.configuration`); bench builds read their last phase from it (see `phases`).
#[cfg(feature = "bench-phases")]
pub fn vm_configuration() -> Option<Vec<u8>> {
    logged(
        host().get_buffer(BufferType::VmConfiguration, 0, usize::MAX),
        "reading the VM configuration",
    )
    .flatten()
}

/// A property as a UTF-8 string, such as `["upstream", "address"]`. A property the host cannot serialise (such
/// as the metadata of a host without any) is `None`, like a missing one.
pub fn property_string(path: &[&str]) -> Option<String> {
    let bytes = host()
        .get_property(path)
        .map_err(|e| log::debug!("llmroute: reading property {}: {e}", path.join(".")))
        .ok()??;
    String::from_utf8(bytes).ok()
}

/// Sends a local reply; the upstream is never contacted.
pub fn send_reply(status: u32, headers: &[(&str, &str)], body: &[u8]) {
    // Marks the reply as the filter's own, so Envoy's local_reply_config leaves its body alone.
    set_request_header(llmroute_core::headers::LOCAL_REPLY, Some("1"));
    logged(
        host().send_local_response(status, headers, body),
        "sending a local reply",
    );
}

/// Sends the core's local reply as it is.
pub fn send_local_reply(reply: &llmroute_core::request_plan::LocalReply) {
    let headers: Vec<(&str, &str)> = reply.headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
    send_reply(reply.status, &headers, &reply.body);
}

fn now_nanos() -> Option<u64> {
    logged(host().now_nanos(), "reading the clock")
}

/// A request id for a request that came without a usable one: unique per time and context, hex.
pub fn fresh_request_id(context_id: u32) -> String {
    let mut seed = now_nanos().unwrap_or(0).to_le_bytes().to_vec();
    seed.extend_from_slice(&context_id.to_le_bytes());
    format!("llmroute-{:016x}", xxhash_rust::xxh3::xxh3_64(&seed))
}

/// Milliseconds since the Unix epoch, by the host's clock; 0 when the host cannot tell.
pub fn now_ms() -> u64 {
    now_nanos().unwrap_or(0) / 1_000_000
}

/// Asks the host to call the root context's `on_tick` every `period_ms`.
pub fn set_tick_period(period_ms: u64) -> bool {
    let period = u32::try_from(period_ms).unwrap_or(u32::MAX);
    logged(host().set_tick_period_ms(period), "setting the tick period").is_some()
}

/// Starts a body-less `GET path` to the Envoy cluster `cluster`; the answer arrives in `on_http_call_response`
/// with the returned token. Through the SDK, whose dispatcher must know the token (see the module doc).
pub fn dispatch_get(cluster: &str, path: &str, timeout_ms: u64) -> Option<u32> {
    dispatch_get_with(cluster, path, cluster, &[], timeout_ms)
}

/// As [`dispatch_get`], with the `:authority` and `extra` request headers given (the caller's own values,
/// never a client's).
pub fn dispatch_get_with(
    cluster: &str,
    path: &str,
    authority: &str,
    extra: &[(&str, &str)],
    timeout_ms: u64,
) -> Option<u32> {
    let mut headers = vec![(":method", "GET"), (":path", path), (":authority", authority)];
    headers.extend_from_slice(extra);
    let timeout = Duration::from_millis(timeout_ms);
    host()
        .http_call(cluster, &headers, None, timeout)
        .map_err(|e| log::debug!("llmroute: calling cluster {cluster} failed: {e}"))
        .ok()
}

/// Starts a `POST path` with a JSON `body` to the Envoy cluster `cluster` (the placement store's etcd), with
/// `authorization` when given (etcd's token); as [`dispatch_get`] otherwise.
pub fn dispatch_post(
    cluster: &str,
    path: &str,
    body: &[u8],
    authorization: Option<&str>,
    timeout_ms: u64,
) -> Option<u32> {
    let mut headers = vec![
        (":method", "POST"),
        (":path", path),
        (":authority", cluster),
        ("content-type", "application/json"),
    ];
    if let Some(token) = authorization {
        headers.push(("authorization", token));
    }
    let timeout = Duration::from_millis(timeout_ms);
    host()
        .http_call(cluster, &headers, Some(body), timeout)
        .map_err(|e| log::debug!("llmroute: calling cluster {cluster} failed: {e}"))
        .ok()
}

/// Makes the calls that follow act on the request context `context_id`, until the current callback returns. False
/// when the host refuses (the context is gone).
pub fn set_effective_context(context_id: u32) -> bool {
    logged(
        host().set_effective_context(context_id),
        format_args!("switching to request context {context_id}"),
    )
    .is_some()
}

/// Resumes the request the filter paused (after an HTTP callout answered).
pub fn resume_request() {
    logged(host().resume_request(), "resuming the request");
}

/// The `:status` of the answer being delivered to `on_http_call_response`, if there is one.
pub fn http_call_status() -> Option<u32> {
    header(MapType::HttpCallResponseHeaders, ":status")?.parse().ok()
}

/// The body of the answer being delivered to `on_http_call_response` (`size` is its length).
pub fn http_call_body(size: usize) -> Option<Vec<u8>> {
    let body = host().get_buffer(BufferType::HttpCallResponseBody, 0, size);
    logged(body, "reading an http call's answer").map(Option::unwrap_or_default)
}

/// A value in the VM-wide shared data, with its compare-and-swap token.
pub fn shared_data(key: &str) -> (Option<Vec<u8>>, Option<u32>) {
    try_shared_data(key).unwrap_or((None, None))
}

/// Reads shared data, telling an absent key (`Some((None, None))`) from a host error (`None`, logged).
pub fn try_shared_data(key: &str) -> Option<(Option<Vec<u8>>, Option<u32>)> {
    logged(host().get_shared_data(key), format_args!("reading shared data {key}"))
}

/// Writes shared data; with `cas`, only if nobody wrote since it was read. False when it was not written.
pub fn set_shared_data(key: &str, value: &[u8], cas: Option<u32>) -> bool {
    match host().set_shared_data(key, value, cas) {
        Ok(()) => true,
        Err(HostError {
            status: HostStatus::CasMismatch,
            ..
        }) => false,
        Err(e) => {
            log::warn!("llmroute: writing shared data {key}: {e}");
            false
        }
    }
}

/// A metric of `kind`; `None` when the host refuses (the metric is then skipped).
pub fn define_metric(kind: MetricType, name: &str) -> Option<u32> {
    logged(host().define_metric(kind, name), format_args!("defining metric {name}"))
}

/// Writes an access-log field: filter state `wasm.<key>`, which the rendered access log reads. `key` comes from
/// `envoy_contract::log_fields`; the value must carry no prompt text and no credential.
pub fn set_log_field(key: &str, value: &str) {
    let _ = logged(
        host().set_property(&[key], value.as_bytes()),
        "setting an access-log field",
    );
}

/// A counter, defined once per VM; `None` when the host refuses (metrics are then skipped).
pub fn define_counter(name: &str) -> Option<u32> {
    logged(
        host().define_metric(MetricType::Counter, name),
        format_args!("defining metric {name}"),
    )
}

pub fn increment(metric: Option<u32>) {
    add(metric, 1);
}

pub fn add(metric: Option<u32>, n: u64) {
    if let (Some(id), Ok(n)) = (metric, i64::try_from(n)) {
        let _ = host().increment_metric(id, n);
    }
}

/// Envoy's shared data, as the core's compare-and-swap loops see it (the in-flight ledger, the limit buckets).
pub struct SharedData;

impl llmroute_core::key_placement::in_flight::SharedStore for SharedData {
    fn get(&self, key: &str) -> (Option<Vec<u8>>, Option<u32>) {
        shared_data(key)
    }

    fn set(&mut self, key: &str, value: &[u8], cas: Option<u32>) -> bool {
        set_shared_data(key, value, cas)
    }
}

/// A metric's current value (summed over the VMs), if it was defined and the host answers.
pub fn metric_value(metric: Option<u32>) -> Option<u64> {
    host().get_metric(metric?).ok()
}

/// Records one observation `v` of a histogram (the same ABI call as a gauge's level, `record_metric`).
pub fn observe(metric: Option<u32>, v: u64) {
    if let Some(id) = metric {
        let _ = host().record_metric(id, v);
    }
}

pub fn set_gauge(metric: Option<u32>, v: u64) {
    if let Some(id) = metric {
        let _ = host().record_metric(id, v);
    }
}

/// The response's status code (`response.code`), once Envoy has one.
pub fn response_code() -> Option<u32> {
    let bytes = logged(host().get_property(&["response", "code"]), "reading response.code")??;
    let raw: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    u32::try_from(u64::from_le_bytes(raw)).ok()
}

/// The backend of the upstream host Envoy picked, from its endpoint metadata (`llmroute.backend`).
pub fn upstream_backend() -> Option<String> {
    property_string(&[
        "xds",
        "upstream_host_metadata",
        "filter_metadata",
        llmroute_core::envoy_contract::METADATA_NAMESPACE,
        llmroute_core::envoy_contract::METADATA_BACKEND,
    ])
}

#[cfg(test)]
mod sdk_imports;
#[cfg(test)]
mod tests;
