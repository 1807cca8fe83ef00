//! `config-echo`: shows a Worker's vars and secrets as it reads them.
//! `GET /<NAME>` answers `env=<value or -> config=<value or ->`: the value
//! of `NAME` from the environment (`std::env::var`, wasi:cli/environment)
//! and from `wasi:config/store`. `GET /` lists the names each interface
//! holds (`env: A,B config: A,B`), never a value. `?log=TEXT` first
//! writes `TEXT` as a line to stdout.

use hearth_sdk::{Guest, IncomingRequest, ResponseOutparam};

struct ConfigEcho;

impl Guest for ConfigEcho {
    fn handle(request: IncomingRequest, out: ResponseOutparam) {
        let path = hearth_sdk::path(&request);
        let (path, query) = path.split_once('?').unwrap_or((&path, ""));
        if let Some(text) = query.strip_prefix("log=") {
            println!("{text}");
        }
        let name = path.trim_start_matches('/');
        let body = if name.is_empty() {
            let mut env: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
            env.sort();
            let mut config: Vec<String> = match hearth_sdk::config::get_all() {
                Ok(all) => all.into_iter().map(|(k, _)| k).collect(),
                Err(e) => vec![format!("error: {e}")],
            };
            config.sort();
            format!("env: {} config: {}", env.join(","), config.join(","))
        } else {
            let env = std::env::var(name).unwrap_or_else(|_| "-".into());
            let config = match hearth_sdk::config::get(name) {
                Ok(Some(v)) => v,
                Ok(None) => "-".into(),
                Err(e) => format!("error: {e}"),
            };
            format!("env={env} config={config}")
        };
        let _ = hearth_sdk::respond(out, 200, &[("content-type", b"text/plain")], body.as_bytes());
    }
}

hearth_sdk::export_worker!(ConfigEcho);
