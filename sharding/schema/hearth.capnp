# hearth's inter-node protocol.
#
# One node (the *shard client*) receives a request for a Worker whose *home*
# is another node on the hash ring. If the request's body is small and
# complete, it sends it whole with `ShardServer.call` and gets the answer in
# the return (see `call` below): one round trip. Otherwise it calls
# `ShardServer.dispatch` on the home
# *and, without waiting for the answer*, pipelines `fetch` on the returned
# `worker` and streams the request body into the pipelined `requestBody`.
# Along with the request it passes `lazy`: a capability to an instance of the
# same Worker on the client itself that costs nothing until invoked.
#
# The home answers `dispatch` with
#   * a Worker of its own: it accepted, the pipelined fetch runs there and the
#     response streams back through the client's `ResponseSink`; or
#   * the client's own `lazy` capability: it refused (overloaded). Cap'n Proto
#     hands a capability back to the vat that hosts it as `receiverHosted`, so
#     the client sees its own object, stops sending body bytes to the home and
#     serves the request locally from the bytes it kept.
#
# Bodies are capabilities: the receiver of a body exposes a `ByteStream` and
# the sender pushes chunks with `write`, a `-> stream` method, so capnp-rpc's
# per-capability flow-control window gives back-pressure end to end.

@0x8db3a6dc2cded9d7;

# ---------------------------------------------------------------- HTTP heads

struct Header {
  name @0 :Text;
  value @1 :Data;   # header values need not be UTF-8
}

struct RequestHead {
  method @0 :Text;
  uri @1 :Text;     # as received by the front door (path and query, or absolute)
  headers @2 :List(Header);
}

struct ResponseHead {
  status @0 :UInt16;
  headers @1 :List(Header);
}

# ---------------------------------------------------------------- bodies

# The receiving end of a body. The sender calls `write` any number of times,
# then exactly one of `end` (the body is complete) or `abort` (the body failed
# and the receiver must not mistake what it has for the whole body). A stream
# whose capability is dropped without either is treated as aborted.
interface ByteStream {
  write @0 (chunk :Data) -> stream;
  end @1 ();
  abort @2 (reason :Text);
}

# Where a Worker delivers its response: `start` carries the head and returns
# the stream the body is written into.
interface ResponseSink {
  start @0 (head :ResponseHead) -> (body :ByteStream);
}

# ---------------------------------------------------------------- Workers

# One Worker (a script ID) on some node. `fetch` returns at once with the
# stream to write the request body into; the response arrives through
# `response`, which may happen before the request body is complete (a Worker
# may stream its answer while it reads).
interface Worker {
  fetch @0 (head :RequestHead, response :ResponseSink) -> (requestBody :ByteStream);
}

# ---------------------------------------------------------------- context

enum TrustLevel {
  untrusted @0;   # e.g. a user Worker behind a dynamic dispatch Worker
  standard @1;    # an ordinary customer Worker
  platform @2;    # a platform Worker (dynamic dispatch, outbound)
}

# Limits this level of the flow runs under, overriding the plan's. Zero means
# "no override" (a zero limit would be meaningless).
struct LimitOverrides {
  cpuMs @0 :UInt64;
  memoryBytes @1 :UInt64;
}

struct TailWorker {
  scriptId @0 :Text;
}

struct Param {
  name @0 :Text;
  value @1 :Text;
}

struct OutboundWorker {
  scriptId @0 :Text;
  params @1 :List(Param);   # the dispatch Worker's parameters for it
}

# One level of a nested invocation (dynamic dispatch Worker -> user Worker ->
# outbound Worker ...). Pointer fields left null mean "not set at this level".
struct ContextFrame {
  scriptId @0 :Text;
  ownershipOverride @1 :Text;   # account the invocation is attributed to
  limits @2 :LimitOverrides;
  trust @3 :TrustLevel;
  tailWorkers @4 :List(TailWorker);
  outbound @5 :OutboundWorker;
  featureFlags @6 :List(Text);
}

struct TraceEvent {
  scriptId @0 :Text;
  node @1 :Text;              # the node that produced the event
  timestampUnixMs @2 :UInt64;
  kind @3 :Text;              # "log", "subrequest", "exception" or "outcome"
  message @4 :Text;
}

# Created at the node of the first Worker of a flow; every node the flow
# reaches can call it without knowing where that node is.
interface ReportTraces {
  reportTraces @0 (events :List(TraceEvent));
}

