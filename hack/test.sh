#!/usr/bin/env bash
# make test's steps, run side by side: every package's tests on Kubernetes
# 1.37, the e2e tests as E2E_SHARDS processes, test-oldest (1.36), the chart
# tests and the release tests (the image for this machine's platform). Each
# e2e process waits on its cluster far more than it computes, so they overlap
# (warm, the machine would idle under one; cold, the compiles keep both cores
# busy). Each job's lines carry its name; a failing e2e shard prints its
# failed tests' output.
set -euo pipefail
cd "$(dirname "$0")/.."
go=${GO:-go}
make=${MAKE:-make}
shards=${E2E_SHARDS:-3}
flags=(-timeout 40m)
read -r -a extra <<<"${TEST_FLAGS:-}"
flags+=("${extra[@]}")
logs=${TMPDIR:-/tmp}/nodeguard-test-logs
mkdir -p "$logs"

# The e2e tests' seconds in a cold make test on 2 cores (.ci/run on
# 2026-11-28, e2e --- PASS lines; the last two rows from runs of their own on
# 2026-12-07; the AKS upgrade rows from a cold .ci/run on 2026-12-08);
# a test not listed counts as 12. The shards
# are dealt longest first, each test to the shard with the least so far.
declare -A seconds=(
	[TestCutHoldsThroughAnotherWritersLongOperations]=167 [TestChaosSoak]=127
	[TestKarpenterConsolidationFollowsTheBudget]=110 [TestKarpenterStrandedCandidatesServeAgain]=79
	[TestDeadNodeOutOfServiceIsReleasedSooner]=57 [TestKubectlDrainOfABlockedPDBIsReplacedFirst]=55
	[TestClusterAutoscalerDeniedScaleDown]=54 [TestClusterAutoscalerRefusedScaleDownKeepsItsPods]=30 [TestClusterAutoscalerScaleDownFollowsTheBudget]=46
	[TestKarpenterNodeDeleteFollowsTheBudget]=29 [TestBlockedPDBPolicyWaitNeverTouchesTheDeployment]=28
	[TestKubectlDrainsAreCutAndTakeTurns]=25
	[TestUnreachableARMAndAPodUnderTwoPDBs]=23 [TestHungARMCall]=18 [TestTrafficCutHoldsWhileCloudProviderReconciles]=17
	[TestClusterAutoscalerTaintIsASignal]=8 [TestPlanPredictsWhatTheDeletionMeets]=25 [TestKarpenterNodeIsCutNotDrained]=6
	[TestProductionNodeDrainsInTiersAndIsReleased]=6 [TestCloudNodeControllerIsNeverRefused]=4
	[TestClusterAutoscalerCancelledScaleDown]=4 [TestScaleDownDisabledWhileTheBudgetAllowsNone]=1
	[TestRestoredNoneHoldsAgainstStaleCopies]=137 [TestEntriesRemovedByCloudProviderAreCut]=80
	[TestKarpenterDeletedNodeIsCutBeforeItsEvictions]=41 [TestForgedEvictionReviewLeavesNothingBehind]=27
	[TestForgedRecordChangesNothing]=23 [TestClusterEnforcesTheInstallsPolicies]=1 [TestTenantSpotNoticeCutsNothing]=61
	[TestAKSUpgradeThatFitsFinishes]=125 [TestAKSUpgradeThatDoesNotFitIsSaidAndGivenUp]=94 [TestBudgetDrainTimeoutBoundsADoNotEvictHold]=45
)

# label NAME prefixes each line of its input with the job's name.
label() { sed -u "s|^|$1: |"; }

# e2e_shards prints one -run expression per shard.
e2e_shards() {
	local -a tests load runs
	mapfile -t tests < <(grep -ho '^func Test[A-Za-z0-9_]*' test/e2e/*_test.go | cut -c6- | grep -vx TestMain |
		while read -r t; do echo "${seconds[$t]:-12} $t"; done | sort -rn | cut -d' ' -f2)
	for ((i = 0; i < shards; i++)); do load[i]=0; runs[i]=""; done
	for t in "${tests[@]}"; do
		local least=0
		for ((i = 1; i < shards; i++)); do ((load[i] < load[least])) && least=$i; done
		load[least]=$((load[least] + ${seconds[$t]:-12}))
		runs[least]+="${runs[least]:+|}$t"
	done
	for ((i = 0; i < shards; i++)); do [ -n "${runs[i]}" ] && echo "^(${runs[i]})\$"; done
}

# e2e_shard N RUN runs one shard verbosely into its log and prints each test's
# result line; on failure, the output of its failed tests and the package's tail.
e2e_shard() {
	local log=$logs/e2e-shard-$1.verbose.log status=0
	$go test -v "${flags[@]}" -run "$2" ./test/e2e >"$log" 2>&1 || status=$?
	grep -E '^(--- |ok|FAIL|panic:)' "$log" || true
	if [ $status -ne 0 ]; then
		echo "failed; whole log: $log"
		awk '/^=== RUN/ {buf = ""; keep = 1} keep {buf = buf $0 "\n"} /^--- FAIL/ {printf "%s", buf; keep = 0} /^--- (PASS|SKIP)/ {keep = 0; buf = ""} END {if (keep) printf "%s", buf}' "$log"
		awk 'seen {print} /^--- / {seen = 1}' "$log" | tail -40
	fi
	return $status
}

# job NAME CMD... runs one job: its lines, prefixed with its name, go to the
# output as they come and to $logs/NAME.log; the job's status is its command's.
job() {
	local name=$1
	shift
	{ "$@" 2>&1 | tee "$logs/$name.log" | label "$name"; exit "${PIPESTATUS[0]}"; } &
	pids+=($!)
	names+=("$name")
}

# in_dir DIR CMD... runs a command in a directory of the module (a job's own
# subshell, so the script stays where it is).
in_dir() { cd "$1" && shift && "$@"; }

# summarize NAME prints a failed job's failures again, at the end of the
# output, where a CI that keeps only the tail still shows them: its failed
# tests' output (without passing packages and tests), then their names.
summarize() {
	local log=$logs/$1.log
	echo "=== $1 failed; whole log: $log"
	grep -vE '^(ok |=== (RUN|PAUSE|CONT)|--- (PASS|SKIP)|PASS$)' "$log" | tail -60 | label "$1"
	grep -E '^(\s*--- FAIL|FAIL|panic:)' "$log" | label "$1" || true
}

mapfile -t others < <($go list ./... | grep -vx "github.com/nodeguard/nodeguard/test/e2e")
# Compile the e2e package once, so that the shards only link it.
$go test -c -o /dev/null ./test/e2e

pids=() names=()
job packages $go test -p "${TEST_P:-2}" "${flags[@]}" "${others[@]}"
n=0
while read -r run; do
	n=$((n + 1))
	job "e2e-$n-of-$shards" e2e_shard "$n" "$run"
done < <(e2e_shards)
job oldest $make --no-print-directory test-oldest
job chart in_dir test/chart $go test "${flags[@]}" ./...
# The image for this machine's platform only: a cold cross-build of the other
# was make test's longest step. make test-release, run by the release
# workflow, builds and checks both.
platform=linux/$($go env GOARCH)
job release in_dir hack/release env NODEGUARD_IMAGE_PLATFORMS="$platform" $go test "${flags[@]}" ./...
failed=()
for i in "${!pids[@]}"; do wait "${pids[i]}" || failed+=("${names[i]}"); done
for name in "${failed[@]}"; do summarize "$name"; done
if [ ${#failed[@]} -gt 0 ]; then
	echo "make test failed in: ${failed[*]}"
	exit 1
fi
