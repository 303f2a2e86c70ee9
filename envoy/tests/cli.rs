//! The `llmroute` binary, driven as an operator would: `validate` and `render` on the fixtures in
//! `testdata/configs/`.
//!
//! - `good-*` fixtures validate with a one-line summary and render to a bootstrap that parses as YAML;
//! - `bad-*` fixtures exit 1, and stderr holds every substring of their first line, `# expect: A && B`.
//!
//! Envoy itself is not run here: `scripts/validate-configs.sh` feeds the renders to `envoy --mode validate`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use llmroute_core::config::EnvHolds;
use serde_json::Value;

const WASM: &str = "/opt/llmroute/llmroute_filter.wasm";

fn configs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/configs")
        .canonicalize()
        .expect("testdata/configs exists")
}

fn fixture(name: &str) -> PathBuf {
    configs_dir().join(name)
}

/// Every fixture whose file name starts with `prefix`, sorted by name.
fn fixtures(prefix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(configs_dir())
        .expect("testdata/configs is readable")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| file_name(p).starts_with(prefix))
        .collect();
    found.sort();
    assert!(
        !found.is_empty(),
        "no {prefix}* fixtures in {}",
        configs_dir().display()
    );
    found
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}

fn llmroute<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    Command::new(env!("CARGO_BIN_EXE_llmroute"))
        .args(args)
        .output()
        .expect("the llmroute binary runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("stdout is UTF-8")
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("stderr is UTF-8")
}

/// The `llmroute` command with every variable the config at `path` names (`auth.keys_env`,
/// `backends[].credential_env`) set to a value the filter accepts, as Envoy's environment would hold them.
fn command_for(path: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_llmroute"));
    let text = std::fs::read_to_string(path).unwrap_or_default();
    if let Ok(cfg) = llmroute_core::load_document(&text) {
        for v in cfg.env_vars() {
            cmd.env(v.name, placeholder(v.holds));
        }
    }
    cmd
}

fn placeholder(holds: EnvHolds) -> &'static str {
    match holds {
        EnvHolds::ApiKeys => "cli-test:cli-test-placeholder-token",
        EnvHolds::BearerToken => "cli-test-placeholder-token",
    }
}

fn validate(path: &Path) -> Output {
    command_for(path)
        .arg("validate")
        .arg(path)
        .output()
        .expect("the llmroute binary runs")
}

/// `llmroute render PATH --wasm WASM [-o OUTPUT]`.
fn render(path: &Path, output: Option<&Path>) -> Output {
    let mut cmd = command_for(path);
    cmd.arg("render").arg(path).args(["--wasm", WASM]);
    if let Some(o) = output {
        cmd.arg("-o").arg(o);
    }
    cmd.output().expect("the llmroute binary runs")
}

/// The substrings a bad fixture's first line, `# expect: A && B`, says the error output must hold.
fn expectations(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let first = text.lines().next().unwrap_or_default();
    let list = first
        .strip_prefix("# expect: ")
        .unwrap_or_else(|| panic!("{}: first line must be `# expect: ...`, not {first:?}", path.display()));
    let subs: Vec<String> = list.split(" && ").map(str::to_string).collect();
    assert!(
        subs.iter().all(|s| !s.trim().is_empty()),
        "{}: empty substring in {first:?}",
        path.display()
    );
    subs
}

/// The error lines of a rejected config: stderr is `PATH: N error(s):` then one indented line per error.
/// Checks the header's count against the lines that follow.
fn error_lines(path: &Path, err: &str) -> Vec<String> {
    let mut lines = err.lines();
    let header = lines.next().unwrap_or_default();
    let prefix = format!("{}: ", path.display());
    let count: usize = header
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix(" error(s):"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line of stderr: {header:?}\n{err}"));
    let errors: Vec<String> = lines
        .map(|l| {
            l.strip_prefix("  ")
                .unwrap_or_else(|| panic!("error line not indented: {l:?}"))
                .to_string()
        })
        .collect();
    assert_eq!(errors.len(), count, "header says {count} error(s):\n{err}");
    assert!(count >= 1, "a rejection lists at least one error:\n{err}");
    errors
}

/// The fixture as a JSON value (YAML or JSON text), to compare a render against what was written.
fn document(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::from_str(&text).unwrap()
}

/// The fixture as the filter is given it: without the fields only the renderer reads.
fn filter_document(path: &Path) -> Value {
    let mut doc = document(path);
    for field in ["listen", "compress_responses", "listen_tls", "retries", "access_log"] {
        doc.as_object_mut().unwrap().remove(field);
    }
    doc
}

/// Parses a rendered bootstrap: it must be YAML, and it is navigated as a JSON value.
fn parse_bootstrap(yaml: &str) -> Value {
    assert!(
        yaml.starts_with("# Rendered by `llmroute render`"),
        "render output starts with its header comment:\n{yaml}"
    );
    let _: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).expect("the render is YAML");
    serde_yaml_ng::from_str(yaml).expect("the render maps onto a JSON value")
}

