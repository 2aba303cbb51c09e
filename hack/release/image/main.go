// Command image builds nodeguard's container image without a container
// engine, as make image runs it:
//
//	go run ./image --root=../.. --out=../../_output/image --version=v0.1.0 [--push=ghcr.io/nodeguard/nodeguard:0.1.0]
//
// It cross-compiles the static binary for each platform and puts it on an
// empty base with a passwd entry for the nonroot user (65532), writing one
// image index as an OCI image layout. The build is reproducible: the same
// commit and Go toolchain give the same digests, as every timestamp is the
// commit's (SOURCE_DATE_EPOCH when set) and the layer is written in a fixed
// order with fixed owners. With --push, it also pushes the index to a
// registry with the credentials of docker login (or crane/ko/GitHub's login).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

func main() {
	var o options
	flag.StringVar(&o.root, "root", "../..", "The repository: the Go module whose ./cmd/nodeguard is built.")
	flag.StringVar(&o.out, "out", "../../_output/image", "Directory of the OCI image layout to write (replaced).")
	flag.StringVar(&o.version, "version", "", "Version stamped into the binary and the image labels (default: git describe).")
	platforms := flag.String("platforms", "linux/amd64,linux/arm64", "Comma-separated platforms.")
	flag.StringVar(&o.tag, "tag", "", "Name of the index in the layout (org.opencontainers.image.ref.name); default: the version without its leading v.")
	flag.StringVar(&o.push, "push", "", "Also push the index to this reference, e.g. ghcr.io/nodeguard/nodeguard:0.1.0.")
	flag.StringVar(&o.digestFile, "digest-file", "", "Write the index digest (sha256:...) to this file.")
	flag.Parse()
	o.platforms = strings.Split(*platforms, ",")
	digest, err := build(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s for %s to %s\n", digest, strings.Join(o.platforms, ", "), o.out)
	if o.push != "" {
		fmt.Printf("pushed %s@%s\n", o.push, digest)
	}
}
