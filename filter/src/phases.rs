//! Bench builds only: the filter with its later phases switched off, to measure inside Envoy what each phase of a
//! request costs (`make build-phases`, cargo feature `bench-phases`; `make bench-overhead` runs it).
//!
//! The VM configuration (`vm_config.configuration`, read once in `on_vm_start`) names the last phase the filter
//! runs; every later one returns at once. The overhead bench starts one Envoy per phase, side by side with plain
//! Envoy and the whole filter, and subtracts each from the next, so each difference is what one phase adds:
//!
//! | phase | adds |
//! |---|---|
//! | `enter` | nothing but entering the VM: the HTTP context and each callback, returning at once |
//! | `headers` | the request headers read whole, the client's headers stripped, the request classified |
//! | `copy` | the body buffered by Envoy and copied into the VM once |
//! | `scan` | the core's decision (`route`: one pass, fields, affinity key) |
//! | `patch` | the head edit of `model` and its `content-length` |
//! | `request` | the rest of the request side: route, affinity and estimate headers, access-log fields |
//! | `response` | the response path: the response-header plan, the usage watch, `on_log` and its metrics |
//!
//! Without the feature, [`runs`] is `true` for every phase and compiles away; `make build` never enables it, and
//! no configuration of a production build can switch a phase off.

/// A phase of one request, in the order the filter runs them.
#[cfg_attr(not(feature = "bench-phases"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Enter,
    Headers,
    Copy,
    Scan,
    Patch,
    Request,
    Response,
}

#[cfg(feature = "bench-phases")]
mod switch {
    use super::Phase;
    use std::cell::Cell;

    thread_local! {
        static LAST: Cell<Phase> = const { Cell::new(Phase::Response) };
    }

    impl Phase {
        /// Every phase, in order.
        pub const ALL: [Phase; 7] = [
            Phase::Enter,
            Phase::Headers,
            Phase::Copy,
            Phase::Scan,
            Phase::Patch,
            Phase::Request,
            Phase::Response,
        ];

        pub fn name(self) -> &'static str {
            match self {
                Phase::Enter => "enter",
                Phase::Headers => "headers",
                Phase::Copy => "copy",
                Phase::Scan => "scan",
                Phase::Patch => "patch",
                Phase::Request => "request",
                Phase::Response => "response",
            }
        }
    }

    /// Sets the last phase from the VM configuration: a phase's name, or nothing for the whole filter.
    pub fn configure(vm_configuration: Option<&[u8]>) {
        let text = vm_configuration.and_then(|b| std::str::from_utf8(b).ok()).unwrap_or("");
        let last = Phase::ALL
            .into_iter()
            .find(|p| p.name() == text.trim())
            .unwrap_or(Phase::Response);
        log::warn!("llmroute: bench build, phases up to `{}` run", last.name());
        LAST.with(|l| l.set(last));
    }

    pub fn runs(phase: Phase) -> bool {
        LAST.with(|l| phase <= l.get())
    }
}

#[cfg(feature = "bench-phases")]
pub use switch::configure;

/// Whether `phase` runs in this VM. Always, unless a bench build was told to stop earlier.
#[inline(always)]
pub fn runs(phase: Phase) -> bool {
    #[cfg(feature = "bench-phases")]
    return switch::runs(phase);
    #[cfg(not(feature = "bench-phases"))]
    {
        let _ = phase;
        true
    }
}
