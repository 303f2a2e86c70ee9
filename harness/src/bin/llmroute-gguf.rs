//! `llmroute-gguf`: writes the tiny random-weight llama GGUF model used by the real-engine tests and demo.
//!
//! It copies the tokenizer from a vocab-only GGUF (llama.cpp's `models/ggml-vocab-llama-spm.gguf`) and adds seeded
//! random llama weights, so the same arguments always give a byte-identical file. See `llmroute_harness::gguf`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use llmroute_harness::gguf::tiny::{n_vocab, TinyLlama};
use llmroute_harness::gguf::Gguf;

#[derive(Parser)]
#[command(
    name = "llmroute-gguf",
    version,
    about = "Write a tiny random-weight llama GGUF with a real vocab"
)]
struct Args {
    /// Vocab-only GGUF to take the tokenizer from.
    #[arg(long)]
    vocab: PathBuf,
    /// Output model file.
    #[arg(long)]
    out: PathBuf,
    /// Embedding width.
    #[arg(long, default_value_t = 256)]
    embd: u32,
    /// Transformer blocks.
    #[arg(long, default_value_t = 4)]
    layers: u32,
    /// Feed-forward width.
    #[arg(long, default_value_t = 768)]
    ff: u32,
    /// Attention heads (as many KV heads).
    #[arg(long, default_value_t = 4)]
    heads: u32,
    /// Weight seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Training context length (llama.context_length).
    #[arg(long, default_value_t = 8192)]
    ctx: u32,
    /// Store matrices as F32 instead of F16.
    #[arg(long)]
    f32: bool,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("llmroute-gguf: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<String, String> {
    let model = TinyLlama {
        embd: args.embd,
        layers: args.layers,
        ff: args.ff,
        heads: args.heads,
        ctx: args.ctx,
        seed: args.seed,
        f16: !args.f32,
    };
    let vocab = Gguf::read_file(&args.vocab)?;
    let n_vocab = n_vocab(&vocab)?;
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let size = model.build(&vocab)?.write_file(&args.out)?;
    Ok(format!(
        "wrote {}: llama {}x{} ff {} heads {}, vocab {n_vocab}, {:.1}M params, {:.1} MB, seed {}",
        args.out.display(),
        model.embd,
        model.layers,
        model.ff,
        model.heads,
        model.n_params(n_vocab) as f64 / 1e6,
        size as f64 / 1e6,
        model.seed,
    ))
}
