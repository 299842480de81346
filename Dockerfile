# syntax=docker/dockerfile:1
# The Diverge server image: `diverge serve` (and the CLI) on Debian 12.
#   docker build -t diverge:0.1.0 .
# Build stage: the same Debian packages as a developer machine (scripts/deps.sh).
# Final stage: only the runtime libraries the binaries link against, git (the server
# mirrors and pushes repositories, SPEC §9), CA certificates, and a non-root user.
# Read-only-root friendly: everything written goes to --data-dir (a volume) and /tmp.

FROM debian:12-slim AS build
WORKDIR /src
COPY scripts/deps.sh scripts/deps.sh
RUN bash scripts/deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWERROR=ON \
    && cmake --build /build -j"$(nproc)" --target diverge diverge-agent-runner \
    && install -D -m 0755 -s /build/diverge /out/usr/local/bin/diverge \
    && install -D -m 0755 -s /build/diverge-agent-runner /out/usr/local/bin/diverge-agent-runner

FROM debian:12-slim
# Runtime libraries of `diverge` (the NEEDED entries of the binary; the test checks them
# against the build's own binary): libmicrohttpd, jansson, pcre2, OpenSSL, curl, yaml,
# SQLite, libseccomp.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        libmicrohttpd12 libjansson4 libpcre2-8-0 libssl3 libcurl4 libyaml-0-2 \
        libsqlite3-0 libseccomp2 git ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 diverge \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/diverge \
        --shell /usr/sbin/nologin diverge \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/diverge
COPY --from=build /out/ /
USER 10001:10001
WORKDIR /var/lib/diverge
ENV DIVERGE_DATA_DIR=/var/lib/diverge/data \
    DIVERGE_LISTEN=0.0.0.0:8080 \
    DIVERGE_LOG_FORMAT=json \
    HOME=/tmp
EXPOSE 8080 8443
ENTRYPOINT ["/usr/local/bin/diverge"]
CMD ["serve"]
