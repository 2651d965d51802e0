# duoserve container: an OpenAI-compatible server for one model on NVIDIA GPUs.
#   docker build -t duoserve .
#   docker run --gpus all -p 8000:8000 -v /path/to/models:/models:ro duoserve -m /models/Llama-3.1-8B-Instruct
# Flags after the image name go to `duoserve serve`; /etc/duoserve/duoserve.json (DUOSERVE_CONFIG)
# makes it listen on 0.0.0.0:8000 unless a flag says otherwise.
# Build arguments: CUDA_VERSION and UBUNTU pick the nvidia/cuda images; CUDA_ARCH the GPU
# architecture of the kernels (90a: H100, H200, GH200; they use Hopper-only instructions).
ARG CUDA_VERSION=13.0.0
ARG UBUNTU=ubuntu24.04

# ---- build: the README's steps (scripts/install-deps.sh, make); the tests run in CI, not here ----
FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
ARG CUDA_ARCH=90a
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN ./scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN make -j"$(nproc)" CUDA=1 CUDA_ARCH="${CUDA_ARCH}" build/duoserve && ./build/duoserve --version

# ---- runtime: CUDA runtime (cudart, cuBLAS) plus the shared libraries duoserve links ----
FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends \
      libuv1t64 libcjson1 libpcre2-8-0 libutf8proc3 curl ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 --shell /usr/sbin/nologin duoserve \
 && mkdir -p /models /etc/duoserve
COPY --from=build /src/build/duoserve /usr/local/bin/duoserve
COPY config/duoserve.example.json /etc/duoserve/duoserve.example.json
RUN printf '{\n  "host": "0.0.0.0",\n  "port": 8000,\n  "device": "cuda"\n}\n' > /etc/duoserve/duoserve.json
ENV DUOSERVE_CONFIG=/etc/duoserve/duoserve.json \
    DUOSERVE_CACHE=/home/duoserve/.cache/duoserve
USER duoserve
WORKDIR /home/duoserve
VOLUME ["/models"]
EXPOSE 8000
# /health is 503 while the model loads or the server drains, so give loading time.
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=3 \
  CMD curl -fsS http://127.0.0.1:8000/health || exit 1
# SIGTERM drains: in-flight requests finish (up to --shutdown-timeout, default 30 s), then exit 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["duoserve", "serve"]
