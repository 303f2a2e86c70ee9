//! Whether the status poll reaches Envoy's admin API, and what to say when it does not.
//!
//! The filter polls the admin address of its config (`admin:` in llmroute.yaml) through the `llmroute_admin`
//! cluster that `llmroute render` writes from it. When that address is not this Envoy's own admin interface (a
//! config pasted into an Envoy whose admin listens elsewhere), every poll fails and `/readyz` stays 503. So a failed
//! poll is named: it becomes an [`AdminFailure`] (the configured address, why, since when) that the filter keeps in
//! shared data, `/llmroute/status` shows and `/readyz`'s reason quotes, and [`after_poll`] says when the state
//! changes, so the filter logs one line when polls start failing and one when they work again, whatever the number
//! of polls and workers.
//!
//! The address is config, not a secret. The reason is built from the outcome only: an HTTP status, and the text of
//! Envoy's own local reply (a connect failure's 503, a timeout's 504) when Envoy answered in the admin's place;
//! another server's body is never quoted.

use serde::{Deserialize, Serialize};

use crate::envoy_contract::ADMIN_CLUSTER;

/// Most bytes of the reason kept: enough for Envoy's connect-failure text.
pub const MAX_ERROR_LEN: usize = 240;

/// Polls of the admin API failing since `since_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminFailure {
    /// `admin:` of the config the filter runs: the address the failing polls go to.
    pub address: String,
    /// Why the latest poll failed, at most [`MAX_ERROR_LEN`] bytes.
    pub error: String,
    /// When the first failed poll of the streak ended, in milliseconds since the Unix epoch.
    pub since_ms: u64,
}

impl AdminFailure {
    /// How long polls have been failing at `now_ms` (0 when the clock stepped back).
    pub fn failing_for_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.since_ms)
    }

    /// The sentence `/readyz`'s reason and the log use: the address, why, and what to check.
    pub fn describe(&self) -> String {
        format!(
            "polls of Envoy's admin API at {} (`admin:` in llmroute.yaml) fail: {}; `admin:` must be the address of \
             this Envoy's own admin interface",
            self.address, self.error
        )
    }

    /// The form kept in shared data: the failure, or JSON `null` while polls work.
    pub fn encode(state: Option<&AdminFailure>) -> Vec<u8> {
        serde_json::to_vec(&state).unwrap_or_default()
    }

    /// Reads [`AdminFailure::encode`]'s bytes; `null` or anything unreadable is no failure.
    pub fn decode(bytes: &[u8]) -> Option<AdminFailure> {
        serde_json::from_slice::<Option<AdminFailure>>(bytes).ok().flatten()
    }
}

/// Why one poll failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollError {
    /// The host refused to call `llmroute_admin` (no such cluster in Envoy's config).
    NotCalled,
    /// No answer came within the poll's timeout.
    NoAnswer { timeout_ms: u64 },
    /// An answer other than 200; `envoy_says` is the text of Envoy's own local reply when Envoy answered in the
    /// admin's place.
    Status { code: u32, envoy_says: Option<String> },
    /// A 200 whose body is not Envoy's admin `/clusters` JSON.
    Unreadable(String),
}

impl std::fmt::Display for PollError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PollError::NotCalled => write!(
                f,
                "the cluster {ADMIN_CLUSTER} could not be called (is it in Envoy's config?)"
            ),
            PollError::NoAnswer { timeout_ms } => write!(f, "no answer within {timeout_ms} ms"),
            PollError::Status {
                code,
                envoy_says: Some(text),
            } => write!(f, "Envoy answered {code} in its place: {text}"),
            PollError::Status { code, envoy_says: None } => {
                write!(f, "it answered HTTP {code}, not Envoy's admin /clusters")
            }
            PollError::Unreadable(why) => write!(f, "its answer is not Envoy's admin /clusters: {why}"),
        }
    }
}

/// How Envoy's own local replies to a routed call begin (plain text, see Envoy's router).
const ENVOY_REPLIES: [&str; 4] = [
    "upstream connect error",
    "upstream request timeout",
    "no healthy upstream",
    "upstream overflow",
];

/// The error of a non-200 answer with `body`: the status, and the body's text only when it is Envoy's own local
/// reply (one line, bounded).
pub fn answered(code: u32, body: &[u8]) -> PollError {
    let envoy_says = std::str::from_utf8(body)
        .ok()
        .map(str::trim)
        .filter(|t| ENVOY_REPLIES.iter().any(|p| t.starts_with(p)))
        .map(one_line);
    PollError::Status { code, envoy_says }
}

/// `text` on one line without control characters, cut to [`MAX_ERROR_LEN`] bytes.
fn one_line(text: &str) -> String {
    let clean: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    crate::text::prefix_on_char_boundary(&clean, MAX_ERROR_LEN).to_string()
}

/// A change of the admin state, with the line to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Polls started failing (or now fail at another address): a warning.
    Failing(String),
    /// Polls work again: an info line.
    Recovered(String),
}