# Travels with every sharded request and is rebuilt as native structs on the
# other side. `frames` is outermost first.
struct ContextStack {
  frames @0 :List(ContextFrame);
  reportTraces @1 :ReportTraces;
  # Milliseconds left until the flow's wall-clock deadline, measured when
  # the stack is written (so clocks need not agree); 0 means no deadline.
  deadlineMs @2 :UInt64;
  # The flow's ID for its CPU budget of nested calls (0: none), and the
  # microseconds of that budget left on the sending node when it called.
  # Each node keeps one budget per flow ID: every nested invocation of the
  # flow on that node draws from it.
  flowId @3 :UInt64;
  nestedCpuUs @4 :UInt64;
  # The W3C trace context (`traceparent`) of the span the call belongs to,
  # so one trace shows every node of the flow: the 128-bit trace ID in two
  # halves (both 0: the flow is not traced), the calling span's ID and the
  # trace flags (bit 0: sampled).
  traceIdHigh @5 :UInt64;
  traceIdLow @6 :UInt64;
  parentSpanId @7 :UInt64;
  traceFlags @8 :UInt8;
}

# ---------------------------------------------------------------- shard server

# A node's RPC bootstrap capability, offered only to peers that presented a
# cluster certificate.
interface ShardServer {
  # Asks the home to take a request for `scriptId`. Returns a Worker to send
  # the request to: one hosted by the home (accepted), or `lazy` itself
  # (refused; never an error to the end user).
  #
  # `scriptId` (here and in `call`) is a Worker's script ID or a Durable
  # Object's ring key, `do:<script>/<class>/<id>` (no script ID starts with
  # `do:`). The home of an object always accepts (the request queues at the
  # object's input gate) and serves it on its resident object; if it
  # refuses anyway (it cannot read the call), the caller answers 503 and
  # does not serve the object itself.
  dispatch @0 (scriptId :Text, context :ContextStack, lazy :Worker) -> (worker :Worker);

  # The one-round-trip form of `dispatch` + `fetch`, for the common request
  # whose body is complete and small (at most 64 KiB): the body travels
  # inline, and a small complete response comes back inline in the return.
  # A response that is large or still streaming goes through `response`
  # instead (as for `fetch`), and the call returns `streamed` once it has
  # been sent. The call stays open while the request runs: finishing it
  # early cancels the invocation.
  #
  # Once sent, the home may have started the request, so the caller never
  # replays it, except after `refused` (the caller's `lazy`, handed back:
  # nothing ran).
  call @1 (scriptId :Text, context :ContextStack, lazy :Worker,
           head :RequestHead, body :Data, response :ResponseSink) -> CallAnswer;

  # Asks the home to get `scriptId` ready for a request that is probably on
  # its way (a client's TLS ClientHello named it in its SNI): what a cold
  # start runs before the handler, without serving anything. Best effort:
  # the home bounds its prewarms and may drop this one. Returns when the
  # Worker is ready or the home gave up.
  prewarm @2 (scriptId :Text) -> (outcome :PrewarmOutcome);

  # Tells a member that `scriptId` was just redeployed with the source whose
  # blake3 is `hash` (hex). A warm copy of another version is checked
  # against the store and dropped if the store agrees it is stale; a member
  # never drops a current copy on anyone's word. Returns once done, so the
  # deploying node knows that every member that answered serves the new
  # version from then on.
  redeployed @3 (scriptId :Text, hash :Text);

  # Asks a member that is not `scriptId`'s home to drop its warm copy now,
  # so requests go to the home again (after a crashed home has rejoined).
  # The home keeps its copy. Returns whether a copy was dropped.
  handBack @4 (scriptId :Text) -> (dropped :Bool);

  # A live tail of `scriptId` on this member (what `hearth tail` shows):
  # each request of it that finishes here, filtered by `status` (as the
  # admin API's `status=`, empty for all) and sampled at `sample` (0..1],
  # goes to `sink` until the sink fails, the caller finishes the call or
  # this member drains. Returns then.
  tail @5 (scriptId :Text, status :Text, sample :Float64, sink :TailSink);
}

# Where a member's live tail goes (`ShardServer.tail`).
interface TailSink {
  # One finished request: a `hearth-trace-event` `RequestEvent` as JSON.
  # An empty `json` is a keepalive, sent when the member has been quiet for
  # a while, so a sink whose reader left is found and the tail ended.
  event @0 (json :Text) -> stream;
}

# What a home did with a `prewarm`.
enum PrewarmOutcome {
  loaded @0;        # loaded and instantiated for it
  alreadyWarm @1;   # it was resident already
  dropped @2;       # not done: the home's prewarms are at their cap, one for
                    # this Worker is already running, or memory is short
  failed @3;        # no such Worker here, or it failed to load or start
}

# A small complete response, carried whole.
struct InlineResponse {
  head @0 :ResponseHead;
  body @1 :Data;
}

# What `ShardServer.call` returns.
struct CallAnswer {
  union {
    refused @0 :Worker;            # `lazy` itself: serve the request yourself
    response @1 :InlineResponse;   # served at the home, response inline
    streamed @2 :Void;             # served at the home, response sent to `response`
  }
  # Microseconds the home spent between receiving the call and answering
  # (admission plus the Worker), so the caller can tell the hop's own cost.
  homeMicros @3 :UInt64;
}
