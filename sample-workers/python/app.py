"""hearth sample Worker in Python.

Built by componentize-py into a wasi:http proxy component: the class
`IncomingHandler` below implements the exported interface
wasi:http/incoming-handler@0.2.10, whose bindings (the `wit_world` package)
componentize-py generates from ../wit/ at build time.

It answers every request with JSON describing it:
  {"worker":"python","method":"POST","path":"/x?y=1","headers":{...},
   "body":"...","bodyLength":N}
`path` is the request's path and query; `headers` maps each lower-case header
name to its value (repeated headers joined with ", ", as the JS Worker's
Fetch API Headers does); `body` is the request body decoded as UTF-8
(malformed bytes become U+FFFD) and `bodyLength` its length in bytes. Like
the JS Worker, a GET or HEAD request's body is not read.

With `?env=NAME,NAME2` the JSON also has `"env": {"NAME": value-or-null}`:
the Worker's vars and secrets as `os.environ` holds them. componentize-py
runs the module's top level when it builds the component, so `os.environ`
is the build machine's until the first request refreshes it from
wasi:cli/environment (`refresh_environ`): a deploy or a secret change
starts new instances, so one read per instance is a read at request time.

The handler is synchronous: it uses the blocking wasi:io stream calls, so it
needs no asyncio event loop.
"""

import json
import os
from urllib.parse import parse_qs, urlsplit

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.imports import environment, streams, types

# Largest chunk asked for per blocking_read of the request body.
READ_CHUNK = 64 * 1024
# blocking_write_and_flush takes at most 4096 bytes per call.
WRITE_CHUNK = 4096

METHODS = {
    types.Method_Get: "GET",
    types.Method_Head: "HEAD",
    types.Method_Post: "POST",
    types.Method_Put: "PUT",
    types.Method_Delete: "DELETE",
    types.Method_Connect: "CONNECT",
    types.Method_Options: "OPTIONS",
    types.Method_Trace: "TRACE",
    types.Method_Patch: "PATCH",
}


def method_name(method: types.Method) -> str:
    if isinstance(method, types.Method_Other):
        return method.value
    return METHODS[type(method)]


def read_body(request: types.IncomingRequest) -> bytes:
    """Reads the whole request body (the stream is dropped before the body)."""
    chunks = []
    with request.consume() as body:
        with body.stream() as stream:
            while True:
                try:
                    chunks.append(stream.blocking_read(READ_CHUNK))
                except Err as e:
                    if isinstance(e.value, streams.StreamError_Closed):
                        break
                    raise
    return b"".join(chunks)


_environ_loaded = False


def refresh_environ() -> None:
    """Makes `os.environ` this instance's environment (once per instance)."""
    global _environ_loaded
    if _environ_loaded:
        return
    os.environ.clear()
    os.environ.update(dict(environment.get_environment()))
    _environ_loaded = True


def describe(request: types.IncomingRequest) -> dict:
    method = method_name(request.method())
    headers: dict = {}
    with request.headers() as fields:
        for name, value in fields.entries():
            name = name.lower()
            text = value.decode("utf-8", errors="replace")
            headers[name] = f"{headers[name]}, {text}" if name in headers else text
    body = b"" if method in ("GET", "HEAD") else read_body(request)
    path = request.path_with_query() or "/"
    answer = {
        "worker": "python",
        "method": method,
        "path": path,
        # Sorted by name, as the JS Worker's Headers iterates them.
        "headers": dict(sorted(headers.items())),
        "body": body.decode("utf-8", errors="replace"),
        "bodyLength": len(body),
    }
    wanted = parse_qs(urlsplit(path).query).get("env")
    if wanted:
        refresh_environ()
        names = [n for n in ",".join(wanted).split(",") if n]
        answer["env"] = {name: os.environ.get(name) for name in names}
    return answer


def respond(response_out: types.ResponseOutparam, status: int, content_type: str, payload: bytes) -> None:
    headers = types.Fields.from_list(
        [("content-type", content_type.encode()), ("content-length", str(len(payload)).encode())]
    )
    response = types.OutgoingResponse(headers)
    response.set_status_code(status)
    body = response.body()
    types.ResponseOutparam.set(response_out, Ok(response))
    with body.write() as out:
        for start in range(0, len(payload), WRITE_CHUNK):
            out.blocking_write_and_flush(payload[start : start + WRITE_CHUNK])
    types.OutgoingBody.finish(body, None)


class IncomingHandler(exports.IncomingHandler):
    def handle(self, request: types.IncomingRequest, response_out: types.ResponseOutparam) -> None:
        try:
            answer = describe(request)
        except Exception as e:  # a broken request still gets an answer
            respond(response_out, 500, "text/plain; charset=utf-8", f"python worker: {e!r}\n".encode())
            return
        payload = json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        respond(response_out, 200, "application/json", payload)
