//! The response-header plan (`response_plan`): media types, the headers set and removed, the body's plan, and
//! which response headers are read for it.

#![allow(clippy::indexing_slicing, clippy::arithmetic_side_effects)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::RefCell;

use llmroute_core::envoy_contract::SESSION_HEADER;
use llmroute_core::key_placement::PlacementReason;
use llmroute_core::load::orca::RESPONSE_HEADER as ORCA;
use llmroute_core::response_plan::{plan, BodyPlan, Media, ResponsePlan, Routed, Settings};
use llmroute_core::{AffinitySource, Api};

#[test]
fn media_types_are_read_without_parameters_or_case() {
    assert_eq!(Media::of("text/event-stream"), Some(Media::EventStream));
    assert_eq!(
        Media::of(" Text/Event-Stream ; charset=utf-8"),
        Some(Media::EventStream)
    );
    assert_eq!(Media::of("application/json; charset=utf-8"), Some(Media::Json));
    assert_eq!(Media::of("APPLICATION/JSON"), Some(Media::Json));
    for other in [
        "",
        "text/plain",
        "application/jsonl",
        "application/problem+json",
        ";application/json",
    ] {
        assert_eq!(Media::of(other), None, "{other:?}");
    }
}

fn routed(api: Api) -> Routed<'static> {
    Routed {
        api,
        cluster: "pool-a",
        affinity: Some(AffinitySource::SystemPrompt),
        echo_session: None,
        placement: None,
        requests_remaining: None,
        tokens_remaining: None,
        assemble: false,
    }
}

/// Plans with these response headers, and returns the plan and the names read.
fn run(s: &Settings, r: Option<&Routed>, response: &[(&str, &str)]) -> (ResponsePlan, Vec<String>) {
    let read = RefCell::new(Vec::new());
    let header = |name: &str| {
        read.borrow_mut().push(name.to_string());
        response.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())
    };
    let upstream = || {
        read.borrow_mut().push("upstream.address".to_string());
        Some("10.0.0.1:80".to_string())
    };
    let p = plan(s, r, &header, &upstream);
    (p, read.into_inner())
}

fn set<'p>(p: &'p ResponsePlan, name: &str) -> Option<&'p str> {
    p.set.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
}

/// The header Envoy's stateful-session filter writes on every response it relays (the host, base64 `IP:PORT`).
const SESSION: (&str, &str) = (SESSION_HEADER, "MTAuMC4wLjE6ODA=");

#[test]
fn an_unrouted_response_reads_only_the_session_header_and_loses_it_when_present() {
    // Envoy's stateful-session filter names the host on every response it relays, whatever the config in force
    // says (a live change may have left it in the bootstrap), so it goes unless debug headers are on.
    let (p, read) = run(&Settings::default(), None, &[SESSION]);
    assert_eq!(
        (p.set.len(), p.remove, p.body, read),
        (
            0,
            vec![SESSION_HEADER],
            BodyPlan::Relay,
            vec![SESSION_HEADER.to_string(), ORCA.to_string()]
        )
    );
    // Without the session filter (hash placement) there is nothing to remove, and no removal is asked for.
    assert!(run(&Settings::default(), None, &[]).0.remove.is_empty());
    // With debug headers on, the session header stays for the operator to see.
    let debug = Settings {
        debug_headers: true,
        ..Settings::default()
    };
    assert!(run(&debug, None, &[SESSION]).0.remove.is_empty());
}

