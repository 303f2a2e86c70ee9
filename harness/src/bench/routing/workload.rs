//! The routing bench's workloads: seeded, deterministic traces of streamed chat requests, and the oracle hit rate
//! of each.
//!
//! A [`Trace`] is a set of [`Session`]s. A session starts at a fixed offset and sends its requests one after
//! another, each after the previous answer plus a think time: the one-request sessions of the open-loop workloads
//! arrive as a Poisson process, and a multi-turn conversation is one session. The tenants workloads are a closed
//! loop instead ([`Trace::in_flight`]): their sessions leave in order, a fixed number in flight, the next one as
//! soon as one ends. Every system replays the same trace.
//!
//! Text is pseudo-random lower-case words from a SplitMix64 generator, at one token per four bytes, which is how
//! the engine emulator counts tokens. Each request carries a `session` id (the tenant, group, prompt or
//! conversation): the bench sends it as `x-session-id` to vllm-router's `consistent_hash`, the only policy that
//! needs a header to group requests. llmroute gets no header and keys on content (the system prompt, else the
//! first user message), which groups the same requests.
//!
//! **Oracle.** An infinite prefix cache behind perfect routing: walking the trace in its nominal order (session
//! start plus turn × think time), every block of a prompt seen before anywhere counts as cached. It uses the
//! emulator's own prompt text and chained block keys ([`cost::prompt_blocks`]), so it is the ceiling of what any
//! router can reach on engines with a shared LRU cache. On the tenants workloads that is "each tenant's first
//! request is cold", which engines whose slots each remember only their last prompt cannot reach once there are
//! more tenants than slots: [`Trace::slot_oracle_cached`] is the ceiling for those.

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::bench::body::ALIAS;
use crate::emulator::cost::{self, BLOCK_TOKENS};
use crate::emulator::Dialect;

/// Bytes per token, as the emulator counts them.
const BYTES_PER_TOKEN: usize = 4;

/// The four workloads of the issue, and two where a few prompt families compete for few cache slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    /// SGLang's generated-shared-prefix: groups of prompts sharing a long system prompt.
    SharedPrefix,
    /// Conversations resent whole with each turn appended.
    MultiTurn,
    /// Zipf-skewed system prompts with one hot prompt.
    Zipf,
    /// Unique prompts: nothing to share, affinity must do no harm.
    Control,
    /// 6 tenants with a long system prompt each, a closed loop, engines whose slots each keep their last prompt:
    /// the real-engine bench's workload (`bench::engines`), emulated.
    Tenants6,
    /// The same with 12 tenants: twice as many tenants as the fleet has slots.
    Tenants12,
    /// The same with 24 tenants: four times as many tenants as the fleet has slots (issue 18).
    Tenants24,
}

impl Workload {
    pub const ALL: [Workload; 7] = [
        Workload::SharedPrefix,
        Workload::MultiTurn,
        Workload::Zipf,
        Workload::Control,
        Workload::Tenants6,
        Workload::Tenants12,
        Workload::Tenants24,
    ];

    /// The id used on the command line, in progress lines and in the plot.
    pub fn id(self) -> &'static str {
        match self {
            Workload::SharedPrefix => "shared-prefix",
            Workload::MultiTurn => "multi-turn",
            Workload::Zipf => "zipf-hot",
            Workload::Control => "low-sharing",
            Workload::Tenants6 => "tenants-6",
            Workload::Tenants12 => "tenants-12",
            Workload::Tenants24 => "tenants-24",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Workload::SharedPrefix => "Generated shared prefix (SGLang-style)",
            Workload::MultiTurn => "Multi-turn chat",
            Workload::Zipf => "Zipf-skewed system prompts, one hot",
            Workload::Control => "Low-sharing control (unique prompts)",
            Workload::Tenants6 => "6 tenants competing for slots",
            Workload::Tenants12 => "12 tenants competing for slots",
            Workload::Tenants24 => "24 tenants competing for slots",
        }
    }

    /// Whether requests share prefixes.
    pub fn shares_prefixes(self) -> bool {
        self != Workload::Control
    }

    /// The tenant count of the tenants workloads.
    pub fn tenants(self) -> Option<usize> {
        match self {
            Workload::Tenants6 => Some(6),
            Workload::Tenants12 => Some(12),
            Workload::Tenants24 => Some(24),
            _ => None,
        }
    }

    /// Whether the engines run with per-slot caches (`CostModel::slot_cache`): only the tenants workloads.
    pub fn slot_cache(self) -> bool {
        self.tenants().is_some()
    }

    /// One of the issue's four workloads, which its goals are about.
    pub fn in_issue(self) -> bool {
        self.tenants().is_none()
    }

    pub fn parse(id: &str) -> Option<Workload> {
        Self::ALL.into_iter().find(|w| w.id() == id)
    }
}

