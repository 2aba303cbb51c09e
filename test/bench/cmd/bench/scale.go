package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nodeguard/nodeguard/test/armemulator"
	"github.com/nodeguard/nodeguard/test/bench"
	"github.com/nodeguard/nodeguard/test/builder"
	"github.com/nodeguard/nodeguard/test/harness"
)

// Processes sampled in the scale section: nodeguard and, as comparators,
// the stock controllers that watch the same nodes and pods.
var scaleProcs = []string{"nodeguard", "kube-controller-manager", "kube-scheduler"}

type scaleResult struct {
	Nodes, Pods, Drained int
	DeploymentPods       int           `json:"deploymentPods"`
	DrainTime            time.Duration `json:"drainTime"`
	Phases               []scalePhase  `json:"phases"`
}

// scalePhase is one window: per process, peak RSS and average CPU.
type scalePhase struct {
	Name     string             `json:"name"`
	Duration time.Duration      `json:"duration"`
	RSS      map[string]int64   `json:"peakRSSBytes"`
	CPU      map[string]float64 `json:"cpuCores"`
}

// sampler reads /proc for the processes every second.
type sampler struct {
	mu   sync.Mutex
	pids map[string]int
	peak map[string]int64
}

func (s *sampler) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		s.sample()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *sampler) sample() map[string]procSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]procSample{}
	for name, pid := range s.pids {
		if ps, err := readProc(pid); err == nil {
			out[name] = ps
			s.peak[name] = max(s.peak[name], ps.RSS)
		}
	}
	return out
}

// window measures a phase: it resets the peaks, runs fn, and returns the
// peak RSS and average CPU of each process over it.
func (s *sampler) window(name string, fn func() error) (scalePhase, error) {
	s.mu.Lock()
	s.peak = map[string]int64{}
	s.mu.Unlock()
	before := s.sample()
	start := time.Now()
	err := fn()
	after := s.sample()
	p := scalePhase{Name: name, Duration: time.Since(start), RSS: map[string]int64{}, CPU: map[string]float64{}}
	s.mu.Lock()
	for n := range s.pids {
		p.RSS[n] = s.peak[n]
		p.CPU[n] = float64(after[n].CPU-before[n].CPU) / float64(after[n].At.Sub(before[n].At))
	}
	s.mu.Unlock()
	return p, err
}

