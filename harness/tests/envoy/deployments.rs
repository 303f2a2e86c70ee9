//! Deployments other than the rendered bootstrap:
//! - an Envoy config written by hand (`testdata/envoy/handwritten.yaml`), built only from its own skeleton and
//!   the sections of `--target filter` pasted in, passes the checks the bootstrap gets: routing by alias with the
//!   model rewritten, affinity, failover across a multi-route alias, a refusal in JSON, Envoy's own errors in
//!   JSON, labelled metrics; another application's route on the same listener is left to it (`other_routes`),
//!   and without that section the filter takes it;
//! - every good fixture's sections, pasted into a bare listener, pass `envoy --mode validate`;
//! - the filter delivered through ECDS from a watched file takes new aliases, models, affinity settings and an
//!   alias' own affinity under load without a failed request, and refuses a bad push while keeping the old config
//!   (stats and log show it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use llmroute_harness::envoy::{envoy_binary, repo_root, wasm_module, Envoy, EnvoyOptions};
use llmroute_harness::fleet::Fleet;
use llmroute_harness::render::{ecds, paste, target, RenderOptions};
use serde_json::{json, Value};

use crate::support::{client, ecds_stat, last_model, post, post_json, push, start_ecds, tally, wait_for};

/// The hand-written config with `${NAME}` placeholders filled and the sections pasted in, as YAML.
fn handwritten(vars: &[(&str, String)], sections: &Value) -> String {
    let mut text = std::fs::read_to_string(repo_root().join("testdata/envoy/handwritten.yaml")).unwrap();
    for (name, value) in vars {
        text = text.replace(&format!("${{{name}}}"), value);
    }
    assert!(!text.contains("${"), "an unfilled placeholder is left:\n{text}");
    let v = paste::paste(&text, sections).unwrap();
    assert!(!v.to_string().contains("@llmroute"), "a marker is left: {v}");
    serde_yaml_ng::to_string(&v).unwrap()
}

/// The llmroute config that goes with the hand-written Envoy config (`testdata/envoy/llmroute.yaml`), with the
/// fleets' endpoints and the Envoy's admin port.
fn llmroute_config(a: &Fleet, b: &Fleet, admin_port: u16) -> Value {
    let text = std::fs::read_to_string(repo_root().join("testdata/envoy/llmroute.yaml")).unwrap();
    let mut v: Value = serde_yaml_ng::from_str(&text).unwrap();
    v["admin"] = json!(format!("127.0.0.1:{admin_port}"));
    v["backends"][0]["endpoints"] = json!(a.endpoints());
    v["backends"][1]["endpoints"] = json!(b.endpoints());
    v
}

fn filter_pieces(doc: &Value, opts: &RenderOptions) -> Value {
    let text = doc.to_string();
    let cfg = llmroute_core::load_document(&text).unwrap();
    target::filter_document(&target::pieces(&cfg, &text, opts).unwrap())
}

fn chat_for(model: &str, user: &str) -> Value {
    json!({ "model": model, "messages": [{ "role": "user", "content": user }] })
}

