use super::*;
use llmroute_core::envoy_contract as contract;

const DOC: &str = include_str!("../../../../testdata/istio/llmroute.yaml");
const NS: &str = "llmroute";

fn load(doc: &str) -> Document {
    llmroute_core::load_document(doc).unwrap()
}

fn render_with(doc: &str, opts: &IstioOptions) -> Vec<(String, Value)> {
    manifests(&load(doc), doc, opts)
        .unwrap()
        .files
        .into_iter()
        .map(|(n, y)| (n, serde_yaml_ng::from_str(&y).unwrap()))
        .collect()
}

fn render(wasm: WasmSource) -> Vec<(String, Value)> {
    render_with(DOC, &IstioOptions::proxy(wasm, NS))
}

fn local() -> WasmSource {
    WasmSource::Local("/w.wasm".into())
}

fn file<'a>(docs: &'a [(String, Value)], name: &str) -> &'a Value {
    &docs
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no {name} among {:?}", docs.iter().map(|d| &d.0).collect::<Vec<_>>()))
        .1
}

fn patches(docs: &[(String, Value)]) -> Vec<Value> {
    file(docs, "envoyfilter.yaml")["spec"]["configPatches"]
        .as_array()
        .unwrap()
        .clone()
}

fn errors(doc: &str, opts: &IstioOptions) -> Vec<String> {
    manifests(&load(doc), doc, opts).unwrap_err()
}

#[test]
fn destination_rules_hash_on_affinity_eject_and_turn_locality_off() {
    let docs = render(local());
    let dr = file(&docs, "destinationrule-llama-models-8080.yaml");
    assert_eq!(dr["spec"]["host"], "llama.models.svc.cluster.local");
    assert_eq!(
        dr["spec"]["exportTo"],
        json!(["."]),
        "it shapes llmroute's traffic only"
    );
    let p = &dr["spec"]["trafficPolicy"];
    assert_eq!(
        p["loadBalancer"]["consistentHash"]["httpHeaderName"],
        contract::AFFINITY
    );
    assert_eq!(p["loadBalancer"]["localityLbSetting"]["enabled"], false);
    assert_eq!(p["outlierDetection"]["consecutive5xxErrors"], 3);
    let vllm = file(&docs, "destinationrule-vllm-models-8000.yaml");
    assert_eq!(vllm["spec"]["trafficPolicy"]["loadBalancer"]["simple"], "LEAST_REQUEST");
}

#[test]
fn the_filter_patch_pauses_and_the_cluster_patch_bounds_the_load() {
    let p = patches(&render(local()));
    let f = &p[0];
    assert_eq!(
        (f["applyTo"].as_str(), f["patch"]["operation"].as_str()),
        (Some("HTTP_FILTER"), Some("INSERT_BEFORE"))
    );
    assert_eq!(
        f["patch"]["value"]["typed_config"]["config"]["allow_on_headers_stop_iteration"],
        true
    );
    let chwbl = p
        .iter()
        .find(|x| x["match"]["cluster"]["name"] == "outbound|8080||llama.models.svc.cluster.local")
        .unwrap();
    assert_eq!(
        chwbl["patch"]["value"]["common_lb_config"]["consistent_hashing_lb_config"]["hash_balance_factor"],
        150
    );
    let l = p.iter().find(|x| x["applyTo"] == "LISTENER").unwrap();
    assert!(
        l["patch"]["value"]["per_connection_buffer_limit_bytes"]
            .as_u64()
            .unwrap()
            > 8 << 20
    );
    assert!(p.iter().any(|x| x["patch"]["value"]["name"] == "llmroute_admin"));
    // The llama.cpp backend's pods get the fleet check's original-destination cluster; vLLM's do not.
    let probes: Vec<&Value> = p
        .iter()
        .filter(|x| {
            x["patch"]["value"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(contract::DISCOVERED_PROBE_CLUSTER_PREFIX))
        })
        .collect();
    assert_eq!(probes.len(), 1, "{probes:?}");
    let c = &probes[0]["patch"]["value"];
    assert_eq!(
        c["name"],
        "llmroute-dst-probe-outbound|8080||llama.models.svc.cluster.local"
    );
    assert_eq!(
        (c["type"].as_str(), c["lb_policy"].as_str()),
        (Some("ORIGINAL_DST"), Some("CLUSTER_PROVIDED"))
    );
}

