//! Observability through the real filter in a real Envoy, read by a real Prometheus: a known scenario (routed
//! requests over two aliases, some streamed, one stream cut, refusals, cached tokens reported by the engine),
//! then PromQL over Envoy's `/stats/prometheus` must return exactly what the scenario implies; every metric the
//! shipped Grafana dashboard queries must exist in that scrape; and the JSON access log must hold one line per
//! request with the routing fields, and no prompt text or credential.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::StreamExt;
use llmroute_harness::envoy::{random_ports, repo_root, Envoy};
use llmroute_harness::fleet::Fleet;
use serde_json::{json, Value};

use crate::support::*;

const A: &str = "alias-a";
const B: &str = "alias-b";
const SECRET: &str = "sk-observability-secret-0123456789";

/// A Prometheus that scrapes Envoy's admin every second, on a random port, killed on drop.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
    log: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The native build's filter metrics carry Envoy's `envoy_dynamicmodulescustom_` prefix on `/stats/prometheus`;
/// this scrape rule takes it off, so that one set of queries serves both builds (docs/native.md).
const NATIVE_RELABEL: &str = "    metric_relabel_configs:\n      - { source_labels: [__name__], regex: 'envoy_dynamicmodulescustom_(.*)', target_label: __name__, replacement: '$1' }\n";

impl Prometheus {
    async fn start(target: std::net::SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\nscrape_configs:\n  - job_name: envoy\n    metrics_path: /stats/prometheus\n    static_configs: [{{ targets: ['{target}'] }}]\n{NATIVE_RELABEL}"
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        for attempt in 0..5 {
            let (port, _) = random_ports(attempt + 7);
            let log = dir.path().join(format!("prometheus-{attempt}.log"));
            let mut child = Command::new("prometheus")
                .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
                .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("prometheus is not installed: run `make prometheus`");
            let url = format!("http://127.0.0.1:{port}");
            let ready = wait_for(Duration::from_secs(20), || async {
                let ok = client().get(format!("{url}/-/ready")).send().await;
                ok.is_ok_and(|r| r.status().is_success())
            })
            .await;
            if ready.is_some() {
                return Prometheus {
                    child,
                    url,
                    _dir: dir,
                    log,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                text.contains("address already in use"),
                "prometheus did not start:\n{text}"
            );
        }
        panic!("prometheus could not bind a port after 5 attempts");
    }

    /// The result vector of an instant query, as `(labels, value)`.
    async fn query(&self, q: &str) -> Vec<(Value, f64)> {
        let encoded: String = q
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        let url = format!("{}/api/v1/query?query={encoded}", self.url);
        let resp = client().get(url).send().await;
        let Ok(resp) = resp else { return Vec::new() };
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        v["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|r| {
                let value = r["value"][1].as_str()?.parse().ok()?;
                Some((r["metric"].clone(), value))
            })
            .collect()
    }

