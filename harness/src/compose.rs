//! A Docker Compose stack for the container checks (`make compose-check`, `harness/tests/compose/`): one compose
//! file started under a project name of its own, so that a run touches only its own containers, networks and
//! volumes, and so that two runs never collide.
//!
//! - [`Stack::up`] first checks that every image the file names is on this machine: no registry is reachable, so
//!   a missing image fails at once, naming `make images`, instead of trying a pull.
//! - The file's published ports are meant to be left to Docker (the check sets the port variables empty);
//!   [`Stack::host_port`] reads the one Docker chose. Networks are Docker's choice too: containers are told apart
//!   by service name, never by a fixed address.
//! - Faults: [`Stack::kill`] services' containers and [`Stack::start`] one again, [`Stack::disconnect`] it from one of the
//!   file's networks and [`Stack::reconnect`] it with the aliases it had there (the service name among them, which
//!   a plain `docker network connect` would not give back, so its peers could no longer resolve it).
//! - [`Stack::down`] runs `down --volumes --remove-orphans` and then checks that no container, network or volume
//!   of the project is left, anonymous volumes included. When a check fails (a panic), dropping the stack prints
//!   every container's log tail, then takes the stack down all the same.
//!
//! Works with `docker compose` (v2) and `docker-compose` (v1), whichever answers (`COMPOSE` picks one), and only
//! asks Docker through its command line.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::envoy::repo_root;

/// The compose project label every container, network and volume of a stack carries.
const PROJECT_LABEL: &str = "com.docker.compose.project";

pub struct Stack {
    tool: Vec<String>,
    project: String,
    file: PathBuf,
    env: Vec<(String, String)>,
    /// Set once [`Stack::down`] ran, so that dropping the stack does nothing more.
    down: bool,
}

/// A container cut off one network, with what [`Stack::reconnect`] needs to put it back as it was.
#[derive(Debug, Clone)]
pub struct Detached {
    pub service: String,
    network: String,
    container: String,
    aliases: Vec<String>,
}

