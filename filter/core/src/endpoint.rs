//! Which API a request is for, from its method and path alone.
//!
//! Decided in the headers phase, before any body byte arrives, so a wrong method or an unknown path is refused
//! without buffering anything. The query string is ignored for matching.

use crate::error::GatewayError;

/// The APIs the filter handles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`: routed by alias and affinity.
    ChatCompletions,
    /// `GET /v1/models`: answered from config.
    ListModels,
    /// `GET /v1/models/{id}`: answered from config.
    GetModel(String),
}

impl Endpoint {
    /// True when the request body must be buffered and read.
    pub fn reads_body(&self) -> bool {
        matches!(self, Endpoint::ChatCompletions)
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat",
            Endpoint::ListModels | Endpoint::GetModel(_) => "models",
        }
    }
}

/// Classifies a request. Errors are the 404 and 405 refusals.
pub fn classify(method: &str, path: &str) -> Result<Endpoint, GatewayError> {
    let bare = path.split(['?', '#']).next().unwrap_or_default();
    let (endpoint, allow) = match bare {
        "/v1/chat/completions" => (Endpoint::ChatCompletions, "POST"),
        "/v1/models" => (Endpoint::ListModels, "GET"),
        _ => match bare.strip_prefix("/v1/models/") {
            Some(id) if !id.is_empty() => (Endpoint::GetModel(id.to_string()), "GET"),
            _ => {
                return Err(GatewayError::NotFound {
                    method: method.to_string(),
                    path: bare.to_string(),
                })
            }
        },
    };
    let method_ok = method == allow || (allow == "GET" && method == "HEAD");
    if !method_ok {
        return Err(GatewayError::MethodNotAllowed {
            method: method.to_string(),
            path: bare.to_string(),
            allow,
        });
    }
    Ok(endpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_is_post_only() {
        assert_eq!(classify("POST", "/v1/chat/completions"), Ok(Endpoint::ChatCompletions));
        let e = classify("GET", "/v1/chat/completions").unwrap_err();
        assert_eq!(e.status(), 405);
        assert_eq!(e.headers(), vec![("allow", "POST")]);
        assert_eq!(classify("PUT", "/v1/chat/completions").unwrap_err().status(), 405);
    }

    #[test]
    fn query_strings_are_ignored() {
        assert_eq!(
            classify("POST", "/v1/chat/completions?x=1"),
            Ok(Endpoint::ChatCompletions)
        );
        assert_eq!(classify("GET", "/v1/models?limit=2"), Ok(Endpoint::ListModels));
    }

    #[test]
    fn models_list_and_get() {
        assert_eq!(classify("GET", "/v1/models"), Ok(Endpoint::ListModels));
        assert_eq!(classify("HEAD", "/v1/models"), Ok(Endpoint::ListModels));
        assert_eq!(classify("GET", "/v1/models/a/b"), Ok(Endpoint::GetModel("a/b".into())));
        assert_eq!(classify("POST", "/v1/models").unwrap_err().status(), 405);
    }

    #[test]
    fn unknown_paths_are_404() {
        for p in [
            "/",
            "/v1",
            "/v1/chat",
            "/v1/chat/completions/",
            "/v2/chat/completions",
            "/v1/models/",
            "/health",
        ] {
            let e = classify("POST", p).unwrap_err();
            assert_eq!(e.status(), 404, "{p}");
            assert_eq!(e.code(), "unknown_url");
        }
    }
}
