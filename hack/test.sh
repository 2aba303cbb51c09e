#!/usr/bin/env bash
# make test's first step: every package's tests on Kubernetes 1.37. The e2e
# package's tests wait on the cluster far more than they compute (one process
# of them was 12 of make test's 14 minutes, the machine mostly idle), so they
# run as E2E_SHARDS processes, each with its own control plane, beside the
# other packages (TEST_P at a time). Test names are dealt to the shards in
# turn, in source order.
set -euo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
shards=${E2E_SHARDS:-3}
flags=(-timeout 40m)
read -r -a extra <<<"${TEST_FLAGS:-}"
flags+=("${extra[@]}")
e2e=./test/e2e

mapfile -t tests < <(grep -ho '^func Test[A-Za-z0-9_]*' "$e2e"/*_test.go | cut -c6- | grep -vx TestMain)
mapfile -t others < <($go list ./... | grep -vx "github.com/nodeguard/nodeguard/test/e2e")

# Compile the e2e package once, so that the shards only link it.
$go test -c -o /dev/null "$e2e"

pids=()
$go test -p "${TEST_P:-2}" "${flags[@]}" "${others[@]}" &
pids+=($!)
for ((i = 0; i < shards; i++)); do
	names=()
	for ((j = i; j < ${#tests[@]}; j += shards)); do names+=("${tests[j]}"); done
	[ ${#names[@]} -gt 0 ] || continue
	run="^($(IFS='|'; echo "${names[*]}"))\$"
	(
		$go test "${flags[@]}" -run "$run" "$e2e" 2>&1 | sed "s|^|e2e $((i + 1))/$shards: |"
		exit "${PIPESTATUS[0]}"
	) &
	pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
