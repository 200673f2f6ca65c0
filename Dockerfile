# syntax=docker/dockerfile:1
#
# A small static image of cascade-guard: built for the musl target, so the
# binary needs no libc, and run from distroless/static as its non-root user
# (uid 65532, which the Helm chart's securityContext expects).
#
#   docker build -t ghcr.io/cascade-guard/cascade-guard:0.1.0 .
#
# The builder compiles for the platform it runs on (x86_64 or aarch64), so a
# multi-platform image is `docker buildx build --platform linux/amd64,linux/arm64`.

# The toolchain the workspace is developed with (workspace rust-version: 1.89).
FROM docker.io/library/rust:1.95-bookworm AS builder
# ring (rustls' crypto) compiles C, so the musl target needs musl's C compiler.
RUN apt-get update \
    && apt-get install -y --no-install-recommends musl-tools \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Only what the build reads: the workspace manifests, the lock file, and the
# crates (local-cluster is a workspace member, so its manifest must be there,
# but it is not built).
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    target="$(uname -m)-unknown-linux-musl" \
    # musl-tools installs its compiler as musl-gcc on every architecture;
    # name it, rather than rely on the cc crate's guess of a prefixed one.
    && export CC_x86_64_unknown_linux_musl=musl-gcc CC_aarch64_unknown_linux_musl=musl-gcc \
    && rustup target add "$target" \
    && cargo build --release --locked --target "$target" -p cascade-guard --bin cascade-guard \
    && cp "target/$target/release/cascade-guard" /cascade-guard \
    && /cascade-guard version --client

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=builder /cascade-guard /cascade-guard
USER 65532:65532
# /metrics, /healthz and /readyz (--http-address).
EXPOSE 8080
ENTRYPOINT ["/cascade-guard"]
CMD ["run"]
