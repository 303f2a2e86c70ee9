# llmroute/llama-server: the project's llama.cpp llama-server build (`make engines`) on an empty base
# (docker/build-images.py assembles rootfs.tar). The contract is ghcr.io/ggml-org/llama.cpp:server's: the entry
# point is /app/llama-server, the arguments are server flags, it listens on 0.0.0.0 (LLAMA_ARG_HOST) port 8080 by
# default, and the image checks its own /health.
FROM scratch
ADD rootfs.tar /
ENV LLAMA_ARG_HOST=0.0.0.0
WORKDIR /app
HEALTHCHECK CMD ["/usr/local/bin/llmroute-probe", "http://127.0.0.1:8080/health"]
ENTRYPOINT ["/app/llama-server"]
