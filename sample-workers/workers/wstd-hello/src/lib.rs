//! `wstd-hello`: a wasi:http component NOT written for hearth. It uses the
//! `wstd` crate's `#[wstd::http_server]` directly, with no hearth-sdk, and
//! responds 200 `hello from wstd`.

use wstd::http::{Body, Error, Request, Response};

#[wstd::http_server]
async fn main(_request: Request<Body>) -> Result<Response<Body>, Error> {
    Ok(Response::new("hello from wstd".into()))
}