#[test]
fn a_backend_with_load_gets_its_pods_original_destination_cluster_whatever_its_kind() {
    let doc = DOC.replace(
        "    lb: least_request\n",
        "    lb: least_request\n    load: { poll_ms: 500 }\n",
    );
    let p = patches(&render_with(&doc, &IstioOptions::proxy(local(), NS)));
    let probes: Vec<&str> = p
        .iter()
        .filter_map(|x| x["patch"]["value"]["name"].as_str())
        .filter(|n| n.starts_with(contract::DISCOVERED_PROBE_CLUSTER_PREFIX))
        .collect();
    assert_eq!(
        probes,
        vec![
            "llmroute-dst-probe-outbound|8080||llama.models.svc.cluster.local",
            "llmroute-dst-probe-outbound|8000||vllm.models.svc.cluster.local"
        ]
    );
}

/// The filter runs on llmroute's own workloads, on every HTTP listener they have, and the route clients use binds
/// to those workloads only: no sidecar of the mesh gets a route to the engines from these manifests.
#[test]
fn the_filter_runs_on_llmroutes_own_workloads_and_the_route_binds_to_them_only() {
    let docs = render(local());
    let ef = file(&docs, "envoyfilter.yaml");
    assert_eq!(ef["metadata"]["namespace"], NS);
    assert_eq!(ef["spec"]["workloadSelector"]["labels"]["istio"], PROXY_NAME);
    for p in patches(&docs) {
        assert_eq!(p["match"]["context"], "GATEWAY", "{p}");
        assert!(
            p["match"]["listener"].get("portNumber").is_none(),
            "every listener: {p}"
        );
    }
    let vs = file(&docs, "virtualservice.yaml");
    assert_eq!(vs["spec"]["gateways"], json!([format!("{NS}/{PROXY_NAME}")]));
    assert_eq!(vs["spec"]["exportTo"], json!(["."]));
    let gw = file(&docs, "gateway.yaml");
    assert_eq!(gw["spec"]["selector"]["istio"], PROXY_NAME);
    assert_eq!(gw["spec"]["servers"][0]["hosts"], json!(["./*"]));
    assert_eq!(gw["spec"]["servers"][0]["port"]["number"], 8000);
    let svc = file(&docs, "service.yaml");
    assert_eq!(svc["spec"]["selector"]["istio"], PROXY_NAME);
    let dep = file(&docs, "deployment.yaml");
    let pod = &dep["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"]["istio"], PROXY_NAME);
    assert_eq!(pod["metadata"]["annotations"]["inject.istio.io/templates"], "gateway");
    assert_eq!(pod["spec"]["serviceAccountName"], PROXY_NAME);
    assert_eq!(file(&docs, "serviceaccount.yaml")["metadata"]["name"], PROXY_NAME);
}

/// Every engine namespace gets a DENY policy for any identity but the proxies' (plaintext has none, so it is
/// denied too).
#[test]
fn engines_deny_every_identity_but_the_proxies() {
    let doc = DOC.replace("vllm.models.svc", "vllm.big.svc");
    let docs = render_with(&doc, &IstioOptions::proxy(local(), NS));
    for ns in ["models", "big"] {
        let ap = file(&docs, &format!("authorizationpolicy-{ns}.yaml"));
        assert_eq!(ap["metadata"]["namespace"], ns);
        assert_eq!(ap["spec"]["action"], "DENY");
        assert_eq!(
            ap["spec"]["rules"],
            json!([{ "from": [{ "source": { "notPrincipals": ["cluster.local/ns/llmroute/sa/llmroute"] } }] }])
        );
        assert!(ap["spec"].get("selector").is_none(), "the whole namespace");
    }
    let mut opts = IstioOptions::proxy(local(), NS);
    opts.engine_selector = vec![("llmroute.io/engine".into(), "true".into())];
    opts.trust_domain = "example.org".into();
    let ap = file(&render_with(DOC, &opts), "authorizationpolicy-models.yaml").clone();
    assert_eq!(ap["spec"]["selector"]["matchLabels"]["llmroute.io/engine"], "true");
    assert_eq!(
        ap["spec"]["rules"][0]["from"][0]["source"]["notPrincipals"][0],
        "example.org/ns/llmroute/sa/llmroute"
    );
}

