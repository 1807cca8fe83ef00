# hearth's container image: `hearth serve` on a minimal base, as a non-root
# user. Build it from the repository root:
#
#   docker build -t hearth .
#
# The builder compiles the release binary (the sample Workers, which the
# binary lists with `hearth samples`, need the wasm32-wasip2 target, Node.js
# and Python; the JS engine it carries ships prebuilt, so no C toolchain);
# the final image holds only the binary. CI checks that the
# build command below is the README's ("Operating hearth").

FROM rust:1.95-bookworm AS builder
RUN rustup target add wasm32-wasip2 \
 && apt-get update \
 && apt-get install -y --no-install-recommends nodejs npm python3-venv python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin hearth \
 && cp target/release/hearth /usr/local/bin/hearth

# distroless/cc: glibc and libgcc (what a Rust binary links), no shell, no
# package manager; `nonroot` is uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /usr/local/bin/hearth /usr/local/bin/hearth
# Worker traffic (HTTP, HTTPS), admin API (/livez, /readyz, /metrics),
# shard RPC (TCP) and gossip (UDP).
EXPOSE 8080 8443 8081 7000 7001/udp
USER nonroot:nonroot
WORKDIR /var/lib/hearth
ENTRYPOINT ["/usr/local/bin/hearth", "serve"]
CMD ["--config", "/etc/hearth/hearth.toml"]
