package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	// nonroot is the user and group nodeguard runs as (distroless' nonroot).
	nonroot = 65532
	// entrypoint is where the binary sits in the image.
	entrypoint = "/nodeguard"
	source     = "https://github.com/nodeguard/nodeguard"
	// refNameAnnotation names an index in an OCI image layout.
	refNameAnnotation = "org.opencontainers.image.ref.name"
)

type options struct {
	root, out, version, tag, push, digestFile string
	platforms                                 []string
}

// build builds the image index and writes it to the layout (and pushes it).
func build(o options) (v1.Hash, error) {
	root, err := filepath.Abs(o.root)
	if err != nil {
		return v1.Hash{}, err
	}
	rev := git(root, "rev-parse", "HEAD")
	created, err := sourceDate(root)
	if err != nil {
		return v1.Hash{}, err
	}
	if o.version == "" {
		o.version = git(root, "describe", "--tags", "--always", "--dirty")
	}
	if o.version == "" {
		o.version = "devel"
	}
	if o.tag == "" {
		o.tag = strings.TrimPrefix(o.version, "v")
	}
	labels := map[string]string{
		"org.opencontainers.image.title":       "nodeguard",
		"org.opencontainers.image.description": "Safe node removal for Kubernetes: NodeDisruptionBudgets, load-balancer cut-over and serial drains",
		"org.opencontainers.image.source":      source,
		"org.opencontainers.image.version":     o.version,
		"org.opencontainers.image.revision":    rev,
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
	}
	tmp, err := os.MkdirTemp("", "nodeguard-image-")
	if err != nil {
		return v1.Hash{}, err
	}
	defer os.RemoveAll(tmp)

	var idx v1.ImageIndex = empty.Index
	for _, p := range o.platforms {
		platform, err := v1.ParsePlatform(p)
		if err != nil {
			return v1.Hash{}, err
		}
		binary := filepath.Join(tmp, platform.OS+"-"+platform.Architecture, "nodeguard")
		if err := goBuild(root, binary, *platform, o.version, rev); err != nil {
			return v1.Hash{}, err
		}
		img, err := image(binary, *platform, created, labels)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("%s: %w", p, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: platform}})
	}
	idx = mutate.IndexMediaType(idx, types.OCIImageIndex)
	idx = mutate.Annotations(idx, labels).(v1.ImageIndex)
	digest, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	if err := writeLayout(o.out, idx, o.tag); err != nil {
		return v1.Hash{}, err
	}
	if o.digestFile != "" {
		if err := os.WriteFile(o.digestFile, []byte(digest.String()+"\n"), 0o644); err != nil {
			return v1.Hash{}, err
		}
	}
	if o.push != "" {
		ref, err := name.ParseReference(o.push)
		if err != nil {
			return v1.Hash{}, err
		}
		if err := remote.WriteIndex(ref, idx, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return v1.Hash{}, fmt.Errorf("pushing %s: %w", ref, err)
		}
	}
	return digest, nil
}

// buildInfoPackage holds the version and commit --version prints.
const buildInfoPackage = "github.com/nodeguard/nodeguard/internal/buildinfo"

// goBuild cross-compiles a static, reproducible nodeguard: no cgo, no paths
// of this machine, no VCS stamp (version and commit go in by -X).
func goBuild(root, out string, p v1.Platform, version, rev string) error {
	ldflags := fmt.Sprintf("-s -w -X %[1]s.version=%[2]s -X %[1]s.commit=%[3]s", buildInfoPackage, version, rev)
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags="+ldflags, "-o", out, "./cmd/nodeguard")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture, "GOFLAGS=-mod=readonly")
	if p.Variant != "" && p.Architecture == "arm" {
		cmd.Env = append(cmd.Env, "GOARM="+strings.TrimPrefix(p.Variant, "v"))
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build for %s/%s: %w\n%s", p.OS, p.Architecture, err, out)
	}
	return nil
}

// image is one platform's image: a single layer with the binary, a passwd
// and group naming the nonroot user, and /tmp.
func image(binary string, p v1.Platform, created time.Time, labels map[string]string) (v1.Image, error) {
	content, err := rootfs(binary, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(content)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: p.Architecture,
		OS:           p.OS,
		Variant:      p.Variant,
		Created:      v1.Time{Time: created},
		Config: v1.Config{
			Entrypoint: []string{entrypoint},
			User:       fmt.Sprintf("%d:%d", nonroot, nonroot),
			WorkingDir: "/",
			Labels:     labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "hack/release/image", Comment: "nodeguard " + labels["org.opencontainers.image.version"]},
	})
	if err != nil {
		return nil, err
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	return mutate.ConfigMediaType(img, types.OCIConfigJSON), nil
}

// rootfs is the layer's tar: fixed order, owners and times.
func rootfs(binary string, created time.Time) ([]byte, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	entries := []struct {
		name     string
		mode     int64
		uid      int
		data     string
		contents []byte
	}{
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, data: fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonroot)},
		{name: "etc/passwd", mode: 0o644, data: fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonroot, nonroot)},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: nonroot},
		{name: strings.TrimPrefix(entrypoint, "/"), mode: 0o755, contents: bin},
		{name: "tmp/", mode: 0o1777},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: created, Format: tar.FormatPAX}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			if e.contents == nil {
				e.contents = []byte(e.data)
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.contents))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.contents); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeLayout replaces dir with an OCI image layout holding the index under
// the tag.
func writeLayout(dir string, idx v1.ImageIndex, tag string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{refNameAnnotation: tag}))
}

// sourceDate is every timestamp of the image: SOURCE_DATE_EPOCH, else the
// commit's time, else the Unix epoch.
func sourceDate(root string) (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		s = git(root, "log", "-1", "--format=%ct")
	}
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// git runs a git command in root; empty when git or the repository is missing.
func git(root string, args ...string) string {
	cmd := exec.Command("git", args...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