/// The sizes of every workload, in tokens, and the arrival rates.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Output tokens per request (`max_tokens`).
    pub output_tokens: u32,
    /// Shared prefix: groups × prompts per group, the shared system prompt and the unique question.
    pub groups: usize,
    pub prompts_per_group: usize,
    pub prefix_tokens: usize,
    pub question_tokens: usize,
    /// Arrival rate of the shared-prefix and control workloads, requests per second.
    pub rate: f64,
    /// Multi-turn: conversations × turns; the first user message (a pasted document), then per turn an assistant
    /// reply and a user message; the think time between an answer and the next turn; conversation starts per
    /// second.
    pub conversations: usize,
    pub turns: usize,
    pub first_user_tokens: usize,
    pub reply_tokens: usize,
    pub turn_user_tokens: usize,
    pub think: Duration,
    pub conversation_rate: f64,
    /// Zipf: system prompts, requests, prompt and user sizes, the hot prompt's share, the exponent of the rest.
    pub zipf_prompts: usize,
    pub zipf_requests: usize,
    pub zipf_prompt_tokens: usize,
    pub zipf_user_tokens: usize,
    pub hot_share: f64,
    pub zipf_exponent: f64,
    /// Arrival rate of the Zipf workload: higher, so that the hot prompt alone overloads one engine.
    pub zipf_rate: f64,
    /// Control: unique prompts and their size.
    pub control_requests: usize,
    pub control_tokens: usize,
    /// Tenants: requests (spread evenly over the tenants), each tenant's system prompt and each request's own
    /// question, requests in flight (closed loop), output tokens (`max_tokens`), and the slots of each engine,
    /// each of which remembers only the last prompt it served.
    pub tenant_requests: usize,
    pub tenant_prompt_tokens: usize,
    pub tenant_question_tokens: usize,
    pub tenant_in_flight: usize,
    pub tenant_output_tokens: u32,
    pub tenant_slots: usize,
}

/// The fewest requests per tenant of a tenants workload: with fewer, most requests are a tenant's first (cold
/// whatever the placement), and the workload would measure little but that.
pub const MIN_REQUESTS_PER_TENANT: usize = 4;

impl Shape {
    /// The default run: each workload takes about 5-6 s to replay.
    pub fn full() -> Shape {
        Shape {
            output_tokens: 12,
            groups: 32,
            prompts_per_group: 12,
            prefix_tokens: 1024,
            question_tokens: 128,
            rate: 64.0,
            conversations: 32,
            turns: 8,
            first_user_tokens: 512,
            reply_tokens: 48,
            turn_user_tokens: 32,
            think: Duration::from_millis(400),
            conversation_rate: 12.0,
            zipf_prompts: 64,
            zipf_requests: 448,
            zipf_prompt_tokens: 512,
            zipf_user_tokens: 96,
            hot_share: 0.4,
            zipf_exponent: 1.0,
            zipf_rate: 80.0,
            control_requests: 256,
            control_tokens: 640,
            tenant_requests: 48,
            tenant_prompt_tokens: 1000,
            tenant_question_tokens: 20,
            tenant_in_flight: 3,
            tenant_output_tokens: 8,
            tenant_slots: 2,
        }
    }

    /// A sanity run: about a quarter of the requests, each workload about 1.5 s (the tenants workloads, already
    /// that short, stay whole).
    pub fn quick() -> Shape {
        Shape {
            groups: 12,
            prompts_per_group: 8,
            conversations: 12,
            turns: 4,
            think: Duration::from_millis(200),
            zipf_prompts: 24,
            zipf_requests: 96,
            control_requests: 64,
            ..Shape::full()
        }
    }

    /// Requests of a tenants workload of `n` tenants: `tenant_requests`, or [`MIN_REQUESTS_PER_TENANT`] per tenant
    /// when that is more (`tenants-24` sends 96).
    pub fn tenant_requests_for(&self, n: usize) -> usize {
        self.tenant_requests.max(n.saturating_mul(MIN_REQUESTS_PER_TENANT))
    }

    /// Prefix-cache blocks per engine: half the shared-prefix workload's prefixes, so one engine cannot hold them
    /// all but a third of them fits with room to spare. Routing then decides the hit rate.
    pub fn cache_blocks(&self) -> usize {
        (self.groups * self.prefix_tokens / BLOCK_TOKENS as usize / 2).max(64)
    }
}

