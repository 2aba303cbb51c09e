package memlimit

import (
	"os"
	"path/filepath"
	"testing"
)

func write(t *testing.T, root, path, content string) {
	t.Helper()
	full := filepath.Join(root, path)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLimit reads the container's memory limit as a pod's cgroup shows it:
// cgroup v2 with its own namespace (memory.max at the root), v2 seen from the
// host's namespace (under the process's path), v1 (memory.limit_in_bytes),
// and no limit ("max", v1's huge value, no file).
func TestLimit(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name   string
		files  map[string]string
		self   string
		want   int64
		wantOK bool
	}{
		{"v2, own namespace", map[string]string{"memory.max": "268435456\n"}, "0::/\n", 256 * mib, true},
		{"v2, the process's path first", map[string]string{"memory.max": "max\n", "kubepods/pod1/c1/memory.max": "134217728\n"}, "0::/kubepods/pod1/c1\n", 128 * mib, true},
		{"v2, no limit", map[string]string{"memory.max": "max\n"}, "0::/\n", 0, false},
		{"v1, the container's mount", map[string]string{"memory/memory.limit_in_bytes": "268435456\n"}, "4:memory:/kubepods/pod1/c1\n0::/\n", 256 * mib, true},
		{"v1, the process's path first", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n", "memory/process_api/x/memory.limit_in_bytes": "536870912\n"},
			"5:devices:/\n4:memory:/process_api/x\n", 512 * mib, true},
		{"v1, no limit", map[string]string{"memory/memory.limit_in_bytes": "9223372036854771712\n"}, "4:cpu,memory:/\n", 0, false},
		{"no cgroup files", nil, "0::/\n", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for path, content := range tt.files {
				write(t, root, path, content)
			}
			got, ok, err := Limit(root, tt.self)
			if err != nil || got != tt.want || ok != tt.wantOK {
				t.Errorf("Limit = %d, %v, %v; want %d, %v", got, ok, err, tt.want, tt.wantOK)
			}
		})
	}
	root := t.TempDir()
	write(t, root, "memory.max", "lots\n")
	if _, _, err := Limit(root, "0::/\n"); err == nil {
		t.Error("an unreadable limit is not an error")
	}
}

func TestSetLeavesGOMEMLIMITAndRatioZeroAlone(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "100MiB")
	if soft, _, err := Set(0.9); soft != 0 || err != nil {
		t.Errorf("with GOMEMLIMIT set, Set set %d (%v)", soft, err)
	}
	t.Setenv("GOMEMLIMIT", "")
	if soft, _, err := Set(0); soft != 0 || err != nil {
		t.Errorf("with ratio 0, Set set %d (%v)", soft, err)
	}
}
