// Package azure sets the Azure Load Balancer backend admin state of nodes:
// Down while a node is leaving service, None otherwise. A Manager keeps the
// desired state per node (keyed by UID), and its workers apply it per backend
// pool: lock, fresh Get, set AdminState on every entry whose node's desired
// state differs, and at most one CreateOrUpdate with If-Match. Errors are
// classified in errors.go: 404 is stale (dropped quietly); 429 parks the pool
// until Retry-After, and when another operation keeps the load balancer busy
// it spends no retry; 412 is re-read at once; 409 and a canceled long-running
// write retry after a fresh Get; everything else is terminal.
//
// The files, in the order a node's change travels:
//
//   - adminstate.go: the admin states, the signal taints and who acts on
//     them, and Signals.DesiredState, the one rule of a node's state;
//   - manager.go: the Manager, what it keeps of each node and pool, and its
//     loop (SetDesired, WaitConfirmed, Forget); options.go its flags;
//   - discover.go: which nodes have entries in which pools;
//     configuration.go: what of the configuration ARM does not know;
//   - writer.go: one writer per load balancer, a pool's attempt; plan.go:
//     what an attempt sets on the entries and in the record;
//   - outcome.go: an attempt's outcome for every node; retry.go: retries,
//     the backoff of failed entries and when the loop wakes; confirm.go: a
//     node confirmed, and how its traffic was cut (CutNote); events.go: the
//     events;
//   - records.go: the record of the entries nodeguard set Down (or
//     restored and holds None), which outlives node and process: kept in
//     Leases (leaserecords.go, sharded for a large pool: recordshards.go) or
//     in memory (memoryrecords.go); gone.go: the restore of a gone node's
//     entries; restore.go: the hold of a restored None against stale
//     writers;
//   - verify.go: the re-reads that catch another writer's revert;
//     instances.go: whether a node's VM still exists; metrics.go.
//
// Sub-packages: config (azure.json, flags, credentials), armclient (the ARM
// client, throttling gate and call metrics), backends (node → entries),
// taintwatch (signals → admin state) and agentpools (AKS upgrade settings).
package azure
