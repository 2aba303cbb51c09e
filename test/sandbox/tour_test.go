package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nodeguard/nodeguard/test/harness"
)

// The README's tour is run as a reader runs it: every ```sh block of its
// section, in order, from a shell that sourced .sandbox/env.sh, against the
// sandbox make run starts. A block must exit 0, unless the HTML comment on the
// line before it promises otherwise:
//
//	<!-- tour: exits 1, prints "allows no more disruptions" -->

var (
	env *harness.Env
	// tourRoot stands for the repository root: .sandbox in it is the
	// sandbox's directory, as under make run.
	tourRoot string
)

func TestMain(m *testing.M) {
	root, err := os.MkdirTemp("", "nodeguard-tour-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tourRoot = root
	code := harness.Run(m, harnessOptions(filepath.Join(root, ".sandbox"), harness.PodsGeneral), &env)
	os.RemoveAll(root)
	os.Exit(code)
}

func TestReadmeTour(t *testing.T) {
	steps := tourSteps(t, filepath.Join(harness.RepoRoot(), "README.md"))
	if env == nil {
		t.Skip("runs the tour against the sandbox's control plane (not with -short)")
	}
	binary, err := harness.NodeguardBinary()
	if err != nil {
		t.Fatal(err)
	}
	plugin, err := harness.PluginBinary()
	if err != nil {
		t.Fatal(err)
	}
	cfg := config{
		nodeguard:   binary,
		plugin:      plugin,
		metricsAddr: "127.0.0.1:" + strconv.Itoa(harness.FreePort(t)),
		probeAddr:   "127.0.0.1:" + strconv.Itoa(harness.FreePort(t)),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb, err := up(ctx, env, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.stop()
	for i, s := range steps {
		out, code := runStep(ctx, s.script)
		t.Logf("tour step %d (line %d), exit %d:\n%s\n%s", i+1, s.line, code, s.script, out)
		if code != s.exit {
			t.Fatalf("tour step %d (README.md line %d) exited %d, the tour says %d; nodeguard's log (tail):\n%s", i+1, s.line, code, s.exit, sb.nodeguard.LogTail(40))
		}
		if s.prints != "" && !strings.Contains(out, s.prints) {
			t.Fatalf("tour step %d (README.md line %d) did not print %q, as the tour says it does", i+1, s.line, s.prints)
		}
	}
}

// runStep runs a tour block in a shell that sourced env.sh and stops at the
// first failing command, as set -e does.
func runStep(ctx context.Context, script string) (string, int) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", ". .sandbox/env.sh\n"+script)
	cmd.Dir = tourRoot
	out, err := cmd.CombinedOutput()
	if err != nil && cmd.ProcessState == nil {
		return fmt.Sprintf("%s\n(%v)", out, err), -1
	}
	return string(out), cmd.ProcessState.ExitCode()
}

type tourStep struct {
	script string
	line   int    // of the opening fence
	exit   int    // the exit code the tour promises
	prints string // what the tour promises it prints, if anything
}

var tourPromise = regexp.MustCompile(`^<!-- tour:(?: exits (\d+))?,?(?: prints "([^"]*)")? -->$`)

// tourSteps returns the ```sh blocks of the README's tour section.
func tourSteps(t *testing.T, readme string) []tourStep {
	t.Helper()
	f, err := os.Open(readme)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		steps              []tourStep
		inTour, inBlock    bool
		promise            []string
		block              strings.Builder
		blockLine, lineNum int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		lineNum++
		switch {
		case inBlock && line == "```":
			inBlock = false
			step := tourStep{script: block.String(), line: blockLine}
			if promise != nil {
				step.exit, _ = strconv.Atoi(promise[1])
				step.prints = promise[2]
			}
			steps = append(steps, step)
			promise = nil
		case inBlock:
			block.WriteString(line + "\n")
		case strings.HasPrefix(line, "## "):
			inTour = strings.Contains(strings.ToLower(line), "tour")
		case inTour && line == "```sh":
			inBlock, blockLine = true, lineNum
			block.Reset()
		case inTour && strings.HasPrefix(line, "<!-- tour:"):
			if promise = tourPromise.FindStringSubmatch(line); promise == nil {
				t.Fatalf("README.md line %d: cannot read the promise %q (want <!-- tour: exits N, prints \"...\" -->)", lineNum, line)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(steps) == 0 {
		t.Fatal("README.md has no ```sh block in a section whose title says tour")
	}
	return steps
}