/// One request of a trace.
#[derive(Debug, Clone)]
pub struct Request {
    /// The chat body, streamed, with `stream_options.include_usage`.
    pub body: Bytes,
    /// The tenant, group, prompt or conversation id (`x-session-id` for vllm-router's `consistent_hash`).
    pub session: String,
    /// Prompt tokens as the emulator counts them.
    pub prompt_tokens: u64,
}

/// Requests sent one after another.
#[derive(Debug, Clone)]
pub struct Session {
    /// When the first request is sent, from the start of the replay.
    pub start: Duration,
    /// Pause between an answer and the next request.
    pub think: Duration,
    pub requests: Vec<Request>,
}

/// One prompt of a trace, in its nominal order, as the oracles see it.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// The request's session id: its tenant, group, prompt or conversation.
    pub key: String,
    /// Prompt tokens and the chained keys of its complete blocks, as the emulator counts them.
    pub tokens: u64,
    pub blocks: Vec<u64>,
}

/// A whole workload, ready to replay.
#[derive(Debug, Clone)]
pub struct Trace {
    pub workload: Workload,
    pub sessions: Vec<Session>,
    /// `Some(n)`: a closed loop: the sessions leave in order, `n` in flight, the next as soon as one ends, and
    /// their start offsets are ignored. `None`: an open loop, each session at its start offset.
    pub in_flight: Option<usize>,
    /// Every prompt in the nominal order (session start plus turn × think time).
    pub prompts: Vec<Prompt>,
    /// Distinct routing keys (groups, conversations, prompts, requests).
    pub keys: usize,
    pub requests: usize,
    pub prompt_tokens: u64,
    /// Tokens an infinite cache behind perfect routing would hold.
    pub oracle_cached: u64,
    /// Distinct prefix-cache blocks in the whole trace: what an infinite cache ends up holding.
    pub distinct_blocks: usize,
    /// One line on its shape, for the report.
    pub summary: String,
}

impl Trace {
    pub fn oracle_hit_rate(&self) -> f64 {
        self.oracle_cached as f64 / self.prompt_tokens.max(1) as f64
    }

    /// Tokens that `slots` slots, each remembering only the last prompt it served, could hold behind a perfect
    /// router that knows the whole trace: the prompts served one at a time in the nominal order, each by the slot
    /// holding its key's last prompt if one does (cached: the blocks the two share), else by an empty slot or the
    /// one whose key comes back last (Belady's farthest-next-use, which is optimal when every hit is worth the
    /// same, as on the tenants workloads). It assumes prompts of different keys share no blocks, which holds for
    /// the tenants workloads. The engines cannot beat it in the nominal order; a closed loop reorders requests a
    /// little, so it is the ceiling up to that.
    pub fn slot_oracle_cached(&self, slots: usize) -> u64 {
        slot_oracle(&self.prompts, slots)
    }

    /// [`Trace::slot_oracle_cached`] ÷ prompt tokens.
    pub fn slot_oracle_hit_rate(&self, slots: usize) -> f64 {
        self.slot_oracle_cached(slots) as f64 / self.prompt_tokens.max(1) as f64
    }

    /// The same perfect router without knowledge of the future: a key's prompt goes to the slot holding the key,
    /// else the slot used least recently is evicted (LRU over the fleet's slots, one request at a time). For
    /// tenants of equal traffic in random order this is about what any online placement can keep warm: each
    /// tenant's repeats find it warm about slots ÷ tenants of the time, however the keys are spread, once every
    /// slot is in use (issue 18, docs/placement.md).
    pub fn slot_lru_cached(&self, slots: usize) -> u64 {
        slot_lru(&self.prompts, slots)
    }

    /// [`Trace::slot_lru_cached`] ÷ prompt tokens.
    pub fn slot_lru_hit_rate(&self, slots: usize) -> f64 {
        self.slot_lru_cached(slots) as f64 / self.prompt_tokens.max(1) as f64
    }

    /// When the last session starts.
    pub fn last_start(&self) -> Duration {
        self.sessions.iter().map(|s| s.start).max().unwrap_or_default()
    }

    /// Builds `workload` from `seed`.
    pub fn generate(workload: Workload, shape: &Shape, seed: u64) -> Trace {
        let mut rng = Rng::new(seed ^ (workload as u64 + 1).wrapping_mul(0xa076_1d64_78bd_642f));
        let mut builder = Builder::default();
        let (keys, summary) = match workload {
            Workload::SharedPrefix => shared_prefix(shape, &mut rng, &mut builder),
            Workload::MultiTurn => multi_turn(shape, &mut rng, &mut builder),
            Workload::Zipf => zipf(shape, &mut rng, &mut builder),
            Workload::Control => control(shape, &mut rng, &mut builder),
            Workload::Tenants6 | Workload::Tenants12 | Workload::Tenants24 => {
                tenants(shape, workload.tenants().unwrap_or(1), &mut rng, &mut builder)
            }
        };
        builder.finish(workload, keys, summary)
    }
}

