// Package memlimit sets the Go runtime's soft memory limit from the
// container's memory limit: as the heap nears it, the garbage collector runs
// more often, where without it the kernel kills the process at the hard limit
// (a fleet's deletion is when nodeguard's memory peaks).
package memlimit

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
)

// unlimited is where a cgroup v1 limit means none: the kernel reports "no
// limit" as the largest page-aligned int64.
const unlimited = int64(1) << 62

// Limit reads the memory limit of the process's cgroup, under root (usually
// /sys/fs/cgroup), given the process's /proc/self/cgroup: cgroup v2's
// memory.max, else cgroup v1's memory.limit_in_bytes. It looks at the
// process's own cgroup path first, then at root itself, which is the
// container's cgroup when the container has its own cgroup namespace or
// mount. ok is false when no limit is set.
func Limit(root string, selfCgroup string) (limit int64, ok bool, err error) {
	for _, path := range candidates(root, selfCgroup) {
		raw, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, false, err
		}
		value := strings.TrimSpace(string(raw))
		if value == "max" {
			return 0, false, nil
		}
		limit, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("%s: %w", path, err)
		}
		if limit <= 0 || limit >= unlimited {
			return 0, false, nil
		}
		return limit, true, nil
	}
	return 0, false, nil
}

// candidates are the files that may hold the limit, the most specific first.
func candidates(root, selfCgroup string) []string {
	var v2, v1 []string
	for _, line := range strings.Split(selfCgroup, "\n") {
		id, rest, _ := strings.Cut(line, ":")
		controllers, path, ok := strings.Cut(rest, ":")
		switch {
		case !ok:
		case id == "0" && controllers == "":
			v2 = append(v2, filepath.Join(root, path, "memory.max"))
		case hasController(controllers, "memory"):
			v1 = append(v1, filepath.Join(root, "memory", path, "memory.limit_in_bytes"))
		}
	}
	v2 = append(v2, filepath.Join(root, "memory.max"))
	v1 = append(v1, filepath.Join(root, "memory", "memory.limit_in_bytes"))
	return append(v2, v1...)
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// Set sets the runtime's soft memory limit to ratio × the container's limit
// and returns what it set, with the container's limit. It sets nothing when
// GOMEMLIMIT is set (the runtime honours it), ratio is 0, or no limit is
// found.
func Set(ratio float64) (soft, container int64, err error) {
	if ratio <= 0 || os.Getenv("GOMEMLIMIT") != "" {
		return 0, 0, nil
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if errors.Is(err, fs.ErrNotExist) {
		return 0, 0, nil // not Linux
	}
	if err != nil {
		return 0, 0, err
	}
	container, ok, err := Limit("/sys/fs/cgroup", string(self))
	if err != nil || !ok {
		return 0, 0, err
	}
	soft = int64(math.Min(ratio, 1) * float64(container))
	debug.SetMemoryLimit(soft)
	return soft, container, nil
}

// SetAndLog is Set for nodeguard's start-up: it logs what it set, or why it
// set nothing, and the runtime keeps its default soft limit on an error.
func SetAndLog(ratio float64, log logr.Logger) {
	soft, container, err := Set(ratio)
	switch {
	case err != nil:
		log.Error(err, "Reading the container's memory limit; the Go runtime keeps its default soft limit")
	case soft > 0:
		log.Info("Soft memory limit set from the container's", "softLimitBytes", soft, "containerLimitBytes", container, "ratio", ratio)
	}
}
