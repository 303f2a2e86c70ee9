//! What the running event hook is serving ([`Current`]: its stream, configuration and body state) and the
//! answer of the callout it reports, in thread-locals the host reads (`host.rs`): the glue's host calls name no
//! stream, as proxy-wasm knows which one a VM serves.

use std::cell::{Cell, RefCell};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::abi::{self, EnvoyBuffer, EnvoyHeader, FilterEnvoyPtr};

/// What the running event hook is serving.
#[derive(Clone, Copy)]
pub struct Current {
    /// The stream, or null for a root context.
    pub filter: FilterEnvoyPtr,
    /// The plugin configuration (`filter_config`) and the filter name (`plugin_root_id`), owned by the config.
    pub config: *const crate::config::FilterConfig,
    /// The stream's context id on this worker (0 for a root context).
    pub context: u32,
    /// The context id of the stream whose hook is running (0 in a root context's hook): a call for another
    /// stream (after `set_effective_context`) that must run in that stream's own hook is deferred to it.
    pub hook_context: u32,
    /// The main thread's root context of the configuration: it ticks and calls out through the configuration.
    pub main: bool,
    /// Inside the request (response) body hook: the received chunk is readable.
    pub in_request_body: bool,
    pub in_response_body: bool,
    /// This filter answered "stop and buffer" to the previous request (response) body chunk.
    pub buffering_request: bool,
    pub buffering_response: bool,
}

impl Current {
    pub const NONE: Current = Current {
        filter: std::ptr::null_mut(),
        config: std::ptr::null(),
        context: 0,
        hook_context: 0,
        main: false,
        in_request_body: false,
        in_response_body: false,
        buffering_request: false,
        buffering_response: false,
    };

    /// True when the effective stream is not the one whose hook is running.
    pub fn other(&self) -> bool {
        self.context != self.hook_context
    }
}

/// An HTTP callout's answer, while `on_http_call_response` reads it.
#[derive(Default)]
pub struct CalloutAnswer {
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl CalloutAnswer {
    /// The answer Envoy hands a callout-done hook (empty unless the callout succeeded).
    ///
    /// # Safety
    /// `headers` and `body_chunks` are null or Envoy's arrays of `headers_size` and `body_chunks_size` entries,
    /// alive for the running hook.
    pub unsafe fn of(
        result: u32,
        headers: *const EnvoyHeader,
        headers_size: usize,
        body_chunks: *const EnvoyBuffer,
        body_chunks_size: usize,
    ) -> CalloutAnswer {
        let mut answer = CalloutAnswer::default();
        if result != abi::CALLOUT_SUCCESS {
            return answer;
        }
        if !headers.is_null() {
            // SAFETY: the caller's contract.
            for h in unsafe { std::slice::from_raw_parts(headers, headers_size) } {
                // SAFETY: as above.
                let (k, v) = unsafe { h.pair() };
                answer
                    .headers
                    .push((String::from_utf8_lossy(k).into_owned(), v.to_vec()));
            }
        }
        if !body_chunks.is_null() {
            // SAFETY: the caller's contract.
            for c in unsafe { std::slice::from_raw_parts(body_chunks, body_chunks_size) } {
                // SAFETY: as above.
                answer.body.extend_from_slice(unsafe { c.bytes() }.unwrap_or_default());
            }
        }
        answer
    }
}

thread_local! {
    static CURRENT: Cell<Current> = const { Cell::new(Current::NONE) };
    static ANSWER: RefCell<Option<CalloutAnswer>> = const { RefCell::new(None) };
}

/// Makes `current` this thread's stream until the running hook ends (`set_effective_context`).
pub fn switch_to(current: Current) {
    CURRENT.with(|c| c.set(current));
}

/// The running hook started the buffered request (response) body (`body`): the glue sees it from now on.
pub fn note_buffered(request: bool) {
    CURRENT.with(|c| {
        let mut now = c.get();
        if request {
            now.buffering_request = true;
        } else {
            now.buffering_response = true;
        }
        c.set(now);
    });
}

/// Reads the callout answer of the running hook, if any.
pub fn with_answer_read<T>(f: impl FnOnce(Option<&CalloutAnswer>) -> T) -> T {
    ANSWER.with(|a| match a.try_borrow() {
        Ok(a) => f(a.as_ref()),
        Err(_) => f(None),
    })
}

/// Runs `f` with `current` as this thread's stream, restoring the previous one after (hooks do not nest, but a
/// local reply sent from a hook may run another filter's hooks on the same thread).
pub fn with_current<T>(current: Current, f: impl FnOnce() -> T) -> T {
    let previous = CURRENT.with(|c| c.replace(current));
    let out = f();
    CURRENT.with(|c| c.set(previous));
    out
}

/// Runs `f` with `answer` readable as the callout response.
pub fn with_answer<T>(answer: CalloutAnswer, f: impl FnOnce() -> T) -> T {
    let previous = ANSWER.with(|a| a.replace(Some(answer)));
    let out = f();
    ANSWER.with(|a| *a.borrow_mut() = previous);
    out
}

pub fn current() -> Current {
    CURRENT.with(Cell::get)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}