/// Collects sessions and the prompt blocks the oracle needs.
#[derive(Default)]
struct Builder {
    sessions: Vec<Session>,
    /// (nominal send time, session, turn, prompt)
    oracle: Vec<(Duration, usize, usize, Prompt)>,
    /// [`Trace::in_flight`].
    in_flight: Option<usize>,
}

impl Builder {
    /// Adds a session of chat requests, each `(session id, messages, max_tokens)`.
    fn session(&mut self, start: Duration, think: Duration, requests: Vec<(String, Value, u32)>) {
        let index = self.sessions.len();
        let mut out = Vec::with_capacity(requests.len());
        for (turn, (session, messages, max_tokens)) in requests.into_iter().enumerate() {
            let body = json!({
                "model": ALIAS,
                "messages": messages,
                "max_tokens": max_tokens,
                "stream": true,
                "stream_options": {"include_usage": true},
            });
            let (tokens, blocks) = cost::prompt_blocks(Dialect::Chat, &body);
            let prompt = Prompt {
                key: session.clone(),
                tokens,
                blocks,
            };
            self.oracle.push((start + think * turn as u32, index, turn, prompt));
            out.push(Request {
                body: Bytes::from(body.to_string()),
                session,
                prompt_tokens: tokens,
            });
        }
        self.sessions.push(Session {
            start,
            think,
            requests: out,
        });
    }

    fn finish(mut self, workload: Workload, keys: usize, summary: String) -> Trace {
        self.oracle.sort_by_key(|a| (a.0, a.1, a.2));
        let prompts: Vec<Prompt> = self.oracle.into_iter().map(|(_, _, _, p)| p).collect();
        let (prompt_tokens, oracle_cached) = oracle(prompts.iter().map(|p| (p.tokens, p.blocks.as_slice())));
        let distinct_blocks = prompts
            .iter()
            .flat_map(|p| p.blocks.iter())
            .collect::<HashSet<_>>()
            .len();
        Trace {
            workload,
            requests: self.sessions.iter().map(|s| s.requests.len()).sum(),
            sessions: self.sessions,
            in_flight: self.in_flight,
            prompts,
            keys,
            prompt_tokens,
            oracle_cached,
            distinct_blocks,
            summary,
        }
    }
}

/// (prompt tokens, cached tokens) of an infinite cache shared by every engine, over prompts in order, each given
/// as its token count and chained block keys: the leading blocks seen before are cached.
pub fn oracle<'a>(prompts: impl IntoIterator<Item = (u64, &'a [u64])>) -> (u64, u64) {
    let mut seen = HashSet::new();
    let (mut total, mut cached) = (0, 0);
    for (tokens, keys) in prompts {
        let hits = keys.iter().take_while(|k| seen.contains(*k)).count() as u64;
        total += tokens;
        cached += (hits * BLOCK_TOKENS).min(tokens);
        seen.extend(keys.iter().copied());
    }
    (total, cached)
}

/// [`Trace::slot_oracle_cached`] over `prompts` in order.
pub fn slot_oracle(prompts: &[Prompt], slots: usize) -> u64 {
    serve_slots(prompts, slots, |i, held, _| {
        let next_use = |key: &str| prompts[i + 1..].iter().position(|p| p.key == key).unwrap_or(usize::MAX);
        (0..held.len()).max_by_key(|&s| next_use(&held[s].key)).unwrap_or(0)
    })
}

/// [`Trace::slot_lru_cached`] over `prompts` in order.
pub fn slot_lru(prompts: &[Prompt], slots: usize) -> u64 {
    serve_slots(prompts, slots, |_, _, last_used| {
        (0..last_used.len()).min_by_key(|&s| last_used[s]).unwrap_or(0)
    })
}

