//! The fair queue: the least-served tenant goes next under any arrival order, weights are honoured, idleness
//! banks no credit, a client that leaves is charged nothing, and the shared-data encoding round-trips.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::arithmetic_side_effects)]

use llmroute_core::fairness::{self, Arrival, Capacity, FairQueue, Refusal, Waiter, NO_HOST};
use proptest::prelude::*;

fn waiter(id: u64, tenant: u64, weight: u32, input: u32, at: u64) -> Waiter {
    Waiter {
        id,
        tenant,
        weight,
        input_tokens: input,
        arrived_ms: at,
        deadline_ms: at + 30_000,
        host: NO_HOST,
    }
}

fn on_host(w: Waiter, host: u32) -> Waiter {
    Waiter { host, ..w }
}

#[derive(Debug, Clone)]
enum Op {
    Arrive { tenant: u64, input: u32, wait_ms: u64 },
    Grant,
    Leave(usize),
    Complete { output: u32 },
    Tick(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..5, 1u32..4000, 0u64..5000).prop_map(|(tenant, input, wait_ms)| Op::Arrive { tenant, input, wait_ms }),
        Just(Op::Grant),
        (0usize..8).prop_map(Op::Leave),
        (0u32..2000).prop_map(|output| Op::Complete { output }),
        (1u64..2000).prop_map(Op::Tick),
    ]
}

fn weight_of(tenant: u64) -> u32 {
    [1, 2, 1, 3, 1][tenant as usize % 5]
}

