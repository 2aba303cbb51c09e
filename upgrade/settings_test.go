package upgrade

import (
	"strings"
	"testing"
	"time"
)

func TestConcurrentDrainsResolvesAsAKSDoes(t *testing.T) {
	for _, c := range []struct {
		surge, unavailable string
		pool, want         int
	}{
		{"", "", 6, 1},       // 10% of 6 rounded up
		{"", "", 25, 3},      // 10% of 25 rounded up
		{"3", "", 6, 3},      // a count
		{"33%", "", 6, 2},    // 1.98 rounded up
		{"0", "1", 6, 1},     // in place, no surge
		{"2", "1", 6, 3},     // both
		{"10", "", 6, 6},     // never more than the pool
		{"0", "0", 6, 1},     // AKS refuses this; at least one
		{"bogus", "", 20, 2}, // unreadable: the default
	} {
		s := Settings{MaxSurge: c.surge, MaxUnavailable: c.unavailable}
		if got := s.ConcurrentDrains(c.pool); got != c.want {
			t.Errorf("maxSurge %q maxUnavailable %q over %d nodes: %d drains at once, want %d", c.surge, c.unavailable, c.pool, got, c.want)
		}
	}
}

func TestJudge(t *testing.T) {
	surge3 := func(timeout time.Duration, behavior string) Settings {
		return Settings{Pool: "user", MaxSurge: "3", DrainTimeout: timeout, UndrainableNodeBehavior: behavior}
	}
	t.Run("a surge within the budget waits for nothing", func(t *testing.T) {
		j := Judge(surge3(time.Minute, ""), 6, 3, 10*time.Minute)
		if !j.Fits || j.LongestWait != 0 || j.Concurrent != 3 {
			t.Errorf("got %+v, want it to fit with no wait", j)
		}
	})
	t.Run("the third node of a surge of three waits two node times", func(t *testing.T) {
		j := Judge(surge3(30*time.Minute, ""), 6, 1, 10*time.Minute)
		if !j.Fits || j.LongestWait != 20*time.Minute {
			t.Errorf("got %+v, want a 20m wait that fits 30m", j)
		}
	})
	t.Run("a wait past the drain timeout does not fit and says what would", func(t *testing.T) {
		j := Judge(surge3(time.Minute, "Cordon"), 6, 1, 40*time.Second)
		if j.Fits || j.LongestWait != 80*time.Second {
			t.Fatalf("got %+v, want an 80s wait that does not fit 1m", j)
		}
		for _, want := range []string{"maxSurge 1 with maxUnavailable 0", "drainTimeoutInMinutes 2 or more", "quarantined"} {
			if !strings.Contains(j.Message, want) {
				t.Errorf("message %q does not say %q", j.Message, want)
			}
		}
	})
	t.Run("soak counts after every node", func(t *testing.T) {
		s := surge3(30*time.Minute, "")
		s.NodeSoak = 5 * time.Minute
		if j := Judge(s, 6, 1, 10*time.Minute); j.LongestWait != 30*time.Minute || j.Fits {
			t.Errorf("got %+v, want a 30m wait that reaches the 30m timeout", j)
		}
	})
	t.Run("a budget with no room never fits", func(t *testing.T) {
		j := Judge(Settings{Pool: "user"}, 6, 0, time.Minute)
		if j.Fits || j.LongestWait != Never {
			t.Errorf("got %+v, want never", j)
		}
	})
	t.Run("unset drain timeout is AKS's 30 minutes", func(t *testing.T) {
		if j := Judge(surge3(0, ""), 6, 1, 14*time.Minute); !j.Fits {
			t.Errorf("28m of wait does not fit the default 30m: %+v", j)
		}
		if j := Judge(surge3(0, ""), 6, 1, 15*time.Minute); j.Fits {
			t.Errorf("30m of wait fits the default 30m: %+v", j)
		}
	})
}