/// The tokens cached when `prompts` are served one at a time, in order, by `slots` slots that each remember only
/// their last prompt: a prompt goes to the slot holding its key (cached: the leading blocks the two share), else
/// to an empty slot, else to the slot `evict(i, held, last_used)` names (`last_used`: the index of each slot's
/// last prompt).
fn serve_slots(prompts: &[Prompt], slots: usize, evict: impl Fn(usize, &[&Prompt], &[usize]) -> usize) -> u64 {
    let mut held: Vec<&Prompt> = Vec::with_capacity(slots);
    let mut last_used: Vec<usize> = Vec::with_capacity(slots);
    let mut cached = 0;
    for (i, prompt) in prompts.iter().enumerate() {
        if slots == 0 {
            break;
        }
        if let Some(s) = held.iter().position(|p| p.key == prompt.key) {
            let common = held[s]
                .blocks
                .iter()
                .zip(&prompt.blocks)
                .take_while(|(a, b)| a == b)
                .count() as u64;
            cached += (common * BLOCK_TOKENS).min(prompt.tokens);
            held[s] = prompt;
            last_used[s] = i;
        } else if held.len() < slots {
            held.push(prompt);
            last_used.push(i);
        } else {
            let s = evict(i, &held, &last_used);
            held[s] = prompt;
            last_used[s] = i;
        }
    }
    cached
}

fn system(text: String) -> Value {
    json!({"role": "system", "content": text})
}

fn user(text: String) -> Value {
    json!({"role": "user", "content": text})
}

/// Poisson arrival times at `rate` per second, `n` of them, the first at 0.
fn arrivals(rng: &mut Rng, n: usize, rate: f64) -> Vec<Duration> {
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                t += exponential(rng, rate);
            }
            Duration::from_secs_f64(t)
        })
        .collect()
}

fn shared_prefix(shape: &Shape, rng: &mut Rng, b: &mut Builder) -> (usize, String) {
    let prefixes: Vec<String> = (0..shape.groups)
        .map(|g| {
            text(
                rng,
                &format!("You are the assistant of tenant {g}. "),
                shape.prefix_tokens,
            )
        })
        .collect();
    let mut requests: Vec<(usize, String)> = (0..shape.groups)
        .flat_map(|g| (0..shape.prompts_per_group).map(move |p| (g, p)))
        .map(|(g, p)| {
            (
                g,
                text(rng, &format!("Question {p} for tenant {g}: "), shape.question_tokens),
            )
        })
        .collect();
    rng.shuffle(&mut requests);
    let times = arrivals(rng, requests.len(), shape.rate);
    for ((g, question), at) in requests.into_iter().zip(times) {
        let messages = json!([system(prefixes[g].clone()), user(question)]);
        b.session(
            at,
            Duration::ZERO,
            vec![(format!("group-{g}"), messages, shape.output_tokens)],
        );
    }
    let summary = format!(
        "{} groups × {} prompts; a {}-token system prompt per group, a {}-token question per prompt, in random \
         order; Poisson arrivals at {:.0} req/s",
        shape.groups, shape.prompts_per_group, shape.prefix_tokens, shape.question_tokens, shape.rate
    );
    (shape.groups, summary)
}

fn multi_turn(shape: &Shape, rng: &mut Rng, b: &mut Builder) -> (usize, String) {
    let starts = arrivals(rng, shape.conversations, shape.conversation_rate);
    for (c, start) in starts.into_iter().enumerate() {
        let mut messages = vec![user(text(
            rng,
            &format!("Conversation {c}. Please read: "),
            shape.first_user_tokens,
        ))];
        let mut turns = Vec::with_capacity(shape.turns);
        for t in 0..shape.turns {
            if t > 0 {
                messages.push(json!({"role": "assistant", "content": text(rng, "", shape.reply_tokens)}));
                messages.push(user(text(rng, &format!("Turn {t}: "), shape.turn_user_tokens)));
            }
            turns.push((
                format!("conversation-{c}"),
                Value::from(messages.clone()),
                shape.output_tokens,
            ));
        }
        b.session(start, shape.think, turns);
    }
    let summary = format!(
        "{} conversations × {} turns, no system prompt; a {}-token first user message, then per turn a {}-token \
         assistant reply and a {}-token user message appended, each turn sent {} ms after the last answer; \
         conversations start at {:.0}/s",
        shape.conversations,
        shape.turns,
        shape.first_user_tokens,
        shape.reply_tokens,
        shape.turn_user_tokens,
        shape.think.as_millis(),
        shape.conversation_rate
    );
    (shape.conversations, summary)
}

