//! Host side of `global_limits` (decisions in `llmroute_core::global_limits`): sets the descriptor headers after
//! admission, recognises the rate-limit filter's own replies on the way back, and writes the tokens its
//! stream-done call charges.

use llmroute_core::config::GlobalLimits;
use llmroute_core::envoy_contract::global;
use llmroute_core::global_limits::{self, Refusal};

use crate::host::{self, Envoy};

/// What an admitted request may be charged, kept from admission to the end of the response.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    reserved: u64,
}

/// Sets the headers the route's descriptors read (client copies were stripped in the headers phase), and charges
/// the input until an engine answers.
pub fn admit(
    envoy: &Envoy,
    g: &GlobalLimits,
    alias: &str,
    key: Option<&str>,
    input: u64,
    max_output: Option<u64>,
) -> Pending {
    for (name, value) in global_limits::descriptor_headers(alias, key) {
        envoy.set_request_header(name, Some(value));
    }
    let n = global_limits::Charge::Input(input).tokens();
    envoy.set_log_field(global::TOKENS_CHARGED, &n.to_string());
    Pending {
        reserved: global_limits::reservation(g, input, max_output),
    }
}

impl Pending {
    /// At response headers: the rate-limit filter's own reply is named (an over-limit one gets `Retry-After` from
    /// the service's reset time, read from the response headers the plan read) and charges nothing; any other
    /// response is charged the reservation until usage comes.
    pub fn on_response_headers(&self, envoy: &Envoy, headers: &host::ResponseHeaders) -> Option<Refusal> {
        let details = envoy.property_string(&["response", "code_details"]).unwrap_or_default();
        match global_limits::refusal(&details) {
            Some(r) => {
                envoy.set_log_field(global::TOKENS_CHARGED, global_limits::NOT_CHARGED);
                if r == Refusal::OverLimit {
                    let reset = headers.get(global::RESET_HEADER);
                    let after = global_limits::retry_after_s(reset.as_deref());
                    envoy.set_response_header("retry-after", &after.to_string());
                }
                Some(r)
            }
            None => {
                self.publish(envoy, None);
                None
            }
        }
    }

    /// The tokens the stream-done call charges: the usage when reported, else the reservation.
    pub fn publish(&self, envoy: &Envoy, used: Option<u64>) {
        let n = global_limits::charge(self.reserved, used).tokens();
        envoy.set_log_field(global::TOKENS_CHARGED, &n.to_string());
    }
}
