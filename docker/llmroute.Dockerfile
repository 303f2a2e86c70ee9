# llmroute/llmroute: the `llmroute` CLI (`make cli`) on an empty base (docker/build-images.py assembles rootfs.tar),
# for the long-running commands that run beside the containers of a fleet: `llmroute register` beside each engine,
# `llmroute discover` beside each Envoy (it writes EDS files into /var/lib/llmroute, a volume Envoy reads). The
# entry point is the CLI; the arguments are its subcommand and flags.
FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/bin
WORKDIR /var/lib/llmroute
ENTRYPOINT ["/usr/local/bin/llmroute"]
CMD ["--help"]
