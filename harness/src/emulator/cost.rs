//! An opt-in cost model, so routers in front of emulated engines see load the way they would with real ones.
//!
//! Off by default ([`EmulatorOptions::cost`](super::EmulatorOptions) is `None`): the emulator then answers at once
//! as it always has. With a [`CostModel`], every inference request that uses the KV cache goes through an engine
//! with a fixed number of slots:
//!
//! 1. **Queue.** It waits, first come first served, for one of `slots` (a fair semaphore).
//! 2. **Prefill.** Holding the slot, it looks its prompt up in the prefix cache (so the cache sees requests in the
//!    order the engine schedules them) and spends `prefill_ms_per_token` per **uncached** prompt token. The cache
//!    is the engine's one LRU cache of blocks, or, with [`CostModel::slot_cache`], the memory of the slot the
//!    request takes: each slot remembers only the last prompt it served (see [`choose_slot`]).
//! 3. **Decode.** The first token is out at the end of prefill, so
//!    `TTFT = queue wait + uncached tokens × prefill_ms_per_token`. Each further token follows
//!    `decode_ms_per_token` later. A stream has as many content deltas as the request's `max_completion_tokens`
//!    (or `max_tokens`, `max_output_tokens`) unless `x-emu-chunks` says otherwise. The slot is released after the
//!    last token.
//!
//! Sleeps are real (`tokio::time`), so a proxy in front sees real queueing. `timings` and `cached_tokens` are
//! reported as without the model. Per engine, [`EngineStats`] counts the requests, prompt and cached tokens and
//! the queue waits, for benches (`Emulator::cost_stats`); `Emulator::reset` clears them.

use std::cmp::Reverse;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::dialect::{Answer, Dialect, StreamFaults, StreamPlan, NON_STREAM_TOKENS};
use super::{cache, pause, Emulator, Shared};

/// What an engine's work costs. See the module documentation for how it is applied.
#[derive(Clone, Debug, PartialEq)]
pub struct CostModel {
    /// Milliseconds per prompt token that is not in the prefix cache.
    pub prefill_ms_per_token: f64,
    /// Milliseconds per output token after the first.
    pub decode_ms_per_token: f64,
    /// Requests served at once; more wait in a FIFO queue. At least 1.
    pub slots: usize,
    /// Per-slot prompt cache, like `llama-server -np N -cram 0`: each slot remembers only the block keys of the
    /// last prompt it served, and the engine's shared LRU cache is not used. A request takes the free slot that
    /// shares the longest prefix with its prompt, else the least recently used free slot ([`choose_slot`]), so a
    /// prefix is warm only in the slot that last served it. False: one LRU cache per engine.
    pub slot_cache: bool,
}

impl CostModel {
    /// Prefill time of `uncached` prompt tokens.
    pub fn prefill(&self, uncached: u64) -> Duration {
        ms(uncached as f64 * self.prefill_ms_per_token)
    }

    /// The pause between two output tokens.
    pub fn decode_step(&self) -> Duration {
        ms(self.decode_ms_per_token)
    }

    /// Time to first token after `queue_wait` in the queue, for `uncached` prompt tokens.
    pub fn ttft(&self, queue_wait: Duration, uncached: u64) -> Duration {
        queue_wait + self.prefill(uncached)
    }

    /// How long a request holds its slot: prefill, then `output` tokens (the first free with the prefill).
    pub fn service(&self, uncached: u64, output: u64) -> Duration {
        self.prefill(uncached) + self.decode_step() * output.saturating_sub(1).min(u64::from(u32::MAX)) as u32
    }
}

fn ms(millis: f64) -> Duration {
    Duration::from_secs_f64(millis.max(0.0) / 1000.0)
}

/// What one engine served under the cost model since it started or was last reset.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    /// Requests that went through a slot.
    pub requests: u64,
    /// Their prompt tokens, and how many of those the prefix cache held.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Total and longest wait for a slot.
    pub queue_wait_total: Duration,
    pub queue_wait_max: Duration,
    /// Most requests waiting for a slot at once.
    pub max_queued: usize,
    /// Each request's TTFT inside the engine (queue wait + prefill), in arrival order at the slot.
    pub ttfts: Vec<Duration>,
}

/// The cost model's state in a running emulator.
pub(super) struct CostState {
    model: CostModel,
    slots: Arc<Semaphore>,
    /// With `slot_cache`: what each slot remembers, and which are taken.
    memory: Option<Arc<Mutex<SlotTable>>>,
    queued: AtomicUsize,
    stats: Mutex<EngineStats>,
}

