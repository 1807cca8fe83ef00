//! Tail Workers: the trace events of a whole flow, delivered in one
//! invocation after the flow ends.
//!
//! # The model
//!
//! A Worker deployed with tail Workers ([`crate::outbound::bindings`]) that
//! serves a client's request starts a *traced flow*. Every level of the flow,
//! on whatever node it runs, records its **trace events** ([`TraceEvent`]):
//!
//! * `log`: each line the Worker writes to stdout or stderr (so `println!`,
//!   `console.log` and `print` all count; a line over [`MAX_LINE_BYTES`] is
//!   cut, its end replaced by a mark saying how many bytes were cut).
//!   Traced or not, each line also goes to the node's own log,
//!   rate-limited per Worker ([`LOG_LINES_PER_SEC`], [`LOG_BURST_LINES`]);
//! * `subrequest`: each outgoing request, where it went and how it ended
//!   (including denied ones). Its URL is [`redact_url`]ed: the value of
//!   every query parameter and any user information become `REDACTED`,
//!   because API keys ride in query strings and a Worker's secrets are
//!   not the operator's to read (see [`redact_url`] for what stays);
//! * `exception`: the error a level failed with (trap, limit, ...);
//! * `outcome`: how the level ended: `ok <status>` or `exception`, with its
//!   wall and CPU time;
//! * `truncated`: a mark the node puts where it left events out, saying
//!   how many and which bound.
//!
//! A level records at most [`MAX_EVENTS`] events and [`MAX_LEVEL_BYTES`]
//! bytes of event text (what one flow can deliver at most, so a level
//! never holds more than its flow could use); past either, its logs and
//! subrequests are counted in one `truncated` mark instead. Its exception
//! and outcome are always recorded, after the mark.
//!
//! When a level's invocation has ended, its events are reported to the
//! flow's first node through a [`Tracing`] sink the node puts in the
//! request (the node carries it as the context stack's `reportTraces`
//! capability), and only then does the level's response body end: so by the
//! time the entry Worker's invocation ends, every level it waited for has
//! reported (a first node that does not answer within [`REPORT_TIMEOUT`]
//! loses that level's events, logged; the response is not held longer).
//! The first node collects everything, up to [`MAX_FLOW_EVENTS`] events and
//! [`MAX_FLOW_BYTES`] bytes of event text for the whole flow (however many
//! levels it has and however often they report; the rest are counted in
//! the batch's `dropped`); when the entry level ends it invokes each tail
//! Worker **once** with `POST /` and a JSON body ([`TailBatch`], serialized
//! once for all of them), as a flow of its own (routed like any request;
//! its own events are not traced). A report that reaches the first node
//! after that (a level still running when the entry ended) is refused with
//! [`ReportError::FlowDelivered`], and counted (`tail_late_reports`).
//!
//! While someone watches a Worker live ([`crate::outbound::live_tail`], `hearth
//! tail`), each of its invocations on the node records the same events
//! even if its flow is not traced (a level with no sink, whose response
//! end is not held), and the finished level becomes one
//! [`crate::outbound::live_tail::RequestEvent`] for the watchers.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use std::future::Future as _;

use futures::future::BoxFuture;
use serde::Serialize;

/// Most events one level records; later ones are counted in a
/// `truncated` mark instead.
pub const MAX_EVENTS: usize = 1024;
/// Longest text of one event, in bytes.
pub const MAX_LINE_BYTES: usize = 4096;
/// Most events one flow delivers to its tail Workers, over all its levels
/// and nodes (a level alone may record [`MAX_EVENTS`]; a flow may have many
/// levels). Events past it are counted in [`TailBatch::dropped`].
pub const MAX_FLOW_EVENTS: usize = 4 * MAX_EVENTS;
/// Most bytes of event text (script ID, node, kind and message) one flow
/// delivers: bounds the first node's memory for a flow and the body each
/// tail Worker receives (about this plus ~100 bytes of JSON per event).
pub const MAX_FLOW_BYTES: usize = 1 << 20;
/// Most bytes of event text one level records (counted as for
/// [`MAX_FLOW_BYTES`]); later events are counted in a `truncated` mark.
/// A level cannot deliver more than its flow takes, so it holds no more
/// while it runs: without this bound, [`MAX_EVENTS`] lines of
/// [`MAX_LINE_BYTES`] were 4 MiB per request in flight.
pub const MAX_LEVEL_BYTES: usize = MAX_FLOW_BYTES;
/// The kind of the mark the node puts where it left events out
/// ([`TraceEvent::kind`]).
pub const TRUNCATED: &str = "truncated";
/// How long a level waits for its events to reach the flow's first node
/// before it gives them up and lets its response end.
pub const REPORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// One trace event of a flow: the type the cluster layer carries too, in
/// a crate of its own that both use (`hearth-trace-event`).
pub use hearth_trace_event::TraceEvent;

