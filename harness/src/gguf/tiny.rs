//! A tiny llama-architecture model with seeded random weights and a real tokenizer, for real-engine tests.
//!
//! Why: llama.cpp needs a model to serve, and no model hub is reachable. This model loads in `llama-server`,
//! tokenizes real text with the Llama SPM vocab copied from a vocab-only GGUF, fills and reuses a real KV/prompt
//! cache and generates real tokens (junk text: the weights are random). Its default size (256 wide, 4 layers, FFN
//! 768, F16) prefills a ~1.5k-token prompt in about 100 ms on 2 cores, so cache hits show clearly in timings.
//!
//! Determinism: weights come from SplitMix64 mapped to a uniform distribution with standard deviation 0.02, with
//! integer-to-float steps only (no `ln`/`cos` from a platform libm), so one seed gives a byte-identical file on
//! every machine. Norm weights are 1.0; the output projection is tied to `token_embd` (no `output.weight`).

use super::{Gguf, Value, ValueType, Writer};
use crate::rng::SplitMix64;

/// A ChatML chat template, so `/v1/chat/completions` and `/v1/messages` format prompts.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + \
message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' \
}}{% endif %}";

/// The tokenizer keys copied from the vocab file; the first two must exist.
const TOKENIZER_KEYS: [&str; 11] = [
    "tokenizer.ggml.model",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
];

/// Weight standard deviation; the uniform range is ±`STD`·√3.
const STD: f32 = 0.02;

/// The model's shape and seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TinyLlama {
    pub embd: u32,
    pub layers: u32,
    pub ff: u32,
    pub heads: u32,
    /// Training context length written to `llama.context_length`.
    pub ctx: u32,
    pub seed: u64,
    /// Matrices in F16 (half the file, the usual llama.cpp layout) rather than F32.
    pub f16: bool,
}

impl Default for TinyLlama {
    fn default() -> Self {
        TinyLlama {
            embd: 256,
            layers: 4,
            ff: 768,
            heads: 4,
            ctx: 8192,
            seed: 42,
            f16: true,
        }
    }
}

impl TinyLlama {
    /// Builds the model file with the tokenizer of `vocab`.
    pub fn build(&self, vocab: &Gguf) -> Result<Writer, String> {
        self.check()?;
        let n_vocab = n_vocab(vocab)?;
        let mut w = Writer::new();
        self.put_hparams(&mut w, n_vocab);
        copy_tokenizer(&mut w, vocab);
        w.kv("tokenizer.chat_template", Value::Str(CHATML_TEMPLATE.into()));
        self.put_tensors(&mut w, n_vocab)?;
        Ok(w)
    }

    /// The parameter count for a vocabulary of `n_vocab` tokens.
    pub fn n_params(&self, n_vocab: u64) -> u64 {
        let (e, f) = (u64::from(self.embd), u64::from(self.ff));
        let block = 4 * e * e + 3 * e * f + 2 * e;
        n_vocab * e + e + u64::from(self.layers) * block
    }

    fn check(&self) -> Result<(), String> {
        if [self.embd, self.layers, self.ff, self.heads, self.ctx].contains(&0) {
            return Err("embd, layers, ff, heads and ctx must be positive".into());
        }
        if !self.embd.is_multiple_of(self.heads) || !(self.embd / self.heads).is_multiple_of(2) {
            return Err(format!(
                "embd {} must split into {} heads of an even size",
                self.embd, self.heads
            ));
        }
        Ok(())
    }

    fn put_hparams(&self, w: &mut Writer, n_vocab: u64) {
        let head_dim = self.embd / self.heads;
        let file_type = if self.f16 { 1 } else { 0 };
        w.kv("general.architecture", Value::Str("llama".into()))
            .kv("general.name", Value::Str("llmroute-tiny-llama".into()))
            .kv("general.file_type", Value::U32(file_type))
            .kv("general.alignment", Value::U32(32))
            .kv("llama.vocab_size", Value::U32(n_vocab as u32))
            .kv("llama.context_length", Value::U32(self.ctx))
            .kv("llama.embedding_length", Value::U32(self.embd))
            .kv("llama.block_count", Value::U32(self.layers))
            .kv("llama.feed_forward_length", Value::U32(self.ff))
            .kv("llama.attention.head_count", Value::U32(self.heads))
            .kv("llama.attention.head_count_kv", Value::U32(self.heads))
            .kv("llama.rope.dimension_count", Value::U32(head_dim))
            .kv("llama.rope.freq_base", Value::F32(10000.0))
            .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    }

    /// `token_embd`, `output_norm`, then each block's tensors, all from one random stream in this order.
    fn put_tensors(&self, w: &mut Writer, n_vocab: u64) -> Result<(), String> {
        let (e, f) = (u64::from(self.embd), u64::from(self.ff));
        let mut rng = SplitMix64::new(self.seed);
        self.put_matrix(w, &mut rng, "token_embd.weight", [e, n_vocab])?;
        put_norm(w, "output_norm.weight", e)?;
        for i in 0..self.layers {
            let blk = |t: &str| format!("blk.{i}.{t}.weight");
            put_norm(w, &blk("attn_norm"), e)?;
            for t in ["attn_q", "attn_k", "attn_v", "attn_output"] {
                self.put_matrix(w, &mut rng, &blk(t), [e, e])?;
            }
            put_norm(w, &blk("ffn_norm"), e)?;
            self.put_matrix(w, &mut rng, &blk("ffn_gate"), [e, f])?;
            self.put_matrix(w, &mut rng, &blk("ffn_up"), [e, f])?;
            self.put_matrix(w, &mut rng, &blk("ffn_down"), [f, e])?;
        }
        Ok(())
    }

    fn put_matrix(&self, w: &mut Writer, rng: &mut SplitMix64, name: &str, dims: [u64; 2]) -> Result<(), String> {
        let data: Vec<f32> = (0..dims[0] * dims[1]).map(|_| weight(rng)).collect();
        if self.f16 {
            w.tensor_f16(name, &dims, &data)?;
        } else {
            w.tensor_f32(name, &dims, &data)?;
        }
        Ok(())
    }
}

/// The vocabulary size: the length of `tokenizer.ggml.tokens`.
pub fn n_vocab(vocab: &Gguf) -> Result<u64, String> {
    match vocab.get("tokenizer.ggml.tokens") {
        Some(Value::Array(ValueType::Str, tokens)) if !tokens.is_empty() => Ok(tokens.len() as u64),
        _ => Err("the vocab file has no tokenizer.ggml.tokens string array".into()),
    }
}

fn copy_tokenizer(w: &mut Writer, vocab: &Gguf) {
    for key in TOKENIZER_KEYS {
        if let Some(v) = vocab.get(key) {
            w.kv(key, v.clone());
        }
    }
}

fn put_norm(w: &mut Writer, name: &str, n: u64) -> Result<(), String> {
    w.tensor_f32(name, &[n], &vec![1.0; n as usize])?;
    Ok(())
}

/// Uniform on [-STD·√3, STD·√3): mean 0, standard deviation `STD`. Exact on every platform.
fn weight(rng: &mut SplitMix64) -> f32 {
    let unit = (rng.next_u64() >> 40) as f32 / (1u32 << 24) as f32;
    (2.0 * unit - 1.0) * (STD * 1.732_050_8)
}

#[cfg(test)]
pub(super) fn test_rng_weights(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| weight(&mut rng)).collect()
}
