# llmroute/prometheus: prometheus and promtool from Debian's package (`make prometheus`) with the compose scrape
# config and llmroute's rules, on an empty base (docker/build-images.py assembles rootfs.tar). The contract is
# prom/prometheus's: the entry point is /bin/prometheus, the default config /etc/prometheus/prometheus.yml, the
# time series in /prometheus, run as nobody, listening on port 9090.
FROM scratch
ADD rootfs.tar /
USER 65534:65534
WORKDIR /prometheus
EXPOSE 9090
VOLUME ["/prometheus"]
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