impl CostState {
    pub(super) fn new(mut model: CostModel) -> Self {
        model.slots = model.slots.max(1);
        CostState {
            slots: Arc::new(Semaphore::new(model.slots)),
            memory: model
                .slot_cache
                .then(|| Arc::new(Mutex::new(SlotTable::new(model.slots)))),
            model,
            queued: AtomicUsize::new(0),
            stats: Mutex::new(EngineStats::default()),
        }
    }

    fn stats(&self) -> MutexGuard<'_, EngineStats> {
        self.stats.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Clears the stats and, with `slot_cache`, what the slots remember (the slots in use stay taken).
    pub(super) fn reset(&self) {
        *self.stats() = EngineStats::default();
        if let Some(memory) = &self.memory {
            lock(memory).forget();
        }
    }
}

fn lock(memory: &Mutex<SlotTable>) -> MutexGuard<'_, SlotTable> {
    memory.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What one slot of an engine with [`CostModel::slot_cache`] remembers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SlotMemory {
    /// Chained block keys of the last prompt the slot served (empty: none yet).
    pub keys: Vec<u64>,
    /// Serving a request now.
    pub busy: bool,
    /// When it last took a request, on a counter that grows by one per request (0: never).
    pub last_used: u64,
}

/// The slot a prompt with block keys `keys` takes among `slots`: the free slot whose remembered keys share the
/// longest common prefix with `keys` (the least recently used of equals), else, when none shares a block, the
/// least recently used free slot (the lowest index of equals). Returns its index and the blocks it shares;
/// `None` when every slot is busy.
pub fn choose_slot(slots: &[SlotMemory], keys: &[u64]) -> Option<(usize, usize)> {
    slots
        .iter()
        .enumerate()
        .filter(|(_, slot)| !slot.busy)
        .map(|(i, slot)| (i, cache::common_prefix(&slot.keys, keys), slot.last_used))
        .max_by_key(|&(i, matched, last_used)| (matched, Reverse(last_used), Reverse(i)))
        .map(|(i, matched, _)| (i, matched))
}

/// The slots of an engine with `slot_cache`.
#[derive(Debug)]
struct SlotTable {
    slots: Vec<SlotMemory>,
    clock: u64,
}

impl SlotTable {
    fn new(slots: usize) -> Self {
        SlotTable {
            slots: vec![SlotMemory::default(); slots],
            clock: 0,
        }
    }

    /// Takes the slot [`choose_slot`] picks for `keys`, which it remembers from now on; returns its index and the
    /// blocks it had cached. `None` when every slot is busy.
    fn take(&mut self, keys: Vec<u64>) -> Option<(usize, usize)> {
        let (index, matched) = choose_slot(&self.slots, &keys)?;
        self.clock += 1;
        self.slots[index] = SlotMemory {
            keys,
            busy: true,
            last_used: self.clock,
        };
        Some((index, matched))
    }

    fn release(&mut self, index: usize) {
        if let Some(slot) = self.slots.get_mut(index) {
            slot.busy = false;
        }
    }

    /// Forgets every prompt and when each slot was used.
    fn forget(&mut self) {
        for slot in &mut self.slots {
            slot.keys.clear();
            slot.last_used = 0;
        }
    }
}

/// The emulator stopped while a request waited for a slot.
#[derive(Debug)]
pub(super) struct Stopped;

/// A request holding one of the engine's slots; the slot is free again when this is dropped.
pub(super) struct Slot {
    /// Dropped after [`Slot::drop`] has released the slot's memory, so a request admitted next finds it free.
    _permit: OwnedSemaphorePermit,
    waited: Duration,
    model: CostModel,
    /// With `slot_cache`: the engine's slots, and the one this request took once it looked its prompt up.
    memory: Option<Arc<Mutex<SlotTable>>>,
    taken: Option<usize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let (Some(memory), Some(index)) = (&self.memory, self.taken.take()) {
            lock(memory).release(index);
        }
    }
}

