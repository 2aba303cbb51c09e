// Command armemulator serves an emulated Azure Resource Manager for load
// balancers, backend pools and NICs, and an AKS managed cluster's agent pools
// (see package armemulator), seeded from a JSON file, until interrupted. It prints its base URL on the first line of
// standard output.
//
//	armemulator --addr 127.0.0.1:8085 --seed seed.json [--async]
//
// GET <url>/emulator/state dumps every pool's entries and admin states.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nodeguard/nodeguard/test/armemulator"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "Address to listen on (host:port; port 0 picks a free one).")
	seedPath := flag.String("seed", "", "JSON file with the seed (armemulator.Seed: subscription, resourceGroup, loadBalancers, interfaces, vms, managedCluster: {name, resourceGroup, agentPools: [{name, count, upgradeSettings: {maxSurge, maxUnavailable, drainTimeoutInMinutes, nodeSoakDurationInMinutes, undrainableNodeBehavior}}]}). Required.")
	async := flag.Bool("async", false, "Serve backend pool writes as asynchronous operations (Azure-AsyncOperation + polling).")
	polls := flag.Int("async-polls", 1, "With --async, how many status polls answer InProgress before an operation completes.")
	flag.Parse()
	if err := run(*addr, *seedPath, armemulator.Options{Async: *async, AsyncPolls: *polls}); err != nil {
		fmt.Fprintln(os.Stderr, "armemulator:", err)
		os.Exit(1)
	}
}

func run(addr, seedPath string, opts armemulator.Options) error {
	if seedPath == "" {
		return fmt.Errorf("--seed is required")
	}
	b, err := os.ReadFile(seedPath)
	if err != nil {
		return err
	}
	var seed armemulator.Seed
	if err := json.Unmarshal(b, &seed); err != nil {
		return fmt.Errorf("parsing %s: %w", seedPath, err)
	}
	s, err := armemulator.Start(addr, seed, opts)
	if err != nil {
		return err
	}
	fmt.Println(s.URL())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	return s.Close()
}