#[test]
fn an_engines_orca_load_report_never_reaches_the_client_debug_headers_or_not() {
    let report = (ORCA, r#"JSON {"named_metrics": {"num_requests_waiting": 2.0}}"#);
    let r = routed(Api::Chat);
    let debug = Settings {
        debug_headers: true,
        ..Settings::default()
    };
    for s in [Settings::default(), debug] {
        let (p, _) = run(
            &s,
            Some(&r),
            &[(":status", "200"), ("content-type", "application/json"), report],
        );
        assert_eq!(p.remove, vec![ORCA], "debug_headers {}", s.debug_headers);
        assert_eq!(run(&s, None, &[report]).0.remove, vec![ORCA]);
    }
}

#[test]
fn a_stream_is_watched_and_loses_its_length_a_json_body_keeps_it() {
    let r = routed(Api::Chat);
    let (p, _) = run(
        &Settings::default(),
        Some(&r),
        &[(":status", "200"), ("content-type", "text/event-stream"), SESSION],
    );
    assert_eq!(p.body, BodyPlan::Watch(Media::EventStream));
    assert_eq!(p.remove, vec![SESSION_HEADER, "content-length"]);
    assert_eq!(set(&p, "x-llmroute-affinity-source"), Some("system"));
    let (p, _) = run(&Settings::default(), Some(&r), &[("content-type", "application/json")]);
    assert_eq!((p.body, p.remove.len()), (BodyPlan::Watch(Media::Json), 0));
    let (p, _) = run(&Settings::default(), Some(&r), &[("content-type", "text/html")]);
    assert_eq!(p.body, BodyPlan::Relay);
}

#[test]
fn an_overloaded_response_is_replaced_in_json_with_retry_after() {
    let r = routed(Api::Messages);
    let (p, read) = run(
        &Settings::default(),
        Some(&r),
        &[("x-envoy-overloaded", "true"), (":status", "503"), SESSION],
    );
    assert_eq!(p.body, BodyPlan::ReplaceOverflow);
    assert_eq!(
        (set(&p, "retry-after"), set(&p, "content-type")),
        (Some("1"), Some("application/json"))
    );
    assert_eq!(p.remove, vec![SESSION_HEADER, "content-length"]);
    assert_eq!(
        read,
        vec![SESSION_HEADER, ORCA, ":status", "x-envoy-overloaded"],
        "nothing else is read once Envoy shed the request"
    );
}

#[test]
fn the_overload_marker_is_read_only_on_a_503() {
    // Envoy marks only its own 503s: any other status is planned without looking for the marker.
    let r = routed(Api::Chat);
    let ok = [(":status", "200"), ("content-type", "application/json")];
    let (p, read) = run(&Settings::default(), Some(&r), &ok);
    assert_eq!(p.body, BodyPlan::Watch(Media::Json));
    assert_eq!(read, vec![SESSION_HEADER, ORCA, ":status", "content-type"]);
    // A 503 that Envoy did not mark is the backend's own answer: planned like any other error.
    let (p, read) = run(&Settings::default(), Some(&r), &[(":status", "503"), ok[1]]);
    assert_eq!(p.body, BodyPlan::Relay);
    assert_eq!(
        read,
        vec![SESSION_HEADER, ORCA, ":status", "x-envoy-overloaded", "content-type"]
    );
}

#[test]
fn a_backend_error_on_messages_is_rewritten_with_the_request_id_but_not_on_chat() {
    let s = Settings {
        request_id: Some("rid-1"),
        ..Settings::default()
    };
    let (p, _) = run(
        &s,
        Some(&routed(Api::Messages)),
        &[(":status", "429"), ("content-type", "text/plain"), SESSION],
    );
    assert_eq!(p.body, BodyPlan::RewriteError(429));
    assert_eq!(set(&p, "request-id"), Some("rid-1"));
    assert_eq!(p.remove, vec![SESSION_HEADER, "content-length"]);
    let (p, _) = run(
        &s,
        Some(&routed(Api::Chat)),
        &[(":status", "429"), ("content-type", "application/json")],
    );
    assert_eq!((p.body, set(&p, "request-id")), (BodyPlan::Relay, None));
}

#[test]
fn a_json_answer_is_watched_for_its_usage_only_when_it_succeeded() {
    // Only a success carries usage: an error's JSON is relayed without a copy into the VM.
    let r = routed(Api::Chat);
    for (status, body) in [
        ("200", BodyPlan::Watch(Media::Json)),
        ("201", BodyPlan::Watch(Media::Json)),
        ("400", BodyPlan::Relay),
        ("500", BodyPlan::Relay),
        ("302", BodyPlan::Relay),
    ] {
        let headers = [(":status", status), ("content-type", "application/json")];
        assert_eq!(run(&Settings::default(), Some(&r), &headers).0.body, body, "{status}");
    }
    // A stream's error is still watched: its outcome is counted.
    let sse = [(":status", "500"), ("content-type", "text/event-stream")];
    let p = run(&Settings::default(), Some(&r), &sse).0;
    assert_eq!(p.body, BodyPlan::Watch(Media::EventStream));
}

#[test]
fn decision_routes_watch_only_a_json_success_for_its_usage() {
    for api in [Api::Decisions, Api::SystemOne] {
        let (p, _) = run(
            &Settings::default(),
            Some(&routed(api)),
            &[("content-type", "text/event-stream"), SESSION],
        );
        assert_eq!((p.body, p.remove.len()), (BodyPlan::Relay, 1), "a stream is relayed");
        let json = |status| {
            let headers = [(":status", status), ("content-type", "application/json")];
            run(&Settings::default(), Some(&routed(api)), &headers).0.body
        };
        assert_eq!(json("200"), BodyPlan::Watch(Media::Json));
        assert_eq!(json("503"), BodyPlan::Relay);
    }
}

#[test]
fn debug_headers_name_the_placement_cluster_limits_and_upstream() {
    let r = Routed {
        placement: Some(PlacementReason::Spilled),
        requests_remaining: Some(4),
        tokens_remaining: None,
        echo_session: Some("s-1"),
        affinity: None,
        ..routed(Api::Chat)
    };
    let plain = run(&Settings::default(), Some(&r), &[]).0;
    assert_eq!(set(&plain, "x-llmroute-cluster"), None);
    assert_eq!(set(&plain, "x-multi-turn-session-id"), Some("s-1"));
    assert_eq!(set(&plain, "x-llmroute-affinity-source"), Some("none"));
    let debug = Settings {
        debug_headers: true,
        ..Settings::default()
    };
    let (p, read) = run(&debug, Some(&r), &[]);
    assert_eq!(set(&p, "x-llmroute-placement"), Some("spilled"));
    assert_eq!(set(&p, "x-llmroute-cluster"), Some("pool-a"));
    assert_eq!(set(&p, "x-llmroute-requests-remaining"), Some("4"));
    assert_eq!(set(&p, "x-llmroute-tokens-remaining"), None);
    assert_eq!(set(&p, "x-llmroute-upstream"), Some("10.0.0.1:80"));
    assert!(read.contains(&"upstream.address".to_string()));
    assert!(!run(&Settings::default(), Some(&r), &[])
        .1
        .contains(&"upstream.address".to_string()));
}

#[test]
fn a_stream_the_gateway_asked_for_is_assembled_only_when_it_is_a_200_event_stream() {
    let r = Routed {
        assemble: true,
        ..routed(Api::Chat)
    };
    let sse = [
        (":status", "200"),
        ("content-type", "text/event-stream; charset=utf-8"),
        SESSION,
    ];
    let (p, _) = run(&Settings::default(), Some(&r), &sse);
    assert_eq!(p.body, BodyPlan::Assemble);
    assert_eq!(set(&p, "content-type"), Some("application/json"));
    assert_eq!(p.remove, vec![SESSION_HEADER, "content-length"]);
    // An engine's error, or a JSON answer, is relayed and watched as usual.
    let error = [(":status", "500"), ("content-type", "text/event-stream")];
    assert_eq!(
        run(&Settings::default(), Some(&r), &error).0.body,
        BodyPlan::Watch(Media::EventStream)
    );
    let json = [(":status", "200"), ("content-type", "application/json")];
    assert_eq!(
        run(&Settings::default(), Some(&r), &json).0.body,
        BodyPlan::Watch(Media::Json)
    );
}
