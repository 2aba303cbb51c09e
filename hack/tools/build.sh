#!/usr/bin/env bash
# Builds the tools the tests and the sandbox need into bin/ (or $BIN), from the
# Go module proxy, skipping whatever is already built for the pinned versions.
# Its arguments name groups (none: all of them):
#   sandbox      etcd, kwok, kube-apiserver, kube-controller-manager,
#                kube-scheduler: what make run and most tests start
#   codegen      controller-gen (make generate, manifests, verify)
#   certmanager  cert-manager (controller, cainjector) and its CRDs
#   karpenter    Karpenter with its kwok cloud provider, and its CRDs
#   oldest       kube-apiserver, kube-controller-manager, kube-scheduler of
#                the oldest supported Kubernetes, into k8s-1.36/ (make test-oldest)
#   test         sandbox, oldest, certmanager and karpenter: everything make test runs
# Each tool prints a line with its expected cold build time before it starts,
# and a progress line every 100 compiled packages.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${BIN:-$root/bin}
mkdir -p "$bin"

# stamp_of prints a hash of a tools module's files (go.mod, go.sum, and main.go
# where the module has its own): a changed pin or source rebuilds. It lists the
# files rather than globbing *.go, so a module without Go files (most of them)
# does not fail the pipeline under pipefail.
stamp_of() {
	(cd "$here/$1" && find . -maxdepth 1 -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) | LC_ALL=C sort | xargs cat) |
		sha256sum | cut -c1-16
}

# up_to_date MODULE BINARY... succeeds when every binary exists and was built from
# the module's current pins.
up_to_date() {
	local module=$1; shift
	[ "$(cat "$bin/.stamp-$module" 2>/dev/null)" = "$(stamp_of "$module")" ] || return 1
	for b in "$@"; do [ -e "$bin/$b" ] || return 1; done
}

# progress reads `go build -v` output (one line per compiled package) and prints a
# line every 100 packages, so a cold build shows it is moving.
progress() {
	local module=$1 start=$SECONDS n=0
	while IFS= read -r line; do
		case "$line" in
		*": "*) echo "  $line" ;; # diagnostics pass through
		*) n=$((n + 1)); [ $((n % 100)) -eq 0 ] && echo "  $module: $n packages compiled ($((SECONDS - start))s)" ;;
		esac
	done
	echo "  $module: done, $n packages compiled ($((SECONDS - start))s)"
}

# build MODULE EXPECTED OUT PACKAGE... builds packages of a tools module to OUT
# (a file, or bin/ for several); EXPECTED is its cold build time on 2 cores.
# The tools carry no symbol table or debug information (-s -w): nobody
# debugs them here, and it makes each link about 40% shorter.
build() {
	local module=$1 expected=$2 out=$3; shift 3
	echo "building $module: $* ($expected cold on 2 cores; later runs skip it)"
	if ! (cd "$here/$module" && go build -v -ldflags='-s -w' -o "$out" "$@" 2>&1) | progress "$module"; then
		echo "building $module tools failed" >&2
		exit 1
	fi
	stamp_of "$module" >"$bin/.stamp-$module"
}

build_codegen() {
	if up_to_date codegen controller-gen; then echo "controller-gen: up to date"; return; fi
	build codegen "about 1 minute" "$bin/controller-gen" sigs.k8s.io/controller-tools/cmd/controller-gen
}

build_etcd() {
	if up_to_date etcd etcd; then echo "etcd: up to date"; return; fi
	build etcd "about 30 seconds" "$bin/etcd" go.etcd.io/etcd/server/v3
}

build_kwok() {
	if up_to_date kwok kwok kwok-stages/pod-fast.yaml; then echo "kwok: up to date"; return; fi
	build kwok "about 1 minute" "$bin/kwok" sigs.k8s.io/kwok/cmd/kwok
	# The stock stages ship inside the kwok module; copy them out so the test
	# harness and the sandbox can hand them to kwok with --config.
	stages=$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
	mkdir -p "$bin/kwok-stages"
	for s in node/fast node/heartbeat-with-lease pod/fast pod/general; do
		out="$bin/kwok-stages/${s/\//-}.yaml"
		: >"$out"
		for f in "$stages/$s"/*.yaml; do
			case "$f" in */kustomization.yaml) continue ;; esac
			{ echo "---"; cat "$f"; } >>"$out"
		done
	done
}

