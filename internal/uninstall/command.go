package uninstall

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Command runs `nodeguard uninstall` with its arguments and returns the exit
// code; scheme holds the types it reads and writes.
func Command(args []string, out io.Writer, scheme *runtime.Scheme) int {
	fs := flag.NewFlagSet("nodeguard uninstall", flag.ContinueOnError)
	var o Options
	o.BindFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), Usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: o.Kubeconfig, Precedence: clientcmd.NewDefaultClientConfigLoadingRules().Precedence},
		&clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeguard uninstall: loading kubeconfig:", err)
		return 1
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeguard uninstall:", err)
		return 1
	}
	if err := Run(context.Background(), c, o, out); err != nil {
		fmt.Fprintln(os.Stderr, "nodeguard uninstall:", err)
		return 1
	}
	return 0
}