proptest! {
    /// Under any interleaving of arrivals, grants, departures and completions, a granted waiter's tenant has no
    /// more weighted service than any other tenant with a waiter, and is that tenant's earliest waiter.
    #[test]
    fn no_tenant_waits_behind_a_tenant_with_more_service(ops in proptest::collection::vec(op(), 1..200)) {
        let mut q = FairQueue::default();
        let mut now = 0u64;
        let mut next_id = 0u64;
        let mut running: Vec<u64> = Vec::new();
        for op in ops {
            match op {
                Op::Arrive { tenant, input, wait_ms } => {
                    next_id += 1;
                    let mut w = waiter(next_id, tenant, weight_of(tenant), input, now);
                    w.deadline_ms = now + wait_ms;
                    let r = q.arrive(w, now, 16);
                    if wait_ms == 0 { prop_assert_eq!(r, Err(Refusal::NoWait)); }
                }
                Op::Grant => {
                    let before = q.clone();
                    let g = q.grant(now);
                    for e in &g.expired { prop_assert!(e.deadline_ms <= now); }
                    if let Some(w) = g.admitted {
                        prop_assert!(w.deadline_ms > now);
                        let c = |t: u64| before.tenant(t).unwrap().counter;
                        let live: Vec<&Waiter> = before.waiters.iter().filter(|x| x.deadline_ms > now).collect();
                        for other in &live {
                            prop_assert!(c(w.tenant) <= c(other.tenant));
                            if other.tenant == w.tenant { prop_assert!(w.arrived_ms <= other.arrived_ms); }
                        }
                        running.push(w.tenant);
                    }
                }
                Op::Leave(i) => {
                    if let Some(w) = q.waiters.get(i).copied() {
                        let before = q.tenant(w.tenant).unwrap().counter;
                        prop_assert!(q.leave(w.id));
                        prop_assert_eq!(q.tenant(w.tenant).unwrap().counter, before);
                        prop_assert!(!q.leave(w.id));
                    }
                }
                Op::Complete { output } => {
                    if let Some(t) = running.pop() { q.complete(t, weight_of(t), u64::from(output)); }
                }
                Op::Tick(ms) => now += ms,
            }
            // Every tenant's active count is its waiters plus its admitted, unfinished requests.
            for t in &q.tenants {
                let waiting = q.waiters.iter().filter(|w| w.tenant == t.id).count();
                let run = running.iter().filter(|&&r| r == t.id).count();
                prop_assert_eq!(t.active as usize, waiting + run);
            }
            prop_assert_eq!(fairness::decode(&fairness::encode(&q)), q.clone());
        }
    }

    /// Two tenants that always have work waiting share the slots in proportion to their weights: after any
    /// number of grants, their weighted service differs by at most one request's cost.
    #[test]
    fn weights_are_honoured(w1 in 1u32..5, w2 in 1u32..5, input in 1u32..500, output in 0u32..500, rounds in 1usize..300) {
        let mut q = FairQueue::default();
        let mut id = 0;
        for t in [1u64, 2] {
            for _ in 0..2 { id += 1; q.arrive(waiter(id, t, if t == 1 { w1 } else { w2 }, input, 0), 0, 64).unwrap(); }
        }
        let mut served = [0u64; 3];
        for _ in 0..rounds {
            let w = q.grant(1).admitted.unwrap();
            served[w.tenant as usize] += u64::from(input) + 2 * u64::from(output);
            q.complete(w.tenant, w.weight, u64::from(output));
            id += 1;
            q.arrive(waiter(id, w.tenant, w.weight, input, 1), 1, 64).unwrap();
        }
        let cost = (u64::from(input) + 2 * u64::from(output)) as f64;
        let per_weight = |i: usize, w: u32| served[i] as f64 / f64::from(w);
        let gap = (per_weight(1, w1) - per_weight(2, w2)).abs();
        prop_assert!(gap <= cost + 1.0, "served {:?} weights {} {} gap {}", served, w1, w2, gap);
    }

    /// The queue as the filter's workers use it: requests arrive on two workers at a backend of `capacity`, each
    /// worker admits only its own waiters, requests end and clients leave, in any order. Never more than
    /// `capacity` run; each admission is of a least-served tenant's earliest waiter among those still waiting;
    /// a waiter is never admitted past its deadline; and a request admitted at arrival found a free slot.
    #[test]
    fn workers_admit_their_own_waiters_within_capacity_least_served_first(
        capacity in 1u64..4,
        ops in proptest::collection::vec((0u8..5, 0u64..2, 0u64..4, 1u32..3000, 0u64..3000), 1..200),
    ) {
        let mut q = FairQueue::default();
        let mut now = 0u64;
        let mut next_id = 0u64;
        let mut running: Vec<u64> = Vec::new();
        let worker_of = |id: u64| id >> 32;
        for (kind, worker, tenant, n, ms) in ops {
            match kind {
                0 | 1 => {
                    next_id += 1;
                    let id = (worker << 32) | next_id;
                    let w = Waiter { id, tenant, weight: weight_of(tenant), input_tokens: n, arrived_ms: now, deadline_ms: now + ms, host: NO_HOST };
                    let before = q.clone();
                    match fairness::arrive(&mut q, w, now, capacity, 8) {
                        Arrival::Admitted => {
                            let live = before.waiters.iter().filter(|x| x.deadline_ms > now).count();
                            prop_assert!(before.running() < capacity);
                            if live > 0 {
                                // It jumped no waiter with less service.
                                let lifted = q.tenant(tenant).unwrap().counter - u64::from(n) * fairness::SCALE / u64::from(weight_of(tenant));
                                for x in before.waiters.iter().filter(|x| x.deadline_ms > now) {
                                    prop_assert!(lifted <= before.tenant(x.tenant).unwrap().counter);
                                }
                            }
                            running.push(tenant);
                        }
                        Arrival::Queued => prop_assert!(q.waiters.iter().any(|x| x.id == id)),
                        Arrival::Refused(Refusal::NoWait) => prop_assert_eq!(ms, 0),
                        Arrival::Refused(Refusal::QueueFull) => prop_assert!(q.waiters.len() >= 8),
                        Arrival::Moved(_) => prop_assert!(false, "plain arrive never moves a request"),
                    }
                }
                2 => {
                    let before = q.clone();
                    let g = q.grant_own(now, capacity, |id| worker_of(id) == worker);
                    let mut seen = before.clone();
                    seen.expire(now);
                    for w in &g.admitted {
                        prop_assert_eq!(worker_of(w.id), worker);
                        prop_assert!(w.deadline_ms > now);
                        let c = |t: u64| seen.tenant(t).unwrap().counter;
                        for other in &seen.waiters {
                            prop_assert!(c(w.tenant) <= c(other.tenant));
                            if other.tenant == w.tenant { prop_assert!(w.arrived_ms <= other.arrived_ms); }
                        }
                        // The next grant sees this one admitted and charged.
                        seen.leave(w.id);
                        seen.admit_now(w.tenant, w.weight, w.input_tokens, NO_HOST);
                        running.push(w.tenant);
                    }
                    if g.admitted.is_empty() && q.running() < capacity {
                        // Nothing admitted with a free slot: nobody waits, or the next waiter is another worker's.
                        let mut probe = q.clone();
                        if let Some(w) = probe.grant(now).admitted {
                            prop_assert_ne!(worker_of(w.id), worker);
                        }
                    }
                }
                3 => {
                    if !running.is_empty() {
                        let t = running.remove(n as usize % running.len());
                        q.complete_measured(t, weight_of(t), NO_HOST, 0, None, ms);
                    }
                }
                _ => now += ms,
            }
            prop_assert!(q.running() <= capacity, "running {} over {}", q.running(), capacity);
            prop_assert_eq!(q.running(), running.len() as u64);
        }
    }

    /// Completion charges the input as measured, not as estimated, plus twice the output, over the weight.
    #[test]
    fn completion_charges_the_measured_input_and_twice_the_output(
        estimate in 0u32..5000, measured in proptest::option::of(0u64..5000), output in 0u64..5000, weight in 1u32..5,
    ) {
        let mut q = FairQueue::default();
        q.admit_now(1, weight, estimate, NO_HOST);
        let start = q.tenant(1).unwrap().counter - u64::from(estimate) * fairness::SCALE / u64::from(weight);
        q.complete_measured(1, weight, NO_HOST, estimate, measured, output);
        let input = measured.unwrap_or(u64::from(estimate));
        let want = (input + 2 * output) * fairness::SCALE / u64::from(weight);
        let got = q.tenant(1).unwrap().counter - start;
        // Each charge and refund rounds down on its own.
        prop_assert!(got.abs_diff(want) <= 3, "got {} want {}", got, want);
        prop_assert_eq!(q.running(), 0);
    }

    #[test]
    fn any_bytes_decode_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = fairness::decode(&bytes);
    }
}

