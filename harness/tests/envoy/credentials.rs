//! Backend credentials through the real filter in a real Envoy:
//! - a client's `Authorization`, `Proxy-Authorization`, `X-Api-Key`, `Api-Key` and `Cookie` reach no backend;
//! - a backend with `credential_env` gets `authorization: Bearer <token>`, the token being the variable's value
//!   in Envoy's environment; a backend without it gets no `authorization` at all;
//! - the token is in no file Envoy was given, not in its log (at debug level), not in its command line, and not in
//!   its admin `config_dump`;
//! - Envoy refuses to start when the variable is unset.

use llmroute_harness::envoy::{Envoy, EnvoyOptions};
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::support::*;

const VAR: &str = "LLMROUTE_TEST_KEYED_TOKEN";

/// Client credentials of every kind the gateway must drop.
const CLIENT_CREDENTIALS: [(&str, &str); 5] = [
    ("authorization", "Bearer sk-client-secret"),
    ("proxy-authorization", "Basic Y2xpZW50OnNlY3JldA=="),
    ("x-api-key", "client-api-key"),
    ("api-key", "client-azure-key"),
    ("cookie", "session=client-cookie"),
];

/// A token unlike anything else in the test, so finding it anywhere means it leaked.
fn token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("tok-{nanos:x}-{}", std::process::id())
}

fn config(keyed: &Fleet, open: &Fleet) -> Value {
    let mut keyed_backend = keyed.backend_entry(150);
    keyed_backend["credential_env"] = json!(VAR);
    json!({
        "version": 1,
        "backends": [keyed_backend, open.backend_entry(150)],
        "models": [
            { "name": "keyed-chat", "routes": [{ "backend": keyed.backend, "upstream_model": UPSTREAM }] },
            { "name": "open-chat", "routes": [{ "backend": open.backend, "upstream_model": UPSTREAM }] },
        ],
    })
}

/// Envoy's log once its last lines are on disk (the launcher has Envoy flush every 100 ms).
async fn flushed_log(envoy: &Envoy) -> String {
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    envoy.log()
}

