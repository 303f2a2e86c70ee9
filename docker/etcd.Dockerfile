# llmroute/etcd: etcd and etcdctl from Debian's etcd-server and etcd-client packages (`make etcd`) on an empty base
# (docker/build-images.py assembles rootfs.tar). The contract is gcr.io/etcd-development/etcd's: the binaries in
# /usr/local/bin, the default command /usr/local/bin/etcd, client port 2379 and peer port 2380, run as root.
FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/bin
WORKDIR /var/etcd
EXPOSE 2379 2380
CMD ["/usr/local/bin/etcd"]
