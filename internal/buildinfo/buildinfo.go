// Package buildinfo says which build of nodeguard runs: --version and the
// nodeguard_build_info metric.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// version and commit describe the build, set with -ldflags "-X
// github.com/nodeguard/nodeguard/internal/buildinfo.version=v1.2.3 -X
// ...buildinfo.commit=<sha>" by make build (git describe and rev-parse) and by
// the release (hack/release/image). Otherwise version is
// the module version go install recorded, or "devel", and commit the
// revision go build recorded, if any ("unknown" when none did).
var version, commit = "", ""

// build is what the binary knows of its build.
type build struct{ version, revision string }

func read() build {
	b := build{version: version, revision: commit}
	if info, ok := debug.ReadBuildInfo(); ok {
		if b.version == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			b.version = info.Main.Version
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && b.revision == "" {
				b.revision = s.Value
			}
		}
	}
	if b.version == "" {
		b.version = "devel"
	}
	if b.revision == "" {
		b.revision = "unknown"
	}
	return b
}

// String describes the build: version, platform, Go toolchain and
// revision.
func String() string {
	b := read()
	return fmt.Sprintf("nodeguard %s %s/%s %s commit %s", b.version, runtime.GOOS, runtime.GOARCH, runtime.Version(), b.revision)
}

// buildInfoMetric is 1, labelled with the build, as Prometheus' own
// *_build_info metrics are: a query joins it to tell which build runs where.
var buildInfoMetric = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "nodeguard_build_info",
	Help: "Always 1; its labels name the running build: version, revision (VCS commit) and goversion.",
}, []string{"version", "revision", "goversion"})

func init() {
	metrics.Registry.MustRegister(buildInfoMetric)
	b := read()
	buildInfoMetric.WithLabelValues(b.version, b.revision, runtime.Version()).Set(1)
}
