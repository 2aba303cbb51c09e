package armemulator

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A hung request, with or without a body, ends when the client gives up, and
// is recorded then.
func TestHangEndsWhenTheClientGivesUp(t *testing.T) {
	s, err := Start("127.0.0.1:0", SeedForNodes("sub", "rg", []Node{{Name: "n0", IPs: []string{"10.0.0.4"}}}, Topology{}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const path = "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/kubernetes/backendAddressPools/kubernetes"
	s.AddFault(Fault{Path: "/backendAddressPools/", Hang: true})
	for _, method := range []string{http.MethodGet, http.MethodPut} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		req, err := http.NewRequestWithContext(ctx, method, s.URL()+path, strings.NewReader(`{"properties":{}}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			t.Fatalf("%s answered %d, want it held", method, resp.StatusCode)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: %v, want the client's deadline", method, err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for s.Count(method, path) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("the hung %s was still held 5 s after the client gave up", method)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
