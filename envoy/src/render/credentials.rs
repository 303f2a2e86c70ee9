//! Backend credentials: a backend with `credential_env: NAME` gets `Authorization: Bearer <token>` on every
//! request Envoy sends it, where the token is the value of the environment variable `NAME` in Envoy's own
//! environment.
//!
//! The token never enters the bootstrap:
//! - it is a static SDS secret `llmroute-credential-<backend>` whose `generic_secret` is a `DataSource` with
//!   `environment_variable: NAME`: Envoy reads the variable when it loads the bootstrap, and refuses to start
//!   (`Environment variable doesn't exist: NAME`) when it is unset;
//! - the upstream filter `envoy.filters.http.credential_injector` with the generic credential
//!   (`envoy.http.injected_credentials.generic`) puts it in `authorization`, after `header_value_prefix:
//!   "Bearer "`, overwriting any value;
//! - Envoy logs neither, at any level, and its admin `config_dump` shows the secret as `[redacted]`.
//!
//! Per backend: the injector is an *upstream* HTTP filter, in the backend cluster's
//! `typed_extension_protocol_options` (`envoy.extensions.upstreams.http.v3.HttpProtocolOptions.http_filters`,
//! ending in `envoy.filters.http.upstream_codec`), so it runs only for requests to that cluster.
//!
//! Aggregate clusters (`envoy.clusters.aggregate`) run their *own* upstream filters, never their members'. For
//! an aggregate with a credentialed member, the aggregate's chain starts with a filter that removes
//! `authorization`, then one injector per credentialed member, each skipped unless the chosen host's metadata
//! `llmroute.backend` names that member (a CEL matcher on `xds.upstream_host_metadata`). The removal matters:
//! header changes made on one attempt are still there on a retry, so without it a retry on another backend
//! would carry the first backend's token. The members' endpoints get the `llmroute.backend` metadata.

use llmroute_core::config::{Backend, Document};
use llmroute_core::envoy_contract as contract;
use serde_json::{json, Value};

use super::json::push;

/// The SDS secret that holds a backend's token.
pub fn secret_name(backend: &str) -> String {
    format!("llmroute-credential-{backend}")
}

const PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const AGGREGATE: &str = "envoy.clusters.aggregate";

/// Adds the secrets and the injectors to a rendered bootstrap. Does nothing when no backend has a credential.
pub fn apply(cfg: &Document, bootstrap: &mut Value) {
    let with_credential: Vec<&Backend> = cfg.backends.iter().filter(|b| b.credential_env.is_some()).collect();
    if with_credential.is_empty() {
        return;
    }
    let resources = &mut bootstrap["static_resources"];
    for b in &with_credential {
        push(&mut resources["secrets"], secret(b));
    }
    let Some(clusters) = resources["clusters"].as_array_mut() else {
        return;
    };
    let credentialed = |name: &str| with_credential.iter().find(|b| b.name == name).copied();
    let mut members_to_tag = Vec::new();
    for cluster in clusters.iter_mut() {
        let name = cluster["name"].as_str().unwrap_or_default().to_string();
        if let Some(b) = credentialed(&name) {
            prepend_upstream_filters(cluster, vec![injector(b)]);
            continue;
        }
        let members = aggregate_members(cluster);
        let covered: Vec<&Backend> = members.iter().filter_map(|m| credentialed(m)).collect();
        if covered.is_empty() {
            continue;
        }
        let mut filters = vec![strip_authorization()];
        filters.extend(covered.iter().map(|b| only_for_backend(injector(b), &b.name)));
        prepend_upstream_filters(cluster, filters);
        members_to_tag.extend(members);
    }
    for cluster in clusters.iter_mut() {
        if let Some(name) = cluster["name"].as_str().map(str::to_string) {
            if members_to_tag.contains(&name) {
                tag_endpoints(cluster, &name);
            }
        }
    }
}

/// The static secret: the variable's name only, never its value.
fn secret(b: &Backend) -> Value {
    json!({
        "name": secret_name(&b.name),
        "generic_secret": { "secret": { "environment_variable": b.credential_env } },
    })
}