fn zipf(shape: &Shape, rng: &mut Rng, b: &mut Builder) -> (usize, String) {
    let prompts: Vec<String> = (0..shape.zipf_prompts)
        .map(|k| {
            text(
                rng,
                &format!("You are persona {k} of the catalogue. "),
                shape.zipf_prompt_tokens,
            )
        })
        .collect();
    let cdf = zipf_cdf(shape.zipf_prompts, shape.hot_share, shape.zipf_exponent);
    let times = arrivals(rng, shape.zipf_requests, shape.zipf_rate);
    for (i, at) in times.into_iter().enumerate() {
        let k = pick(&cdf, rng.unit());
        let question = text(rng, &format!("Request {i}: "), shape.zipf_user_tokens);
        let messages = json!([system(prompts[k].clone()), user(question)]);
        b.session(
            at,
            Duration::ZERO,
            vec![(format!("prompt-{k}"), messages, shape.output_tokens)],
        );
    }
    let summary = format!(
        "{} requests over {} system prompts of {} tokens: prompt 0 takes {:.0}% of requests, the rest follow Zipf \
         s = {}; a {}-token user message each; Poisson arrivals at {:.0} req/s",
        shape.zipf_requests,
        shape.zipf_prompts,
        shape.zipf_prompt_tokens,
        shape.hot_share * 100.0,
        shape.zipf_exponent,
        shape.zipf_user_tokens,
        shape.zipf_rate
    );
    (shape.zipf_prompts, summary)
}

fn control(shape: &Shape, rng: &mut Rng, b: &mut Builder) -> (usize, String) {
    let rate = shape.rate * 0.75;
    let times = arrivals(rng, shape.control_requests, rate);
    for (i, at) in times.into_iter().enumerate() {
        let messages = json!([user(text(rng, &format!("Unique request {i}: "), shape.control_tokens))]);
        b.session(
            at,
            Duration::ZERO,
            vec![(format!("request-{i}"), messages, shape.output_tokens)],
        );
    }
    let summary = format!(
        "{} unique {}-token user messages, no system prompt; Poisson arrivals at {rate:.0} req/s",
        shape.control_requests, shape.control_tokens
    );
    (shape.control_requests, summary)
}

fn tenants(shape: &Shape, n: usize, rng: &mut Rng, b: &mut Builder) -> (usize, String) {
    let prompts: Vec<String> = (0..n)
        .map(|t| {
            text(
                rng,
                &format!("You are the assistant of tenant {t}. "),
                shape.tenant_prompt_tokens,
            )
        })
        .collect();
    // Balanced: requests ÷ tenants each (the first tenants one more when it does not divide), in a seeded order.
    let requests = shape.tenant_requests_for(n);
    let mut order: Vec<usize> = (0..requests).map(|i| i % n.max(1)).collect();
    rng.shuffle(&mut order);
    for (i, t) in order.into_iter().enumerate() {
        let question = text(
            rng,
            &format!("Question {i} from tenant {t}: "),
            shape.tenant_question_tokens,
        );
        let messages = json!([system(prompts[t].clone()), user(question)]);
        b.session(
            Duration::ZERO,
            Duration::ZERO,
            vec![(format!("tenant-{t}"), messages, shape.tenant_output_tokens)],
        );
    }
    b.in_flight = Some(shape.tenant_in_flight.max(1));
    let summary = format!(
        "{n} tenants, each with its own {}-token system prompt; {} requests ({} per tenant) in a seeded random \
         order of tenants, each its tenant's system prompt and a {}-token question of its own, `max_tokens` {}; a \
         closed loop with {} in flight; engines of {} slots, each slot remembering only its last prompt",
        shape.tenant_prompt_tokens,
        requests,
        requests / n.max(1),
        shape.tenant_question_tokens,
        shape.tenant_output_tokens,
        shape.tenant_in_flight,
        shape.tenant_slots
    );
    (n, summary)
}

/// The cumulative distribution over `n` prompts: prompt 0 has `hot`, the others share the rest as 1/rank^s.
fn zipf_cdf(n: usize, hot: f64, s: f64) -> Vec<f64> {
    let weights: Vec<f64> = (1..n).map(|rank| 1.0 / (rank as f64).powf(s)).collect();
    let sum: f64 = weights.iter().sum();
    let mut acc = if n > 1 { hot } else { 1.0 };
    let mut cdf = vec![acc];
    for w in weights {
        acc += (1.0 - hot) * w / sum;
        cdf.push(acc);
    }
    cdf
}

fn pick(cdf: &[f64], u: f64) -> usize {
    cdf.iter().position(|&c| u < c).unwrap_or(cdf.len().saturating_sub(1))
}

/// The workloads' generator.
pub type Rng = crate::rng::SplitMix64;

/// `head` followed by random words, `tokens` × 4 bytes in all (or `head` alone if longer).
fn text(rng: &mut Rng, head: &str, tokens: usize) -> String {
    rng.text(head, tokens * BYTES_PER_TOKEN)
}

