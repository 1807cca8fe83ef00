//! `hearth tail SCRIPT`: a Worker's requests on every node, live, until
//! Ctrl-C.
//!
//! One `--admin` URL is enough: the node asked gathers every member's
//! requests over the cluster's RPC connections (`GET
//! /v1/scripts/{id}/tail`, see `hearth::live_tail`), and each event names
//! the node that served it. Given several URLs, this command asks each node
//! for its own requests only (`scope=node`) and merges the streams itself;
//! each node's `GET /v1/ring` names it and lists the members, and a member
//! no `--admin` URL reaches is named on stderr once (its requests are not
//! shown). A stream that ends (its node stopped, or drained) is said so on
//! stderr, and the others keep streaming.

use std::collections::BTreeSet;
use std::io::Write as _;

use anyhow::{Context, bail};

use hearth_admin_client::{RequestEvent, TailItem, TailQuery};

/// `hearth tail`'s flags.
#[derive(clap::Args)]
pub(crate) struct TailArgs {
    /// The Worker to watch.
    script: String,
    /// Admin URL of a node, e.g. http://127.0.0.1:8081: it gathers the
    /// whole cluster's requests. Repeated, each node given streams its own
    /// and this command merges them.
    #[arg(long, required = true)]
    admin: Vec<String>,
    /// Admin token (default: $HEARTH_ADMIN_TOKEN).
    #[arg(long, env = "HEARTH_ADMIN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: crate::AdminTlsArgs,
    /// Only requests that ended so: 2xx, 4xx, 5xx, a status (404), ok (no
    /// exception) or error (an exception or a 5xx).
    #[arg(long)]
    status: Option<String>,
    /// The fraction of matching requests to show, in (0, 1]. Nodes also
    /// sample on their own past ~100 requests/s; the rate in effect is shown.
    #[arg(long)]
    sample: Option<f64>,
    /// `pretty` (a line per request, its logs indented) or `json` (one
    /// JSON object per line).
    #[arg(long, value_enum, default_value_t = Format::Pretty)]
    format: Format,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Pretty,
    Json,
}

/// What one node's stream task tells the printer.
enum News {
    Item(String, TailItem),
    Ended(String, String),
}

