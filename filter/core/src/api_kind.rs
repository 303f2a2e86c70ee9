//! The inference APIs by name: which ones the gateway serves, the path and method of each, and the error dialect
//! (envelope) each one speaks.
//!
//! A leaf of the core: the config names APIs (an alias's `endpoints`), the classifier (`crate::endpoint`) maps a
//! request's method and path to one, and every refusal is written in its envelope, so all three import these
//! names from here and nothing here imports them back.

/// The inference APIs the filter routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/responses`
    Responses,
    /// `POST /v1/embeddings`
    Embeddings,
    /// `POST /v1/messages` (Anthropic)
    Messages,
    /// `POST /v1/decisions` (OpenAI Decisions format, the NVCF LLM Gateway's beta route): only `model` is read.
    Decisions,
    /// `POST /v1/systemone` (TypeSafe System One format, the NVCF LLM Gateway's beta route): only `model` is read.
    SystemOne,
}

impl Api {
    pub const ALL: [Api; 7] = [
        Api::Chat,
        Api::Completions,
        Api::Responses,
        Api::Embeddings,
        Api::Messages,
        Api::Decisions,
        Api::SystemOne,
    ];
    pub const NAMES: &'static str = "chat, completions, responses, embeddings, messages, decisions, systemone";

    /// The name used in config (`endpoints: [...]`), logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Responses => "responses",
            Api::Embeddings => "embeddings",
            Api::Messages => "messages",
            Api::Decisions => "decisions",
            Api::SystemOne => "systemone",
        }
    }

    pub fn parse(name: &str) -> Option<Api> {
        Api::ALL.into_iter().find(|a| a.name() == name)
    }

    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
            Api::Responses => "/v1/responses",
            Api::Embeddings => "/v1/embeddings",
            Api::Messages => "/v1/messages",
            Api::Decisions => "/v1/decisions",
            Api::SystemOne => "/v1/systemone",
        }
    }

    pub fn envelope(self) -> Envelope {
        match self {
            Api::Messages => Envelope::Anthropic,
            Api::SystemOne => Envelope::SystemOne,
            _ => Envelope::OpenAi,
        }
    }

    /// The decision-model routes: the body is opaque but for `model`, and no alias serves them by default.
    pub fn is_decision(self) -> bool {
        matches!(self, Api::Decisions | Api::SystemOne)
    }

    /// A bit for [`ApiSet`].
    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of APIs, such as the endpoints an alias serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiSet(u8);

impl ApiSet {
    pub const ALL: ApiSet = ApiSet(0b111_1111);
    /// What an alias without `endpoints` serves: every API but the decision routes, which must be listed.
    pub const DEFAULT: ApiSet = ApiSet(0b1_1111);
    pub const EMPTY: ApiSet = ApiSet(0);

    pub fn with(self, api: Api) -> ApiSet {
        ApiSet(self.0 | api.bit())
    }

    pub fn contains(self, api: Api) -> bool {
        self.0 & api.bit() != 0
    }
}

/// The error dialect of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Envelope {
    /// `{"error":{"message","type","param","code"}}`
    OpenAi,
    /// `{"type":"error","error":{"type","message"},"request_id"}`
    Anthropic,
    /// `{"error":{"code","message","request_id"},"request_id"}` (TypeSafe System One)
    SystemOne,
}