/// An exponential gap, in seconds, at `rate` per second.
fn exponential(rng: &mut Rng, rate: f64) -> f64 {
    rng.exponential(1.0 / rate.max(1e-9))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(r: &Request) -> Vec<Value> {
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        v["messages"].as_array().unwrap().clone()
    }

    #[test]
    fn traces_are_deterministic_and_seeded() {
        let shape = Shape::quick();
        for w in Workload::ALL {
            let a = Trace::generate(w, &shape, 7);
            let b = Trace::generate(w, &shape, 7);
            let c = Trace::generate(w, &shape, 8);
            let bodies = |t: &Trace| -> Vec<Bytes> {
                t.sessions
                    .iter()
                    .flat_map(|s| s.requests.iter().map(|r| r.body.clone()))
                    .collect()
            };
            assert_eq!(bodies(&a), bodies(&b), "{w:?}");
            assert_ne!(bodies(&a), bodies(&c), "{w:?}");
            assert_eq!(a.oracle_cached, b.oracle_cached);
            assert!(a.requests > 0 && a.prompt_tokens > 0);
        }
    }

    #[test]
    fn shared_prefix_oracle_is_every_repeat_of_a_prefix() {
        let shape = Shape::quick();
        let t = Trace::generate(Workload::SharedPrefix, &shape, 1);
        assert_eq!(t.requests, shape.groups * shape.prompts_per_group);
        assert_eq!(t.keys, shape.groups);
        // Every prompt after the first of its group reuses the whole system prompt's complete blocks.
        let prefix_blocks = (shape.prefix_tokens * 4 + "system:".len()) as u64 / 64;
        let repeats = (shape.groups * (shape.prompts_per_group - 1)) as u64;
        assert_eq!(t.oracle_cached, repeats * prefix_blocks * BLOCK_TOKENS);
        let r = t.oracle_hit_rate();
        assert!(r > 0.7 && r < 0.9, "{r}");
    }

    #[test]
    fn multi_turn_resends_the_conversation_with_the_turn_appended() {
        let shape = Shape::quick();
        let t = Trace::generate(Workload::MultiTurn, &shape, 1);
        assert_eq!(t.sessions.len(), shape.conversations);
        let conv = &t.sessions[0];
        assert_eq!(conv.requests.len(), shape.turns);
        assert_eq!(conv.think, shape.think);
        for pair in conv.requests.windows(2) {
            let (before, after) = (messages(&pair[0]), messages(&pair[1]));
            assert_eq!(after.len(), before.len() + 2);
            assert_eq!(after[..before.len()], before[..]);
            assert_eq!(after[before.len()]["role"], "assistant");
            assert_eq!(pair[0].session, pair[1].session);
        }
        assert!(t.oracle_hit_rate() > 0.5, "{}", t.oracle_hit_rate());
    }

    #[test]
    fn zipf_has_one_hot_prompt() {
        let shape = Shape::full();
        let t = Trace::generate(Workload::Zipf, &shape, 3);
        let hot = t
            .sessions
            .iter()
            .filter(|s| s.requests[0].session == "prompt-0")
            .count() as f64;
        let share = hot / t.requests as f64;
        assert!((share - shape.hot_share).abs() < 0.07, "{share}");
        let cdf = zipf_cdf(4, 0.4, 1.0);
        assert!((cdf[3] - 1.0).abs() < 1e-9);
        assert!((cdf[0] - 0.4).abs() < 1e-9);
        assert_eq!(pick(&cdf, 0.0), 0);
        assert_eq!(pick(&cdf, 0.999_999), 3);
    }

    #[test]
    fn control_shares_nothing() {
        let t = Trace::generate(Workload::Control, &Shape::quick(), 5);
        assert_eq!(t.oracle_cached, 0);
        assert_eq!(t.keys, t.requests);
    }

    #[test]
    fn tenants_are_balanced_closed_loop_and_their_oracle_is_each_first_request_cold() {
        let shape = Shape::full();
        for (w, n, requests) in [
            (Workload::Tenants6, 6, 48),
            (Workload::Tenants12, 12, 48),
            (Workload::Tenants24, 24, 96),
        ] {
            let t = Trace::generate(w, &shape, 42);
            assert_eq!((t.requests, t.keys, t.in_flight), (requests, n, Some(3)));
            let mut per_tenant = std::collections::HashMap::new();
            for s in &t.sessions {
                assert_eq!(s.requests.len(), 1);
                *per_tenant.entry(s.requests[0].session.clone()).or_insert(0) += 1;
            }
            assert_eq!(per_tenant.len(), n);
            assert!(per_tenant.values().all(|&c| c == requests / n), "{per_tenant:?}");
            let first = messages(&t.sessions[0].requests[0]);
            let system = first[0]["content"].as_str().unwrap();
            assert_eq!(system.len(), 4000);
            assert!(first[1]["content"].as_str().unwrap().len() == 80);
            let body: Value = serde_json::from_slice(&t.sessions[0].requests[0].body).unwrap();
            assert_eq!(body["max_tokens"], 8);
            // Every request but each tenant's first reuses the system prompt's complete blocks.
            let system_blocks = (4000 + "system:".len()) as u64 / 64;
            assert_eq!(t.oracle_cached, (requests - n) as u64 * system_blocks * BLOCK_TOKENS);
            // With a slot per tenant the slot-limited ceiling is the same; with fewer slots it is lower.
            assert_eq!(t.slot_oracle_cached(n), t.oracle_cached);
            assert!(t.slot_oracle_cached(n / 2) < t.oracle_cached);
            // Without the future, LRU over the slots keeps less; with a slot per tenant, as much.
            assert!(t.slot_lru_cached(n / 2) < t.slot_oracle_cached(n / 2));
            assert_eq!(t.slot_lru_cached(n), t.oracle_cached);
            assert_eq!(t.slot_oracle_cached(0), 0);
        }
        let twelve = Trace::generate(Workload::Tenants12, &shape, 42);
        let six_slots = twelve.slot_oracle_hit_rate(6);
        assert!(
            six_slots > 0.2 && six_slots < twelve.oracle_hit_rate() - 0.1,
            "{six_slots}"
        );
        assert!(Workload::Tenants6.slot_cache() && !Workload::Zipf.slot_cache());
        assert_eq!(Workload::parse("tenants-12"), Some(Workload::Tenants12));
        assert_eq!(Workload::parse("tenants-24"), Some(Workload::Tenants24));
    }

    #[test]
    fn slot_oracle_evicts_the_key_needed_last() {
        let p = |key: &str, block: u64| Prompt {
            key: key.into(),
            tokens: 20,
            blocks: vec![block],
        };
        // A B C A B A on 2 slots: C evicts B (needed after A), B then evicts C (never needed): A hits twice.
        // LRU would evict A for C and hit once.
        let trace = [p("a", 1), p("b", 2), p("c", 3), p("a", 1), p("b", 2), p("a", 1)];
        assert_eq!(slot_oracle(&trace, 2), 2 * BLOCK_TOKENS);
        assert_eq!(slot_oracle(&trace, 3), 3 * BLOCK_TOKENS);
        // LRU on 2 slots evicts A for C, then B for A, then C for B: only the last A hits. A cycle of 3 keys on 2
        // slots never hits under LRU, where Belady hits twice.
        assert_eq!(slot_lru(&trace, 2), BLOCK_TOKENS);
        assert_eq!(slot_lru(&trace, 3), 3 * BLOCK_TOKENS);
        let cycle = [p("a", 1), p("b", 2), p("c", 3), p("a", 1), p("b", 2), p("c", 3)];
        assert_eq!(slot_lru(&cycle, 2), 0);
        assert_eq!(slot_oracle(&cycle, 2), 2 * BLOCK_TOKENS);
        // A key's next prompt shares only the leading blocks it has in common with its last one.
        let grows = [
            p("a", 1),
            Prompt {
                blocks: vec![1, 7],
                tokens: 40,
                ..p("a", 1)
            },
        ];
        assert_eq!(slot_oracle(&grows, 1), BLOCK_TOKENS);
    }

    #[test]
    fn oracle_counts_leading_blocks_seen_anywhere() {
        let (total, cached) = oracle([(40, &[1, 2][..]), (40, &[1, 2, 3][..]), (20, &[9, 2][..])]);
        assert_eq!(total, 100);
        assert_eq!(cached, 32);
        let (_, capped) = oracle([(40, &[1, 2, 3][..]), (20, &[1, 2, 3][..])]);
        assert_eq!(capped, 20);
    }

    #[test]
    fn arrivals_average_the_rate() {
        let mut rng = Rng::new(1);
        let t = arrivals(&mut rng, 2001, 100.0);
        let span = t.last().unwrap().as_secs_f64();
        assert!((span - 20.0).abs() < 2.0, "{span}");
        assert_eq!(t[0], Duration::ZERO);
        assert_eq!(text(&mut Rng::new(3), "ab ", 4).len(), 16);
        assert_eq!(text(&mut Rng::new(3), "a long head", 1), "a long head");
    }
}
