//! The secrets the filter reads from Envoy's environment, visible inside the Wasm VM: the API keys' variable
//! (`auth.keys_env`) and the placement store's etcd password (`affinity.placement_store.etcd.auth.password_env`).
//!
//! Envoy gives a VM none of its own environment unless the plugin's `vm_config.environment_variables` lists the
//! names in `host_env_keys`; the filter then reads them with `std::env::var` (WASI `environ_get`). Only the
//! variables' *names* are rendered, never their values.

use serde_json::{json, Value};

/// Where a plugin configuration (the JSON form of llmroute.yaml) names a variable the VM must see.
const VARIABLES: [&str; 2] = ["/auth/keys_env", "/affinity/placement_store/etcd/auth/password_env"];

/// The variables a plugin configuration names, in [`VARIABLES`] order.
pub fn variables(plugin_config: &str) -> Vec<String> {
    let Ok(v) = serde_json::from_str::<Value>(plugin_config) else {
        return Vec::new();
    };
    VARIABLES
        .iter()
        .filter_map(|p| v.pointer(p)?.as_str().map(str::to_string))
        .collect()
}

/// Adds `environment_variables.host_env_keys` to a wasm filter's `vm_config` when the config names any variable.
pub fn expose_keys(filter: &mut Value, plugin_config: &str) {
    let vars = variables(plugin_config);
    if vars.is_empty() {
        return;
    }
    if let Some(vm) = filter.pointer_mut("/typed_config/config/vm_config") {
        vm["environment_variables"] = json!({ "host_env_keys": vars });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_name_is_rendered() {
        let cfg = r#"{"auth":{"keys_env":"LLMROUTE_KEYS"}}"#;
        let mut f = json!({"typed_config": {"config": {"vm_config": {"vm_id": "x"}}}});
        expose_keys(&mut f, cfg);
        assert_eq!(
            f["typed_config"]["config"]["vm_config"]["environment_variables"],
            json!({"host_env_keys": ["LLMROUTE_KEYS"]})
        );
        let both = r#"{"auth":{"keys_env":"LLMROUTE_KEYS"},"affinity":{"placement_store":{"etcd":{"auth":{"user":"u","password_env":"ETCD_PW"}}}}}"#;
        let mut f = json!({"typed_config": {"config": {"vm_config": {"vm_id": "x"}}}});
        expose_keys(&mut f, both);
        assert_eq!(
            f["typed_config"]["config"]["vm_config"]["environment_variables"],
            json!({"host_env_keys": ["LLMROUTE_KEYS", "ETCD_PW"]})
        );
        let mut plain = json!({"typed_config": {"config": {"vm_config": {"vm_id": "x"}}}});
        expose_keys(&mut plain, "{}");
        assert!(plain["typed_config"]["config"]["vm_config"]
            .get("environment_variables")
            .is_none());
    }
}
