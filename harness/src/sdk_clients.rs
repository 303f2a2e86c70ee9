//! Running the project's Python checks with the real `openai` and `anthropic` SDKs installed in `.tools/venv`
//! (`make sdk-clients`). Shared by the emulator SDK tests and the real-engine tests.

use std::path::{Path, PathBuf};

use crate::envoy::repo_root;

/// The venv's Python, or an error that says how to install the SDKs.
pub fn python() -> Result<PathBuf, String> {
    let python = repo_root().join(".tools/venv/bin/python");
    if !python.exists() {
        return Err(format!(
            "{} is missing: run `make sdk-clients` to install the openai and anthropic SDKs",
            python.display()
        ));
    }
    Ok(python)
}

/// A command that runs `script` with the venv's Python, with proxy variables removed (every target is on
/// loopback), no bytecode written into the tree, and the process killed if the command is dropped.
pub fn script_command(script: &Path) -> Result<tokio::process::Command, String> {
    let mut command = tokio::process::Command::new(python()?);
    command
        .arg(script)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .kill_on_drop(true);
    for proxy in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        command.env_remove(proxy);
    }
    Ok(command)
}
