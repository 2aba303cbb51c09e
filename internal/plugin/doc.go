// Package plugin is `kubectl nodeguard`: it reads the cluster, never writes
// it, and says why a node is still there (why), what removing nodes will run
// into and how long it may take (plan), and what each NodeDisruptionBudget
// counts out (budgets). What a drain will meet comes from finalizer/foresight,
// the same reading nodeguard's admission warnings give.
//
// cluster.go reads what the commands share: nodeguard's drain settings
// from its Deployment, a node, the budgets and PDBs, a node's drain deadline
// and what its drain will meet. why.go is `why`, budgets.go `budgets`, and
// `plan` is plan.go (the report, put together node by node),
// simulation.go (the waves: deletes admitted by the budgets as they stand,
// budget.Evaluate), estimate.go (a drain's time from its PDB chains),
// upgrade.go (an AKS upgrade, pool by pool with its upgrade settings) and
// planprint.go (the table and its summary).
package plugin
