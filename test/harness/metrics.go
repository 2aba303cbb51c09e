package harness

import (
	"testing"

	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// CounterSum adds up the counter metric name of this process (controller-
// runtime's registry) over the series whose label label has one of values.
func CounterSum(t testing.TB, name, label string, values ...string) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, v := range values {
		want[v] = true
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && want[l.GetValue()] {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}