#[test]
fn engines_in_llmroutes_own_namespace_need_a_selector() {
    let errs = errors(DOC, &IstioOptions::proxy(local(), "models"));
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(
        errs[0].contains("namespace `models`") && errs[0].contains("--engine-selector"),
        "{errs:?}"
    );
    let mut opts = IstioOptions::proxy(local(), "models");
    opts.engine_selector = vec![("app".into(), "engine".into())];
    assert!(manifests(&load(DOC), DOC, &opts).is_ok());
}

#[test]
fn an_ingress_gateway_names_its_service_account_for_the_engines_to_admit() {
    let gateway = |sa: Option<&str>| {
        let mut o = IstioOptions::proxy(local(), "istio-ingress");
        o.deployment = Deployment::Gateway {
            gateway: "istio-ingress/llm".into(),
            host: "llm.example.com".into(),
            selector: "ingressgateway".into(),
            service_account: sa.map(str::to_string),
        };
        o
    };
    let errs = errors(DOC, &gateway(None));
    assert!(errs.iter().any(|e| e.contains("--gateway-service-account")), "{errs:?}");
    let docs = render_with(DOC, &gateway(Some("gw")));
    let ap = file(&docs, "authorizationpolicy-models.yaml");
    assert_eq!(
        ap["spec"]["rules"][0]["from"][0]["source"]["notPrincipals"][0],
        "cluster.local/ns/istio-ingress/sa/gw"
    );
    assert_eq!(
        file(&docs, "envoyfilter.yaml")["spec"]["workloadSelector"]["labels"]["istio"],
        "ingressgateway"
    );
    assert!(patches(&docs)
        .iter()
        .filter(|p| p["applyTo"] == "HTTP_FILTER")
        .all(|p| p["match"]["listener"]["portNumber"] == 8000));
    assert!(!docs.iter().any(|(n, _)| n == "deployment.yaml" || n == "gateway.yaml"));
}

#[test]
fn a_remote_module_goes_through_ecds() {
    let sha = "a".repeat(64);
    let p = patches(&render(WasmSource::Remote {
        url: "oci://r.example/f:1".into(),
        sha256: sha.clone(),
    }));
    assert_eq!(p[0]["applyTo"], "EXTENSION_CONFIG");
    let remote = &p[0]["patch"]["value"]["typed_config"]["config"]["vm_config"]["code"]["remote"];
    assert_eq!(
        (remote["http_uri"]["uri"].as_str(), remote["sha256"].as_str()),
        (Some("oci://r.example/f:1"), Some(sha.as_str()))
    );
    assert_eq!(
        p[1]["patch"]["value"]["config_discovery"]["type_urls"][0],
        patches::WASM_TYPE_URL
    );
}

#[test]
fn the_placement_store_cluster_is_added() {
    let p = patches(&render(local()));
    let store: Vec<&Value> = p
        .iter()
        .filter(|x| x["patch"]["value"]["name"] == contract::PLACEMENT_STORE_CLUSTER)
        .collect();
    assert_eq!(store.len(), 1, "{store:?}");
    assert_eq!(
        (store[0]["applyTo"].as_str(), store[0]["patch"]["operation"].as_str()),
        (Some("CLUSTER"), Some("ADD"))
    );
    let c = &store[0]["patch"]["value"];
    assert_eq!(c["type"], "STRICT_DNS", "the members are named by DNS in the fixture");
    let eps = c["load_assignment"]["endpoints"][0]["lb_endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 2);
}

/// The embedded config names the proxy's admin, which is where `llmroute_admin` points.
#[test]
fn the_embedded_admin_is_the_proxys_admin() {
    let doc = format!("{DOC}admin: 127.0.0.1:9901\n");
    let p = patches(&render_with(&doc, &IstioOptions::proxy(local(), NS)));
    let embedded = p[0]["patch"]["value"]["typed_config"]["config"]["configuration"]["value"]
        .as_str()
        .unwrap();
    assert_eq!(load(embedded).admin.to_string(), "127.0.0.1:15000");
    let notes = manifests(&load(&doc), &doc, &IstioOptions::proxy(local(), NS))
        .unwrap()
        .notes;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("127.0.0.1:9901 is replaced by 127.0.0.1:15000")
                && n.contains("must be the address of the proxy's own admin interface")),
        "{notes:?}"
    );
}