build_kube() {
	if up_to_date kube kube-apiserver kube-controller-manager kube-scheduler; then echo "kube-apiserver, kube-controller-manager, kube-scheduler: up to date"; return; fi
	build kube "about 3 minutes" "$bin/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
}

# The oldest supported Kubernetes's control plane, side by side, for the tests
# run on both ends of the supported range (NODEGUARD_KUBE_VERSION=1.36). All
# three components: version skew forbids a kube-controller-manager or
# kube-scheduler newer than kube-apiserver, so an e2e on 1.36 needs its own.
build_kube136() {
	if up_to_date kube-1.36 k8s-1.36/kube-apiserver k8s-1.36/kube-controller-manager k8s-1.36/kube-scheduler; then
		echo "kube-apiserver, kube-controller-manager, kube-scheduler 1.36: up to date"
		return
	fi
	mkdir -p "$bin/k8s-1.36"
	build kube-1.36 "about 4 minutes" "$bin/k8s-1.36/" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler
}

build_certmanager() {
	if up_to_date certmanager cert-manager cert-manager-crds/cert-manager.io_certificates.yaml; then echo "cert-manager: up to date"; return; fi
	build certmanager "about 3 minutes" "$bin/cert-manager" .
	# The CRDs ship inside the cert-manager module; copy them out for the tests.
	crds=$(cd "$here/certmanager" && go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)/deploy/crds
	rm -rf "$bin/cert-manager-crds" && mkdir -p "$bin/cert-manager-crds"
	cp "$crds"/*.yaml "$bin/cert-manager-crds/"
	chmod u+w "$bin/cert-manager-crds"/*.yaml
}

build_karpenter() {
	if up_to_date karpenter karpenter-kwok karpenter-crds/karpenter.sh_nodeclaims.yaml; then echo "karpenter: up to date"; return; fi
	build karpenter "about 4 minutes" "$bin/karpenter-kwok" sigs.k8s.io/karpenter/kwok
	# The CRDs ship inside the Karpenter module: NodePool and NodeClaim, and the
	# kwok provider's KWOKNodeClass. NodeOverlay and CapacityBuffer are left out:
	# Karpenter runs with their feature gates off.
	dir=$(cd "$here/karpenter" && go list -m -f '{{.Dir}}' sigs.k8s.io/karpenter)
	rm -rf "$bin/karpenter-crds" && mkdir -p "$bin/karpenter-crds"
	cp "$dir"/pkg/apis/crds/karpenter.sh_nodepools.yaml "$dir"/pkg/apis/crds/karpenter.sh_nodeclaims.yaml \
		"$dir"/kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml "$bin/karpenter-crds/"
	chmod u+w "$bin/karpenter-crds"/*.yaml
}

# tools_of prints the tools of a group, in build order.
tools_of() {
	case "$1" in
	sandbox) echo etcd kwok kube ;;
	codegen | certmanager | karpenter) echo "$1" ;;
	oldest) echo kube136 ;;
	test) echo etcd kwok kube kube136 certmanager karpenter ;;
	all) echo codegen etcd kwok kube kube136 certmanager karpenter ;;
	*) echo "hack/tools/build.sh: unknown group $1 (sandbox, codegen, oldest, certmanager, karpenter, test, all)" >&2; return 1 ;;
	esac
}

# Each tool once, in the order of the first group that names it.
todo=()
for group in "${@:-all}"; do
	tools=$(tools_of "$group")
	for tool in $tools; do
		case " ${todo[*]} " in *" $tool "*) ;; *) todo+=("$tool") ;; esac
	done
done
for tool in "${todo[@]}"; do "build_$tool"; done