/// Runs `program args`, returning its standard output; an error carries the command and its standard error.
fn run(program: &str, args: &[String], env: &[(String, String)]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{program} {}` exited {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn docker(args: &[&str]) -> Result<String, String> {
    run("docker", &args.iter().map(|a| a.to_string()).collect::<Vec<_>>(), &[])
}

/// The compose tool as a program and its leading arguments: `COMPOSE` when set (as the Makefile passes it), else
/// `docker compose` when the plugin answers, else `docker-compose`.
fn compose_tool() -> Result<Vec<String>, String> {
    if let Ok(c) = std::env::var("COMPOSE") {
        let words: Vec<String> = c.split_whitespace().map(str::to_string).collect();
        if !words.is_empty() {
            return Ok(words);
        }
    }
    for candidate in [vec!["docker", "compose"], vec!["docker-compose"]] {
        let ok = Command::new(candidate[0])
            .args(&candidate[1..])
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return Ok(candidate.into_iter().map(str::to_string).collect());
        }
    }
    Err("neither `docker compose` nor `docker-compose` answers: install Docker's compose tool".into())
}

impl Stack {
    /// A stack of `file` (relative to the repository root) under a fresh project name that starts with
    /// `llmroute-<name>-`; `env` is given to the compose tool (image and port variables). Nothing starts yet.
    pub fn new(file: &str, name: &str, env: &[(&str, &str)]) -> Result<Stack, String> {
        docker(&["version", "--format", "{{.Server.Version}}"])
            .map_err(|e| format!("the Docker engine does not answer: {e}"))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        Ok(Stack {
            tool: compose_tool()?,
            project: format!("llmroute-{name}-{}-{}", std::process::id(), nanos % 1_000_000_000),
            file: repo_root().join(file),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            down: false,
        })
    }

    pub fn project(&self) -> &str {
        &self.project
    }

    fn compose_args(&self, args: &[&str]) -> Vec<String> {
        let mut all: Vec<String> = self.tool[1..].to_vec();
        all.extend([
            "-p".into(),
            self.project.clone(),
            "-f".into(),
            self.file.display().to_string(),
        ]);
        all.extend(args.iter().map(|a| a.to_string()));
        all
    }

    /// Runs the compose tool on this stack's file and project.
    pub fn compose(&self, args: &[&str]) -> Result<String, String> {
        run(&self.tool[0], &self.compose_args(args), &self.env)
    }

    /// The images the file names, as the compose tool resolves them with this stack's variables.
    pub fn images(&self) -> Result<BTreeSet<String>, String> {
        let text = self.compose(&["config"])?;
        let doc: Value = serde_yaml_ng::from_str(&text).map_err(|e| format!("compose config: {e}"))?;
        let services = doc["services"]
            .as_object()
            .ok_or_else(|| format!("compose config lists no services:\n{text}"))?;
        Ok(services
            .values()
            .filter_map(|s| s["image"].as_str().map(str::to_string))
            .collect())
    }

    /// Checks that every image is on this machine, then starts the stack in the background.
    pub fn up(&self) -> Result<(), String> {
        for image in self.images()? {
            docker(&["image", "inspect", "--format", "{{.Id}}", &image]).map_err(|_| {
                format!(
                    "image {image} is not on this machine: `make images` builds the llmroute/* images from local files"
                )
            })?;
        }
        self.compose(&["up", "-d"]).map(|_| ())
    }

    /// The id of `service`'s container.
    pub fn container(&self, service: &str) -> Result<String, String> {
        let id = self.compose(&["ps", "-a", "-q", service])?.trim().to_string();
        if id.is_empty() {
            return Err(format!("{service}: no container in project {}", self.project));
        }
        Ok(id)
    }

    /// The full name of the file's network `network` in this project.
    pub fn network(&self, network: &str) -> Result<String, String> {
        let project = format!("label={PROJECT_LABEL}={}", self.project);
        let net = format!("label=com.docker.compose.network={network}");
        let name = docker(&[
            "network",
            "ls",
            "--filter",
            &project,
            "--filter",
            &net,
            "--format",
            "{{.Name}}",
        ])?;
        match name.lines().collect::<Vec<_>>().as_slice() {
            [one] => Ok(one.to_string()),
            other => Err(format!("network {network} of {}: found {other:?}", self.project)),
        }
    }

    fn networks_of(&self, container: &str) -> Result<Value, String> {
        let text = docker(&["inspect", "--format", "{{json .NetworkSettings.Networks}}", container])?;
        serde_json::from_str(&text).map_err(|e| format!("inspect {container}: {e}"))
    }

    /// `service`'s address on the file's network `network`.
    pub fn ip(&self, service: &str, network: &str) -> Result<String, String> {
        let networks = self.networks_of(&self.container(service)?)?;
        networks[self.network(network)?]["IPAddress"]
            .as_str()
            .filter(|ip| !ip.is_empty())
            .map(str::to_string)
            .ok_or_else(|| format!("{service} has no address on {network}: {networks}"))
    }

    /// The host port Docker published `service`'s container `port` on (127.0.0.1).
    pub fn host_port(&self, service: &str, port: u16) -> Result<u16, String> {
        let out = docker(&["port", &self.container(service)?, &format!("{port}/tcp")])?;
        out.lines()
            .filter_map(|l| l.rsplit_once(':'))
            .find_map(|(_, p)| p.trim().parse().ok())
            .ok_or_else(|| format!("{service}: port {port} is not published: {out:?}"))
    }

    /// Runs `args` inside `service`'s container.
    pub fn exec(&self, service: &str, args: &[&str]) -> Result<String, String> {
        let id = self.container(service)?;
        let mut all = vec!["exec", id.as_str()];
        all.extend_from_slice(args);
        docker(&all)
    }

    /// `docker exec` of `args` in `service`'s container, to spawn: for a command that runs on, such as a watch whose
    /// output is read as it comes.
    pub fn exec_command(&self, service: &str, args: &[&str]) -> Result<tokio::process::Command, String> {
        let mut cmd = tokio::process::Command::new("docker");
        cmd.arg("exec").arg(self.container(service)?).args(args);
        Ok(cmd)
    }

    /// Sends the containers of `services` SIGKILL, all in one `docker kill`.
    pub fn kill(&self, services: &[&str]) -> Result<(), String> {
        let ids = services
            .iter()
            .map(|s| self.container(s))
            .collect::<Result<Vec<_>, _>>()?;
        let mut args = vec!["kill"];
        args.extend(ids.iter().map(String::as_str));
        docker(&args).map(|_| ())
    }

    /// Starts `service`'s stopped container again.
    pub fn start(&self, service: &str) -> Result<(), String> {
        docker(&["start", &self.container(service)?]).map(|_| ())
    }

    /// Cuts `service`'s container off the file's network `network`.
    pub fn disconnect(&self, service: &str, network: &str) -> Result<Detached, String> {
        let container = self.container(service)?;
        let full = self.network(network)?;
        let aliases = self.networks_of(&container)?[&full]["Aliases"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        docker(&["network", "disconnect", &full, &container])?;
        Ok(Detached {
            service: service.to_string(),
            network: full,
            container,
            aliases,
        })
    }

    /// Connects a container [`Stack::disconnect`] cut off back to its network, with the aliases it had there.
    pub fn reconnect(&self, d: &Detached) -> Result<(), String> {
        let mut args = vec!["network".to_string(), "connect".to_string()];
        for a in &d.aliases {
            args.extend(["--alias".to_string(), a.clone()]);
        }
        args.extend([d.network.clone(), d.container.clone()]);
        run("docker", &args, &[]).map(|_| ())
    }

    /// The last `lines` lines of every container's log.
    pub fn logs(&self, lines: usize) -> String {
        self.compose(&["logs", "--no-color", "--tail", &lines.to_string()])
            .unwrap_or_else(|e| e)
    }

    fn project_filter(&self) -> String {
        format!("label={PROJECT_LABEL}={}", self.project)
    }

    /// The volumes the project's containers mount (named and anonymous).
    fn mounted_volumes(&self) -> Vec<String> {
        let ids = docker(&["ps", "-aq", "--filter", &self.project_filter()]).unwrap_or_default();
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if ids.is_empty() {
            return Vec::new();
        }
        let mut args = vec![
            "inspect",
            "--format",
            "{{range .Mounts}}{{if eq .Type \"volume\"}}{{.Name}} {{end}}{{end}}",
        ];
        args.extend(ids);
        docker(&args)
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    /// What is left of the project: containers, networks and volumes carrying its label, and any of `mounted`
    /// (volumes its containers had) that still exists.
    fn leftovers(&self, mounted: &[String]) -> Vec<String> {
        let filter = self.project_filter();
        let mut left = Vec::new();
        for (kind, args) in [
            (
                "container",
                vec!["ps", "-a", "--filter", &filter, "--format", "{{.Names}}"],
            ),
            (
                "network",
                vec!["network", "ls", "--filter", &filter, "--format", "{{.Name}}"],
            ),
            (
                "volume",
                vec!["volume", "ls", "--filter", &filter, "--format", "{{.Name}}"],
            ),
        ] {
            match docker(&args) {
                Ok(out) => left.extend(out.split_whitespace().map(|n| format!("{kind} {n}"))),
                Err(e) => left.push(format!("{kind}s: {e}")),
            }
        }
        for v in mounted {
            if docker(&["volume", "inspect", v]).is_ok() && !left.contains(&format!("volume {v}")) {
                left.push(format!("volume {v}"));
            }
        }
        left
    }

    fn take_down(&mut self) -> Result<(), String> {
        self.down = true;
        let mounted = self.mounted_volumes();
        self.compose(&["down", "--volumes", "--remove-orphans", "--timeout", "5"])?;
        let left = self.leftovers(&mounted);
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("`down --volumes` left {} behind: {left:?}", self.project))
        }
    }

    /// Takes the stack down (`down --volumes --remove-orphans`); an error when any container, network or volume of
    /// the project is left.
    pub fn down(mut self) -> Result<(), String> {
        self.take_down()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if self.down {
            return;
        }
        if std::thread::panicking() {
            eprintln!(
                "----- compose logs ({}) -----\n{}\n----- end of compose logs -----",
                self.project,
                self.logs(80)
            );
        }
        if let Err(e) = self.take_down() {
            eprintln!("compose: {e}");
        }
    }
}
