//! Which API a request is for, from its method and path alone, and in which dialect its errors are written.
//!
//! Decided in the headers phase, before any body byte arrives, so a wrong method or an unknown path is refused
//! without buffering anything. The query string is ignored for matching.

pub use crate::api_kind::{Api, ApiSet, Envelope};
use crate::error::GatewayError;
use crate::status::StatusPage;

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// An inference API: routed by alias and affinity.
    Inference(Api),
    /// `GET /v1/models`: answered from config.
    ListModels,
    /// `GET /v1/models/{id}`: answered from config.
    GetModel(String),
    /// `GET /llmroute/status`, `/healthz`, `/readyz`: answered by the filter, GET only, no body read.
    Status(StatusPage),
}

impl Endpoint {
    pub fn name(&self) -> &'static str {
        match self {
            Endpoint::Inference(api) => api.name(),
            Endpoint::ListModels | Endpoint::GetModel(_) => "models",
            Endpoint::Status(_) => "status",
        }
    }
}

/// Classifies a request. Errors are the 404 and 405 refusals.
pub fn classify(method: &str, path: &str) -> Result<Endpoint, GatewayError> {
    let bare = path.split(['?', '#']).next().unwrap_or_default();
    if let Some(page) = StatusPage::from_path(bare) {
        return match method {
            "GET" => Ok(Endpoint::Status(page)),
            _ => Err(GatewayError::MethodNotAllowed {
                method: method.to_string(),
                path: bare.to_string(),
                allow: "GET",
            }),
        };
    }
    let api = Api::ALL.into_iter().find(|a| a.path() == bare);
    let (endpoint, allow) = match (api, bare) {
        (Some(api), _) => (Endpoint::Inference(api), "POST"),
        (None, "/v1/models") => (Endpoint::ListModels, "GET"),
        (None, _) => match bare.strip_prefix("/v1/models/") {
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
    fn every_api_is_post_only() {
        for api in Api::ALL {
            assert_eq!(classify("POST", api.path()), Ok(Endpoint::Inference(api)));
            let e = classify("GET", api.path()).unwrap_err();
            assert_eq!(e.status(), 405);
            assert_eq!(e.headers(), vec![("allow", "POST")]);
        }
    }

    #[test]
    fn names_round_trip_and_sets_work() {
        let mut set = ApiSet::EMPTY;
        for api in Api::ALL {
            assert_eq!(Api::parse(api.name()), Some(api));
            assert!(!set.contains(api));
            set = set.with(api);
            assert!(set.contains(api));
        }
        assert_eq!(set, ApiSet::ALL);
        assert!(!ApiSet::DEFAULT.contains(Api::Decisions) && !ApiSet::DEFAULT.contains(Api::SystemOne));
        assert!(Api::ALL
            .iter()
            .filter(|a| !a.is_decision())
            .all(|&a| ApiSet::DEFAULT.contains(a)));
        assert_eq!(Api::parse("chat_completions"), None);
    }

    #[test]
    fn only_messages_speaks_anthropic() {
        for api in Api::ALL {
            let want = match api {
                Api::Messages => Envelope::Anthropic,
                Api::SystemOne => Envelope::SystemOne,
                _ => Envelope::OpenAi,
            };
            assert_eq!(api.envelope(), want);
        }
    }

    #[test]
    fn query_strings_are_ignored() {
        assert_eq!(
            classify("POST", "/v1/chat/completions?x=1"),
            Ok(Endpoint::Inference(Api::Chat))
        );
        assert_eq!(classify("GET", "/v1/models?limit=2"), Ok(Endpoint::ListModels));
    }

    #[test]
    fn models_list_and_get() {
        assert_eq!(classify("HEAD", "/v1/models"), Ok(Endpoint::ListModels));
        assert_eq!(classify("GET", "/v1/models/a/b"), Ok(Endpoint::GetModel("a/b".into())));
        assert_eq!(classify("POST", "/v1/models").unwrap_err().status(), 405);
    }

    #[test]
    fn status_pages_are_get_only() {
        for page in StatusPage::ALL {
            assert_eq!(classify("GET", page.path()), Ok(Endpoint::Status(page)));
            let with_query = format!("{}?verbose=1", page.path());
            assert_eq!(classify("GET", &with_query), Ok(Endpoint::Status(page)));
            assert_eq!(Endpoint::Status(page).name(), "status");
            for method in ["POST", "HEAD", "PUT", "DELETE"] {
                let e = classify(method, page.path()).unwrap_err();
                assert_eq!(e.status(), 405, "{method} {}", page.path());
                assert_eq!(e.headers(), vec![("allow", "GET")]);
            }
        }
        for p in ["/llmroute/status/", "/llmroute", "/healthz/", "/readyz/x"] {
            assert_eq!(classify("GET", p).unwrap_err().status(), 404, "{p}");
        }
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
