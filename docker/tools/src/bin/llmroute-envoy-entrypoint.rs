//! The `llmroute/envoy` image's entry point (see `llmroute_container_tools::entrypoint`): decides what to run,
//! hands the log devices to Envoy's user when it drops root, and replaces itself with the program.

use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use llmroute_container_tools::entrypoint::{self, Env};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env = Env {
        loglevel: std::env::var("loglevel").ok(),
        envoy_uid: std::env::var("ENVOY_UID").ok(),
        envoy_gid: std::env::var("ENVOY_GID").ok(),
        uid: effective_uid(),
    };
    let plan = match entrypoint::plan(&args, &env) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("llmroute-envoy-entrypoint: {e}");
            return ExitCode::from(2);
        }
    };
    let mut command = Command::new(&plan.program);
    command.args(&plan.args);
    if let Some((uid, gid)) = plan.run_as {
        for device in ["/dev/stdout", "/dev/stderr"] {
            if let Err(e) = std::os::unix::fs::chown(device, Some(uid), Some(gid)) {
                eprintln!("llmroute-envoy-entrypoint: chown {uid}:{gid} {device}: {e}");
            }
        }
        command.uid(uid).gid(gid);
    }
    let e = command.exec();
    eprintln!("llmroute-envoy-entrypoint: running {}: {e}", plan.program);
    ExitCode::from(127)
}

/// The effective user id, from `/proc/self/status` (`Uid:` real, effective, saved, fs); root when unreadable,
/// which only makes the entry point try to switch user, as the official one does.
fn effective_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|id| id.parse().ok())
        .unwrap_or(0)
}