/// Waits, first come first served, for a slot: `Ok(None)` at once when the emulator has no cost model or the
/// dialect does not use the KV cache (embeddings).
pub(super) async fn admit(shared: &Shared, dialect: Dialect) -> Result<Option<Slot>, Stopped> {
    let Some(state) = shared.cost.as_ref().filter(|_| dialect.uses_cache()) else {
        return Ok(None);
    };
    let start = Instant::now();
    // Tokio's semaphore hands freed permits to waiters in order, so this never jumps the queue.
    let (permit, waited) = match state.slots.clone().try_acquire_owned() {
        Ok(permit) => (Some(permit), Duration::ZERO),
        Err(_) => {
            let queued = state.queued.fetch_add(1, Ordering::SeqCst) + 1;
            {
                let mut stats = state.stats();
                stats.max_queued = stats.max_queued.max(queued);
            }
            let mut stopped = shared.stopped.clone();
            let permit = tokio::select! {
                permit = state.slots.clone().acquire_owned() => permit.ok(),
                _ = stopped.wait_for(|stop| *stop) => None,
            };
            state.queued.fetch_sub(1, Ordering::SeqCst);
            (permit, start.elapsed())
        }
    };
    let permit = permit.ok_or(Stopped)?;
    Ok(Some(Slot {
        _permit: permit,
        waited,
        model: state.model.clone(),
        memory: state.memory.clone(),
        taken: None,
    }))
}

impl Slot {
    /// With `slot_cache`: takes a free slot for `prompt` ([`choose_slot`]) and returns the prompt tokens it had
    /// cached; the slot remembers `prompt` from now on. `None` without `slot_cache`: the engine's shared cache
    /// answers.
    pub(super) fn cached_tokens(&mut self, prompt: &[u8]) -> Option<u64> {
        let memory = self.memory.as_ref()?;
        let mut table = lock(memory);
        if let Some(index) = self.taken.take() {
            table.release(index);
        }
        // The permit guarantees a free slot; were none free, the request would run uncached.
        let Some((index, matched)) = table.take(cache::block_keys(prompt)) else {
            return Some(0);
        };
        self.taken = Some(index);
        Some(cache::cached_tokens(matched, prompt))
    }

    /// Counts the request, sets its output length and token pace, and spends its prefill time. `answer` carries
    /// the cache lookup done after admission. False if the emulator stopped meanwhile.
    pub(super) async fn prefill(
        &self,
        shared: &Shared,
        request: &Value,
        explicit_chunks: bool,
        answer: &mut Answer,
        stream: &mut StreamFaults,
    ) -> bool {
        if let Some(state) = &shared.cost {
            let mut stats = state.stats();
            stats.requests += 1;
            stats.prompt_tokens += answer.prompt_tokens;
            stats.cached_tokens += answer.cached_tokens;
            stats.queue_wait_total += self.waited;
            stats.queue_wait_max = stats.queue_wait_max.max(self.waited);
            stats.ttfts.push(self.model.ttft(self.waited, answer.uncached_tokens()));
        }
        answer.chunk_delay = self.model.decode_step();
        if !explicit_chunks {
            if let Some(tokens) = output_tokens(request) {
                stream.chunks = tokens;
            }
        }
        pause(&shared.stopped, self.model.prefill(answer.uncached_tokens())).await
    }

    /// A non-streamed answer: the output tokens after the first. False if the emulator stopped meanwhile.
    pub(super) async fn decode_plain(&self, shared: &Shared) -> bool {
        pause(&shared.stopped, self.model.service(0, NON_STREAM_TOKENS)).await
    }
}

/// Sends the first content delta of a stream with its head, at the end of prefill; the others keep their
/// decode pause.
pub(super) fn first_token_at_once(plan: &mut StreamPlan) {
    if let Some(frame) = plan.frames.iter_mut().find(|frame| !frame.delay.is_zero()) {
        frame.delay = Duration::ZERO;
    }
}

/// The output length a request asks for: `max_completion_tokens`, else `max_tokens`, else `max_output_tokens`
/// (at least 1, at most 4096).
pub fn output_tokens(request: &Value) -> Option<u32> {
    ["max_completion_tokens", "max_tokens", "max_output_tokens"]
        .iter()
        .find_map(|field| request.get(*field).and_then(Value::as_u64))
        .map(|n| n.clamp(1, 4096) as u32)
}

/// A prompt as the emulator's prefix cache sees it: its token count and the chained keys of its complete blocks.
/// Benches use it to compute what an infinite cache would hold.
pub fn prompt_blocks(dialect: Dialect, request: &Value) -> (u64, Vec<u64>) {
    let prompt = dialect.prompt_text(request);
    (
        cache::token_count(prompt.as_bytes()),
        cache::block_keys(prompt.as_bytes()),
    )
}