#[test]
fn a_tenant_back_from_idle_starts_level_with_the_least_active() {
    let mut q = FairQueue::default();
    // Tenant 1 is served a lot while tenant 2 is idle.
    for i in 0..10 {
        q.arrive(waiter(i, 1, 1, 1000, 0), 0, 64).unwrap();
        let w = q.grant(0).admitted.unwrap();
        q.complete(w.tenant, 1, 0);
    }
    q.arrive(waiter(100, 1, 1, 1000, 0), 0, 64).unwrap();
    q.arrive(waiter(101, 1, 1, 1000, 0), 0, 64).unwrap();
    // Tenant 2 arrives: it starts level with tenant 1, so the two alternate instead of tenant 2 taking every slot.
    q.arrive(waiter(200, 2, 1, 1000, 0), 0, 64).unwrap();
    q.arrive(waiter(201, 2, 1, 1000, 0), 0, 64).unwrap();
    assert_eq!(q.tenant(2).unwrap().counter, q.tenant(1).unwrap().counter);
    let order: Vec<u64> = (0..4).map(|_| q.grant(0).admitted.unwrap().tenant).collect();
    assert_eq!(order, vec![1, 2, 1, 2]);
}

#[test]
fn a_new_tenant_on_an_idle_backend_starts_at_the_floor() {
    let mut q = FairQueue::default();
    q.admit_now(1, 1, 5000, NO_HOST);
    q.complete(1, 1, 0);
    assert_eq!(q.floor, 5000 * fairness::SCALE);
    q.admit_now(2, 1, 0, NO_HOST);
    assert_eq!(q.tenant(2).unwrap().counter, 5000 * fairness::SCALE);
}

#[test]
fn a_hot_tenant_cannot_starve_a_quiet_one() {
    let mut q = FairQueue::default();
    // The hot tenant queues 50 requests first; the quiet one then queues one.
    for i in 0..50 {
        q.arrive(waiter(i, 7, 1, 2000, 0), 0, 1024).unwrap();
    }
    q.arrive(waiter(999, 8, 1, 100, 0), 0, 1024).unwrap();
    let first = q.grant(0).admitted.unwrap();
    let second = q.grant(0).admitted.unwrap();
    assert_eq!(
        (first.tenant, second.tenant),
        (7, 8),
        "the quiet tenant goes second, not 51st"
    );
}