/// `authorization: Bearer <secret>`, replacing any value already there.
fn injector(b: &Backend) -> Value {
    json!({
        "name": "envoy.filters.http.credential_injector",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.credential_injector.v3.CredentialInjector",
            "overwrite": true,
            "credential": {
                "name": "envoy.http.injected_credentials.generic",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.http.injected_credentials.generic.v3.Generic",
                    "credential": { "name": secret_name(&b.name) },
                    "header": "authorization",
                    "header_value_prefix": "Bearer ",
                },
            },
        },
    })
}

/// Removes `authorization` on every attempt, so a retry never carries another backend's token.
fn strip_authorization() -> Value {
    json!({
        "name": "llmroute.strip_authorization",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "mutations": { "request_mutations": [{ "remove": "authorization" }] },
        },
    })
}

/// Wraps `filter` so it is skipped unless the chosen host's `llmroute.backend` metadata is `backend`. A host
/// without that metadata skips it too.
fn only_for_backend(filter: Value, backend: &str) -> Value {
    let md = || select(select(ident("xds"), "upstream_host_metadata"), "filter_metadata");
    let ours = || select(md(), contract::METADATA_NAMESPACE);
    // !has(md.llmroute) || !has(md.llmroute.backend) || md.llmroute.backend != "<backend>"
    let skip = call(
        "_||_",
        vec![
            call(
                "_||_",
                vec![
                    call("!_", vec![has(md(), contract::METADATA_NAMESPACE)]),
                    call("!_", vec![has(ours(), contract::METADATA_BACKEND)]),
                ],
            ),
            call(
                "_!=_",
                vec![
                    select(ours(), contract::METADATA_BACKEND),
                    json!({ "const_expr": { "string_value": backend } }),
                ],
            ),
        ],
    );
    let name = filter["name"].clone();
    json!({
        "name": format!("{}.{backend}", name.as_str().unwrap_or_default()),
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.common.matching.v3.ExtensionWithMatcher",
            "extension_config": filter,
            "xds_matcher": { "matcher_list": { "matchers": [{
                "predicate": { "single_predicate": {
                    "input": {
                        "name": "envoy.matching.inputs.cel_data_input",
                        "typed_config": { "@type": "type.googleapis.com/xds.type.matcher.v3.HttpAttributesCelMatchInput" },
                    },
                    "custom_match": {
                        "name": "envoy.matching.matchers.cel_matcher",
                        "typed_config": {
                            "@type": "type.googleapis.com/xds.type.matcher.v3.CelMatcher",
                            "expr_match": { "parsed_expr": { "expr": skip } },
                        },
                    },
                } },
                "on_match": { "action": {
                    "name": "skip",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.common.matcher.action.v3.SkipFilter",
                    },
                } },
            }] } },
        },
    })
}

fn ident(name: &str) -> Value {
    json!({ "ident_expr": { "name": name } })
}

fn select(operand: Value, field: &str) -> Value {
    json!({ "select_expr": { "operand": operand, "field": field } })
}

fn has(operand: Value, field: &str) -> Value {
    json!({ "select_expr": { "operand": operand, "field": field, "test_only": true } })
}

fn call(function: &str, args: Vec<Value>) -> Value {
    json!({ "call_expr": { "function": function, "args": args } })
}

/// The member cluster names of an aggregate cluster; empty for any other cluster.
fn aggregate_members(cluster: &Value) -> Vec<String> {
    let ty = &cluster["cluster_type"];
    if ty["name"].as_str() != Some(AGGREGATE) {
        return Vec::new();
    }
    let members = ty["typed_config"]["clusters"].as_array().into_iter().flatten();
    members.filter_map(|m| m.as_str().map(str::to_string)).collect()
}