/// What a tail Worker receives: `POST /` with this as JSON.
#[derive(Debug, Clone, Serialize)]
pub struct TailBatch {
    /// The flow's entry Worker.
    pub entry: String,
    /// The flow's events in the order they reached the first node, at most
    /// [`MAX_FLOW_EVENTS`] and [`MAX_FLOW_BYTES`].
    pub events: Vec<TraceEvent>,
    /// Events of the flow left out to stay within those bounds.
    pub dropped: u64,
}

/// Why the first node did not take a level's events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// The flow's events were already delivered to its tail Workers: the
    /// level reported after the entry level had ended.
    #[error("the flow was already delivered to its tail Workers; late trace events refused")]
    FlowDelivered,
    /// The events did not reach the flow's first node.
    #[error("trace events did not reach the flow's first node: {0}")]
    Unreachable(String),
}

/// Where a level's events go: toward the flow's first node.
pub trait TraceSink: Send + Sync + 'static {
    /// Delivers `events`; resolves once they have arrived, or with why not.
    fn report(&self, events: Vec<TraceEvent>) -> BoxFuture<'static, Result<(), ReportError>>;
}

/// The request extension that turns tracing on for a level.
#[derive(Clone)]
pub struct Tracing(pub Arc<dyn TraceSink>);

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tracing")
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Room [`clip`] keeps for its mark: ` …[N bytes cut]` with N of up to
/// 20 digits.
const CLIP_MARK: usize = 40;

/// `s` within [`MAX_LINE_BYTES`]: a longer one is cut, and ends with a
/// mark of how many bytes were cut.
fn clip(mut s: String) -> String {
    if s.len() > MAX_LINE_BYTES {
        let total = s.len();
        let mut end = MAX_LINE_BYTES - CLIP_MARK;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str(&format!(" …[{} bytes cut]", total - end));
    }
    s
}

/// What stands for a value [`redact_url`] hides.
pub const REDACTED: &str = "REDACTED";

/// `url` as trace events and the live tail show it: the value of every
/// query parameter becomes [`REDACTED`] (`?key=abc&page=2` shows as
/// `?key=REDACTED&page=REDACTED`; a parameter without `=`, which may be a
/// token itself, becomes `REDACTED`), user information in the authority
/// too (`https://REDACTED@host/`), and a fragment is left out. The scheme,
/// host, path and the parameters' names stay, so requests can still be
/// told apart. API keys ride in query strings: a client's to the Worker,
/// a Worker's (often one of its secrets, which the operator cannot read
/// otherwise) to an origin. Cut at [`MAX_LINE_BYTES`] like any event
/// text.
pub fn redact_url(url: &str) -> String {
    let url = url.split_once('#').map_or(url, |(u, _)| u);
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let mut out = String::with_capacity(url.len());
    match head.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            out.push_str(scheme);
            out.push_str("://");
            match authority.rsplit_once('@') {
                Some((_, host)) => {
                    out.push_str(REDACTED);
                    out.push('@');
                    out.push_str(host);
                }
                None => out.push_str(authority),
            }
            out.push_str(path);
        }
        None => out.push_str(head),
    }
    if let Some(query) = query {
        out.push('?');
        for (i, pair) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            match pair.split_once('=') {
                Some((name, "")) => {
                    out.push_str(name);
                    out.push('=');
                }
                Some((name, _)) => {
                    out.push_str(name);
                    out.push('=');
                    out.push_str(REDACTED);
                }
                None if pair.is_empty() => {}
                None => out.push_str(REDACTED),
            }
        }
    }
    clip(out)
}

