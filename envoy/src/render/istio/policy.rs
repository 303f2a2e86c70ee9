//! The engines admit llmroute's workloads only: one `AuthorizationPolicy` per engine namespace.
//!
//! The policy is a DENY: every request whose peer identity is not the filter's workloads' service account is
//! refused by the engines' own sidecars. A request without a peer identity (plaintext, or from outside the mesh)
//! matches `notPrincipals` too, so it is refused as well. Istio evaluates DENY policies before ALLOW ones, so no
//! ALLOW policy of the namespace reopens the path. With `--engine-selector`, the policy covers only the pods with
//! those labels; otherwise every workload of the namespace.

use std::collections::BTreeSet;

use llmroute_core::config::Backend;
use serde_json::{json, Value};

use super::{IstioCluster, IstioOptions};

/// The policy's name in each engine namespace.
pub const POLICY_NAME: &str = "llmroute-engines";

/// `(namespace, AuthorizationPolicy)` for each namespace the backends' Services live in, sorted.
pub fn authorization_policies(backends: &[(&Backend, IstioCluster)], opts: &IstioOptions) -> Vec<(String, Value)> {
    let Some(principal) = opts.principal() else {
        return Vec::new();
    };
    let namespaces: BTreeSet<&str> = backends.iter().filter_map(|(_, c)| c.namespace()).collect();
    namespaces
        .into_iter()
        .map(|ns| {
            let mut spec = json!({
                "action": "DENY",
                "rules": [{ "from": [{ "source": { "notPrincipals": [principal] } }] }],
            });
            if !opts.engine_selector.is_empty() {
                let labels: serde_json::Map<String, Value> = opts
                    .engine_selector
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
                    .collect();
                spec["selector"] = json!({ "matchLabels": labels });
            }
            let v = json!({
                "apiVersion": "security.istio.io/v1",
                "kind": "AuthorizationPolicy",
                "metadata": {
                    "name": POLICY_NAME,
                    "namespace": ns,
                    "labels": { "app.kubernetes.io/managed-by": "llmroute" },
                },
                "spec": spec,
            });
            (ns.to_string(), v)
        })
        .collect()
}
