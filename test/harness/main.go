package harness

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Main is a TestMain body for a package that shares one control plane across
// its tests: it starts the control plane into *env, runs the tests, keeps the
// tail of every component's log if anything failed (printing those of
// components that exited), and stops everything.
// With -short, it runs the tests without a control plane (*env stays nil) so that
// tests needing one can skip.
func Main(m *testing.M, opts Options, env **Env) {
	os.Exit(Run(m, opts, env))
}

// Run is Main without the exit: it returns the exit code, for a TestMain with
// cleanup of its own.
func Run(m *testing.M, opts Options, env **Env) int {
	defer removeNodeguardBinary()
	if !flag.Parsed() {
		flag.Parse()
	}
	// Test clients log nothing worth reading; without a logger
	// controller-runtime prints a stack trace the first time one is built.
	ctrllog.SetLogger(logr.Discard())
	if testing.Short() {
		return m.Run()
	}
	e, err := Start(context.Background(), opts)
	if e != nil {
		defer func() {
			if err := e.Stop(); err != nil {
				fmt.Fprintf(os.Stderr, "stopping control plane: %v\n", err)
			}
		}()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting control plane: %v\n", err)
		if e != nil {
			fmt.Fprint(os.Stderr, e.LogTails(40))
		}
		return 1
	}
	*env = e
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "\ncontrol-plane logs (tails): %s\n", keepLog(strings.TrimSuffix(filepath.Base(os.Args[0]), ".test")+"-control-plane", e.LogTails(200)))
		fmt.Fprint(os.Stderr, e.exitedTails(20))
	}
	return code
}
