package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version and commit describe the release, set at build time with
// -ldflags "-X main.version=v1.2.3 -X main.commit=<sha>" (hack/release/image
// does). Otherwise version is the module version go install recorded, or
// "devel", and commit the revision go build recorded, if any.
var version, commit = "", ""

// versionString describes the build: release, commit and Go toolchain.
func versionString() string {
	v, rev := version, commit
	if info, ok := debug.ReadBuildInfo(); ok {
		if v == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && rev == "" {
				rev = s.Value
			}
		}
	}
	if v == "" {
		v = "devel"
	}
	s := fmt.Sprintf("nodeguard %s %s/%s %s", v, runtime.GOOS, runtime.GOARCH, runtime.Version())
	if rev != "" {
		s += " commit " + rev
	}
	return s
}