// runScale measures nodeguard's footprint with many kwok nodes and pods, idle
// and while nodes drain. Most pods are created bound to their nodes (no
// scheduler, no ReplicaSet controller: the stock controllers' client rate
// limits would take far longer than the measurement); a tenth belong to
// Deployments under PDBs, so drains go through the budgets.
func runScale(ctx context.Context, c config, env *harness.Env) (*scaleResult, error) {
	r := &scaleResult{Nodes: c.scaleNodes, Pods: c.scalePods, Drained: c.scaleDrain}
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 2000, 2000
	cl, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		return nil, err
	}
	var names []string
	var emuNodes []armemulator.Node
	for i := range c.scaleNodes {
		name := fmt.Sprintf("scale-%04d", i)
		names = append(names, name)
		emuNodes = append(emuNodes, armemulator.Node{Name: name, IPs: []string{nodeIP(i)}})
	}
	emu, err := armemulator.Start("127.0.0.1:0", armemulator.SeedForNodes(subscription, resourceGroup, emuNodes, armemulator.Topology{Internal: true}), armemulator.Options{})
	if err != nil {
		return nil, err
	}
	defer emu.Close()
	ng, err := startNodeguard(c.nodeguard, env, env.Kubeconfig, emu.URL(), filepath.Join(env.Dir, "nodeguard-scale.log"))
	if err != nil {
		return nil, err
	}
	defer ng.stop()
	s := &sampler{pids: map[string]int{"nodeguard": ng.pid()}, peak: map[string]int64{}}
	for _, p := range scaleProcs[1:] {
		if pid := childPID(p); pid > 0 {
			s.pids[p] = pid
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.run(sctx)

	idle := func(name string) error {
		p, err := s.window(name, func() error {
			select {
			case <-time.After(c.scaleIdle):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		r.Phases = append(r.Phases, p)
		return err
	}
	if err := idle("empty cluster, idle"); err != nil {
		return r, err
	}
	logf("scale: creating %d nodes", c.scaleNodes)
	p, err := s.window(fmt.Sprintf("creating %d nodes", c.scaleNodes), func() error {
		if err := forEach(ctx, names, 32, func(ctx context.Context, n string) error {
			i, _ := strconv.Atoi(n[len("scale-"):])
			return cl.Create(ctx, builder.Node(n, builder.WithLabels(managedLabel, "true"), builder.WithInternalIP(nodeIP(i))))
		}); err != nil {
			return err
		}
		return harness.Poll(ctx, 10*time.Minute, func(ctx context.Context) (bool, error) {
			var nodes corev1.NodeList
			if err := cl.List(ctx, &nodes); err != nil {
				return false, err
			}
			ready := 0
			for _, n := range nodes.Items {
				for _, cond := range n.Status.Conditions {
					if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
						ready++
					}
				}
			}
			return ready >= c.scaleNodes, nil
		})
	})
	r.Phases = append(r.Phases, p)
	if err != nil {
		return r, err
	}

	logf("scale: creating %d pods", c.scalePods)
	if err := create(ctx, cl, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "scale"}}); err != nil {
		return r, err
	}
	deployments := max(c.scalePods/10/100, 1)
	r.DeploymentPods = deployments * 100
	bare := c.scalePods - r.DeploymentPods
	p, err = s.window(fmt.Sprintf("creating %d pods", c.scalePods), func() error {
		for i := range deployments {
			app := fmt.Sprintf("web-%d", i)
			if err := create(ctx, cl, builder.Deployment("scale", app, 100)); err != nil {
				return err
			}
			if err := create(ctx, cl, builder.PDB("scale", app, builder.MaxUnavailable("10%"))); err != nil {
				return err
			}
		}
		var podNames []string
		for i := range bare {
			podNames = append(podNames, strconv.Itoa(i))
		}
		if err := forEach(ctx, podNames, 32, func(ctx context.Context, s string) error {
			i, _ := strconv.Atoi(s)
			return cl.Create(ctx, barePod("scale", "filler-"+s, names[i%len(names)]))
		}); err != nil {
			return err
		}
		return harness.Poll(ctx, 30*time.Minute, func(ctx context.Context) (bool, error) {
			var ds appsv1.DeploymentList
			if err := cl.List(ctx, &ds, client.InNamespace("scale")); err != nil {
				return false, err
			}
			ready := 0
			for _, d := range ds.Items {
				ready += int(d.Status.ReadyReplicas)
			}
			return ready >= r.DeploymentPods, nil
		})
	})
	r.Phases = append(r.Phases, p)
	if err != nil {
		return r, err
	}
	if err := idle(fmt.Sprintf("%d nodes, %d pods, idle", c.scaleNodes, c.scalePods)); err != nil {
		return r, err
	}

	logf("scale: deleting %d nodes under nodeguard", c.scaleDrain)
	drained := names[:c.scaleDrain]
	p, err = s.window(fmt.Sprintf("draining %d nodes", c.scaleDrain), func() error {
		if err := forEach(ctx, drained, 20, func(ctx context.Context, n string) error {
			return cl.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}); err != nil {
			return err
		}
		return harness.Poll(ctx, 15*time.Minute, func(ctx context.Context) (bool, error) {
			var nodes corev1.NodeList
			if err := cl.List(ctx, &nodes); err != nil {
				return false, err
			}
			left := map[string]bool{}
			for _, n := range drained {
				left[n] = true
			}
			for _, n := range nodes.Items {
				if left[n.Name] {
					return false, nil
				}
			}
			return true, nil
		})
	})
	r.DrainTime = p.Duration
	r.Phases = append(r.Phases, p)
	return r, err
}

func nodeIP(i int) string { return fmt.Sprintf("10.40.%d.%d", i/250, i%250+1) }

// barePod is a pod bound to a node, owned by no controller.
func barePod(ns, name, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": "filler"}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			Containers:                    []corev1.Container{{Name: "app", Image: "registry.k8s.io/pause:3.10"}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
}

func scaleTable(r *scaleResult) *bench.Table {
	if r == nil || len(r.Phases) == 0 {
		return nil
	}
	t := &bench.Table{
		Title: fmt.Sprintf("4. Scale: %d kwok nodes, %d pods; nodeguard beside the stock controllers", r.Nodes, r.Pods),
		Header: []string{"phase", "duration", "nodeguard RSS", "nodeguard CPU", "kube-controller-manager RSS", "kube-controller-manager CPU",
			"kube-scheduler RSS", "kube-scheduler CPU", "nodeguard / KCM RSS"},
	}
	mib := func(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }
	for _, p := range r.Phases {
		row := []string{p.Name, bench.Seconds(p.Duration)}
		for _, n := range scaleProcs {
			row = append(row, mib(p.RSS[n]), fmt.Sprintf("%.2f cores", p.CPU[n]))
		}
		row = append(row, bench.Times(float64(p.RSS["nodeguard"])/float64(max(p.RSS["kube-controller-manager"], 1))))
		t.AddRow(row...)
	}
	t.Note("RSS is the peak of 1-second samples of /proc/<pid>/status in the phase; CPU is user+system time over the phase ÷ its wall time. kube-controller-manager and kube-scheduler cache every pod; nodeguard lists a draining node's pods on demand.")
	t.Note("%d of the pods belong to %d Deployments under maxUnavailable 10%% PDBs; the rest are created bound to their nodes (no controller). Draining %d nodes (default --max-concurrent-drains) took %s.",
		r.DeploymentPods, r.DeploymentPods/100, r.Drained, bench.Seconds(r.DrainTime))
	return t
}