/// `auth.keys_env` reaches istio-proxy from a Secret, and the VM sees the variable; the bootstrap override
/// carries every stats tag.
#[test]
fn keys_come_from_a_secret_and_the_bootstrap_override_carries_the_stats_tags() {
    let doc = format!("{DOC}auth: {{ keys_env: LLMROUTE_KEYS }}\n");
    let r = manifests(&load(&doc), &doc, &IstioOptions::proxy(local(), NS)).unwrap();
    let docs: Vec<(String, Value)> = r
        .files
        .iter()
        .map(|(n, y)| (n.clone(), serde_yaml_ng::from_str(y).unwrap()))
        .collect();
    let container = &file(&docs, "deployment.yaml")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["name"], "istio-proxy");
    let env = container["env"].as_array().unwrap();
    let keys = env.iter().find(|e| e["name"] == "LLMROUTE_KEYS").unwrap();
    assert_eq!(
        keys["valueFrom"]["secretKeyRef"],
        json!({ "name": "llmroute-keys", "key": "LLMROUTE_KEYS" })
    );
    assert!(
        !r.files.iter().any(|(_, y)| y.contains("tok-")),
        "no key value is rendered"
    );
    let vm = &patches(&docs)[0]["patch"]["value"]["typed_config"]["config"]["vm_config"];
    assert_eq!(vm["environment_variables"]["host_env_keys"], json!(["LLMROUTE_KEYS"]));
    let override_path = env.iter().find(|e| e["name"] == "ISTIO_BOOTSTRAP_OVERRIDE").unwrap()["value"]
        .as_str()
        .unwrap()
        .to_string();
    let mount = &container["volumeMounts"][0]["mountPath"];
    assert!(
        override_path.starts_with(mount.as_str().unwrap()),
        "{override_path} under {mount}"
    );
    let cm = file(&docs, "configmap-bootstrap.yaml");
    let overlay: Value = serde_json::from_str(cm["data"]["custom_bootstrap.json"].as_str().unwrap()).unwrap();
    let tags = overlay["stats_config"]["stats_tags"].as_array().unwrap();
    assert_eq!(tags.len(), contract::metrics::LABELS.len());
    assert!(
        r.notes
            .iter()
            .any(|n| n.contains("create secret generic llmroute-keys")),
        "{:?}",
        r.notes
    );
}

/// Every reason at once, each naming its field.
#[test]
fn every_error_is_reported_at_once() {
    let doc = "version: 1\nlisten: 0.0.0.0:15001\nbackends:\n  - { name: a, kind: vllm, endpoints: ['127.0.0.1:9000'] }\n  - { name: 'outbound|80||b.models.svc.cluster.local', kind: vllm, discovery: { mesh_tls: true }, credential_env: TOKEN }\nmodels:\n  - { name: m, routes: [{ backend: a }] }\nglobal_limits: { address: '127.0.0.1:8081' }\n";
    let errs = errors(doc, &IstioOptions::proxy(local(), NS));
    for want in [
        "backends[a].name",
        "backends[a].discovery",
        "backends[outbound|80||b.models.svc.cluster.local].credential_env",
        "global_limits:",
        "listen: port 15001",
    ] {
        assert!(
            errs.iter().any(|e| e.starts_with(want)),
            "{want} missing from {errs:#?}"
        );
    }
    assert_eq!(errs.len(), 5, "{errs:#?}");
}

#[test]
fn bad_sources_are_refused() {
    assert!(WasmSource::from_args(Some("rel.wasm".into()), None, None).is_err());
    assert!(WasmSource::from_args(None, Some("http://x".into()), Some("a".repeat(64))).is_err());
    assert!(WasmSource::from_args(None, Some("https://x".into()), Some("A".repeat(64))).is_err());
    assert!(WasmSource::from_args(None, Some("https://x".into()), None).is_err());
    assert_eq!(parse_cluster("outbound|8000|v1|h.ns.svc.cluster.local"), None);
}
