package upgrade

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// AKS's defaults for unset upgrade settings.
const (
	DefaultMaxSurge     = "10%"
	DefaultDrainTimeout = 30 * time.Minute
	// UndrainableSchedule (the default) makes a node AKS could not drain
	// schedulable again and fails the upgrade; UndrainableCordon quarantines
	// it (cordoned, labelled kubernetes.azure.com/upgrade-status=Quarantined)
	// and goes on.
	UndrainableSchedule = "Schedule"
	UndrainableCordon   = "Cordon"
)

// Settings are an agent pool's upgradeSettings as ARM reports them.
type Settings struct {
	// Pool is the agent pool's name (a node's kubernetes.azure.com/agentpool).
	Pool string
	// MaxSurge and MaxUnavailable are a count ("3") or a percentage of the
	// pool ("33%"), "" when unset.
	MaxSurge, MaxUnavailable string
	// DrainTimeout is drainTimeoutInMinutes (0 when unset: 30 minutes).
	DrainTimeout time.Duration
	// NodeSoak is nodeSoakDurationInMinutes: AKS's wait after each node.
	NodeSoak time.Duration
	// UndrainableNodeBehavior is Schedule, Cordon or "" (Schedule).
	UndrainableNodeBehavior string
}

// Source gives the settings of every agent pool of the cluster, by name.
// err is the last read's failure: the settings are then unknown (nil map),
// or as last read; ErrNotRead before the first read has ended.
type Source interface {
	AgentPools() (map[string]Settings, error)
}

// ErrNotRead is a Source's error before its first read has ended: what was
// said of the settings before (a restart) stands until then.
var ErrNotRead = errors.New("the AKS agent pools have not been read yet")

// EffectiveDrainTimeout is the pool's drain timeout, AKS's default if unset.
func (s Settings) EffectiveDrainTimeout() time.Duration {
	if s.DrainTimeout <= 0 {
		return DefaultDrainTimeout
	}
	return s.DrainTimeout
}

// Behavior is UndrainableNodeBehavior, AKS's default if unset.
func (s Settings) Behavior() string {
	if s.UndrainableNodeBehavior == "" {
		return UndrainableSchedule
	}
	return s.UndrainableNodeBehavior
}

// ConcurrentDrains is how many of a pool of poolSize nodes an upgrade drains
// at once: maxSurge (default 10%) plus maxUnavailable (default 0), each a
// count or a percentage of the pool rounded up, as AKS resolves them; at
// least 1, at most the pool. A value AKS would refuse counts as unset.
func (s Settings) ConcurrentDrains(poolSize int) int {
	surge := resolve(s.MaxSurge, poolSize)
	if s.MaxSurge == "" || surge < 0 {
		surge = resolve(DefaultMaxSurge, poolSize)
	}
	n := surge + max(resolve(s.MaxUnavailable, poolSize), 0)
	return max(min(n, poolSize), 1)
}

// resolve reads a count or a percentage of poolSize (rounded up); -1 when v
// is neither.
func resolve(v string, poolSize int) int {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if p, ok := strings.CutSuffix(v, "%"); ok {
		pct, err := strconv.Atoi(p)
		if err != nil || pct < 0 || pct > 100 {
			return -1
		}
		return int(math.Ceil(float64(pct) * float64(poolSize) / 100))
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// Judgement is what an upgrade of one pool meets under one budget.
type Judgement struct {
	Pool string
	// Nodes is how many of the budget's nodes are in the pool.
	Nodes int
	// Concurrent is how many of them the upgrade drains at once.
	Concurrent int
	// Room is how many the budget lets be unavailable at once.
	Room int
	// LongestWait is the longest a drain waits for the budget: the last
	// node of a batch waits for the nodes ahead of it, room at a time.
	// Never (a negative duration) when the budget has no room at all.
	LongestWait time.Duration
	// Fits is false when that wait reaches the pool's drain timeout: AKS
	// then gives up on the node.
	Fits bool
	// Message says why, and the settings that would fit.
	Message string
}

// Never is LongestWait when the budget allows no disruption at all.
const Never = time.Duration(-1)

// Judge judges an upgrade of a pool under a budget that lets room of its
// nodes be unavailable at once. nodeTime is how long an upgrade keeps one
// node out (from its first eviction until it is schedulable and Ready
// again: its drain, reimage and boot). The last node of a batch of
// Concurrent waits ceil(Concurrent/room)-1 node times (plus the pool's soak
// after each) before its first eviction is admitted; AKS's drain timeout runs
// from the cordon, so that wait must end well before it.
func Judge(s Settings, nodes, room int, nodeTime time.Duration) Judgement {
	j := Judgement{Pool: s.Pool, Nodes: nodes, Concurrent: s.ConcurrentDrains(nodes), Room: room}
	timeout := s.EffectiveDrainTimeout()
	if room <= 0 {
		j.LongestWait = Never
		j.Message = fmt.Sprintf("agent pool %s: the budget allows no node of it to be unavailable, so an upgrade can drain none: every node's drain waits until drainTimeoutInMinutes %d and the upgrade fails (Schedule) or quarantines it (Cordon)",
			s.Pool, Minutes(timeout))
		return j
	}
	turns := (j.Concurrent + room - 1) / room
	j.LongestWait = time.Duration(turns-1) * (nodeTime + s.NodeSoak)
	j.Fits = j.LongestWait < timeout
	if j.Concurrent <= room {
		j.Message = fmt.Sprintf("agent pool %s: an upgrade drains %d node(s) at once, within the budget's %d: no drain waits for the budget", s.Pool, j.Concurrent, room)
		return j
	}
	j.Message = fmt.Sprintf("agent pool %s: an upgrade drains %d node(s) at once (%s) but the budget lets %d be unavailable: the last of a batch waits about %s (%d node time(s) of %s) for its turn",
		s.Pool, j.Concurrent, s.Surge(), room, j.LongestWait.Round(time.Second), turns-1, nodeTime+s.NodeSoak)
	if j.Fits {
		j.Message += fmt.Sprintf(", within drainTimeoutInMinutes %d", Minutes(timeout))
		return j
	}
	j.Message += fmt.Sprintf(", past drainTimeoutInMinutes %d, so AKS gives up on it (%s). Settings that fit: maxSurge %d with maxUnavailable 0, or drainTimeoutInMinutes %d or more",
		Minutes(timeout), givesUp(s.Behavior()), room, Minutes(j.LongestWait+nodeTime))
	return j
}

// Minutes rounds d up to whole minutes, as drainTimeoutInMinutes counts.
func Minutes(d time.Duration) int {
	return int((d + time.Minute - 1) / time.Minute)
}

func givesUp(behavior string) string {
	if behavior == UndrainableCordon {
		return "Cordon: the node is quarantined and nodeguard gives its budget room back"
	}
	return "Schedule: the upgrade fails"
}

// Surge says maxSurge and maxUnavailable as set, each unset one as AKS's
// default: "maxSurge 3, maxUnavailable 0 (default)".
func (s Settings) Surge() string {
	return fmt.Sprintf("maxSurge %s, maxUnavailable %s", orDefault(s.MaxSurge, DefaultMaxSurge), orDefault(s.MaxUnavailable, "0"))
}

func orDefault(v, def string) string {
	if v == "" {
		return def + " (default)"
	}
	return v
}