#[test]
fn a_request_arriving_at_a_free_slot_goes_at_once_and_at_a_full_one_waits() {
    let mut q = FairQueue::default();
    assert_eq!(
        fairness::arrive(&mut q, waiter(1, 1, 1, 10, 0), 0, 1, 8),
        Arrival::Admitted
    );
    assert_eq!(
        fairness::arrive(&mut q, waiter(2, 2, 1, 10, 0), 0, 1, 8),
        Arrival::Queued
    );
    let mut no_wait = waiter(3, 3, 1, 10, 0);
    no_wait.deadline_ms = 0;
    assert_eq!(
        fairness::arrive(&mut q, no_wait, 0, 1, 8),
        Arrival::Refused(Refusal::NoWait)
    );
    assert_eq!(
        fairness::arrive(&mut q, waiter(4, 4, 1, 10, 0), 0, 1, 1),
        Arrival::Refused(Refusal::QueueFull)
    );
    assert_eq!((q.running(), q.depth()), (1, 1));
    // A slot frees: the waiter is granted, by its own worker only.
    q.complete(1, 1, 0);
    assert!(q.grant_own(0, 1, |id| id == 99).admitted.is_empty());
    assert_eq!(q.grant_own(0, 1, |id| id == 2).admitted.len(), 1);
    // Expired waiters leave whoever looks, before a full queue is judged.
    let mut q = FairQueue::default();
    q.admit_now(9, 1, 0, NO_HOST);
    q.arrive(waiter(5, 5, 1, 1, 0), 0, 1).unwrap();
    assert_eq!(
        fairness::arrive(&mut q, waiter(6, 6, 1, 1, 30_000), 30_000, 1, 1),
        Arrival::Queued
    );
    assert_eq!(q.waiters.iter().map(|w| w.id).collect::<Vec<_>>(), [6]);
}

#[test]
fn a_full_queue_and_expired_waiters_are_refused() {
    let mut q = FairQueue::default();
    q.arrive(waiter(1, 1, 1, 1, 0), 0, 1).unwrap();
    assert_eq!(q.arrive(waiter(2, 2, 1, 1, 0), 0, 1), Err(Refusal::QueueFull));
    let g = q.grant(30_000);
    assert_eq!(g.admitted, None);
    assert_eq!(g.expired.len(), 1);
    assert_eq!(q.tenant(1).unwrap().active, 0);
}