/// Tokens per prefix-cache block.
pub const BLOCK_TOKENS: u64 = cache::BLOCK_TOKENS;

impl Emulator {
    /// What this engine served under its cost model; `None` without one.
    pub fn cost_stats(&self) -> Option<EngineStats> {
        self.shared.cost.as_ref().map(|state| state.stats().clone())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::super::EmulatorOptions;
    use super::*;
    use futures_util::StreamExt;
    use serde_json::json;

    fn model(slots: usize) -> CostModel {
        CostModel {
            prefill_ms_per_token: 0.5,
            decode_ms_per_token: 4.0,
            slots,
            slot_cache: false,
        }
    }

    #[test]
    fn ttft_is_queue_wait_plus_uncached_prefill() {
        let m = model(1);
        assert_eq!(m.prefill(100), Duration::from_millis(50));
        assert_eq!(m.prefill(0), Duration::ZERO);
        assert_eq!(m.ttft(Duration::from_millis(30), 100), Duration::from_millis(80));
        assert_eq!(m.decode_step(), Duration::from_millis(4));
        // 100 uncached tokens, 5 output tokens: 50 ms prefill (first token), then 4 × 4 ms.
        assert_eq!(m.service(100, 5), Duration::from_millis(66));
        assert_eq!(m.service(0, 1), Duration::ZERO);
        assert_eq!(m.service(0, 0), Duration::ZERO);
    }

    #[test]
    fn fifo_queue_arithmetic() {
        // Three requests at once, one slot, each 50 ms of service: TTFTs of one, two and three prefills when
        // nothing is decoded, plus the service of those ahead when something is.
        let m = model(1);
        let service = m.service(100, 1);
        let ttfts: Vec<Duration> = (0..3u32).map(|ahead| m.ttft(service * ahead, 100)).collect();
        assert_eq!(
            ttfts,
            [50, 100, 150].map(Duration::from_millis).to_vec(),
            "queue wait is the service of those ahead"
        );
    }

    #[test]
    fn output_tokens_prefer_max_completion_tokens() {
        assert_eq!(output_tokens(&json!({"max_tokens": 7})), Some(7));
        assert_eq!(
            output_tokens(&json!({"max_completion_tokens": 3, "max_tokens": 7})),
            Some(3)
        );
        assert_eq!(output_tokens(&json!({"max_output_tokens": 0})), Some(1));
        assert_eq!(output_tokens(&json!({})), None);
    }

    #[test]
    fn prompt_blocks_match_the_cache() {
        let request = json!({"messages": [{"role": "user", "content": "x".repeat(200)}]});
        let (tokens, keys) = prompt_blocks(Dialect::Chat, &request);
        // "user:" + 200 bytes = 205 bytes: 52 tokens, 3 complete 64-byte blocks.
        assert_eq!(tokens, 52);
        assert_eq!(keys.len(), 3);
    }

    fn memory(keys: &[u64], busy: bool, last_used: u64) -> SlotMemory {
        SlotMemory {
            keys: keys.to_vec(),
            busy,
            last_used,
        }
    }

    #[test]
    fn choose_slot_takes_the_longest_shared_prefix_else_the_least_recently_used() {
        let slots = [
            memory(&[1, 2, 3], false, 5),
            memory(&[1, 2, 9], false, 2),
            memory(&[7], false, 1),
        ];
        assert_eq!(choose_slot(&slots, &[1, 2, 3, 4]), Some((0, 3)));
        // Equal prefixes: the least recently used of them.
        assert_eq!(choose_slot(&slots, &[1, 2, 5]), Some((1, 2)));
        // Nothing shared: the least recently used free slot.
        assert_eq!(choose_slot(&slots, &[8]), Some((2, 0)));
        assert_eq!(choose_slot(&slots, &[]), Some((2, 0)));
        // Busy slots are never taken, however much they share.
        let busy = [
            memory(&[1, 2, 3], true, 5),
            memory(&[1, 2, 9], false, 2),
            memory(&[7], true, 1),
        ];
        assert_eq!(choose_slot(&busy, &[1, 2, 3]), Some((1, 2)));
        assert_eq!(choose_slot(&busy, &[7]), Some((1, 0)));
        let full = [memory(&[1], true, 1), memory(&[2], true, 2)];
        assert_eq!(choose_slot(&full, &[1]), None);
        // Slots never used: the lowest index.
        let fresh: [SlotMemory; 3] = Default::default();
        assert_eq!(choose_slot(&fresh, &[1]), Some((0, 0)));
    }

    /// One request served alone: takes its slot and releases it; the blocks it found cached.
    fn serve(table: &mut SlotTable, keys: &[u64]) -> usize {
        let (index, matched) = table.take(keys.to_vec()).unwrap();
        table.release(index);
        matched
    }

    const A: [u64; 3] = [1, 2, 3];
    const B: [u64; 3] = [4, 5, 6];
    const C: [u64; 3] = [7, 8, 9];

    #[test]
    fn two_tenants_alternating_on_two_slots_both_stay_warm() {
        let mut table = SlotTable::new(2);
        let hits: Vec<usize> = [A, B, A, B, A, B].iter().map(|k| serve(&mut table, k)).collect();
        assert_eq!(hits, [0, 0, 3, 3, 3, 3]);
        assert_eq!(
            (table.slots[0].keys.as_slice(), table.slots[1].keys.as_slice()),
            (&A[..], &B[..])
        );
    }

    #[test]
    fn a_third_tenant_evicts_the_least_recently_used() {
        let mut table = SlotTable::new(2);
        // After A B A, B is the least recently used: C takes its slot, so A stays warm and B turns cold.
        let hits: Vec<usize> = [A, B, A, C, A, B].iter().map(|k| serve(&mut table, k)).collect();
        assert_eq!(hits, [0, 0, 3, 0, 3, 0]);
    }

    #[test]
    fn concurrent_same_prompt_requests_take_the_second_slot_and_evict_it() {
        let mut table = SlotTable::new(2);
        assert_eq!([A, B].map(|k| serve(&mut table, &k)), [0, 0]);
        // Two requests of A at once: the first takes A's slot, warm; the second the only free one, B's, cold.
        let first = table.take(A.to_vec()).unwrap();
        let second = table.take(A.to_vec()).unwrap();
        assert_eq!((first, second), ((0, 3), (1, 0)));
        assert_eq!(table.take(C.to_vec()), None, "both slots are busy");
        table.release(0);
        table.release(1);
        // Both slots now hold A: B was evicted.
        assert_eq!(serve(&mut table, &B), 0);
        assert_eq!(serve(&mut table, &A), 3);
        table.forget();
        assert_eq!(serve(&mut table, &A), 0, "a reset forgets every prompt");
    }

    fn body(prompt: &str, tokens: u32) -> String {
        json!({
            "model": "m",
            "stream": true,
            "max_tokens": tokens,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": prompt}],
        })
        .to_string()
    }

    /// Sends one streamed chat request; returns (TTFT, total time, content deltas, cached tokens).
    async fn timed(url: String, body: String) -> (Duration, Duration, usize, u64) {
        let start = Instant::now();
        let response = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let (mut ttft, mut deltas, mut cached, mut text) = (None, 0, 0, String::new());
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
            while let Some(end) = text.find("\n\n") {
                let event: String = text.drain(..end + 2).collect();
                let Some(data) = event.trim().strip_prefix("data: ") else {
                    continue;
                };
                let Ok(v) = serde_json::from_str::<Value>(data) else {
                    continue;
                };
                if v.pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
                    .is_some_and(|c| !c.is_empty())
                {
                    deltas += 1;
                    ttft.get_or_insert(start.elapsed());
                }
                if let Some(n) = v
                    .pointer("/usage/prompt_tokens_details/cached_tokens")
                    .and_then(Value::as_u64)
                {
                    cached = n;
                }
            }
        }
        (ttft.unwrap(), start.elapsed(), deltas, cached)
    }

