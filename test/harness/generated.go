package harness

import (
	"os"
	"strings"
	"testing"
)

// GeneratedSection checks the part of the file at path between the markers
// begin and end against want, for docs generated from a command's help. With
// update it rewrites that part instead. It returns what the file holds there
// and whether that differs from want (never after an update).
func GeneratedSection(t testing.TB, path, begin, end, want string, update bool) (got string, differs bool) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	b, e := strings.Index(doc, begin), strings.Index(doc, end)
	if b < 0 || e < b {
		t.Fatalf("%s lacks the markers %q and %q around its generated part", path, begin, end)
	}
	got = doc[b+len(begin) : e]
	if got == want {
		return got, false
	}
	if !update {
		return got, true
	}
	if err := os.WriteFile(path, []byte(doc[:b+len(begin)]+want+doc[e:]), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("rewrote the generated part of %s", path)
	return want, false
}