fn hcm(bootstrap: &Value) -> &Value {
    &bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
}

/// The wasm filter's config: the first http filter but Envoy's compressor, which goes ahead of it when asked.
fn wasm_config(bootstrap: &Value) -> &Value {
    let filters = hcm(bootstrap)["http_filters"].as_array().expect("http_filters");
    let wasm = filters
        .iter()
        .find(|f| f["name"] != "envoy.filters.http.compressor")
        .expect("a filter besides the compressor");
    &wasm["typed_config"]["config"]
}

/// Everything a bootstrap must hold for the config it came from.
fn check_bootstrap(path: &Path, yaml: &str) {
    let name = file_name(path);
    let doc = document(path);
    let v = parse_bootstrap(yaml);

    // The textual forms an operator would grep for.
    for needle in [
        "allow_on_headers_stop_iteration: true",
        "cluster_header: x-llmroute-cluster",
        "header_name: x-llmroute-affinity",
    ] {
        assert!(yaml.contains(needle), "{name}: render lacks `{needle}`:\n{yaml}");
    }

    // One cluster per backend, same names, same order, each with its own load assignment, or fed by EDS from
    // its file; a discovered backend without an EDS file is defined outside the bootstrap and left out.
    let want: Vec<&str> = doc["backends"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b.get("discovery").is_none_or(|d| d.get("eds_path").is_some()))
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    let clusters = backend_clusters(&v);
    let got: Vec<&str> = clusters.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(got, want, "{name}: cluster names");
    for c in clusters {
        match c["type"].as_str() {
            Some("EDS") => assert!(c["eds_cluster_config"]["eds_config"]["path_config_source"]["path"].is_string()),
            _ => assert_eq!(c["load_assignment"]["cluster_name"], c["name"], "{name}"),
        }
        let needle = format!("name: {}", c["name"].as_str().unwrap());
        assert!(yaml.contains(&needle), "{name}: render lacks `{needle}`");
    }

    // The route leaves the cluster choice to the filter and hashes on its affinity header.
    let route = &hcm(&v)["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
    assert_eq!(route["cluster_header"], "x-llmroute-cluster", "{name}");
    assert_eq!(
        route["hash_policy"][0]["header"]["header_name"], "x-llmroute-affinity",
        "{name}"
    );

    // The wasm filter pauses on headers, loads the module given on the command line, and embeds the config.
    let wasm = wasm_config(&v);
    assert_eq!(wasm["allow_on_headers_stop_iteration"], true, "{name}");
    assert_eq!(wasm["vm_config"]["code"]["local"]["filename"], WASM, "{name}");
    let embedded = wasm["configuration"]["value"].as_str().expect("embedded config");
    let embedded: Value = serde_json::from_str(embedded).expect("the embedded config is JSON");
    assert_eq!(
        embedded,
        filter_document(path),
        "{name}: the embedded config is the document as written, less the renderer's fields"
    );
    // With bounded-keys placement (top-level or an alias' own), Envoy's stateful-session filter reads the filter's host choice; it must sit
    // between the wasm filter and the router.
    let names: Vec<&str> = hcm(&v)["http_filters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    // The top-level placement, or any alias' own (`models[].affinity.placement`).
    let alias_bounded = doc["models"]
        .as_array()
        .is_some_and(|ms| ms.iter().any(|m| m["affinity"]["placement"] == "bounded_keys"));
    let bounded = doc["affinity"]["placement"] == "bounded_keys" || alias_bounded;
    // With `compress_responses`, Envoy's compressor goes first, so it compresses what the wasm filter relayed.
    let compress = doc["compress_responses"] == true;
    let mut want: Vec<&str> = Vec::new();
    if compress {
        want.push("envoy.filters.http.compressor");
    }
    want.push("llmroute");
    // With `global_limits`, Envoy's rate-limit filter reads the descriptor headers the wasm filter sets.
    let global = doc.get("global_limits").is_some();
    if global {
        want.push("envoy.filters.http.ratelimit");
    }
    if bounded {
        want.push("envoy.filters.http.stateful_session");
    }
    want.push("envoy.filters.http.router");
    assert_eq!(names, want, "{name}");
    if bounded {
        let at = usize::from(compress) + usize::from(global) + 1;
        let state = &hcm(&v)["http_filters"][at]["typed_config"]["session_state"]["typed_config"];
        assert_eq!(state["name"], "x-llmroute-endpoint", "{name}");
    }
}

#[test]
fn validate_accepts_every_good_fixture_with_a_one_line_summary() {
    for path in fixtures("good-") {
        let out = validate(&path);
        let (so, se) = (stdout(&out), stderr(&out));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}:\nstdout: {so}\nstderr: {se}",
            path.display()
        );
        assert_eq!(so.lines().count(), 1, "one summary line:\n{so}");
        assert_only_expected_warnings(&path, &se);
        let prefix = format!("{}: ok: ", path.display());
        assert!(so.starts_with(&prefix), "summary starts with {prefix:?}: {so}");
        for part in ["backend(s)", "endpoint(s)", "model alias(es)", "; listen ", ", admin "] {
            assert!(so.contains(part), "summary lacks {part:?}: {so}");
        }
    }
}

