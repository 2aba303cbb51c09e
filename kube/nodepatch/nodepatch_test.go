package nodepatch

import (
	"encoding/json"
	"testing"
)

// TestAnnotationPathEscapes: an annotation key's "/" and "~" are escaped as
// RFC 6901 asks, so a JSON patch reaches the annotation, not a path below it.
func TestAnnotationPathEscapes(t *testing.T) {
	for key, want := range map[string]string{
		"cluster-autoscaler.kubernetes.io/scale-down-disabled": "/metadata/annotations/cluster-autoscaler.kubernetes.io~1scale-down-disabled",
		"example.com/a~b": "/metadata/annotations/example.com~1a~0b",
		"plain":           "/metadata/annotations/plain",
	} {
		if got := AnnotationPath(key); got != want {
			t.Errorf("AnnotationPath(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestTestOfNullIsWritten: a test that a field is absent carries "value":
// null, the member RFC 6902 requires of a test (kube-apiserver passes such a
// test on an absent field).
func TestTestOfNullIsWritten(t *testing.T) {
	data, err := json.Marshal([]Op{Test("/spec/taints", nil)})
	if err != nil {
		t.Fatal(err)
	}
	if want := `[{"op":"test","path":"/spec/taints","value":null}]`; string(data) != want {
		t.Errorf("patch %s, want %s", data, want)
	}
}