    /// 400 bytes of `c`: 102 prompt tokens with the `user:` prefix (405 bytes), 6 complete cache blocks.
    fn prompt(c: char) -> String {
        c.to_string().repeat(400)
    }

    #[tokio::test]
    async fn requests_queue_behind_one_slot_and_cached_prompts_skip_prefill() {
        let mut opts = EmulatorOptions::new("costly");
        opts.cost = Some(model(1));
        let emulator = Emulator::spawn_with(opts).await.unwrap();
        let url = format!("http://{}/v1/chat/completions", emulator.addr());

        // Alone: 102 uncached tokens, about 51 ms to the first token, then 3 more tokens 4 ms apart.
        let (ttft, total, deltas, cached) = timed(url.clone(), body(&prompt('a'), 4)).await;
        assert_eq!((deltas, cached), (4, 0));
        assert!(
            ttft >= Duration::from_millis(50) && ttft < Duration::from_millis(90),
            "{ttft:?}"
        );
        assert!(total >= ttft + Duration::from_millis(12), "{total:?} after {ttft:?}");

        // The same prompt again: 96 tokens cached (6 blocks), 6 to prefill.
        let (ttft, _, _, cached) = timed(url.clone(), body(&prompt('a'), 1)).await;
        assert_eq!(cached, 96);
        assert!(ttft < Duration::from_millis(30), "{ttft:?}");

        // Three new prompts at once behind one slot, one output token each: the TTFTs step by a prefill.
        let runs = ['b', 'c', 'd'].map(|c| tokio::spawn(timed(url.clone(), body(&prompt(c), 1))));
        let mut ttfts = Vec::new();
        for run in runs {
            ttfts.push(run.await.unwrap().0);
        }
        ttfts.sort();
        assert!(ttfts[0] >= Duration::from_millis(50), "{ttfts:?}");
        assert!(ttfts[1] >= Duration::from_millis(100), "{ttfts:?}");
        assert!(ttfts[2] >= Duration::from_millis(150), "{ttfts:?}");
        assert!(ttfts[2] < Duration::from_millis(260), "{ttfts:?}");

        let stats = emulator.cost_stats().unwrap();
        assert_eq!(stats.requests, 5);
        assert_eq!(stats.prompt_tokens, 5 * 102);
        assert_eq!(stats.cached_tokens, 96);
        assert_eq!(stats.max_queued, 2);
        assert!(stats.queue_wait_max >= Duration::from_millis(90), "{stats:?}");
        assert_eq!(stats.ttfts.len(), 5);
        assert_eq!(
            stats.ttfts[1],
            Duration::from_secs_f64(0.003),
            "6 uncached tokens, nothing queued"
        );
        assert!(stats.ttfts[4] >= Duration::from_millis(150), "{:?}", stats.ttfts);
        emulator.reset();
        assert_eq!(emulator.cost_stats().unwrap(), EngineStats::default());
    }