#[test]
fn validate_summaries_count_what_the_fixtures_define() {
    for (name, counts) in [
        (
            "good-basic.yaml",
            "1 backend(s), 3 endpoint(s), 1 model alias(es); listen 127.0.0.1:10000, admin 127.0.0.1:9901",
        ),
        (
            "good-basic.json",
            "1 backend(s), 3 endpoint(s), 1 model alias(es); listen 127.0.0.1:10000, admin 127.0.0.1:9901",
        ),
        (
            "good-minimal.yaml",
            "1 backend(s), 1 endpoint(s), 1 model alias(es); listen 127.0.0.1:10000, admin 127.0.0.1:9901",
        ),
        (
            "good-multi.yaml",
            "3 backend(s), 5 endpoint(s), 2 model alias(es); listen 127.0.0.1:10000, admin 127.0.0.1:9901",
        ),
    ] {
        let path = fixture(name);
        let out = validate(&path);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        assert_eq!(stdout(&out).trim_end(), format!("{}: ok: {counts}", path.display()));
    }
}

#[test]
fn validate_rejects_every_bad_fixture_with_the_expected_errors() {
    let mut failures = Vec::new();
    for path in fixtures("bad-") {
        let name = file_name(&path);
        let expect = expectations(&path);
        let out = validate(&path);
        let (so, se) = (stdout(&out), stderr(&out));
        if out.status.code() != Some(1) {
            failures.push(format!(
                "{name}: exit {:?}, expected 1\nstdout: {so}\nstderr: {se}",
                out.status.code()
            ));
            continue;
        }
        assert!(so.is_empty(), "{name}: nothing on stdout when rejected: {so}");
        error_lines(&path, &se);
        let missing: Vec<&String> = expect.iter().filter(|s| !se.contains(s.as_str())).collect();
        if !missing.is_empty() {
            failures.push(format!("{name}: stderr lacks {missing:?}\n{se}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn bad_many_lists_every_error_not_just_the_first() {
    let path = fixture("bad-many.yaml");
    let expect = expectations(&path);
    assert!(expect.len() >= 3, "bad-many.yaml should expect several errors");
    let out = validate(&path);
    assert_eq!(out.status.code(), Some(1));
    let errors = error_lines(&path, &stderr(&out));
    assert!(
        errors.len() >= expect.len(),
        "{} independent mistakes, {} error line(s):\n{}",
        expect.len(),
        errors.len(),
        errors.join("\n")
    );
    // Each expected error is its own line, in document order.
    let mut last = None;
    for s in &expect {
        let at = errors
            .iter()
            .position(|e| e.contains(s.as_str()))
            .unwrap_or_else(|| panic!("no error line holds {s:?}:\n{}", errors.join("\n")));
        if let Some(l) = last {
            assert!(at > l, "{s:?} is out of document order:\n{}", errors.join("\n"));
        }
        last = Some(at);
    }
}

#[test]
fn render_to_stdout_gives_a_complete_bootstrap_for_every_good_fixture() {
    for path in fixtures("good-") {
        let out = render(&path, None);
        let (so, se) = (stdout(&out), stderr(&out));
        assert_eq!(out.status.code(), Some(0), "{}: {se}", path.display());
        assert_only_expected_warnings(&path, &se);
        check_bootstrap(&path, &so);
    }
}

#[test]
fn render_to_a_file_writes_what_stdout_would_show() {
    let dir = tempfile::tempdir().unwrap();
    for path in fixtures("good-") {
        let file = dir.path().join(format!("{}.envoy.yaml", file_name(&path)));
        let out = render(&path, Some(&file));
        assert_eq!(out.status.code(), Some(0), "{}: {}", path.display(), stderr(&out));
        assert!(out.stdout.is_empty(), "nothing on stdout with -o: {}", stdout(&out));
        let written = std::fs::read_to_string(&file).expect("-o wrote the file");
        check_bootstrap(&path, &written);

        let to_stdout = render(&path, None);
        assert_eq!(written, stdout(&to_stdout), "{}: -o and stdout differ", path.display());
    }
}

/// The clusters rendered for backends, without the gateway's own (`llmroute_admin`, `llmroute-failover-N`).
fn backend_clusters(v: &Value) -> Vec<&Value> {
    let all = v["static_resources"]["clusters"].as_array().expect("clusters");
    all.iter()
        .filter(|c| !c["name"].as_str().unwrap().starts_with("llmroute"))
        .collect()
}

/// Stderr holds warnings only, exactly those the fixture's `# warn:` line names.
fn assert_only_expected_warnings(path: &Path, se: &str) {
    let expected = expected_warnings(path);
    assert_eq!(se.lines().count(), expected.len(), "{}: warnings: {se}", path.display());
    for w in expected {
        assert!(
            se.contains(&format!("warning: {w}")),
            "{}: missing warning {w}: {se}",
            path.display()
        );
    }
}

/// The warnings a good fixture's `# warn: A && B` line names, if any.
fn expected_warnings(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("# warn: "))
        .map(|w| w.split(" && ").map(str::to_string).collect())
        .unwrap_or_default()
}

#[test]
fn render_of_good_multi_keeps_each_backends_kind_and_policy() {
    let out = render(&fixture("good-multi.yaml"), None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = parse_bootstrap(&stdout(&out));
    let clusters = backend_clusters(&v);
    let summary: Vec<(&str, &str, &str)> = clusters
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap(),
                c["type"].as_str().unwrap(),
                c["load_balancing_policy"]["policies"][0]["typed_extension_config"]["name"]
                    .as_str()
                    .unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("llama-local", "STATIC", "envoy.load_balancing_policies.ring_hash"),
            ("vllm-pool", "STRICT_DNS", "envoy.load_balancing_policies.least_request"),
            ("ollama-v6", "STATIC", "envoy.load_balancing_policies.round_robin"),
        ]
    );
    let ring = &clusters[0]["load_balancing_policy"]["policies"][0]["typed_extension_config"]["typed_config"];
    assert_eq!(ring["consistent_hashing_lb_config"]["hash_balance_factor"], 125);
    let v6 =
        &clusters[2]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"];
    assert_eq!(
        (v6["address"].as_str(), v6["port_value"].as_u64()),
        (Some("::1"), Some(11434))
    );
    let dns =
        &clusters[1]["load_assignment"]["endpoints"][0]["lb_endpoints"][1]["endpoint"]["address"]["socket_address"];
    assert_eq!(dns["address"], "vllm-1.vllm.internal");
    assert_eq!(clusters[0]["connect_timeout"], "0.500s");

    let route = &hcm(&v)["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
    assert_eq!(route["timeout"], "300.000s");
    let buffer = v["static_resources"]["listeners"][0]["per_connection_buffer_limit_bytes"]
        .as_u64()
        .unwrap();
    assert!(
        buffer > 16_777_216,
        "the listener buffers more than the filter's body limit: {buffer}"
    );
}

#[test]
fn json_and_yaml_forms_of_the_same_document_render_the_same_bootstrap() {
    let rendered = |name: &str| {
        let out = render(&fixture(name), None);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        stdout(&out)
    };
    assert_eq!(
        document(&fixture("good-basic.json")),
        document(&fixture("good-basic.yaml"))
    );
    assert_eq!(rendered("good-basic.json"), rendered("good-basic.yaml"));
}

#[test]
fn render_of_a_bad_config_exits_1_and_writes_no_file() {
    let dir = tempfile::tempdir().unwrap();
    for path in fixtures("bad-") {
        let name = file_name(&path);
        let file = dir.path().join(format!("{name}.envoy.yaml"));
        let out = render(&path, Some(&file));
        let se = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{name}: {se}");
        assert!(
            !file.exists(),
            "{name}: render wrote {} for a rejected config",
            file.display()
        );
        assert!(out.stdout.is_empty(), "{name}: nothing on stdout: {}", stdout(&out));
        for s in expectations(&path) {
            assert!(se.contains(&s), "{name}: render's stderr lacks {s:?}:\n{se}");
        }
    }
}

#[test]
fn render_of_a_bad_config_to_stdout_prints_no_bootstrap() {
    let out = render(&fixture("bad-version.yaml"), None);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty(), "no partial bootstrap: {}", stdout(&out));
    assert!(stderr(&out).contains("version = 2: unsupported schema version"));
}

#[test]
fn a_missing_config_file_is_a_clear_error() {
    let path = fixture("does-not-exist.yaml");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("out.yaml");
    for out in [validate(&path), render(&path, Some(&file))] {
        let se = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{se}");
        assert!(out.stdout.is_empty());
        assert!(
            se.contains(&path.display().to_string()),
            "the error names the file: {se}"
        );
        assert!(se.contains("No such file or directory"), "the error says why: {se}");
        assert_eq!(se.lines().count(), 1, "one line: {se}");
    }
    assert!(!file.exists());
}

#[test]
fn usage_errors_exit_2() {
    for args in [vec!["validate"], vec!["render", "x.yaml"], vec!["frobnicate"]] {
        let out = llmroute(args.iter());
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(!stderr(&out).is_empty(), "{args:?}: clap explains the usage");
    }
}

/// `llmroute render PATH --wasm WASM ARGS...`, to stdout.
fn render_args(path: &Path, args: &[&str]) -> Output {
    let mut cmd = command_for(path);
    cmd.arg("render").arg(path).args(["--wasm", WASM]).args(args);
    cmd.output().expect("the llmroute binary runs")
}

fn parse_yaml(out: &Output) -> Value {
    assert!(out.status.success(), "render failed: {}", stderr(out));
    serde_yaml_ng::from_str(&stdout(out)).expect("the render is YAML")
}

#[test]
fn target_envoy_is_the_default() {
    let path = fixture("good-multi.yaml");
    let plain = render_args(&path, &[]);
    let explicit = render_args(&path, &["--target", "envoy"]);
    assert!(plain.status.success() && explicit.status.success());
    assert_eq!(stdout(&plain), stdout(&explicit));
}

#[test]
fn target_filter_prints_the_pieces_the_bootstrap_is_made_of() {
    for path in fixtures("good-") {
        let name = file_name(&path);
        let pieces = parse_yaml(&render_args(&path, &["--target", "filter"]));
        let boot = parse_bootstrap(&stdout(&render_args(&path, &[])));
        let filters = hcm(&boot)["http_filters"].as_array().unwrap();
        let (before_router, router) = filters.split_at(filters.len() - 1);
        assert_eq!(router[0]["name"], "envoy.filters.http.router", "{name}");
        assert_eq!(pieces["http_filters"], Value::from(before_router.to_vec()), "{name}");
        let routes = hcm(&boot)["route_config"]["virtual_hosts"][0]["routes"]
            .as_array()
            .unwrap();
        assert_eq!(routes.last().unwrap()["route"], pieces["route"], "{name}");
        match pieces.get("failover_route") {
            Some(f) => assert_eq!(&routes[0], f, "{name}"),
            None => assert_eq!(routes.len(), 1, "{name}"),
        }
        let clusters = boot["static_resources"]["clusters"].as_array().unwrap();
        let extra = pieces["clusters"].as_array().unwrap();
        assert!(
            extra.iter().any(|c| c["name"] == "llmroute_admin"),
            "{name}: the admin cluster is an extra cluster"
        );
        assert_eq!(&clusters[clusters.len() - extra.len()..], extra.as_slice(), "{name}");
        assert_eq!(pieces.get("secrets"), boot["static_resources"].get("secrets"), "{name}");
        for c in extra {
            assert!(
                !backend_clusters(&boot).iter().any(|b| b["name"] == c["name"]),
                "{name}: no backend cluster among the extras"
            );
        }
    }
}

#[test]
fn target_filter_includes_what_failover_needs_and_says_what_it_cannot_carry() {
    let path = fixture("good-multi.yaml");
    let out = render_args(&path, &["--target", "filter"]);
    let pieces = parse_yaml(&out);
    let text = stdout(&out);
    assert!(
        text.starts_with("# Rendered by `llmroute render --target filter`"),
        "{text}"
    );
    let names: Vec<&str> = pieces["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"llmroute-failover-0"), "{names:?}");
    let aggregate = &pieces["clusters"][0]["cluster_type"]["typed_config"]["clusters"];
    assert_eq!(
        aggregate,
        &serde_json::json!(["llama-local", "vllm-pool"]),
        "priority 10 before 20"
    );
    assert_eq!(
        pieces["failover_route"]["match"]["headers"][0]["name"],
        "x-llmroute-alias"
    );
    assert_eq!(pieces["listener"]["per_connection_buffer_limit_bytes"], 17825792);
    // The members' endpoints carry the metadata the failover's upstream role reads.
    for c in pieces["backend_clusters"].as_array().unwrap() {
        let eps = &c["load_assignment"]["endpoints"][0]["lb_endpoints"];
        for e in eps.as_array().unwrap() {
            assert_eq!(
                e["metadata"]["filter_metadata"]["llmroute"]["backend"], c["name"],
                "{c}"
            );
        }
    }
    let err = stderr(&out);
    assert!(
        err.contains("note: admin: the filter polls Envoy's admin API at 127.0.0.1:9901")
            && err.contains("(127.0.0.1:9901) must be the address of your Envoy's own admin interface"),
        "{err}"
    );
}

/// What once had to be copied from `--target envoy` by hand is in the one document: the backends' TLS and
/// credentials with their clusters, the listener's TLS, and the connection manager's and bootstrap's fields.
#[test]
fn target_filter_carries_tls_credentials_and_the_edge_settings() {
    let path = fixture("good-tls.yaml");
    let out = render_args(&path, &["--target", "filter"]);
    let pieces = parse_yaml(&out);
    let boot = parse_bootstrap(&stdout(&render_args(&path, &[])));
    assert_eq!(
        pieces["backend_clusters"],
        Value::from(backend_clusters(&boot).into_iter().cloned().collect::<Vec<_>>())
    );
    let listener = &boot["static_resources"]["listeners"][0];
    assert_eq!(
        pieces["filter_chain"]["transport_socket"],
        listener["filter_chains"][0]["transport_socket"]
    );
    for (k, v) in pieces["connection_manager"].as_object().unwrap() {
        assert_eq!(&hcm(&boot)[k], v, "{k}");
    }
    assert_eq!(pieces["bootstrap"]["stats_config"], boot["stats_config"]);
    assert_eq!(pieces["bootstrap"]["overload_manager"], boot["overload_manager"]);
    let err = stderr(&out);
    assert!(!err.contains("copy"), "nothing is left to copy by hand: {err}");
}

/// `--paste-into`: the template's markers filled with the sections; the template's own parts kept.
#[test]
fn target_filter_pastes_into_a_template() {
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("mine.yaml");
    std::fs::write(
        &template,
        "static_resources:\n  clusters: ['@llmroute backend_clusters', '@llmroute clusters', { name: app }]\n",
    )
    .unwrap();
    let path = fixture("good-multi.yaml");
    let out = render_args(
        &path,
        &["--target", "filter", "--paste-into", template.to_str().unwrap()],
    );
    let v = parse_yaml(&out);
    let pieces = parse_yaml(&render_args(&path, &["--target", "filter"]));
    let names: Vec<&str> = v["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    let want = pieces["backend_clusters"].as_array().unwrap().len() + pieces["clusters"].as_array().unwrap().len() + 1;
    assert_eq!(names.len(), want, "{names:?}");
    assert_eq!(names.last(), Some(&"app"));
    let refused = render_args(&path, &["--paste-into", template.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains("--paste-into goes with --target filter"));
}

#[test]
fn target_ecds_is_a_discovery_response_with_the_embedded_document() {
    let path = fixture("good-basic.yaml");
    let v = parse_yaml(&render_args(&path, &["--target", "ecds"]));
    assert!(v["version_info"].as_str().is_some_and(|s| s.len() == 16), "{v}");
    let r = &v["resources"][0];
    assert_eq!(
        r["@type"],
        "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
    );
    assert_eq!(r["name"], "llmroute");
    let boot = parse_bootstrap(&stdout(&render_args(&path, &[])));
    assert_eq!(r["typed_config"], hcm(&boot)["http_filters"][0]["typed_config"]);
    let embedded: Value =
        serde_json::from_str(r["typed_config"]["config"]["configuration"]["value"].as_str().unwrap()).unwrap();
    assert_eq!(embedded, filter_document(&path));
}

#[test]
fn ecds_path_makes_the_filter_discovered_and_adds_the_node() {
    let path = fixture("good-basic.yaml");
    let boot = parse_bootstrap(&stdout(&render_args(
        &path,
        &["--ecds-path", "/run/llmroute/ecds.yaml"],
    )));
    let entry = &hcm(&boot)["http_filters"][0];
    assert_eq!(entry["name"], "llmroute");
    assert!(entry.get("typed_config").is_none(), "{entry}");
    assert_eq!(
        entry["config_discovery"]["config_source"]["path_config_source"]["path"],
        "/run/llmroute/ecds.yaml"
    );
    assert_eq!(boot["node"]["id"], "llmroute");
    assert_eq!(boot["node"]["cluster"], "llmroute");
    let inline = parse_bootstrap(&stdout(&render_args(&path, &[])));
    assert!(inline.get("node").is_none());

    let pieces = parse_yaml(&render_args(&path, &["--target", "filter", "--ecds-path", "/p.yaml"]));
    assert_eq!(
        pieces["http_filters"][0]["config_discovery"]["config_source"]["path_config_source"]["path"],
        "/p.yaml"
    );
    let refused = render_args(&path, &["--target", "ecds", "--ecds-path", "/p.yaml"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains("--ecds-path goes with --target envoy or filter"));
}

#[test]
fn every_target_refuses_a_bad_config_and_prints_nothing() {
    let path = fixture("bad-many.yaml");
    for t in ["envoy", "filter", "ecds"] {
        let out = render_args(&path, &["--target", t]);
        assert_eq!(out.status.code(), Some(1), "--target {t}");
        assert!(stdout(&out).is_empty(), "--target {t}: {}", stdout(&out));
        assert!(stderr(&out).contains("error(s):"), "--target {t}");
    }
    let unknown = render_args(&fixture("good-basic.yaml"), &["--target", "nginx"]);
    assert_eq!(unknown.status.code(), Some(2));
}

/// `llmroute ARGS... PATH` with the variables `unset` removed from its environment and `set` added.
fn with_env(args: &[&str], path: &Path, unset: &[&str], set: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_llmroute"));
    cmd.args(args).arg(path);
    for name in unset {
        cmd.env_remove(name);
    }
    cmd.envs(set.iter().copied())
        .output()
        .expect("the llmroute binary runs")
}

#[test]
fn an_unset_variable_the_config_names_is_a_warning_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("envoy.yaml");
    let out_arg = out_file.to_str().unwrap();
    for (name, vars) in [
        ("good-admission.yaml", vec!["auth.keys_env = LLMROUTE_KEYS: not set"]),
        (
            "good-tls.yaml",
            vec![
                "backends[0].credential_env = VLLM_TOKEN: not set",
                "backends[1].credential_env = HOSTED_TOKEN: not set",
            ],
        ),
    ] {
        let path = fixture(name);
        let unset = ["LLMROUTE_KEYS", "VLLM_TOKEN", "HOSTED_TOKEN"];
        for args in [vec!["validate"], vec!["render", "--wasm", WASM, "-o", out_arg]] {
            let out = with_env(&args, &path, &unset, &[]);
            let se = stderr(&out);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{name} {args:?}: a warning, not an error: {se}"
            );
            assert_eq!(se.lines().count(), vars.len(), "{name} {args:?}: {se}");
            for v in &vars {
                assert!(se.contains(&format!("warning: {v}")), "{name} {args:?}: {se}");
            }
            assert!(se.contains("Envoy"), "{name}: the warning says what fails: {se}");
        }
    }
}

#[test]
fn require_env_makes_an_unset_variable_an_error_and_writes_nothing() {
    let path = fixture("good-tls.yaml");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("envoy.yaml");
    let unset = ["VLLM_TOKEN", "HOSTED_TOKEN"];
    let set_one = [("VLLM_TOKEN", "a-token")];
    for args in [
        vec!["validate", "--require-env"],
        vec!["render", "--require-env", "--wasm", WASM, "-o", file.to_str().unwrap()],
    ] {
        let out = with_env(&args, &path, &unset, &set_one);
        let se = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {se}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", stdout(&out));
        let errors = error_lines(&path, &se);
        assert_eq!(errors.len(), 1, "only the unset variable: {se}");
        assert!(
            errors[0].starts_with("backends[1].credential_env = HOSTED_TOKEN: not set"),
            "{se}"
        );
    }
    assert!(!file.exists(), "render wrote a bootstrap Envoy would refuse");

    let all_set = [("VLLM_TOKEN", "a-token"), ("HOSTED_TOKEN", "b-token")];
    let out = with_env(&["validate", "--require-env"], &path, &[], &all_set);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
}

#[test]
fn keys_the_filter_would_refuse_are_reported_without_their_token() {
    let path = fixture("good-admission.yaml");
    let token = "short-secret";
    let keys = format!("team-a:{token}");
    let out = with_env(&["validate"], &path, &[], &[("LLMROUTE_KEYS", &keys)]);
    let se = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{se}");
    assert!(
        se.contains("warning: auth.keys_env = LLMROUTE_KEYS: the filter would refuse") && se.contains("team-a"),
        "{se}"
    );
    assert!(!se.contains(token), "a token never reaches the output: {se}");

    let out = with_env(
        &["validate", "--require-env"],
        &path,
        &[],
        &[("LLMROUTE_KEYS", "no-colon")],
    );
    let se = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{se}");
    assert!(
        se.contains("auth.keys_env = LLMROUTE_KEYS") && se.contains("no `:`"),
        "{se}"
    );
}

#[test]
fn a_relative_wasm_path_is_refused_for_every_target() {
    let path = fixture("good-basic.yaml");
    let dir = tempfile::tempdir().unwrap();
    for target in ["envoy", "filter", "ecds", "istio"] {
        let out_path = dir.path().join(target);
        let out = command_for(&path)
            .arg("render")
            .arg(&path)
            .args(["--target", target, "--wasm", "target/llmroute_filter.wasm", "-o"])
            .arg(&out_path)
            .output()
            .unwrap();
        let se = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "--target {target}: {se}");
        assert!(
            se.contains("'target/llmroute_filter.wasm'")
                && se.contains("Envoy would look up from its own working directory")
                && se.contains("absolute path"),
            "--target {target}: {se}"
        );
        assert!(!out_path.exists(), "--target {target}: nothing is written");
    }
}

fn istio_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/istio/llmroute.yaml")
        .canonicalize()
        .expect("testdata/istio/llmroute.yaml exists")
}

#[test]
fn target_istio_writes_the_manifests_and_says_what_is_left_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = istio_fixture();
    let doc = std::fs::read_to_string(&path)
        .unwrap()
        .replace("limits:", "auth: { keys_env: LLMROUTE_KEYS }\nlimits:");
    let config = dir.path().join("llmroute.yaml");
    std::fs::write(&config, doc).unwrap();
    let out_dir = dir.path().join("istio");
    let out = render_args(
        &config,
        &[
            "--target",
            "istio",
            "--namespace",
            "llmroute",
            "-o",
            out_dir.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let listed: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    for name in [
        "authorizationpolicy-models.yaml",
        "deployment.yaml",
        "envoyfilter.yaml",
        "gateway.yaml",
    ] {
        assert!(listed.iter().any(|l| l.ends_with(name)), "{name}: {listed:?}");
        assert!(out_dir.join(name).exists(), "{name}");
    }
    let err = stderr(&out);
    let prefix = format!("{}: note: ", config.display());
    for want in [
        "kubectl -n llmroute create secret generic llmroute-keys --from-literal=LLMROUTE_KEYS=",
        "admin: the filter polls the Istio proxy's admin at 127.0.0.1:15000 for /readyz and /llmroute/status; it must \
         be the address of the proxy's own admin interface",
        "denies every request not made as cluster.local/ns/llmroute/sa/llmroute",
    ] {
        assert!(
            err.lines().any(|l| l.starts_with(&prefix) && l.contains(want)),
            "{want}:\n{err}"
        );
    }
}

/// Like `validate`: the file's name, the count, then every error, the flags' and the config's, and nothing written.
#[test]
fn target_istio_reports_every_error_at_once_with_the_file_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mesh.yaml");
    std::fs::write(
        &config,
        "version: 1\nbackends:\n  - { name: a, kind: vllm, endpoints: ['127.0.0.1:9000'] }\n  - { name: 'outbound|80||b.llmroute.svc.cluster.local', kind: vllm, discovery: {} }\nmodels:\n  - { name: m, routes: [{ backend: a }] }\nglobal_limits: { address: '127.0.0.1:8081' }\n",
    )
    .unwrap();
    let out_dir = dir.path().join("istio");
    let out = Command::new(env!("CARGO_BIN_EXE_llmroute"))
        .arg("render")
        .arg(&config)
        .args([
            "--target",
            "istio",
            "--wasm-url",
            "http://registry.example.com/f.wasm",
            "--engine-selector",
            "nolabel",
            "-o",
        ])
        .arg(&out_dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.starts_with(&format!("{}: 6 error(s):\n", config.display())),
        "{err}"
    );
    for want in [
        "  --wasm-url",
        "  --engine-selector: \"nolabel\" is not LABEL=VALUE",
        "  backends[a].name: not an Istio outbound cluster name",
        "  backends[a].discovery:",
        "  backends[outbound|80||b.llmroute.svc.cluster.local]: the engines' namespace `llmroute`",
        "  global_limits:",
    ] {
        assert!(err.lines().any(|l| l.starts_with(want)), "{want}:\n{err}");
    }
    assert!(stdout(&out).is_empty());
    assert!(!out_dir.exists(), "nothing is written");
}

#[test]
fn the_compose_files_bootstraps_are_the_renders_of_their_configs() {
    // The compose files mount these renders: one left stale after an edit of its llmroute.yaml would run a config
    // nobody wrote. `make compose-render` writes them.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in ["compose", "compose/replicas"] {
        let config = root.join(dir).join("llmroute.yaml");
        let out = llmroute([
            "render".as_ref(),
            config.as_os_str(),
            "--wasm".as_ref(),
            "/etc/envoy/llmroute_filter.wasm".as_ref(),
        ]);
        assert!(out.status.success(), "{}: {}", config.display(), stderr(&out));
        let committed = std::fs::read_to_string(root.join(dir).join("envoy.yaml")).unwrap();
        assert!(
            stdout(&out) == committed,
            "envoy/{dir}/envoy.yaml is not the render of envoy/{dir}/llmroute.yaml: run `make compose-render`"
        );
    }
}