fn chat_for(alias: &str) -> Value {
    let mut body = chat(Some("creds"), "hello");
    body["model"] = json!(alias);
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_backend_gets_only_its_own_credential_and_the_token_is_never_written() {
    let keyed = Fleet::start("keyed", 1).await.unwrap();
    let open = Fleet::start("open", 1).await.unwrap();
    let token = token();
    let opts = EnvoyOptions {
        log_level: "debug".into(),
        env: vec![(VAR.to_string(), token.clone())],
        ..EnvoyOptions::default()
    };
    let envoy = Envoy::start_with(config(&keyed, &open), opts).await.unwrap();

    for c in [client(), h2_client()] {
        for (alias, backend) in [("keyed-chat", "keyed-0"), ("open-chat", "open-0")] {
            let (status, answered, body) = post(&c, &envoy, &chat_for(alias), &CLIENT_CREDENTIALS).await;
            assert_eq!((status, answered.as_str()), (200, backend), "{body}");
        }
    }

    let bearer = format!("Bearer {token}");
    let keyed_got = keyed.engines[0].chat_requests();
    let open_got = open.engines[0].chat_requests();
    assert_eq!((keyed_got.len(), open_got.len()), (2, 2));
    for r in &keyed_got {
        let auth: Vec<&str> = r
            .headers
            .iter()
            .filter(|(k, _)| k == "authorization")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(auth, vec![bearer.as_str()], "exactly the backend's own token");
    }
    for r in &open_got {
        assert_eq!(
            r.header("authorization"),
            None,
            "a backend without credential_env gets none"
        );
    }
    for r in keyed_got.iter().chain(&open_got) {
        for (name, value) in CLIENT_CREDENTIALS.iter().skip(1) {
            assert_eq!(r.header(name), None, "client {name} must not reach {}", r.backend);
            assert!(
                !r.headers.iter().any(|(_, v)| v.contains(value)),
                "client {name} value leaked into {}: {:?}",
                r.backend,
                r.headers
            );
        }
        assert!(
            !r.headers.iter().any(|(_, v)| v.contains("sk-client-secret")),
            "{:?}",
            r.headers
        );
    }

    // The token is in no file Envoy was given, nor in what it logged or shows.
    let bootstrap = envoy.bootstrap_yaml();
    assert!(
        bootstrap.contains(&format!("environment_variable: {VAR}")),
        "{bootstrap}"
    );
    assert!(!bootstrap.contains(&token), "the rendered bootstrap holds the token");
    let log = flushed_log(&envoy).await;
    assert!(
        log.contains("[debug]") && log.contains("/v1/chat/completions"),
        "the log should hold the requests, at debug level"
    );
    assert!(!log.contains(&token), "Envoy logged the token");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", envoy.pid())).unwrap_or_default();
    assert!(!String::from_utf8_lossy(&cmdline).contains(&token));
    let dump = reqwest::get(envoy.admin_url("/config_dump?include_eds"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        dump.contains("llmroute-credential-keyed"),
        "the secret should be listed"
    );
    assert!(!dump.contains(&token), "config_dump shows the token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unset_credential_variable_stops_envoy_from_starting() {
    let keyed = Fleet::start("keyed", 1).await.unwrap();
    let open = Fleet::start("open", 1).await.unwrap();
    let mut config = config(&keyed, &open);
    config["backends"][0]["credential_env"] = json!("LLMROUTE_TEST_TOKEN_THAT_IS_NEVER_SET");
    let err = match Envoy::start(config).await {
        Ok(_) => panic!("Envoy started without the backend's token"),
        Err(e) => e,
    };
    assert!(
        err.contains("Environment variable doesn't exist: LLMROUTE_TEST_TOKEN_THAT_IS_NEVER_SET"),
        "{err}"
    );
}

/// An alias whose routes fail over from `first` to `second` (an aggregate cluster): the retry must never carry
/// the first backend's token, and a credentialed second backend still gets its own.
async fn failover_case(keyed_first: bool) {
    let keyed = Fleet::start("keyed", 1).await.unwrap();
    let open = Fleet::start("open", 1).await.unwrap();
    let (first, second) = if keyed_first { (&keyed, &open) } else { (&open, &keyed) };
    let mut config = config(&keyed, &open);
    config["models"] = json!([{ "name": ALIAS, "routes": [
        { "backend": first.backend, "upstream_model": "first-model", "priority": 1 },
        { "backend": second.backend, "upstream_model": "second-model", "priority": 2 },
    ] }]);
    let token = token();
    let opts = EnvoyOptions {
        env: vec![(VAR.to_string(), token.clone())],
        ..EnvoyOptions::default()
    };
    let envoy = Envoy::start_with(config, opts).await.unwrap();
    // The first backend stays healthy but answers 503: Envoy tries it, then retries on the second.
    first.engines[0].set_fault_status(Some(503));
    let (status, answered, body) = post(&client(), &envoy, &chat(None, "fail over"), &CLIENT_CREDENTIALS).await;
    assert_eq!(
        (status, answered.as_str()),
        (200, format!("{}-0", second.backend).as_str()),
        "{body}"
    );

    let bearer = format!("Bearer {token}");
    let tried = first.engines[0].chat_requests();
    let served = second.engines[0].chat_requests();
    assert_eq!(tried.len(), 1, "the first priority was tried once");
    assert_eq!(served.len(), 1);
    let (keyed_got, open_got) = if keyed_first {
        (&tried[0], &served[0])
    } else {
        (&served[0], &tried[0])
    };
    let auth: Vec<&str> = keyed_got
        .headers
        .iter()
        .filter(|(k, _)| k == "authorization")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(
        auth,
        vec![bearer.as_str()],
        "the keyed backend gets exactly its own token"
    );
    assert_eq!(
        open_got.header("authorization"),
        None,
        "no token may follow a retry to a backend without credential_env"
    );
    let sent: Value = serde_json::from_slice(&served[0].body).unwrap();
    assert_eq!(sent["model"], "second-model");
    for r in [&tried[0], &served[0]] {
        for (name, _) in CLIENT_CREDENTIALS.iter().skip(1) {
            assert_eq!(r.header(name), None, "client {name} must not reach {}", r.backend);
        }
    }
    assert!(!flushed_log(&envoy).await.contains(&token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_from_a_keyed_backend_leaves_its_token_behind() {
    failover_case(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_to_a_keyed_backend_brings_its_own_token() {
    failover_case(false).await;
}