proptest! {
    /// With a per-host bound: under any order of arrivals on three hosts, admissions by any worker, completions and
    /// clock steps, no host runs more than its bound and the backend no more than its own; each admission is the
    /// least-served tenant's earliest waiter among the waiters whose host has room (a waiter on a full host holds
    /// nobody back); a request admitted on arrival found room on its host and jumped no waiter that could go with
    /// less service; after a
    /// worker that holds every waiter releases, no waiter whose host has room is left while the backend has room;
    /// and the queue still round-trips through its encoding.
    #[test]
    fn hosts_hold_their_bound_and_a_full_host_holds_nobody_back(
        backend in 1u64..8,
        per_host in 1u32..3,
        ops in proptest::collection::vec((0u8..5, 1u32..4, 0u64..4, 1u32..3000, 0u64..3000), 1..200),
    ) {
        let cap = Capacity { backend, per_host: Some(per_host) };
        let mut q = FairQueue::default();
        let (mut now, mut next_id) = (0u64, 0u64);
        let mut running: Vec<(u64, u32)> = Vec::new();
        let eligible = |q: &FairQueue, w: &Waiter| q.host_has_room(w.host, cap);
        for (kind, host, tenant, n, ms) in ops {
            match kind {
                0 | 1 => {
                    next_id += 1;
                    let w = on_host(Waiter { deadline_ms: now + ms.max(1), ..waiter(next_id, tenant, weight_of(tenant), n, now) }, host);
                    let mut before = q.clone();
                    before.expire(now);
                    // Half the arrivals may go around a full host.
                    let alternates: &[u32] = if kind == 1 { &[3, 2, 1] } else { &[] };
                    match fairness::arrive_around(&mut q, w, now, cap, 64, alternates) {
                        Arrival::Admitted => {
                            prop_assert!(before.running() < backend && before.host_has_room(host, cap));
                            // It jumped no waiter that could go and had less service.
                            let lifted = q.tenant(tenant).unwrap().counter - u64::from(n) * fairness::SCALE / u64::from(weight_of(tenant));
                            for x in before.waiters.iter().filter(|x| eligible(&before, x)) {
                                prop_assert!(lifted <= before.tenant(x.tenant).unwrap().counter);
                            }
                            running.push((tenant, host));
                        }
                        Arrival::Moved(to) => {
                            // Only an idle tenant that would not have gone at once on its own host, only to a host
                            // with room that nobody waits for.
                            prop_assert!(before.tenant(tenant).is_none_or(|t| t.active == 0));
                            let would_go = before.running() < backend
                                && before.host_has_room(host, cap)
                                && !before.waiters.iter().any(|x| eligible(&before, x));
                            prop_assert!(!would_go && before.running() < backend && before.host_has_room(to, cap));
                            prop_assert!(to != host && alternates.contains(&to));
                            prop_assert!(!before.waiters.iter().any(|x| x.host == to));
                            running.push((tenant, to));
                        }
                        _ => {}
                    }
                }
                2 => {
                    let mut seen = q.clone();
                    seen.expire(now);
                    let g = q.grant_own(now, cap, |_| true);
                    for w in &g.admitted {
                        prop_assert!(eligible(&seen, w));
                        let c = |t: u64| seen.tenant(t).unwrap().counter;
                        for other in seen.waiters.iter().filter(|o| eligible(&seen, o)) {
                            prop_assert!(c(w.tenant) <= c(other.tenant));
                            if other.tenant == w.tenant { prop_assert!(w.arrived_ms <= other.arrived_ms); }
                        }
                        seen.leave(w.id);
                        seen.admit_now(w.tenant, w.weight, w.input_tokens, w.host);
                        running.push((w.tenant, w.host));
                    }
                    if q.running() < backend {
                        prop_assert!(!q.waiters.iter().any(|w| eligible(&q, w)), "a waiter with room was left");
                    }
                }
                3 => {
                    if !running.is_empty() {
                        let (t, h) = running.remove(n as usize % running.len());
                        q.complete_measured(t, weight_of(t), h, 0, None, ms);
                    }
                }
                _ => now += ms,
            }
            prop_assert!(q.running() <= backend);
            prop_assert_eq!(q.running(), running.len() as u64);
            for h in 1..4u32 {
                let model = running.iter().filter(|(_, x)| *x == h).count() as u32;
                prop_assert_eq!(q.host_running(h), model);
                prop_assert!(model <= per_host, "host {} runs {} over {}", h, model, per_host);
            }
            prop_assert_eq!(fairness::decode(&fairness::encode(&q)), q.clone());
        }
    }
}

/// A flood that fills its host waits there, while a quiet tenant on another host goes at once, even though the
/// flood's tenant is less served and arrived first.
#[test]
fn a_flood_held_at_its_full_host_does_not_hold_back_a_quiet_tenant_elsewhere() {
    let cap = Capacity {
        backend: 8,
        per_host: Some(1),
    };
    let mut q = FairQueue::default();
    assert_eq!(
        fairness::arrive(&mut q, on_host(waiter(1, 7, 1, 10, 0), 1), 0, cap, 64),
        Arrival::Admitted
    );
    for id in 2..6 {
        assert_eq!(
            fairness::arrive(&mut q, on_host(waiter(id, 7, 1, 10, 0), 1), 0, cap, 64),
            Arrival::Queued
        );
    }
    // The quiet tenant is charged far more than the flood so far, and still goes: its host is free.
    q.admit_now(8, 1, 100_000, NO_HOST);
    q.complete(8, 1, 0);
    let quiet = on_host(waiter(9, 8, 1, 10, 0), 2);
    assert_eq!(fairness::arrive(&mut q, quiet, 0, cap, 64), Arrival::Admitted);
    assert_eq!((q.host_running(1), q.host_running(2), q.depth()), (1, 1, 4));
    // The flood's host frees: its next waiter goes, one at a time.
    q.complete_measured(7, 1, 1, 10, None, 0);
    let g = q.grant_own(0, cap, |_| true);
    assert_eq!(g.admitted.iter().map(|w| w.id).collect::<Vec<_>>(), vec![2]);
    // Without the per-host bound, the same queue would let every flood waiter run.
    let g = q.grant_own(0, 8u64, |_| true);
    assert_eq!(g.admitted.len(), 3);
}

