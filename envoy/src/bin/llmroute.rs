//! The `llmroute` command line: validate a config, render the Envoy bootstrap for it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use llmroute_envoy::render::{bootstrap_yaml, RenderOptions};

#[derive(Parser)]
#[command(
    name = "llmroute",
    version,
    about = "LLM routing for Envoy: validate llmroute.yaml and render its Envoy bootstrap"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a config file; print a one-line summary, or every error and exit 1.
    Validate {
        /// Path to llmroute.yaml (YAML or JSON).
        config: PathBuf,
    },
    /// Write a complete Envoy bootstrap for a config file.
    Render {
        /// Path to llmroute.yaml (YAML or JSON).
        config: PathBuf,
        /// Path of llmroute_filter.wasm as Envoy will see it.
        #[arg(long)]
        wasm: String,
        /// Output file; standard output when absent.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Validate { config } => {
            let (cfg, _) = load(&config)?;
            let endpoints: usize = cfg.backends.iter().map(|b| b.endpoints.len()).sum();
            println!(
                "{}: ok: {} backend(s), {} endpoint(s), {} model alias(es); listen {}, admin {}",
                config.display(),
                cfg.backends.len(),
                endpoints,
                cfg.models.len(),
                cfg.listen,
                cfg.admin
            );
            Ok(())
        }
        Command::Render { config, wasm, output } => {
            let (cfg, text) = load(&config)?;
            let yaml = bootstrap_yaml(&cfg, &text, &RenderOptions::new(wasm))?;
            match output {
                Some(path) => std::fs::write(&path, yaml).map_err(|e| format!("{}: {e}", path.display())),
                None => {
                    print!("{yaml}");
                    Ok(())
                }
            }
        }
    }
}

fn load(path: &PathBuf) -> Result<(llmroute_core::Config, String), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    match llmroute_core::load_config(&text) {
        Ok(cfg) => {
            for w in &cfg.warnings {
                eprintln!("{}: warning: {w}", path.display());
            }
            Ok((cfg, text))
        }
        Err(errs) => {
            let n = errs.0.len();
            let lines: Vec<String> = errs.0.iter().map(|e| format!("  {e}")).collect();
            Err(format!("{}: {n} error(s):\n{}", path.display(), lines.join("\n")))
        }
    }
}