/// Streams the Worker's requests from every node given until Ctrl-C.
pub(crate) async fn run(args: TailArgs) -> anyhow::Result<()> {
    let token = args
        .token
        .clone()
        .context("tailing a Worker needs the admin token: --token or HEARTH_ADMIN_TOKEN")?;
    if let Some(s) = args.sample
        && !(s > 0.0 && s <= 1.0)
    {
        bail!("--sample {s}: expected a fraction in (0, 1], e.g. 0.1");
    }
    let gathered = args.admin.len() == 1;
    let query = TailQuery {
        status: args.status.clone(),
        sample: args.sample,
        node_only: !gathered,
    };
    // Caught from the start (not at the first wait), so a Ctrl-C at any
    // point ends the tail cleanly.
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("cannot catch SIGINT")?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<News>(1024);
    let mut tailed = BTreeSet::new();
    let mut members = BTreeSet::new();
    for url in &args.admin {
        let admin = args.tls.client(url, token.clone())?;
        let view = admin
            .ring(None)
            .await
            .with_context(|| format!("asking {url} for its node ID"))?;
        members.extend(view.members.iter().map(|m| m.id.clone()));
        // Open every stream before the first event prints: a refusal
        // (bad filter, wrong token) stops here.
        let stream = admin
            .tail(&args.script, &query)
            .await
            .with_context(|| format!("tailing {} on {}", args.script, view.node))?;
        tailed.insert(view.node.clone());
        tokio::spawn(follow(view.node, stream, tx.clone()));
    }
    drop(tx);
    let missing: Vec<&String> = members.difference(&tailed).collect();
    if gathered {
        tailed.extend(members.iter().cloned());
    } else if !missing.is_empty() {
        eprintln!(
            "not tailed (give their --admin URLs too): {}",
            missing
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    eprintln!(
        "tailing {} on {} (Ctrl-C to stop)",
        args.script,
        tailed.iter().cloned().collect::<Vec<_>>().join(", ")
    );
    let mut open = args.admin.len();
    let mut printer = Printer {
        format: args.format,
        rate: Default::default(),
        dropped: Default::default(),
    };
    loop {
        let news = tokio::select! {
            _ = interrupt.recv() => return Ok(()),
            n = rx.recv() => n,
        };
        match news {
            Some(News::Item(node, item)) => {
                if printer.item(&node, item).is_err() {
                    // Whoever read our output went away (a closed pipe).
                    return Ok(());
                }
            }
            Some(News::Ended(node, why)) => {
                open -= 1;
                eprintln!("{node}: tail ended ({why}); {open} node(s) still tailed");
                if open == 0 {
                    bail!("every node's tail ended");
                }
            }
            None => bail!("every node's tail ended"),
        }
    }
}

/// Reads one node's stream to its end, passing on what it says.
async fn follow(
    node: String,
    mut stream: hearth_admin_client::TailStream,
    tx: tokio::sync::mpsc::Sender<News>,
) {
    let why = loop {
        match stream.next().await {
            Some(Ok(item)) => {
                if tx.send(News::Item(node.clone(), item)).await.is_err() {
                    return;
                }
            }
            Some(Err(e)) => break e.to_string(),
            None => break "the node closed the stream".to_string(),
        }
    };
    let _ = tx.send(News::Ended(node, why)).await;
}

struct Printer {
    format: Format,
    /// The sampling rate each node said last (a change is shown).
    rate: std::collections::HashMap<String, f64>,
    /// Events each node said it dropped so far.
    dropped: std::collections::HashMap<String, u64>,
}

impl Printer {
    fn item(&mut self, node: &str, item: TailItem) -> std::io::Result<()> {
        match item {
            TailItem::Event(e) => {
                // A gathered stream carries every member's events, each
                // with its own node's count.
                let from = if e.node.is_empty() { node } else { &e.node };
                self.dropped_now(from, e.dropped);
                self.event(&e)
            }
            TailItem::Keepalive { dropped } => {
                self.dropped_now(node, dropped);
                Ok(())
            }
            TailItem::Comment(_) => Ok(()),
        }
    }

    /// Says on stderr when a node dropped events for us since last time.
    fn dropped_now(&mut self, node: &str, dropped: u64) {
        let seen = self.dropped.entry(node.to_string()).or_default();
        if dropped > *seen {
            eprintln!(
                "{}: {} event(s) dropped (this tail read too slowly, or the node's \
                 live tail memory budget was full)",
                printable(node),
                dropped - *seen
            );
            *seen = dropped;
        }
    }

    fn event(&mut self, e: &RequestEvent) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        if self.format == Format::Json {
            let line = serde_json::to_string(e).map_err(std::io::Error::other)?;
            // serde_json escapes C0 controls; DEL, C1 and bidi controls it
            // leaves, and a terminal may act on them.
            writeln!(out, "{}", json_safe(&line))?;
            return out.flush();
        }
        let last = self.rate.entry(e.node.clone()).or_insert(1.0);
        if (e.sample_rate - *last).abs() > 1e-6 {
            *last = e.sample_rate;
            writeln!(
                out,
                "({}: sampling, {} of matching requests shown)",
                printable(&e.node),
                percent(e.sample_rate)
            )?;
        }
        writeln!(out, "{}", headline(e))?;
        for t in &e.events {
            if t.kind != "outcome" {
                writeln!(out, "    {}: {}", printable(&t.kind), printable(&t.message))?;
            }
        }
        out.flush()
    }
}

/// `17:40:01.123 node-1 200 GET http://x/ cpu 0.41 ms wall 1.20 ms ok`.
fn headline(e: &RequestEvent) -> String {
    let mut line = format!(
        "{} {} {} {} {} cpu {:.2} ms wall {:.2} ms {}",
        clock(e.timestamp_unix_ms),
        printable(&e.node),
        e.status,
        printable(&e.method),
        printable(&e.url),
        e.cpu_ms,
        e.wall_ms,
        printable(&e.outcome)
    );
    if e.sample_rate < 1.0 {
        line.push_str(&format!(" [sampled {}]", percent(e.sample_rate)));
    }
    line
}

/// Whether a terminal may act on `c` rather than show it: C0 and C1
/// controls, DEL, and the bidirectional formatting characters (which
/// reorder what follows them on the line).
fn is_control(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` as text a terminal shows and does not act on: every control
/// character escaped (`\n`, `\r`, `\t`, `\u{1b}`, ...). What a Worker logs
/// reaches the operator's terminal through `hearth tail`; an escape
/// sequence in it could set the clipboard (OSC 52), retitle the window or
/// fake the lines around it.
fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_control(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A JSON line with the control characters serde_json leaves as they are
/// (DEL, C1, bidi controls) written as `\uXXXX` escapes: the same JSON
/// value, inert on a terminal.
fn json_safe(line: &str) -> std::borrow::Cow<'_, str> {
    if !line.chars().any(is_control) {
        return std::borrow::Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        if is_control(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `HH:MM:SS.mmm` (UTC) of a Unix time in milliseconds.
fn clock(ms: u64) -> String {
    let day = (ms / 1000) % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day / 3600,
        day / 60 % 60,
        day % 60,
        ms % 1000
    )
}

fn percent(rate: f64) -> String {
    let p = rate * 100.0;
    if p >= 10.0 {
        format!("{p:.0}%")
    } else {
        format!("{p:.1}%")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_escape_sequences_reach_the_terminal_escaped() {
        // OSC 52 (set the clipboard), a CSI, a fake second line, C1 CSI,
        // a bidi override.
        let hostile = "a\u{1b}]52;c;aGk=\u{7}b\u{1b}[2Jc\nfake 200 GET /\rd\u{9b}e\u{202e}f\u{7f}";
        let shown = printable(hostile);
        assert!(!shown.chars().any(is_control), "{shown:?}");
        assert_eq!(
            shown,
            "a\\u{1b}]52;c;aGk=\\u{7}b\\u{1b}[2Jc\\nfake 200 GET /\\rd\\u{9b}e\\u{202e}f\\u{7f}"
        );
        assert_eq!(printable("plain text"), "plain text");

        let e = RequestEvent {
            node: "n".into(),
            url: format!("/{hostile}"),
            method: "GET".into(),
            outcome: "ok".into(),
            ..RequestEvent::default()
        };
        assert!(!headline(&e).chars().any(is_control));

        let json = serde_json::to_string(&e).expect("json");
        let safe = json_safe(&json);
        assert!(!safe.chars().any(is_control), "{safe}");
        let back: RequestEvent = serde_json::from_str(&safe).expect("still JSON");
        assert_eq!(back.url, e.url, "the same value, escaped");
    }

    #[test]
    fn a_request_is_one_readable_line() {
        let e = RequestEvent {
            script_id: "w".into(),
            node: "node-2".into(),
            timestamp_unix_ms: 86_400_000 + 3_723_045,
            method: "GET".into(),
            url: "/hi".into(),
            status: 200,
            outcome: "ok".into(),
            cpu_ms: 0.5,
            wall_ms: 1.25,
            sample_rate: 0.1,
            ..RequestEvent::default()
        };
        assert_eq!(
            headline(&e),
            "01:02:03.045 node-2 200 GET /hi cpu 0.50 ms wall 1.25 ms ok [sampled 10%]"
        );
    }
}