/// Starts Envoy from the hand-written config for fleets `a` and `b`, with the sections (after `edit`) pasted in.
async fn start_handwritten(a: &Fleet, b: &Fleet, edit: impl Fn(&mut Value)) -> Envoy {
    let wasm = wasm_module().display().to_string();
    Envoy::start_bootstrap(
        |listen, admin| {
            let mut sections = filter_pieces(&llmroute_config(a, b, admin), &RenderOptions::new(wasm.clone()));
            edit(&mut sections);
            let vars = [("LISTEN_PORT", listen.to_string()), ("ADMIN_PORT", admin.to_string())];
            handwritten(&vars, &sections)
        },
        EnvoyOptions::default(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handwritten_envoy_with_the_pasted_pieces_routes_sticks_fails_over_and_refuses() {
    let a = Fleet::start("llama-a", 3).await.unwrap();
    let b = Fleet::start("llama-b", 1).await.unwrap();
    let envoy = start_handwritten(&a, &b, |_| {}).await;
    assert!(
        envoy.bootstrap_yaml().contains("edge_ingress"),
        "the hand-written listener runs"
    );
    let c = client();

    // Routing by alias, model rewritten.
    let (status, backend, body) = post(&c, &envoy, &chat_for("b-chat", "hello b"), &[]).await;
    assert_eq!((status, backend.as_str()), (200, "llama-b-0"), "{body}");
    assert_eq!(last_model(&b.engines[0]), "b-only");
    let (status, backend, body) = post(&c, &envoy, &chat_for("local-chat", "hello a"), &[]).await;
    assert_eq!(status, 200, "{body}");
    assert!(backend.starts_with("llama-a-"), "{backend}");
    let served = a.engines.iter().find(|e| e.name() == backend).unwrap();
    assert_eq!(last_model(served), "a-local");

    // Affinity: one session sticks to one engine; many sessions spread over the fleet.
    let mut sticky = Vec::new();
    for i in 0..8 {
        let (s, who, _) = post(
            &c,
            &envoy,
            &chat_for("local-chat", &format!("turn {i}")),
            &[("x-session-id", "tenant-7")],
        )
        .await;
        assert_eq!(s, 200);
        sticky.push(who);
    }
    assert_eq!(tally(sticky.clone()).len(), 1, "one session, one engine: {sticky:?}");
    let mut spread = Vec::new();
    for i in 0..16 {
        let session = format!("session-{i}");
        let (s, who, _) = post(
            &c,
            &envoy,
            &chat_for("local-chat", "same prompt"),
            &[("x-session-id", &session)],
        )
        .await;
        assert_eq!(s, 200);
        spread.push(who);
    }
    assert!(
        tally(spread.clone()).len() >= 2,
        "sixteen sessions use more than one engine: {spread:?}"
    );

    // Failover: every llama-a engine answers 503, so the multi-route alias moves on to llama-b with its model.
    for e in &a.engines {
        e.set_fault_status(Some(503));
    }
    b.reset();
    let (status, backend, body) = post(&c, &envoy, &chat_for("fallback-chat", "fail over"), &[]).await;
    assert_eq!((status, backend.as_str()), (200, "llama-b-0"), "{body}");
    assert_eq!(last_model(&b.engines[0]), "b-second");
    assert!(
        a.engines.iter().map(|e| e.chat_requests().len()).sum::<usize>() > 0,
        "the first priority was tried first"
    );
    for e in &a.engines {
        e.set_fault_status(None);
    }

    // A refusal in JSON, with no engine contacted.
    a.reset();
    b.reset();
    let resp = c
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(chat_for("no-such-alias", "hi").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    assert_eq!(
        resp.headers().get("x-llmroute-error").and_then(|v| v.to_str().ok()),
        Some("model_not_found")
    );
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    assert_eq!(a.chat_counts().iter().chain(b.chat_counts().iter()).sum::<usize>(), 0);

    // Another application's route on the same listener: untouched by the filter, whatever the request says.
    for req in [
        c.get(envoy.url("/app/hello")),
        c.post(envoy.url("/app/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("x-llmroute-cluster", "llama-a")
            .body(chat_for("local-chat", "not for llmroute").to_string()),
    ] {
        let r = req.send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert!(r.headers().get("x-llmroute-error").is_none());
        assert_eq!(r.text().await.unwrap(), "the other app");
    }
    assert_eq!(a.chat_counts().iter().chain(b.chat_counts().iter()).sum::<usize>(), 0);
    // The filter's own pages, on its routes.
    let ready = wait_for(Duration::from_secs(15), || async {
        reqwest::get(envoy.url("/readyz"))
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    assert!(
        ready.is_some(),
        "/readyz never answered 200 through the hand-written routes"
    );

    // The pasted bootstrap section's stats_tags: the filter's metrics carry their labels as Prometheus labels.
    let prom = reqwest::get(envoy.admin_url("/stats/prometheus"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series: Vec<&str> = prom
        .lines()
        .filter(|l| l.starts_with("llmroute_requests_total{"))
        .collect();
    assert!(
        series
            .iter()
            .any(|l| l.contains("alias=\"b-chat\"") && l.contains("backend=\"llama-b\"")),
        "labelled series: {series:?}"
    );
}

/// What docs/deploy-existing-envoy.md warns about: without the failover aggregate among the pasted clusters, a
/// multi-route alias names a cluster that does not exist, while single-route aliases still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_failover_aggregate_a_multi_route_alias_has_no_cluster() {
    let a = Fleet::start("llama-a", 3).await.unwrap();
    let b = Fleet::start("llama-b", 1).await.unwrap();
    let envoy = start_handwritten(&a, &b, |pieces| {
        if let Some(list) = pieces["clusters"].as_array_mut() {
            list.retain(|c| !c["name"].as_str().unwrap_or_default().starts_with("llmroute-failover-"));
        }
    })
    .await;
    let c = client();
    let (status, backend, _) = post(&c, &envoy, &chat_for("b-chat", "single route"), &[]).await;
    assert_eq!((status, backend.as_str()), (200, "llama-b-0"));
    let (status, backend, body) = post(&c, &envoy, &chat_for("fallback-chat", "multi route"), &[]).await;
    assert_eq!((status, backend.as_str()), (503, ""), "{body}");
    // Envoy's own 503, in the API's JSON envelope through the pasted connection_manager's local_reply_config.
    assert!(body["error"]["code"].is_string(), "not a JSON error envelope: {body}");
    assert_eq!(a.chat_counts(), vec![0, 0, 0], "no engine of the alias is reached");
}

/// A bare listener with markers for every section, and another application's route.
const BARE: &str = r#"
admin: { address: { socket_address: { address: 127.0.0.1, port_value: ${ADMIN_PORT} } } }
"@llmroute bootstrap": merge
static_resources:
  listeners:
  - name: mine
    address: { socket_address: { address: 127.0.0.1, port_value: ${LISTEN_PORT} } }
    "@llmroute listener": merge
    filter_chains:
    - "@llmroute filter_chain": merge
      filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: mine
          "@llmroute connection_manager": merge
          route_config:
            virtual_hosts:
            - name: v
              domains: ["*"]
              routes:
              - "@llmroute failover_route"
              - { match: { prefix: /v1/ }, route: "@llmroute route" }
              - match: { prefix: /app/ }
                direct_response: { status: 200, body: { inline_string: app } }
                "@llmroute other_routes": merge
          http_filters: ["@llmroute http_filters", { name: envoy.filters.http.router, typed_config: { "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router } }]
  clusters: ["@llmroute backend_clusters", "@llmroute clusters"]
  secrets: ["@llmroute secrets"]
"#;

/// Without `other_routes` on it, another application's route is the filter's too: an unknown path gets the
/// filter's JSON 404 and the application never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_other_routes_the_filter_takes_another_apps_route() {
    let a = Fleet::start("llama-a", 3).await.unwrap();
    let b = Fleet::start("llama-b", 1).await.unwrap();
    let envoy = start_handwritten(&a, &b, |sections| {
        sections.as_object_mut().unwrap().remove("other_routes");
    })
    .await;
    let r = client().get(envoy.url("/app/hello")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(
        r.headers().get("x-llmroute-error").and_then(|v| v.to_str().ok()),
        Some("unknown_url")
    );
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].is_string(), "{v}");
}

/// Every good fixture's sections, pasted into a bare listener (plus, for a discovered backend, the cluster the
/// notes say is defined elsewhere), make a config Envoy accepts.
#[test]
fn every_good_fixtures_pieces_pass_envoy_validate() {
    let envoy = envoy_binary();
    assert!(envoy.exists(), "{} is missing: run `make envoy`", envoy.display());
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for entry in std::fs::read_dir(repo_root().join("testdata/configs")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("good-") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let cfg = llmroute_core::load_document(&text).unwrap();
        let opts = RenderOptions::new(wasm_module().display().to_string());
        let sections = target::filter_document(&target::pieces(&cfg, &text, &opts).unwrap());
        let template = BARE
            .replace("${ADMIN_PORT}", &cfg.admin.port().to_string())
            .replace("${LISTEN_PORT}", &cfg.render_only.listen.port().to_string());
        let mut boot = paste::paste(&template, &sections).unwrap_or_else(|e| panic!("{name}: {e}"));
        let clusters = boot["static_resources"]["clusters"].as_array_mut().unwrap();
        let elsewhere: Vec<Value> = cfg
            .backends
            .iter()
            .filter(|b| !clusters.iter().any(|c| c["name"] == b.name.as_str()))
            .map(|b| json!({ "name": b.name, "type": "STATIC", "connect_timeout": "1s" }))
            .collect();
        clusters.extend(elsewhere);
        let file = dir.path().join(format!("{name}.json"));
        std::fs::write(&file, boot.to_string()).unwrap();
        // Backend tokens, the API keys and the placement store's etcd password come from Envoy's environment; the
        // filter refuses to start without its keys or that password, so give it placeholders.
        let mut vars: Vec<(String, String)> = cfg
            .backends
            .iter()
            .filter_map(|b| b.credential_env.clone())
            .map(|v| (v, "placeholder".to_string()))
            .collect();
        if let Some(auth) = &cfg.auth {
            vars.push((auth.keys_env.clone(), "validate:placeholder-token".to_string()));
        }
        let store_auth = cfg.affinity.placement_store.as_ref().and_then(|s| s.auth.as_ref());
        vars.extend(store_auth.map(|a| (a.password_env.clone(), "placeholder".to_string())));
        // Paths in the fixtures (a CA file) are relative to the repository, as `make validate-configs` runs them.
        let out = std::process::Command::new(&envoy)
            .current_dir(repo_root())
            .args(["--mode", "validate", "-c"])
            .arg(&file)
            .envs(vars)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: envoy --mode validate refused the pasted sections:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 5, "only {checked} good fixtures");
}

/// One chat request for `alias` carrying the header `(name, value)`: its status, `x-llmroute-affinity-source` and
/// echoed `x-multi-turn-session-id` ("" when absent).
async fn keyed(c: &reqwest::Client, envoy: &Envoy, alias: &str, header: (&str, &str)) -> (u16, String, String) {
    let body = chat_for(alias, "probe").to_string();
    let r = post_json(c, envoy.url("/v1/chat/completions"), body, &[header]).await;
    let h = |n: &str| r.header(n).unwrap_or_default().to_string();
    (r.status, h("x-llmroute-affinity-source"), h("x-multi-turn-session-id"))
}

struct Outcome {
    status: u16,
    backend: String,
    source: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ecds_pushes_apply_under_load_and_a_bad_push_is_refused() {
    let a = Fleet::start("llama-a", 3).await.unwrap();
    let b = Fleet::start("llama-b", 1).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ecds_path = dir.path().join("llmroute-ecds.yaml");
    let opts = RenderOptions::new(wasm_module().display().to_string()).with_ecds(ecds_path.display().to_string());
    let base = |admin: u16| {
        let mut doc = llmroute_config(&a, &b, admin);
        doc["models"] =
            json!([{ "name": "local-chat", "routes": [{ "backend": "llama-a", "upstream_model": "model-v1" }] }]);
        doc
    };
    let (envoy, admin) = start_ecds(&ecds_path, &opts, &base).await;
    assert!(envoy.bootstrap_yaml().contains("config_discovery"));
    let c = client();

    // Steady load: 4 workers, local-chat with a session header, until told to stop (at most 3000 requests: alone,
    // the whole test takes about 660, and a busy machine stretches every wait on a push).
    let stop = Arc::new(AtomicBool::new(false));
    let results: Arc<Mutex<Vec<Outcome>>> = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (stop, results, c, url) = (
            stop.clone(),
            results.clone(),
            c.clone(),
            envoy.url("/v1/chat/completions"),
        );
        workers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) && results.lock().unwrap().len() < 3000 {
                let body = chat_for("local-chat", &format!("load {w} {i}"));
                let resp = c
                    .post(&url)
                    .header("content-type", "application/json")
                    .header("x-session-id", format!("s{}", i % 5))
                    .body(body.to_string())
                    .send()
                    .await;
                let outcome = match resp {
                    Ok(r) => {
                        let h = |n: &str| {
                            r.headers()
                                .get(n)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_string()
                        };
                        let o = Outcome {
                            status: r.status().as_u16(),
                            backend: h("x-emu-backend"),
                            source: h("x-llmroute-affinity-source"),
                        };
                        let _ = r.bytes().await;
                        o
                    }
                    Err(e) => Outcome {
                        status: 0,
                        backend: e.to_string(),
                        source: String::new(),
                    },
                };
                results.lock().unwrap().push(outcome);
                i += 1;
            }
        }));
    }
    let done = || results.lock().unwrap().len();
    let wait_more = |n: usize| {
        let target = done() + n;
        let results = results.clone();
        async move {
            wait_for(Duration::from_secs(30), || {
                let r = results.clone();
                async move { r.lock().unwrap().len() >= target }
            })
            .await
            .expect("the load keeps flowing");
        }
    };
    wait_more(40).await;
    assert!(a.engines.iter().any(|e| !e.chat_requests().is_empty()));
    // The model names the engines got since their last reset.
    let models_seen = |fleet: &Fleet| -> Vec<String> {
        let mut all = Vec::new();
        for e in &fleet.engines {
            for r in e.chat_requests() {
                let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                all.push(v["model"].as_str().unwrap_or_default().to_string());
            }
        }
        all
    };
    let before = models_seen(&a);
    assert!(
        before.len() >= 30 && before.iter().all(|m| m == "model-v1"),
        "{before:?}"
    );

    // (a) A new upstream model and a new alias.
    let mut doc_a = base(admin);
    doc_a["models"] = json!([
        { "name": "local-chat", "routes": [{ "backend": "llama-a", "upstream_model": "model-v2" }] },
        { "name": "new-chat", "routes": [{ "backend": "llama-b", "upstream_model": "b-new" }] },
    ]);
    push(
        &ecds_path,
        &ecds::discovery_response(&doc_a.to_string(), &opts).unwrap(),
    );
    let took = wait_for(Duration::from_secs(15), || {
        let c = c.clone();
        let envoy = &envoy;
        async move { post(&c, envoy, &chat_for("new-chat", "new alias"), &[]).await.1 == "llama-b-0" }
    })
    .await;
    assert!(took.is_some(), "the new alias never took effect");
    assert_eq!(last_model(&b.engines[0]), "b-new");
    // Every worker has the new config well before 40 more requests are done; then only the new model is sent.
    wait_more(40).await;
    a.reset();
    wait_more(60).await;
    let after = models_seen(&a);
    assert!(after.len() >= 40 && after.iter().all(|m| m == "model-v2"), "{after:?}");

    // (b) Affinity: the session header changes, so x-session-id no longer keys affinity.
    let mut doc_b = doc_a.clone();
    doc_b["affinity"] = json!({ "session_headers": ["x-tenant"], "user_prefix_bytes": 256 });
    let last_sources = |n: usize| -> Vec<String> {
        let r = results.lock().unwrap();
        r.iter().rev().take(n).map(|o| o.source.clone()).collect()
    };
    assert_eq!(last_sources(20), vec!["session".to_string(); 20]);
    push(
        &ecds_path,
        &ecds::discovery_response(&doc_b.to_string(), &opts).unwrap(),
    );
    let took = wait_for(Duration::from_secs(15), || async {
        keyed(&c, &envoy, "local-chat", ("x-session-id", "probe")).await.1 == "user-prefix"
    })
    .await;
    assert!(took.is_some(), "the new affinity settings never took effect");
    wait_more(60).await;
    assert_eq!(last_sources(30), vec!["user-prefix".to_string(); 30]);
    a.reset();
    let accepted = ecds_stat(&envoy, "update_success").await;
    assert_eq!(accepted, Some(3), "the first config and two pushes");
    let version_b = ecds::discovery_response(&doc_b.to_string(), &opts).unwrap()["version_info"].clone();

    // (c) A push that fails validation (raw text, past our CLI): refused, and the old config stays. It also holds a
    // field only the renderer reads, as a whole llmroute.yaml would: the filter names it and what to give it instead.
    let mut bad = doc_b.clone();
    bad["models"][1]["routes"][0]["backend"] = Value::from("llama-zz");
    bad["compress_responses"] = Value::from(true);
    let raw = ecds::discovery_response_raw(&bad.to_string(), &opts).unwrap();
    push(&ecds_path, &raw);
    let refused = wait_for(Duration::from_secs(15), || async {
        ecds_stat(&envoy, "config_fail").await.unwrap_or(0) >= 1
    })
    .await;
    assert!(
        refused.is_some(),
        "no config_fail: {:?}",
        reqwest::get(envoy.admin_url("/stats?filter=extension_config_discovery"))
            .await
            .unwrap()
            .text()
            .await
    );
    assert_eq!(ecds_stat(&envoy, "update_rejected").await, Some(1));
    assert_eq!(
        ecds_stat(&envoy, "update_success").await,
        accepted,
        "the refused push is not a success"
    );
    let stats = reqwest::get(envoy.admin_url("/stats?filter=extension_config_discovery"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        stats.contains(&format!(
            "extension_config_discovery.http_filter.llmroute.version_text: {version_b}"
        )),
        "the version in force is still the last good one ({version_b}):\n{stats}"
    );
    wait_more(60).await;
    assert_eq!(
        last_sources(30),
        vec!["user-prefix".to_string(); 30],
        "the old config stays"
    );
    let kept = models_seen(&a);
    assert!(kept.len() >= 40 && kept.iter().all(|m| m == "model-v2"), "{kept:?}");
    let (status, backend, _) = post(&c, &envoy, &chat_for("new-chat", "still here"), &[]).await;
    assert_eq!((status, backend.as_str()), (200, "llama-b-0"));
    let log_has = wait_for(Duration::from_secs(5), || {
        let log = envoy.log();
        async move {
            log.contains("llmroute config:")
                && log.contains("llama-zz")
                && log.contains("compress_responses: only `llmroute render` reads this field")
                && log.contains("`llmroute render --target filter`")
        }
    })
    .await;
    assert!(
        log_has.is_some(),
        "the filter logs why it refused the push:\n{}",
        envoy.log()
    );

    // (d) One alias' own routing method: local-chat reads x-session-id again for itself, while the top-level
    // list stays x-tenant; the next requests follow it, and none fails.
    let mut doc_d = doc_b.clone();
    doc_d["models"][0]["affinity"] = json!({ "session_headers": ["x-session-id"] });
    push(
        &ecds_path,
        &ecds::discovery_response(&doc_d.to_string(), &opts).unwrap(),
    );
    let took = wait_for(Duration::from_secs(15), || async {
        let (_, source, echo) = keyed(&c, &envoy, "local-chat", ("x-session-id", "probe-d")).await;
        source == "session" && echo == "probe-d"
    })
    .await;
    assert!(took.is_some(), "the alias' own session headers never took effect");
    assert_eq!(ecds_stat(&envoy, "update_success").await, accepted.map(|n| n + 1));
    wait_more(60).await;
    assert_eq!(last_sources(30), vec!["session".to_string(); 30]);
    // new-chat has no affinity of its own: the top-level x-tenant still keys it, x-session-id does not.
    for (header, want) in [("x-session-id", "user-prefix"), ("x-tenant", "session")] {
        let (status, source, _) = keyed(&c, &envoy, "new-chat", (header, "t-1")).await;
        assert_eq!((status, source.as_str()), (200, want), "{header}");
    }

    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    let results = results.lock().unwrap();
    let failed: Vec<String> = results
        .iter()
        .filter(|o| o.status != 200)
        .map(|o| format!("{} {}", o.status, o.backend))
        .collect();
    assert!(
        results.len() >= 300,
        "a bounded but real load: {} requests",
        results.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}",
        failed.len(),
        results.len()
    );
    assert!(results.iter().all(|o| o.backend.starts_with("llama-a-")));
}
