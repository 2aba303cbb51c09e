package budget

import (
	"fmt"
	"time"

	"github.com/robfig/cron/v3"

	ngv1alpha1 "github.com/nodeguard/nodeguard/api/v1alpha1"
)

// maxFirings bounds the walk over a window's firings inside one duration (a
// schedule firing every minute with a 7-day duration fires 10,080 times).
const maxFirings = 20000

// ActiveWindow is a disruption window that is open now.
type ActiveWindow struct {
	Schedule string
	// Ends is when the window closes (the latest end if firings overlap).
	Ends time.Time
	// MaxUnavailable is how many selected nodes may be unavailable meanwhile.
	MaxUnavailable int32
}

// ParseSchedule parses a window's schedule: a five-field cron expression or a
// macro such as @daily. The budget webhook refuses what it cannot parse, so
// that every stored schedule is one the deletes can evaluate.
func ParseSchedule(schedule string) (cron.Schedule, error) {
	return cron.ParseStandard(schedule)
}

// NeverFiring returns the windows whose schedule parses but fires never
// (within the five years the cron parser looks ahead), such as "0 0 31 2 *":
// each as "windows[i] (schedule)". Such a window never opens.
func NeverFiring(windows []ngv1alpha1.DisruptionWindow, now time.Time) []string {
	var never []string
	for i, w := range windows {
		if schedule, err := ParseSchedule(w.Schedule); err == nil && schedule.Next(now.UTC()).IsZero() {
			never = append(never, fmt.Sprintf("windows[%d] (%q)", i, w.Schedule))
		}
	}
	return never
}

// activeWindow returns the open window that allows the fewest unavailable
// nodes, or nil when none is open at now. Schedules are evaluated in UTC.
func activeWindow(windows []ngv1alpha1.DisruptionWindow, expected int32, now time.Time) (*ActiveWindow, error) {
	var tightest *ActiveWindow
	now = now.UTC()
	for i, w := range windows {
		ends, open, err := windowEnd(w, now)
		if err != nil {
			return nil, fmt.Errorf("windows[%d]: %w", i, err)
		}
		if !open {
			continue
		}
		var maxUnavailable int32
		if w.MaxUnavailable != nil {
			if maxUnavailable, err = scaled(w.MaxUnavailable, expected); err != nil {
				return nil, fmt.Errorf("windows[%d].maxUnavailable: %w", i, err)
			}
		}
		if tightest == nil || maxUnavailable < tightest.MaxUnavailable ||
			(maxUnavailable == tightest.MaxUnavailable && ends.After(tightest.Ends)) {
			tightest = &ActiveWindow{Schedule: w.Schedule, Ends: ends, MaxUnavailable: maxUnavailable}
		}
	}
	return tightest, nil
}

// windowEnd reports whether the window is open at now and when it closes: it is
// open when the schedule fired within the last duration.
func windowEnd(w ngv1alpha1.DisruptionWindow, now time.Time) (time.Time, bool, error) {
	schedule, err := ParseSchedule(w.Schedule)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("schedule %q: %w", w.Schedule, err)
	}
	if w.Duration.Duration <= 0 {
		return time.Time{}, false, nil
	}
	var ends time.Time
	open := false
	// Next is strictly after its argument, so start one second before.
	fired := schedule.Next(now.Add(-w.Duration.Duration - time.Second))
	for i := 0; i < maxFirings && !fired.IsZero() && !fired.After(now); i++ {
		if end := fired.Add(w.Duration.Duration); end.After(now) {
			ends, open = end, true
		}
		fired = schedule.Next(fired)
	}
	return ends, open, nil
}

// NextWindowChange is the next time after now at which a window of the budget
// opens or closes, so the status controller can recompute then. Zero if none.
// Schedules are in UTC, as activeWindow reads them: cron reads a schedule in
// the zone of the time it is given, and the process's clock may be local.
func NextWindowChange(windows []ngv1alpha1.DisruptionWindow, now time.Time) time.Time {
	now = now.UTC()
	var next time.Time
	earliest := func(t time.Time) {
		if !t.IsZero() && t.After(now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for _, w := range windows {
		schedule, err := ParseSchedule(w.Schedule)
		if err != nil {
			continue
		}
		earliest(schedule.Next(now))
		if ends, open, err := windowEnd(w, now); err == nil && open {
			earliest(ends)
		}
	}
	return next
}
