package harness

import (
	"fmt"
	"path/filepath"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Who is who in a harness cluster. The components and the tests' own
// setup act as the admin (Env.Config, system:masters); nodeguard acts as its
// ServiceAccount, as installed, and so does Karpenter (karpenter.go): the
// install's admission policies (Options.InstallPolicies) tell them apart by
// username, as they do in a real cluster.

// NodeguardUser is the username of nodeguard's ServiceAccount as the install
// creates it (manifests/base, manifests/rbac).
const NodeguardUser = "system:serviceaccount:nodeguard-system:nodeguard"

// nodeguardGroups are the groups nodeguard is impersonated with: its
// ServiceAccount's, plus system:masters, so that it keeps every permission
// whatever flags a test gives it. The harness does not install nodeguard's
// RBAC; test/install TestLeastPrivilege runs it under exactly that.
var nodeguardGroups = []string{"system:masters", "system:serviceaccounts", "system:serviceaccounts:nodeguard-system", "system:authenticated"}

// NodeOperator is a user who may read, create and write nodes (and their
// status) and nothing else: an operator that patches nodes, whom the
// install's policies refuse what they guard (Options.InstallPolicies binds
// the role).
const NodeOperator = "nodeguard-harness:node-operator"

// WriteImpersonatingKubeconfig writes to path a copy of kubeconfig (an admin
// one: it may impersonate) whose every user impersonates user with groups
// (none: kube-apiserver gives a ServiceAccount its own groups). It works
// through an APIProxy too, which forwards the impersonation headers.
func WriteImpersonatingKubeconfig(kubeconfig, path, user string, groups ...string) error {
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		return err
	}
	for _, auth := range cfg.AuthInfos {
		auth.Impersonate, auth.ImpersonateGroups = user, groups
	}
	return clientcmd.WriteToFile(*cfg, path)
}

// AsNodeguardKubeconfig writes, in the test's temporary directory, a copy of
// the admin kubeconfig (the cluster's, or an APIProxy's) that acts as
// nodeguard's ServiceAccount, and returns its path: what nodeguard runs with.
func AsNodeguardKubeconfig(t testing.TB, kubeconfig string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nodeguard.kubeconfig")
	if err := WriteImpersonatingKubeconfig(kubeconfig, path, NodeguardUser, nodeguardGroups...); err != nil {
		t.Fatalf("writing nodeguard's kubeconfig: %v", err)
	}
	return path
}

// AsUser returns a client of the cluster that impersonates user, with groups
// and system:authenticated.
func (e *Env) AsUser(user string, groups ...string) (client.Client, error) {
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append([]string{"system:authenticated"}, groups...)}
	return client.New(cfg, client.Options{Scheme: e.Scheme})
}

// nodeguardIdentity sets up Env.NodeguardKubeconfig and Env.AsNodeguard.
func (e *Env) nodeguardIdentity() error {
	e.NodeguardKubeconfig = filepath.Join(e.Dir, "nodeguard.kubeconfig")
	if err := WriteImpersonatingKubeconfig(e.Kubeconfig, e.NodeguardKubeconfig, NodeguardUser, nodeguardGroups...); err != nil {
		return fmt.Errorf("writing nodeguard's kubeconfig: %w", err)
	}
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: NodeguardUser, Groups: nodeguardGroups}
	var err error
	e.AsNodeguard, err = client.New(cfg, client.Options{Scheme: e.Scheme})
	return err
}