/// The events of one level, as they happen.
#[derive(Debug)]
pub(crate) struct TraceBuffer {
    script_id: String,
    inner: Mutex<BufferState>,
}

#[derive(Debug, Default)]
struct BufferState {
    events: Vec<TraceEvent>,
    /// Bytes of text in `events`, as [`event_bytes`] counts them.
    bytes: usize,
    /// Events left out past [`MAX_EVENTS`] or [`MAX_LEVEL_BYTES`], and
    /// their bytes.
    dropped: u64,
    dropped_bytes: usize,
    partial: Vec<u8>,
    /// The exception and outcome: recorded whatever the bounds, last.
    ends: Vec<TraceEvent>,
}

impl TraceBuffer {
    pub(crate) fn new(script_id: &str) -> Arc<Self> {
        Arc::new(TraceBuffer {
            script_id: script_id.to_string(),
            inner: Mutex::new(BufferState::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, BufferState> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an event of `kind`, within the level's bounds.
    pub(crate) fn push(&self, kind: &str, message: String) {
        let mut s = self.state();
        push_locked(&mut s, &self.script_id, kind, message);
    }

    /// Records how the level ended (its exception, its outcome): always,
    /// after everything else.
    pub(crate) fn push_end(&self, kind: &str, message: String) {
        let e = event(&self.script_id, kind, clip(message));
        self.state().ends.push(e);
    }

    /// Bytes the guest wrote to stdout or stderr: each complete line is a
    /// `log` event.
    fn write_log(&self, bytes: &[u8]) {
        let mut s = self.state();
        s.partial.extend_from_slice(bytes);
        while let Some(i) = s.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = s.partial.drain(..=i).collect();
            let text = String::from_utf8_lossy(&line[..i])
                .trim_end_matches('\r')
                .to_string();
            push_locked(&mut s, &self.script_id, "log", text);
        }
        if s.partial.len() > MAX_LINE_BYTES {
            let line = std::mem::take(&mut s.partial);
            push_locked(
                &mut s,
                &self.script_id,
                "log",
                String::from_utf8_lossy(&line).into_owned(),
            );
        }
    }

    /// Everything recorded (an unfinished last line included), once, and
    /// whether events were left out (then a `truncated` mark says how
    /// many, before the exception and outcome).
    pub(crate) fn take(&self) -> (Vec<TraceEvent>, bool) {
        let mut s = self.state();
        if !s.partial.is_empty() {
            let line = std::mem::take(&mut s.partial);
            push_locked(
                &mut s,
                &self.script_id,
                "log",
                String::from_utf8_lossy(&line).into_owned(),
            );
        }
        let dropped = std::mem::take(&mut s.dropped);
        let dropped_bytes = std::mem::take(&mut s.dropped_bytes);
        s.bytes = 0;
        let mut events = std::mem::take(&mut s.events);
        if dropped > 0 {
            events.push(event(
                &self.script_id,
                TRUNCATED,
                format!(
                    "{dropped} events ({dropped_bytes} bytes) left out: a Worker's request \
                     records at most {MAX_EVENTS} events and {MAX_LEVEL_BYTES} bytes"
                ),
            ));
        }
        events.append(&mut s.ends);
        (events, dropped > 0)
    }
}

fn event(script_id: &str, kind: &str, message: String) -> TraceEvent {
    TraceEvent {
        script_id: script_id.to_string(),
        node: String::new(),
        timestamp_unix_ms: now_ms(),
        kind: kind.to_string(),
        message,
    }
}

fn push_locked(s: &mut BufferState, script_id: &str, kind: &str, message: String) {
    if s.events.len() >= MAX_EVENTS {
        s.dropped += 1;
        s.dropped_bytes += script_id.len() + kind.len() + message.len().min(MAX_LINE_BYTES);
        return;
    }
    let e = event(script_id, kind, clip(message));
    let bytes = event_bytes(&e);
    if s.bytes + bytes > MAX_LEVEL_BYTES {
        s.dropped += 1;
        s.dropped_bytes += bytes;
        return;
    }
    s.bytes += bytes;
    s.events.push(e);
}

/// Lines a Worker may write to the node's log per second, on each node
/// (its token bucket's refill rate).
pub const LOG_LINES_PER_SEC: u32 = 100;
/// Lines a Worker may write to the node's log in one burst (its token
/// bucket's size).
pub const LOG_BURST_LINES: u32 = 200;

/// Where a Worker's output lines go on this node besides any trace: the
/// node's log (tracing target `hearth::worker`, level info), one event per
/// line tagged with the script ID and the request ID, through a token
/// bucket of [`LOG_BURST_LINES`] refilled at [`LOG_LINES_PER_SEC`] shared
/// by all the Worker's instances. Lines over it are dropped and counted;
/// the count is logged as one `N lines dropped` line when the next line
/// gets through (or the Worker is dropped), so a chatty Worker cannot
/// flood the node's log.
pub(crate) struct WorkerLog {
    script_id: Arc<str>,
    bucket: Mutex<Bucket>,
}

struct Bucket {
    tokens: f64,
    last: std::time::Instant,
    dropped: u64,
}

impl WorkerLog {
    /// The node log of Worker `script_id`, with a full bucket.
    pub(crate) fn new(script_id: Arc<str>) -> Arc<Self> {
        Arc::new(WorkerLog {
            script_id,
            bucket: Mutex::new(Bucket {
                tokens: f64::from(LOG_BURST_LINES),
                last: std::time::Instant::now(),
                dropped: 0,
            }),
        })
    }

    /// Takes a token for one line: `Some(n)` if it may be logged (`n`
    /// lines were dropped since the last one that was), `None` if not.
    fn admit(&self) -> Option<u64> {
        let mut b = self.bucket.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        let refill = now.duration_since(b.last).as_secs_f64() * f64::from(LOG_LINES_PER_SEC);
        b.tokens = (b.tokens + refill).min(f64::from(LOG_BURST_LINES));
        b.last = now;
        if b.tokens < 1.0 {
            b.dropped += 1;
            return None;
        }
        b.tokens -= 1.0;
        Some(std::mem::take(&mut b.dropped))
    }

    /// Logs one line the Worker wrote to `stream`, if the bucket allows.
    fn line(&self, stream: &'static str, request_id: &str, text: &str) {
        let Some(dropped) = self.admit() else {
            return;
        };
        let script = &*self.script_id;
        if dropped > 0 {
            report_dropped(script, dropped);
        }
        tracing::info!(target: "hearth::worker", script, request_id, stream, "{text}");
    }
}

fn report_dropped(script: &str, dropped: u64) {
    tracing::warn!(target: "hearth::worker", script, dropped,
        "{dropped} lines dropped: over the log rate limit of {LOG_LINES_PER_SEC} lines/s \
         ({LOG_BURST_LINES} in a burst) per Worker");
}

impl Drop for WorkerLog {
    fn drop(&mut self) {
        let b = self.bucket.get_mut().unwrap_or_else(|p| p.into_inner());
        if b.dropped > 0 {
            report_dropped(&self.script_id, b.dropped);
        }
    }
}

/// A Worker's stdout or stderr. Each complete line goes to the node's log
/// ([`WorkerLog`]), and to the trace buffer of the request it is serving
/// if that request is traced (a tail Worker's `log` events).
#[derive(Clone)]
pub(crate) struct LogPipe {
    pub(crate) tap: Arc<Mutex<Option<Arc<TraceBuffer>>>>,
    /// The request being served (its ID made on its first line), shared
    /// by the instance's stdout and stderr.
    request: Arc<Mutex<Option<String>>>,
    /// This stream's unfinished line.
    partial: Arc<Mutex<Vec<u8>>>,
    stream: &'static str,
    log: Arc<WorkerLog>,
}

impl LogPipe {
    /// An instance's stdout and stderr, logging to `log`.
    pub(crate) fn pair(log: Arc<WorkerLog>) -> (LogPipe, LogPipe) {
        let stdout = LogPipe {
            tap: Arc::default(),
            request: Arc::default(),
            partial: Arc::default(),
            stream: "stdout",
            log,
        };
        let stderr = LogPipe {
            partial: Arc::default(),
            stream: "stderr",
            ..stdout.clone()
        };
        (stdout, stderr)
    }

    /// Sends what the instance writes from now on to `buffer` (or nowhere).
    pub(crate) fn set(&self, buffer: Option<Arc<TraceBuffer>>) {
        *self.tap.lock().unwrap_or_else(|p| p.into_inner()) = buffer;
    }

    /// A new request starts: its lines get a new request ID.
    pub(crate) fn begin_request(&self) {
        *self.request.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The request ID lines are tagged with now (made on first use).
    fn request_id(&self) -> String {
        self.request
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(crate::flow::request_id)
            .clone()
    }

    /// Logs each complete line of `bytes` (and a line over
    /// [`MAX_LINE_BYTES`] without its end).
    fn to_node_log(&self, bytes: &[u8]) {
        let mut partial = self.partial.lock().unwrap_or_else(|p| p.into_inner());
        partial.extend_from_slice(bytes);
        let mut request = None;
        while let Some(i) = partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = partial.drain(..=i).collect();
            let text = String::from_utf8_lossy(&line[..i]);
            let id = request.get_or_insert_with(|| self.request_id());
            self.log.line(
                self.stream,
                id,
                clip(text.trim_end_matches('\r').to_string()).as_str(),
            );
        }
        if partial.len() > MAX_LINE_BYTES {
            let line = std::mem::take(&mut *partial);
            let id = request.get_or_insert_with(|| self.request_id());
            self.log.line(
                self.stream,
                id,
                clip(String::from_utf8_lossy(&line).into_owned()).as_str(),
            );
        }
    }

    /// Logs this stream's unfinished last line, if any (its request ended).
    pub(crate) fn flush_line(&self) {
        let line = std::mem::take(&mut *self.partial.lock().unwrap_or_else(|p| p.into_inner()));
        if !line.is_empty() {
            let id = self.request_id();
            self.log.line(
                self.stream,
                &id,
                clip(String::from_utf8_lossy(&line).into_owned()).as_str(),
            );
        }
    }
}

impl tokio::io::AsyncWrite for LogPipe {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let tap = self.tap.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(b) = tap {
            b.write_log(buf);
        }
        self.to_node_log(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl wasmtime_wasi::cli::IsTerminal for LogPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl wasmtime_wasi::cli::StdoutStream for LogPipe {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// Collects a whole flow's events on its first node, within
/// [`MAX_FLOW_EVENTS`] and [`MAX_FLOW_BYTES`], until it is delivered.
pub(crate) struct Collector {
    state: Mutex<Collected>,
    stats: Arc<crate::stats::Stats>,
}

#[derive(Default)]
struct Collected {
    events: Vec<TraceEvent>,
    bytes: usize,
    dropped: u64,
    delivered: bool,
}

/// The bytes of text `e` holds, as [`MAX_FLOW_BYTES`] counts them.
fn event_bytes(e: &TraceEvent) -> usize {
    e.script_id.len() + e.node.len() + e.kind.len() + e.message.len()
}

impl Collector {
    pub(crate) fn new(stats: Arc<crate::stats::Stats>) -> Self {
        Collector {
            state: Mutex::new(Collected::default()),
            stats,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Collected> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes in one level's events, as many as the flow's bounds leave room
    /// for; refused once the flow was delivered.
    fn collect(&self, events: Vec<TraceEvent>) -> Result<(), ReportError> {
        let mut s = self.state();
        if s.delivered {
            crate::stats::Stats::bump(&self.stats.tail_late_reports);
            return Err(ReportError::FlowDelivered);
        }
        for e in events {
            let bytes = event_bytes(&e);
            if s.events.len() >= MAX_FLOW_EVENTS || s.bytes + bytes > MAX_FLOW_BYTES {
                s.dropped += 1;
            } else {
                s.bytes += bytes;
                s.events.push(e);
            }
        }
        Ok(())
    }

    /// The flow's events and how many were dropped, once: from now on
    /// reports are refused.
    fn take(&self) -> (Vec<TraceEvent>, u64) {
        let mut s = self.state();
        s.delivered = true;
        s.bytes = 0;
        (
            std::mem::take(&mut s.events),
            std::mem::take(&mut s.dropped),
        )
    }
}

impl TraceSink for Collector {
    fn report(&self, events: Vec<TraceEvent>) -> BoxFuture<'static, Result<(), ReportError>> {
        let taken = self.collect(events);
        Box::pin(async move { taken })
    }
}

/// One traced level, from its invocation's start to its report.
pub(crate) struct Level {
    pub(crate) buffer: Arc<TraceBuffer>,
    /// Where its events go in its flow; `None` when it is recorded only
    /// for live watchers.
    pub(crate) sink: Option<Tracing>,
    /// Set while someone watches the Worker live
    /// ([`crate::outbound::live_tail`]): the request becomes one event for them.
    pub(crate) live: Option<LiveRequest>,
    /// The status the node answers with when the level failed before the
    /// Worker answered.
    pub(crate) node_status: Option<u16>,
    pub(crate) started: std::time::Instant,
    pub(crate) node: String,
    /// Set on the flow's first node: the tail Workers to invoke once this
    /// (entry) level has ended.
    pub(crate) tails: Option<TailDelivery>,
    /// The node's counters (levels whose events were cut).
    pub(crate) stats: Arc<crate::stats::Stats>,
}

/// What the live tail needs of a request besides its events.
pub(crate) struct LiveRequest {
    pub(crate) hub: Arc<crate::outbound::live_tail::LiveTail>,
    pub(crate) method: String,
    /// The request's URL, [`redact_url`]ed.
    pub(crate) url: String,
}

/// The tail Workers of a flow and what they will be sent.
pub(crate) struct TailDelivery {
    pub(crate) collector: Arc<Collector>,
    pub(crate) entry: String,
    pub(crate) tails: Vec<String>,
    pub(crate) invoker: Option<Arc<dyn crate::flow::Invoker>>,
    pub(crate) limits: crate::limits::PlanLimits,
    pub(crate) stats: Arc<crate::stats::Stats>,
    /// The entry request's `CDN-Loop` entries: a tail Worker's fetches
    /// count on from them, so a tail Worker that fetches the Worker it
    /// tails loops only as far as the front door lets it ([`crate::flow`]).
    pub(crate) mark: crate::flow::LoopMark,
}

impl Level {
    /// Records how the level ended, reports its events, and (on the first
    /// node) hands the flow to its tail Workers.
    pub(crate) async fn finish(
        self,
        status: Option<u16>,
        error: Option<String>,
        cpu: std::time::Duration,
    ) {
        let wall = self.started.elapsed();
        if let Some(e) = &error {
            self.buffer.push_end("exception", e.clone());
        }
        let how = match (&error, status) {
            (None, Some(s)) => format!("ok {s}"),
            (None, None) => "ok".to_string(),
            (Some(_), Some(s)) => format!("exception after {s}"),
            (Some(_), None) => "exception".to_string(),
        };
        self.buffer.push_end(
            "outcome",
            format!(
                "{how}; wall {:.3} ms, cpu {:.3} ms",
                wall.as_secs_f64() * 1000.0,
                cpu.as_secs_f64() * 1000.0
            ),
        );
        let (mut events, truncated) = self.buffer.take();
        if truncated {
            crate::stats::Stats::bump(&self.stats.trace_levels_truncated);
        }
        for e in &mut events {
            e.node.clone_from(&self.node);
        }
        if let Some(live) = self.live {
            let status = status.or(self.node_status).unwrap_or(500);
            live.hub.publish(crate::outbound::live_tail::RequestEvent {
                script_id: self.buffer.script_id.clone(),
                node: self.node.clone(),
                timestamp_unix_ms: now_ms(),
                method: live.method,
                url: live.url,
                status,
                outcome: if error.is_some() { "exception" } else { "ok" }.into(),
                cpu_ms: cpu.as_secs_f64() * 1000.0,
                wall_ms: wall.as_secs_f64() * 1000.0,
                events: if self.sink.is_some() {
                    events.clone()
                } else {
                    std::mem::take(&mut events)
                },
                sample_rate: 1.0,
                dropped: 0,
            });
        }
        // A first node that does not answer must not hold this level's
        // response: its events are given up after REPORT_TIMEOUT.
        if let Some(sink) = &self.sink {
            match tokio::time::timeout(REPORT_TIMEOUT, sink.0.report(events)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "trace events dropped"),
                Err(_) => tracing::warn!(
                    "trace events not delivered to the flow's first node in time; dropped"
                ),
            }
        }
        if let Some(t) = self.tails {
            tokio::spawn(t.deliver());
        }
    }
}

impl TailDelivery {
    /// Invokes each tail Worker once with the whole flow's events.
    async fn deliver(self) {
        use http_body_util::BodyExt;
        let (events, dropped) = self.collector.take();
        let batch = TailBatch {
            entry: self.entry.clone(),
            events,
            dropped,
        };
        // Serialized once; each tail Worker's body shares these bytes.
        let Ok(json) = serde_json::to_vec(&batch).map(bytes::Bytes::from) else {
            return;
        };
        drop(batch);
        let Some(invoker) = self.invoker else {
            tracing::warn!(entry = %self.entry, "tail Workers need a hearth node; events dropped");
            return;
        };
        for tail in self.tails {
            let req = http::Request::post(format!("http://{tail}.internal/"))
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(crate::body::full(json.clone()));
            let Ok(mut req) = req else { continue };
            self.mark.carry(req.headers_mut());
            let call = crate::flow::NestedCall {
                caller: self.entry.clone(),
                target: tail.clone(),
                kind: crate::outbound::bindings::CallKind::Tail,
                depth: 2,
                cpu_left: self.limits.request_cpu,
                deadline: std::time::Instant::now() + self.limits.request_wall,
                caller_bindings: Arc::new(crate::outbound::bindings::Bindings::default()),
                caller_extensions: http::Extensions::new(),
                nested_cpu: None,
            };
            let resp = invoker.invoke(call, req).await;
            let status = resp.status();
            // Read to the end: the tail Worker's invocation completes.
            let _ = resp.into_body().collect().await;
            crate::stats::Stats::bump(&self.stats.tail_deliveries);
            if !status.is_success() {
                crate::stats::Stats::bump(&self.stats.tail_failures);
                tracing::warn!(entry = %self.entry, %tail, %status, "tail Worker failed");
            }
        }
    }
}

/// A response body whose end waits for `done`: a traced level's events
/// reach the first node before its caller sees the body end.
pub(crate) struct HoldEnd {
    pub(crate) inner: crate::body::Body,
    pub(crate) done: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl http_body::Body for HoldEnd {
    type Data = bytes::Bytes;
    type Error = crate::body::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(None) => match self.done.as_mut() {
                Some(rx) => match std::pin::Pin::new(rx).poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(_) => {
                        self.done = None;
                        Poll::Ready(None)
                    }
                },
                None => Poll::Ready(None),
            },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(message: String) -> TraceEvent {
        TraceEvent {
            script_id: "w".into(),
            node: "n".into(),
            timestamp_unix_ms: 0,
            kind: "log".into(),
            message,
        }
    }

    #[test]
    fn a_flow_is_bounded_in_events_and_bytes_and_closed_once_taken() {
        let stats = Arc::new(crate::stats::Stats::default());
        let c = Collector::new(stats.clone());
        for _ in 0..10 {
            let level: Vec<_> = (0..MAX_EVENTS).map(|i| event(i.to_string())).collect();
            c.collect(level).expect("open");
        }
        let (events, dropped) = c.take();
        assert_eq!(events.len(), MAX_FLOW_EVENTS);
        assert_eq!(dropped, (10 * MAX_EVENTS - MAX_FLOW_EVENTS) as u64);
        assert_eq!(
            c.collect(vec![event("late".into())]),
            Err(ReportError::FlowDelivered)
        );
        assert_eq!(
            stats
                .tail_late_reports
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );

        let c = Collector::new(stats);
        let big: Vec<_> = (0..1000)
            .map(|_| event("x".repeat(MAX_LINE_BYTES)))
            .collect();
        c.collect(big).expect("open");
        let (events, dropped) = c.take();
        let bytes: usize = events.iter().map(event_bytes).sum();
        assert!(bytes <= MAX_FLOW_BYTES, "{bytes}");
        assert_eq!(events.len() as u64 + dropped, 1000);
        assert!(dropped > 0);
    }

    #[test]
    fn output_becomes_one_log_event_per_line_and_is_bounded() {
        let b = TraceBuffer::new("w");
        b.write_log(b"first li");
        b.write_log(b"ne\nsecond\r\nthird");
        let (events, truncated) = b.take();
        let lines: Vec<&str> = events.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(lines, ["first line", "second", "third"]);
        assert!(events.iter().all(|e| e.kind == "log" && e.script_id == "w"));
        assert!(!truncated);
        assert!(b.take().0.is_empty(), "taken once");

        // Past the count: one mark, then the outcome, which is always kept.
        for i in 0..MAX_EVENTS + 5 {
            b.push("subrequest", format!("{i}"));
        }
        b.push("log", "x".repeat(MAX_LINE_BYTES * 2));
        b.push_end("outcome", "ok 200".into());
        let (events, truncated) = b.take();
        assert!(truncated);
        assert_eq!(events.len(), MAX_EVENTS + 2);
        assert_eq!(events[MAX_EVENTS].kind, TRUNCATED);
        assert!(
            events[MAX_EVENTS].message.starts_with("6 events ("),
            "{}",
            events[MAX_EVENTS].message
        );
        assert_eq!(events[MAX_EVENTS + 1].kind, "outcome");

        // Past the bytes: long lines are cut and marked, and the level
        // holds at most MAX_LEVEL_BYTES of them.
        let mut line = vec![b'y'; MAX_LINE_BYTES * 2];
        line.push(b'\n');
        for _ in 0..1000 {
            b.write_log(&line);
        }
        b.push_end("outcome", "ok 200".into());
        let (events, truncated) = b.take();
        assert!(truncated);
        let (mark, rest) = events.split_at(events.len() - 2);
        let text: usize = mark.iter().map(event_bytes).sum();
        assert!(text <= MAX_LEVEL_BYTES, "{text}");
        assert!(mark.len() > 200, "{}", mark.len());
        let line = &mark[0].message;
        assert!(line.len() <= MAX_LINE_BYTES, "{}", line.len());
        assert!(
            line.ends_with(" bytes cut]"),
            "{}",
            &line[line.len() - 40..]
        );
        assert_eq!(rest[0].kind, TRUNCATED);
        assert!(
            rest[0]
                .message
                .starts_with(&format!("{} events (", 1000 - mark.len())),
            "{}",
            rest[0].message
        );
        assert_eq!(rest[1].kind, "outcome");
    }

    #[test]
    fn urls_show_without_query_values_or_user_information() {
        for (url, shown) in [
            ("/", "/"),
            (
                "/search?q=cats&api_key=s3cr3t",
                "/search?q=REDACTED&api_key=REDACTED",
            ),
            (
                "https://api.example.com/v1?key=s3cr3t&empty=&flag#frag",
                "https://api.example.com/v1?key=REDACTED&empty=&REDACTED",
            ),
            (
                "http://user:s3cr3t@origin.example/p?",
                "http://REDACTED@origin.example/p?",
            ),
            (
                "http://next.internal/?fetch=http://a/b?token=s3cr3t&n=1",
                "http://next.internal/?fetch=REDACTED&n=REDACTED",
            ),
            ("/a&&b=c?x=1&&y=2", "/a&&b=c?x=REDACTED&&y=REDACTED"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
        let long = format!("/?k={}", "v".repeat(MAX_LINE_BYTES * 2));
        assert_eq!(redact_url(&long), "/?k=REDACTED");
        let long = format!("/{}", "p".repeat(MAX_LINE_BYTES * 2));
        assert!(redact_url(&long).len() <= MAX_LINE_BYTES);
    }
}