/// Puts `filters` first in the cluster's upstream HTTP filter chain, creating the chain (HTTP/1.1, ending in
/// `upstream_codec`) when the cluster has none.
fn prepend_upstream_filters(cluster: &mut Value, filters: Vec<Value>) {
    let options = &mut cluster["typed_extension_protocol_options"][PROTOCOL_OPTIONS];
    if options.get("@type").is_none() {
        options["@type"] = Value::from(format!("type.googleapis.com/{PROTOCOL_OPTIONS}"));
    }
    let chosen = ["explicit_http_config", "use_downstream_protocol_config", "auto_config"];
    if !chosen.iter().any(|k| options.get(*k).is_some()) {
        options["explicit_http_config"] = json!({ "http_protocol_options": {} });
    }
    if !options["http_filters"].is_array() {
        options["http_filters"] = json!([{
            "name": "envoy.filters.http.upstream_codec",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec",
            },
        }]);
    }
    if let Some(chain) = options["http_filters"].as_array_mut() {
        chain.splice(0..0, filters);
    }
}

/// Sets `llmroute.backend` metadata on every endpoint of a cluster that lacks it.
fn tag_endpoints(cluster: &mut Value, backend: &str) {
    for group in cluster["load_assignment"]["endpoints"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        for endpoint in group["lb_endpoints"].as_array_mut().into_iter().flatten() {
            let md = &mut endpoint["metadata"]["filter_metadata"][contract::METADATA_NAMESPACE];
            if md.get(contract::METADATA_BACKEND).is_none() {
                md[contract::METADATA_BACKEND] = Value::from(backend);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::{bootstrap, bootstrap_yaml, RenderOptions};

    const DOC: &str = "version: 1\nbackends:\n  - name: a\n    kind: llamacpp\n    endpoints: ['127.0.0.1:8081']\n    credential_env: LLAMA_A_TOKEN\n  - name: b\n    kind: vllm\n    endpoints: ['127.0.0.1:9000']\n  - name: c\n    kind: openai\n    endpoints: ['127.0.0.1:9100']\n    credential_env: OPENAI_KEY\nmodels:\n  - name: m\n    routes: [{ backend: a }]\n";

    fn render(doc: &str) -> Value {
        let cfg = llmroute_core::load_document(doc).unwrap();
        bootstrap(&cfg, doc, &RenderOptions::new("/x/llmroute.wasm")).unwrap()
    }

    fn cluster<'v>(v: &'v Value, name: &str) -> &'v Value {
        let clusters = v["static_resources"]["clusters"].as_array().unwrap();
        clusters.iter().find(|c| c["name"] == name).unwrap()
    }

    fn chain(c: &Value) -> &Vec<Value> {
        c["typed_extension_protocol_options"][PROTOCOL_OPTIONS]["http_filters"]
            .as_array()
            .unwrap()
    }

    #[test]
    fn each_credential_is_an_env_secret_and_an_injector_on_its_own_cluster() {
        let v = render(DOC);
        let secrets = v["static_resources"]["secrets"].as_array().unwrap();
        assert_eq!(
            secrets,
            &vec![
                json!({"name": "llmroute-credential-a", "generic_secret": {"secret": {"environment_variable": "LLAMA_A_TOKEN"}}}),
                json!({"name": "llmroute-credential-c", "generic_secret": {"secret": {"environment_variable": "OPENAI_KEY"}}}),
            ]
        );
        let a = cluster(&v, "a");
        let options = &a["typed_extension_protocol_options"][PROTOCOL_OPTIONS];
        assert_eq!(options["explicit_http_config"], json!({"http_protocol_options": {}}));
        let filters = chain(a);
        assert_eq!(filters.len(), 2);
        assert_eq!(filters[0]["name"], "envoy.filters.http.credential_injector");
        let generic = &filters[0]["typed_config"]["credential"]["typed_config"];
        assert_eq!(generic["credential"]["name"], "llmroute-credential-a");
        assert_eq!(generic["header_value_prefix"], "Bearer ");
        assert_eq!(filters[0]["typed_config"]["overwrite"], true);
        assert_eq!(filters[1]["name"], "envoy.filters.http.upstream_codec");
        assert_eq!(
            chain(cluster(&v, "c"))[0]["typed_config"]["credential"]["typed_config"]["credential"]["name"],
            "llmroute-credential-c"
        );
        assert!(cluster(&v, "b").get("typed_extension_protocol_options").is_none());
    }

    #[test]
    fn no_credential_renders_nothing() {
        let doc = DOC
            .replace("    credential_env: LLAMA_A_TOKEN\n", "")
            .replace("    credential_env: OPENAI_KEY\n", "");
        let v = render(&doc);
        assert!(v["static_resources"].get("secrets").is_none());
        assert!(!v.to_string().contains("credential_injector"));
    }

    #[test]
    fn the_bootstrap_names_the_variable_never_its_value() {
        let cfg = llmroute_core::load_document(DOC).unwrap();
        let yaml = bootstrap_yaml(&cfg, DOC, &RenderOptions::new("/x/llmroute.wasm")).unwrap();
        assert!(yaml.contains("environment_variable: LLAMA_A_TOKEN"));
        assert!(!yaml.contains("inline_string"));
        assert!(!yaml.contains("inline_bytes"));
    }

    #[test]
    fn an_existing_upstream_chain_keeps_its_filters_after_the_injector() {
        let mut c = json!({
            "name": "a",
            "typed_extension_protocol_options": { PROTOCOL_OPTIONS: {
                "@type": format!("type.googleapis.com/{PROTOCOL_OPTIONS}"),
                "explicit_http_config": { "http2_protocol_options": {} },
                "http_filters": [{ "name": "llmroute" }, { "name": "envoy.filters.http.upstream_codec" }],
            } },
        });
        prepend_upstream_filters(&mut c, vec![json!({ "name": "x" })]);
        let names: Vec<&str> = chain(&c).iter().map(|f| f["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["x", "llmroute", "envoy.filters.http.upstream_codec"]);
        assert_eq!(
            c["typed_extension_protocol_options"][PROTOCOL_OPTIONS]["explicit_http_config"],
            json!({ "http2_protocol_options": {} })
        );
    }

    #[test]
    fn an_aggregate_strips_then_injects_per_member_host() {
        let cfg = llmroute_core::load_document(DOC).unwrap();
        let mut v = bootstrap(&cfg, DOC, &RenderOptions::new("/x/llmroute.wasm")).unwrap();
        // Undo the direct render, add an aggregate over a, b and c, and apply again.
        let clusters = v["static_resources"]["clusters"].as_array_mut().unwrap();
        for c in clusters.iter_mut() {
            c.as_object_mut().unwrap().remove("typed_extension_protocol_options");
        }
        clusters.push(json!({
            "name": "alias-m",
            "cluster_type": {
                "name": "envoy.clusters.aggregate",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig",
                    "clusters": ["a", "b", "c"],
                },
            },
        }));
        v["static_resources"].as_object_mut().unwrap().remove("secrets");
        apply(&cfg, &mut v);

        let agg = cluster(&v, "alias-m");
        let filters = chain(agg);
        let names: Vec<&str> = filters.iter().map(|f| f["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "llmroute.strip_authorization",
                "envoy.filters.http.credential_injector.a",
                "envoy.filters.http.credential_injector.c",
                "envoy.filters.http.upstream_codec",
            ]
        );
        let guarded = &filters[1]["typed_config"];
        assert_eq!(
            guarded["extension_config"]["typed_config"]["credential"]["typed_config"]["credential"]["name"],
            "llmroute-credential-a"
        );
        let text = guarded["xds_matcher"].to_string();
        assert!(
            text.contains("upstream_host_metadata") && text.contains("\"string_value\":\"a\""),
            "{text}"
        );
        for name in ["a", "b", "c"] {
            let endpoint = &cluster(&v, name)["load_assignment"]["endpoints"][0]["lb_endpoints"][0];
            assert_eq!(endpoint["metadata"]["filter_metadata"]["llmroute"]["backend"], name);
        }
    }
}
