package harness

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// PollInterval is how often Eventually re-checks its condition.
const PollInterval = 100 * time.Millisecond

// Eventually polls cond until it returns true, and fails the test with msg and
// the last error if that does not happen within timeout.
func Eventually(t testing.TB, timeout time.Duration, cond func(ctx context.Context) (bool, error), msg string, args ...any) {
	t.Helper()
	if err := Poll(context.Background(), timeout, cond); err != nil {
		t.Fatalf("timed out after %s waiting until %s: %v", timeout, fmt.Sprintf(msg, args...), err)
	}
}

// Poll calls cond every PollInterval until it returns true (nil), or returns an
// error when timeout or ctx ends first, wrapping cond's last error if any.
func Poll(ctx context.Context, timeout time.Duration, cond func(ctx context.Context) (bool, error)) error {
	return PollEvery(ctx, PollInterval, timeout, cond)
}

// PollEvery is Poll at another pace (slower, for LISTs of thousands of objects).
func PollEvery(ctx context.Context, every, timeout time.Duration, cond func(ctx context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	var lastErr error
	for {
		ok, err := cond(ctx)
		if ok && err == nil {
			return nil
		}
		if err != nil {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return lastErr
			}
			return ctx.Err()
		case <-ticker.C:
		}
	}
}