    /// The single value of a query that sums to one series; `None` when empty.
    async fn scalar(&self, q: &str) -> Option<f64> {
        self.query(q).await.first().map(|(_, v)| *v)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// What one request's response reported as usage: (prompt, completion, cached).
fn usage(body: &Value) -> (u64, u64, u64) {
    let u = &body["usage"];
    let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    (
        n("/prompt_tokens"),
        n("/completion_tokens"),
        n("/prompt_tokens_details/cached_tokens"),
    )
}

async fn stream(envoy: &Envoy, alias: &str, user: &str, headers: &[(&str, &str)]) -> bool {
    let body = json!({"model": alias, "messages": [{"role": "user", "content": user}], "stream": true});
    let mut req = client()
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {SECRET}"))
        .body(body.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut s = resp.bytes_stream();
    while let Some(chunk) = s.next().await {
        if chunk.is_err() {
            return true;
        }
    }
    false
}

fn dashboard_metrics(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    collect_exprs(&v, &mut exprs);
    assert!(exprs.len() >= 5, "the dashboard has too few queries: {exprs:?}");
    let mut names: Vec<String> = exprs
        .iter()
        .flat_map(|e| {
            let mut out = Vec::new();
            let b = e.as_bytes();
            let mut i = 0;
            while let Some(off) = e[i..].find("llmroute_") {
                let start = i + off;
                let mut end = start;
                while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
                    end += 1;
                }
                let before = start.checked_sub(1).map(|j| b[j]);
                if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b':') {
                    out.push(e[start..end].to_string());
                }
                i = end;
            }
            out
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

fn collect_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", Value::String(s)) => out.push(s.clone()),
                    _ => collect_exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_exprs(x, out)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_sees_what_the_scenario_implies_and_the_access_log_has_a_line_per_request() {
    let fleet = Fleet::start("llama-a", 2).await.unwrap();
    let logs = tempfile::tempdir().unwrap();
    let access = logs.path().join("access.json");
    let config = json!({
        "version": 1,
        "backends": [fleet.backend_entry(150)],
        "models": [
            {"name": A, "routes": [{"backend": "llama-a"}]},
            {"name": B, "routes": [{"backend": "llama-a"}]},
        ],
        "retries": {"attempts": 0},
        "access_log": {"path": access.display().to_string()},
    });
    let envoy = Envoy::start(config).await.unwrap();
    let c = client();
    let auth = format!("Bearer {SECRET}");
    let hdrs = [("authorization", auth.as_str())];

    // Alias A: 4 plain requests sharing a long system prompt, so the engine reports cached tokens on repeats.
    let system = "You are a careful assistant who answers briefly. ".repeat(30);
    let mut want = (0, 0, 0);
    for i in 0..4 {
        let mut body = chat(Some(&system), &format!("observability prompt text {i}"));
        body["model"] = json!(A);
        let (status, _, resp) = post(&c, &envoy, &body, &hdrs).await;
        assert_eq!(status, 200, "{resp}");
        let (p, o, k) = usage(&resp);
        want = (want.0 + p, want.1 + o, want.2 + k);
    }
    assert!(want.2 > 0, "the emulator reported no cached tokens");
    // Alias B: 3 complete streams and 1 the engine cuts.
    for i in 0..3 {
        assert!(!stream(&envoy, B, &format!("observability prompt text s{i}"), &[]).await);
    }
    assert!(stream(&envoy, B, "observability prompt text cut", &[("x-emu-cut-mid", "1")]).await);
    // 3 refusals: two unknown models, one body that is not JSON.
    for _ in 0..2 {
        let body =
            json!({"model": "no-such-model", "messages": [{"role": "user", "content": "observability prompt text r"}]});
        let (status, _, _) = post(&c, &envoy, &body, &hdrs).await;
        assert_eq!(status, 404);
    }
    let resp = c
        .post(envoy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);

    let prom = Prometheus::start(envoy.admin).await;
    let checks: Vec<(String, f64)> = vec![
        (
            format!("sum(llmroute_requests_total{{alias=\"{A}\",code_class=\"2xx\",api=\"chat\"}})"),
            4.0,
        ),
        (
            format!("sum(llmroute_requests_total{{alias=\"{B}\",backend=\"llama-a\"}})"),
            4.0,
        ),
        ("sum(llmroute_rejections_total{reason=\"model_not_found\"})".into(), 2.0),
        ("sum(llmroute_rejections_total)".into(), 3.0),
        ("sum(llmroute_stream_outcomes_total{outcome=\"complete\"})".into(), 3.0),
        (
            "sum(llmroute_stream_outcomes_total{outcome=\"upstream_cut\"})".into(),
            1.0,
        ),
        (
            format!("sum(llmroute_tokens_total{{alias=\"{A}\",kind=\"input\"}})"),
            want.0 as f64,
        ),
        (
            format!("sum(llmroute_tokens_total{{alias=\"{A}\",kind=\"output\"}})"),
            want.1 as f64,
        ),
        (
            format!("sum(llmroute_tokens_total{{alias=\"{A}\",kind=\"cached\"}})"),
            want.2 as f64,
        ),
        (
            format!("sum(llmroute_request_prompt_tokens_count{{alias=\"{A}\"}})"),
            4.0,
        ),
        ("sum(llmroute_request_duration_milliseconds_count)".into(), 8.0),
        ("sum(llmroute_time_to_first_byte_milliseconds_count)".into(), 8.0),
        (
            format!("sum(llmroute_time_to_first_byte_milliseconds_count{{alias=\"{B}\"}})"),
            4.0,
        ),
        // Envoy keeps histogram sums in log-linear bins, so `_sum` is exact only to about 1%.
        (
            format!(
                "round(sum(llmroute_request_prompt_tokens_sum{{alias=\"{A}\"}}) / {} * 50)",
                want.0
            ),
            50.0,
        ),
    ];
    // Histograms reach the admin output at Envoy's stats flush (5 s), so poll, within a bound.
    let all_there = wait_for(Duration::from_secs(40), || async {
        for (q, v) in &checks {
            if prom.scalar(q).await != Some(*v) {
                return false;
            }
        }
        true
    })
    .await;
    if all_there.is_none() {
        let mut report = String::new();
        for (q, v) in &checks {
            report += &format!("{q}: want {v}, got {:?}\n", prom.scalar(q).await);
        }
        panic!(
            "PromQL disagrees with the scenario:\n{report}\nprometheus log:\n{}\nenvoy log:\n{}",
            prom.log(),
            envoy.log()
        );
    }
    // The labels are closed: no series carries prompt text, the model a client made up, or a credential.
    let series = prom.query("{__name__=~\"llmroute_.+\"}").await;
    let labels = serde_json::to_string(&series.iter().map(|(l, _)| l).collect::<Vec<_>>()).unwrap();
    for leak in ["observability prompt", "no-such-model", SECRET] {
        assert!(!labels.contains(leak), "{leak} leaked into a label: {labels}");
    }

    // Every metric the shipped dashboard queries exists in the live scrape.
    let names = dashboard_metrics(&repo_root().join("envoy/grafana/llmroute.json"));
    for expected in [
        "llmroute_requests_total",
        "llmroute_time_to_first_byte_milliseconds_bucket",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not found in the dashboard: {names:?}"
        );
    }
    for name in &names {
        let found = prom.query(&format!("count({{__name__=\"{name}\"}})")).await;
        assert!(
            !found.is_empty(),
            "the dashboard queries {name}, which the scrape lacks"
        );
    }

    // The access log: one JSON line per request (8 routed, 3 refused), flushed by Envoy within a second or so.
    let lines = || {
        std::fs::read_to_string(&access)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let flushed = wait_for(Duration::from_secs(15), || async { lines().len() >= 11 }).await;
    assert!(
        flushed.is_some(),
        "access log:\n{}\n{}",
        lines().join("\n"),
        envoy.log()
    );
    let text = lines().join("\n");
    assert_eq!(lines().len(), 11, "{text}");
    for leak in ["observability prompt", SECRET, "careful assistant"] {
        assert!(!text.contains(leak), "{leak} in the access log:\n{text}");
    }
    let entries: Vec<Value> = lines().iter().map(|l| serde_json::from_str(l).unwrap()).collect();
    let routed: Vec<&Value> = entries
        .iter()
        .filter(|e| e["gen_ai.request.model"].is_string())
        .collect();
    assert_eq!(routed.len(), 8, "{text}");
    for e in &routed {
        assert_eq!(e["llmroute.backend"], "llama-a", "{e}");
        assert!(e["request_id"].as_str().is_some_and(|s| !s.is_empty()), "{e}");
        let host = e["llmroute.upstream_host"].as_str().unwrap_or_default();
        assert!(fleet.endpoints().iter().any(|ep| ep == host), "{e}");
        assert_eq!(e["http.response.status_code"], 200, "{e}");
        assert!(e["llmroute.affinity_source"].is_string(), "{e}");
        assert!(e["llmroute.time_to_first_byte_ms"].is_number(), "{e}");
    }
    let of = |alias: &'static str| routed.iter().filter(move |e| e["gen_ai.request.model"] == alias);
    let sum = |field: &str| -> u64 {
        of(A)
            .map(|e| e[field].as_str().and_then(|s| s.parse::<u64>().ok()).unwrap_or(0))
            .sum()
    };
    assert_eq!(
        (
            sum("gen_ai.usage.input_tokens"),
            sum("gen_ai.usage.output_tokens"),
            sum("llmroute.usage.cached_tokens")
        ),
        want,
        "{text}"
    );
    let mut outcomes: Vec<&str> = of(B).filter_map(|e| e["llmroute.stream_outcome"].as_str()).collect();
    outcomes.sort();
    assert_eq!(outcomes, ["complete", "complete", "complete", "upstream_cut"], "{text}");
    let refused: Vec<&Value> = entries.iter().filter(|e| e["gen_ai.request.model"].is_null()).collect();
    let mut codes: Vec<u64> = refused
        .iter()
        .filter_map(|e| e["http.response.status_code"].as_u64())
        .collect();
    codes.sort();
    assert_eq!(codes, [400, 404, 404], "{text}");
    let mut errors: Vec<&str> = refused.iter().filter_map(|e| e["llmroute.error"].as_str()).collect();
    errors.sort();
    assert_eq!(errors, ["invalid_json", "model_not_found", "model_not_found"], "{text}");
}