/// A quiet tenant whose key sits on a host the flood fills goes around it to a host with room; the flood, which
/// holds its host itself, waits for it.
#[test]
fn an_idle_tenant_goes_around_a_host_others_fill_and_the_flood_does_not() {
    let cap = Capacity {
        backend: 8,
        per_host: Some(1),
    };
    let mut q = FairQueue::default();
    assert_eq!(
        fairness::arrive(&mut q, on_host(waiter(1, 7, 1, 10, 0), 1), 0, cap, 64),
        Arrival::Admitted
    );
    let flood = on_host(waiter(2, 7, 1, 10, 0), 1);
    assert_eq!(
        fairness::arrive_around(&mut q, flood, 0, cap, 64, &[2]),
        Arrival::Queued
    );
    let quiet = on_host(waiter(3, 8, 1, 10, 0), 1);
    assert_eq!(
        fairness::arrive_around(&mut q, quiet, 0, cap, 64, &[2]),
        Arrival::Moved(2)
    );
    assert_eq!((q.host_running(1), q.host_running(2), q.depth()), (1, 1, 1));
    // Every other host full: the quiet tenant's next request waits, first in line for its own host.
    let again = on_host(waiter(4, 9, 1, 10, 0), 1);
    assert_eq!(
        fairness::arrive_around(&mut q, again, 0, cap, 64, &[2]),
        Arrival::Queued
    );
}

/// A slot that has just freed on the flooded host would go to the flood's earliest waiter (the returning tenant
/// starts level with it): an idle tenant whose key is there goes to a free host instead of waiting a whole flood
/// request.
#[test]
fn an_idle_tenant_goes_around_a_freed_slot_the_flood_waits_for() {
    let cap = Capacity {
        backend: 8,
        per_host: Some(1),
    };
    let mut q = FairQueue::default();
    assert_eq!(
        fairness::arrive(&mut q, on_host(waiter(1, 7, 1, 10, 0), 1), 0, cap, 64),
        Arrival::Admitted
    );
    assert_eq!(
        fairness::arrive(&mut q, on_host(waiter(2, 7, 1, 10, 0), 1), 0, cap, 64),
        Arrival::Queued
    );
    q.complete_measured(7, 1, 1, 10, None, 0);
    assert!(
        q.host_has_room(1, cap),
        "the flood's next waiter is not admitted yet (its worker has not ticked)"
    );
    let quiet = on_host(waiter(3, 8, 1, 10, 0), 1);
    assert_eq!(
        fairness::arrive_around(&mut q, quiet, 0, cap, 64, &[2]),
        Arrival::Moved(2)
    );
    // A host someone waits for is not jumped: with the flood also waiting for host 2, the quiet one queues.
    let mut q2 = FairQueue::default();
    for (id, host) in [(1, 1), (2, 2)] {
        fairness::arrive(&mut q2, on_host(waiter(id, 7, 1, 10, 0), host), 0, cap, 64);
    }
    for (id, host) in [(3, 1), (4, 2)] {
        assert_eq!(
            fairness::arrive(&mut q2, on_host(waiter(id, 7, 1, 10, 0), host), 0, cap, 64),
            Arrival::Queued
        );
    }
    q2.complete_measured(7, 1, 2, 10, None, 0);
    let quiet = on_host(waiter(5, 8, 1, 10, 0), 1);
    assert_eq!(
        fairness::arrive_around(&mut q2, quiet, 0, cap, 64, &[2]),
        Arrival::Queued
    );
}
