//! The `llmroute/envoy` image's entry point: what the official `envoyproxy/envoy` image's `docker-entrypoint.sh`
//! does, decided here as data so that the image needs no shell.
//!
//! - Arguments that start with `-` are Envoy's: `envoy` is put in front of them. Any other first argument is the
//!   program to run (in this image only `envoy` exists).
//! - When the program is `envoy` and `$loglevel` is set, `--log-level $loglevel` is appended.
//! - Run as root (the default), the program runs as `$ENVOY_UID`:`$ENVOY_GID` (101:101 unless set), after
//!   `/dev/stdout` and `/dev/stderr` are given to that user so that Envoy can open them for its logs;
//!   `ENVOY_UID=0` keeps root. Run as any other user, nothing changes.

/// The user the official image runs Envoy as.
pub const DEFAULT_ID: u32 = 101;

/// The image's default command, as in the official image.
pub const DEFAULT_COMMAND: [&str; 3] = ["envoy", "-c", "/etc/envoy/envoy.yaml"];

/// What the entry point's environment holds.
#[derive(Debug, Default, Clone)]
pub struct Env {
    pub loglevel: Option<String>,
    pub envoy_uid: Option<String>,
    pub envoy_gid: Option<String>,
    /// The entry point's own user id.
    pub uid: u32,
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The program, looked up on `PATH` when it has no `/`.
    pub program: String,
    pub args: Vec<String>,
    /// `(uid, gid)` to switch to before running it; `None` keeps the current user.
    pub run_as: Option<(u32, u32)>,
}

/// The plan for `args` (the arguments after the entry point's own name). The error names the variable and value.
pub fn plan(args: &[String], env: &Env) -> Result<Plan, String> {
    let mut argv: Vec<String> = if args.is_empty() {
        DEFAULT_COMMAND.iter().map(|s| s.to_string()).collect()
    } else {
        args.to_vec()
    };
    if argv.first().is_some_and(|a| a.starts_with('-')) {
        argv.insert(0, "envoy".to_string());
    }
    if argv.first().is_some_and(|a| a == "envoy") {
        if let Some(level) = env.loglevel.as_deref().filter(|l| !l.is_empty()) {
            argv.push("--log-level".to_string());
            argv.push(level.to_string());
        }
    }
    let uid = id("ENVOY_UID", env.envoy_uid.as_deref())?;
    let gid = id("ENVOY_GID", env.envoy_gid.as_deref())?;
    let run_as = (env.uid == 0 && uid != 0).then_some((uid, gid));
    let mut argv = argv.into_iter();
    let program = argv.next().unwrap_or_default();
    Ok(Plan {
        program,
        args: argv.collect(),
        run_as,
    })
}

fn id(name: &str, value: Option<&str>) -> Result<u32, String> {
    match value.filter(|v| !v.is_empty()) {
        None => Ok(DEFAULT_ID),
        Some(v) => v
            .parse()
            .map_err(|_| format!("{name}={v:?}: must be a numeric id (0 keeps root)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn root() -> Env {
        Env::default()
    }

    #[test]
    fn flags_alone_run_envoy_and_no_arguments_run_the_default_command() {
        let p = plan(
            &strings(&["-c", "/etc/envoy/envoy.yaml", "--concurrency", "2"]),
            &root(),
        )
        .unwrap();
        assert_eq!(p.program, "envoy");
        assert_eq!(p.args, strings(&["-c", "/etc/envoy/envoy.yaml", "--concurrency", "2"]));
        let p = plan(&[], &root()).unwrap();
        assert_eq!(
            (p.program.as_str(), p.args),
            ("envoy", strings(&["-c", "/etc/envoy/envoy.yaml"]))
        );
        let p = plan(&strings(&["envoy", "--version"]), &root()).unwrap();
        assert_eq!((p.program.as_str(), p.args), ("envoy", strings(&["--version"])));
    }

    #[test]
    fn loglevel_is_appended_to_envoy_only() {
        let env = Env {
            loglevel: Some("debug".into()),
            ..root()
        };
        let p = plan(&strings(&["-c", "x.yaml"]), &env).unwrap();
        assert_eq!(p.args, strings(&["-c", "x.yaml", "--log-level", "debug"]));
        let p = plan(
            &strings(&["/usr/local/bin/llmroute-probe", "http://127.0.0.1:9901/ready"]),
            &env,
        )
        .unwrap();
        assert_eq!(p.args, strings(&["http://127.0.0.1:9901/ready"]));
    }

    #[test]
    fn root_drops_to_envoy_uid_unless_it_is_zero_and_other_users_stay() {
        assert_eq!(plan(&[], &root()).unwrap().run_as, Some((101, 101)));
        let env = Env {
            envoy_uid: Some("1000".into()),
            envoy_gid: Some("2000".into()),
            ..root()
        };
        assert_eq!(plan(&[], &env).unwrap().run_as, Some((1000, 2000)));
        let env = Env {
            envoy_uid: Some("0".into()),
            ..root()
        };
        assert_eq!(plan(&[], &env).unwrap().run_as, None);
        let env = Env { uid: 65534, ..root() };
        assert_eq!(plan(&[], &env).unwrap().run_as, None);
        let env = Env {
            envoy_uid: Some("envoy".into()),
            ..root()
        };
        let e = plan(&[], &env).unwrap_err();
        assert!(e.contains("ENVOY_UID=\"envoy\"") && e.contains("numeric"), "{e}");
    }
}
