//! `models[].stream_upstream: always`: which requests go upstream streamed although the client did not ask,
//! and the minimal body edits that make them so.
//!
//! Only chat and responses requests are converted, and only when the client did not send `stream: true`. The
//! edits are splices like the `model` rewrite, so every other byte reaches the engine as sent:
//! - a `stream` member (`false`, `null`, or anything but `true`) gets the value `true`; a body without one gets
//!   `,"stream":true` before its closing brace;
//! - a chat body without `stream_options` (in any letter case) also gets
//!   `,"stream_options":{"include_usage":true}`, so the stream reports the usage the rebuilt answer carries.
//!
//! The response is then rebuilt into one JSON answer by [`crate::stream::assemble`]. Cost: one pass over the
//! top-level members, already scanned by the route decision.

use crate::endpoint::Api;
use crate::json::Member;
use crate::route::{Edit, INCLUDE_USAGE};

/// The value a converted request's `stream` member gets, and the member added when there is none.
const STREAM_TRUE: &str = "true";
const ADD_STREAM: &str = ",\"stream\":true";

/// The edits that send this request upstream streamed; `None` when it is left as sent (another API, or the
/// client already streams). `stream` is the body's `stream` member; `has_options` tells whether the body has
/// `stream_options` in any letter case.
pub(crate) fn edits(api: Api, body: &[u8], stream: Option<Member>, has_options: bool) -> Option<Vec<Edit>> {
    if !matches!(api, Api::Chat | Api::Responses) {
        return None;
    }
    if stream.is_some_and(|m| m.value.of(body) == STREAM_TRUE.as_bytes()) {
        return None;
    }
    let close = body.iter().rposition(|&b| b == b'}')?;
    let mut edits = Vec::new();
    let mut insert = String::new();
    match stream {
        Some(m) => edits.push(Edit {
            span: m.value,
            text: STREAM_TRUE.to_string(),
        }),
        None => insert.push_str(ADD_STREAM),
    }
    if api == Api::Chat && !has_options {
        insert.push_str(INCLUDE_USAGE);
    }
    if !insert.is_empty() {
        edits.push(Edit::insert(close, &insert));
    }
    Some(edits)
}

#[cfg(test)]
mod tests {
    use crate::config::{load, Config};
    use crate::endpoint::Api;
    use crate::route::route;

    fn cfg() -> Config {
        load(
            r#"{"version":1,"backends":[{"name":"a","kind":"llamacpp","endpoints":["127.0.0.1:1"]}],
                "models":[{"name":"m","routes":[{"backend":"a","upstream_model":"up"}],"stream_upstream":"always"},
                          {"name":"same","routes":[{"backend":"a"}],"stream_upstream":"always"},
                          {"name":"plain","routes":[{"backend":"a"}]}]}"#,
        )
        .unwrap()
    }

    /// The body that goes upstream, and whether the answer is to be rebuilt.
    fn sent(api: Api, body: &str) -> (String, bool) {
        let d = route(&cfg(), api, body.as_bytes(), None).unwrap();
        let out = d
            .patch
            .as_ref()
            .map_or(body.as_bytes().to_vec(), |p| p.apply(body.as_bytes()));
        assert_eq!(d.body_len(body.len()), Some(out.len()));
        assert!(!d.strip_usage_chunk);
        let out = String::from_utf8(out).unwrap();
        serde_json::from_str::<serde_json::Value>(&out).unwrap();
        (out, d.assemble)
    }

    #[test]
    fn a_chat_request_without_stream_gets_stream_and_include_usage() {
        let (out, assemble) = sent(
            Api::Chat,
            r#"{"model":"m", "messages":[{"role":"user","content":"x"}] }"#,
        );
        assert!(assemble);
        assert_eq!(
            out,
            r#"{"model":"up", "messages":[{"role":"user","content":"x"}] ,"stream":true,"stream_options":{"include_usage":true}}"#
        );
    }

    #[test]
    fn stream_false_or_null_is_replaced_in_place() {
        for v in ["false", "null", "0"] {
            let body = format!(r#"{{"stream" : {v},"model":"same","messages":[{{"role":"user","content":"x"}}]}}"#);
            let (out, assemble) = sent(Api::Chat, &body);
            assert!(assemble, "{v}");
            assert_eq!(
                out,
                r#"{"stream" : true,"model":"same","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#
            );
        }
    }

    #[test]
    fn the_clients_stream_options_are_kept() {
        let body = r#"{"model":"same","stream":false,"Stream_Options":{"include_usage":false},"messages":[{"role":"user","content":"x"}]}"#;
        let (out, assemble) = sent(Api::Chat, body);
        assert!(assemble);
        assert_eq!(out, body.replace("\"stream\":false", "\"stream\":true"));
    }

    #[test]
    fn responses_get_stream_only() {
        let (out, assemble) = sent(Api::Responses, r#"{"model":"m","input":"hi"}"#);
        assert!(assemble);
        assert_eq!(out, r#"{"model":"up","input":"hi","stream":true}"#);
    }

    #[test]
    fn streamed_requests_other_apis_and_as_sent_aliases_are_left_alone() {
        let streamed = r#"{"model":"same","stream":true,"messages":[{"role":"user","content":"x"}]}"#;
        assert_eq!(sent(Api::Chat, streamed), (streamed.to_string(), false));
        let completions = r#"{"model":"same","prompt":"x"}"#;
        assert_eq!(sent(Api::Completions, completions), (completions.to_string(), false));
        let plain = r#"{"model":"plain","messages":[{"role":"user","content":"x"}]}"#;
        assert_eq!(sent(Api::Chat, plain), (plain.to_string(), false));
    }
}