/// The admin state after one poll of `address` ended at `now_ms` with `outcome`, given the state before (`prev`),
/// and the change to log, if the state changed: a failure keeps its streak's start while the address stays the
/// same, and only entering or leaving a failure is a change.
pub fn after_poll(
    prev: Option<&AdminFailure>,
    outcome: Result<(), PollError>,
    address: &str,
    now_ms: u64,
) -> (Option<AdminFailure>, Option<Change>) {
    match (prev, outcome) {
        (None, Ok(())) => (None, None),
        (Some(p), Ok(())) => (
            None,
            Some(Change::Recovered(format!(
                "llmroute: polls of Envoy's admin API at {} work again",
                p.address
            ))),
        ),
        (prev, Err(e)) => {
            let same_streak = prev.filter(|p| p.address == address);
            let next = AdminFailure {
                address: address.to_string(),
                error: one_line(&e.to_string()),
                since_ms: same_streak.map_or(now_ms, |p| p.since_ms),
            };
            let change = same_streak.is_none().then(|| {
                Change::Failing(format!(
                    "llmroute: {}; /readyz answers 503 once the last health snapshot is stale",
                    next.describe()
                ))
            });
            (Some(next), change)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: &str = "127.0.0.1:9911";
    const REFUSED: &[u8] =
        b"upstream connect error or disconnect/reset before headers. reset reason: remote connection \
failure, transport failure reason: delayed connect error: Connection refused";

    #[test]
    fn only_entering_and_leaving_a_failure_is_logged() {
        let err = || Err(answered(503, REFUSED));
        let (first, change) = after_poll(None, err(), AT, 1000);
        let first = first.unwrap();
        assert_eq!(first.since_ms, 1000);
        assert!(first.error.contains("Connection refused"), "{first:?}");
        let Some(Change::Failing(line)) = change else {
            panic!("{change:?}")
        };
        assert!(
            line.contains(AT) && line.contains("`admin:`") && line.contains("Connection refused"),
            "{line}"
        );

        // The streak goes on: its start stays, the latest reason shows, nothing is logged.
        let (again, change) = after_poll(Some(&first), Err(answered(404, b"<html>")), AT, 2000);
        let again = again.unwrap();
        assert_eq!((again.since_ms, change), (1000, None));
        assert_eq!(again.error, "it answered HTTP 404, not Envoy's admin /clusters");

        // A new address (the config changed) is a new streak.
        let (moved, change) = after_poll(Some(&again), err(), "127.0.0.1:9901", 3000);
        assert_eq!(moved.unwrap().since_ms, 3000);
        assert!(matches!(change, Some(Change::Failing(l)) if l.contains("127.0.0.1:9901")));

        let (ok, change) = after_poll(Some(&again), Ok(()), AT, 4000);
        assert_eq!(ok, None);
        assert_eq!(
            change,
            Some(Change::Recovered(format!(
                "llmroute: polls of Envoy's admin API at {AT} work again"
            )))
        );
        assert_eq!(after_poll(None, Ok(()), AT, 5000), (None, None));
    }

    #[test]
    fn only_envoys_own_replies_are_quoted() {
        assert_eq!(
            answered(503, b"a page of another server that says upstream connect error"),
            PollError::Status {
                code: 503,
                envoy_says: None
            }
        );
        assert_eq!(
            answered(504, b"upstream request timeout"),
            PollError::Status {
                code: 504,
                envoy_says: Some("upstream request timeout".into())
            }
        );
        assert_eq!(
            answered(401, &[0xff, 0xfe]),
            PollError::Status {
                code: 401,
                envoy_says: None
            }
        );
        let long = format!("upstream connect error\r\n{}", "é".repeat(500));
        let PollError::Status {
            envoy_says: Some(text), ..
        } = answered(503, long.as_bytes())
        else {
            panic!()
        };
        assert!(
            text.len() <= MAX_ERROR_LEN && !text.contains('\n') && !text.contains('\r'),
            "{text}"
        );
        assert_eq!(
            PollError::NotCalled.to_string(),
            "the cluster llmroute_admin could not be called (is it in Envoy's config?)"
        );
        assert_eq!(
            PollError::NoAnswer { timeout_ms: 900 }.to_string(),
            "no answer within 900 ms"
        );
    }

    #[test]
    fn the_state_round_trips_through_shared_data() {
        let f = AdminFailure {
            address: AT.into(),
            error: "no answer within 900 ms".into(),
            since_ms: 7,
        };
        assert_eq!(AdminFailure::decode(&AdminFailure::encode(Some(&f))), Some(f.clone()));
        assert_eq!(AdminFailure::encode(None), b"null");
        assert_eq!(AdminFailure::decode(b"null"), None);
        assert_eq!(AdminFailure::decode(b""), None);
        assert_eq!(f.failing_for_ms(5), 0);
        assert_eq!(f.failing_for_ms(1007), 1000);
    }
}