    #[tokio::test]
    async fn two_slots_serve_two_at_once() {
        let mut opts = EmulatorOptions::new("two");
        opts.cost = Some(model(2));
        let emulator = Emulator::spawn_with(opts).await.unwrap();
        let url = format!("http://{}/v1/chat/completions", emulator.addr());
        let runs = ['e', 'f'].map(|c| tokio::spawn(timed(url.clone(), body(&prompt(c), 1))));
        for run in runs {
            let ttft = run.await.unwrap().0;
            assert!(ttft < Duration::from_millis(95), "{ttft:?}");
        }
        assert_eq!(emulator.cost_stats().unwrap().max_queued, 0);
    }

    #[tokio::test]
    async fn slot_cache_keeps_a_prefix_warm_only_in_the_slot_that_last_served_it() {
        let mut opts = EmulatorOptions::new("slots");
        opts.cost = Some(CostModel {
            prefill_ms_per_token: 0.01,
            slot_cache: true,
            ..model(2)
        });
        let emulator = Emulator::spawn_with(opts).await.unwrap();
        let url = format!("http://{}/v1/chat/completions", emulator.addr());
        let mut cached = Vec::new();
        // A B A: both warm in their slots; C takes B's slot (the least recently used); A stays warm, B is cold.
        for c in ['a', 'b', 'a', 'c', 'a', 'b'] {
            cached.push(timed(url.clone(), body(&prompt(c), 1)).await.3);
        }
        assert_eq!(cached, [0, 0, 96, 0, 96, 0]);
        let stats = emulator.cost_stats().unwrap();
        assert_eq!((stats.requests, stats.cached_tokens), (6, 192));
        // Two of the same prompt at once: one finds it warm, the other takes the other slot, cold.
        let runs = ['b', 'b'].map(|c| tokio::spawn(timed(url.clone(), body(&prompt(c), 10))));
        let mut both = Vec::new();
        for run in runs {
            both.push(run.await.unwrap().3);
        }
        both.sort_unstable();
        assert_eq!(both, [0, 96]);
        emulator.reset();
        assert_eq!(
            timed(url.clone(), body(&prompt('b'), 1)).await.3,
            0,
            "a reset forgets the slots"
        );
    }

    #[tokio::test]
    async fn without_a_cost_model_there_are_no_stats() {
        let emulator = Emulator::spawn("free").await.unwrap();
        assert_eq!(emulator.cost_stats(), None);
    }
}
