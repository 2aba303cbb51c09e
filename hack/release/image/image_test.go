package main

import (
	"archive/tar"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const testVersion = "v0.0.0-imagetest"

// releasePlatforms are the platforms a release's image holds.
var releasePlatforms = []string{"linux/amd64", "linux/arm64"}

// platformsUnderTest are the platforms the test builds: a release's, or those
// NODEGUARD_IMAGE_PLATFORMS lists (make test sets this machine's alone).
func platformsUnderTest() []string {
	if env := os.Getenv("NODEGUARD_IMAGE_PLATFORMS"); env != "" {
		platforms := strings.Split(env, ",")
		slices.Sort(platforms)
		return platforms
	}
	return releasePlatforms
}

// makeImage runs make image into dir, as a user would.
func makeImage(t *testing.T, dir string) {
	t.Helper()
	cmd := exec.Command("make", "-C", filepath.Join("..", "..", ".."), "image", "IMAGE_OUT="+dir, "VERSION="+testVersion,
		"PLATFORMS="+strings.Join(platformsUnderTest(), ","))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
}

// indexOf reads the layout's image index named by the tag.
func indexOf(t *testing.T, dir, tag string) v1.ImageIndex {
	t.Helper()
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("reading the OCI layout: %v", err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range m.Manifests {
		if d.Annotations[refNameAnnotation] == tag {
			if d.MediaType != types.OCIImageIndex {
				t.Errorf("%s is a %s, want an OCI image index", tag, d.MediaType)
			}
			idx, err := top.ImageIndex(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			return idx
		}
	}
	t.Fatalf("the layout has no index named %s: %+v", tag, m.Manifests)
	return nil
}

// unpack extracts the image's only layer into dir and returns its headers by
// path.
func unpack(t *testing.T, img v1.Image, dir string) map[string]*tar.Header {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v; want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	headers := map[string]*tar.Header{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		headers[strings.TrimSuffix(h.Name, "/")] = h
		path := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(path, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, os.FileMode(h.Mode)&os.ModePerm); err != nil {
			t.Fatal(err)
		}
	}
	return headers
}

// TestImage builds the image with make image and checks what a cluster runs:
// an OCI index with linux/amd64 and linux/arm64 images (or the platforms
// NODEGUARD_IMAGE_PLATFORMS names), each a static nodeguard for its
// architecture as the entrypoint, run as the nonroot user 65532 that the
// image's passwd names, and nothing else but /tmp. The binary of this
// machine's architecture, unpacked, runs --version. A second build gives the
// same digest: the image is reproducible.
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-builds nodeguard")
	}
	want := platformsUnderTest()
	out := filepath.Join(t.TempDir(), "image")
	makeImage(t, out)
	idx := indexOf(t, out, strings.TrimPrefix(testVersion, "v"))
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, d := range m.Manifests {
		platforms = append(platforms, d.Platform.OS+"/"+d.Platform.Architecture)
	}
	slices.Sort(platforms)
	if !slices.Equal(platforms, want) {
		t.Fatalf("platforms %v, want %v", platforms, want)
	}
	ran := false
	for _, d := range m.Manifests {
		t.Run(d.Platform.Architecture, func(t *testing.T) {
			img, err := idx.Image(d.Digest)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.OS != "linux" || cfg.Architecture != d.Platform.Architecture {
				t.Errorf("config platform %s/%s, index says %s/%s", cfg.OS, cfg.Architecture, d.Platform.OS, d.Platform.Architecture)
			}
			if !slices.Equal(cfg.Config.Entrypoint, []string{"/nodeguard"}) || len(cfg.Config.Cmd) != 0 {
				t.Errorf("entrypoint %q cmd %q, want [/nodeguard] and no cmd", cfg.Config.Entrypoint, cfg.Config.Cmd)
			}
			if cfg.Config.User != "65532:65532" {
				t.Errorf("user %q, want 65532:65532 (runAsNonRoot needs a numeric user)", cfg.Config.User)
			}
			if got := cfg.Config.Labels["org.opencontainers.image.version"]; got != testVersion {
				t.Errorf("version label %q, want %s", got, testVersion)
			}
			if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
				t.Errorf("manifest media type %s, want OCI", mt)
			}

			root := t.TempDir()
			files := unpack(t, img, root)
			var names []string
			for name := range files {
				names = append(names, name)
			}
			slices.Sort(names)
			if want := []string{"etc", "etc/group", "etc/passwd", "home", "home/nonroot", "nodeguard", "tmp"}; !slices.Equal(names, want) {
				t.Errorf("image files %v, want %v", names, want)
			}
			if h := files["nodeguard"]; h == nil || h.Mode != 0o755 || h.Uid != 0 {
				t.Errorf("/nodeguard %+v, want mode 0755 owned by root (not writable by the user it runs as)", h)
			}
			if h := files["tmp"]; h == nil || h.Mode != 0o1777 {
				t.Errorf("/tmp %+v, want mode 1777", h)
			}
			passwd, _ := os.ReadFile(filepath.Join(root, "etc", "passwd"))
			if !strings.Contains(string(passwd), "\nnonroot:x:65532:65532:") {
				t.Errorf("/etc/passwd lacks the nonroot user 65532:\n%s", passwd)
			}

			binary := filepath.Join(root, "nodeguard")
			checkStaticELF(t, binary, d.Platform.Architecture)
			if d.Platform.Architecture != runtime.GOARCH {
				return
			}
			ran = true
			got, err := exec.Command(binary, "--version").CombinedOutput()
			if err != nil || !strings.HasPrefix(string(got), "nodeguard "+testVersion+" linux/"+runtime.GOARCH+" ") {
				t.Errorf("unpacked /nodeguard --version: %v\n%s\nwant nodeguard %s linux/%s ...", err, got, testVersion, runtime.GOARCH)
			}
		})
	}
	if !ran {
		t.Errorf("no image for this machine's architecture (%s): --version not run", runtime.GOARCH)
	}

	again := filepath.Join(t.TempDir(), "image")
	makeImage(t, again)
	first, _ := idx.Digest()
	second, _ := indexOf(t, again, strings.TrimPrefix(testVersion, "v")).Digest()
	if first != second {
		t.Errorf("two builds of the same commit: index %s, then %s; the image is not reproducible", first, second)
	}
}

// checkStaticELF checks the binary is an executable for the architecture with
// no dynamic loader: it runs on an image with no libc.
func checkStaticELF(t *testing.T, path, arch string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("/nodeguard is not an ELF binary: %v", err)
	}
	defer f.Close()
	want := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
	if f.Machine != want {
		t.Errorf("/nodeguard is built for %s, want %s", f.Machine, want)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("/nodeguard needs a dynamic loader: it would not start on an image without libc")
		}
	}
	if f.Type != elf.ET_EXEC {
		t.Errorf("/nodeguard ELF type %s, want an executable", f.Type)
	}
}
