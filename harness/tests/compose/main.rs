//! The container checks (`make compose-check`, part of `make test`): the compose files in `envoy/` started with the
//! local images (`make images`, built `FROM scratch` from this machine's files; no registry is needed), faults
//! made with Docker itself (a container killed, one cut off a network), and every point checked through the
//! published ports, Envoy's admin and etcd. Each run uses a project name of its own and lets Docker choose ports
//! and subnets; on a failure every container's log tail is printed, and the stack is always taken down, after
//! which no container, network or volume of it may remain. Without Docker, compose or the images the checks fail;
//! they never skip.
//!
//! - `demo`: `envoy/docker-compose.yaml`, three engines behind one Envoy.
//! - `replicas`: `envoy/docker-compose.replicas.yaml`, two Envoy replicas sharing placement through a 3-member etcd,
//!   engines registered in etcd and discovered.

mod demo;
mod replicas;
mod support;
