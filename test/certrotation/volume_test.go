package certrotation

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// secretVolume stands in for the kubelet's Secret volume under nodeguard's
// --webhook-cert-dir. The kubelet sees a changed Secret only at its next sync
// of the pod (up to a minute or more later; lag here), then writes the keys as
// its atomic writer does: into a new directory, swapped in by renaming the
// ..data symlink, which tls.crt and tls.key point through. nodeguard's
// certificate watcher (controller-runtime's certwatcher) must pick that up.
type secretVolume struct {
	dir       string
	key       client.ObjectKey
	lag       time.Duration
	mu        sync.Mutex
	mounted   []byte // tls.crt as last written
	changedAt time.Time
	version   int
}

// mount writes the Secret's current keys at once, as the kubelet does when
// the pod starts.
func (v *secretVolume) mount(ctx context.Context) error {
	s, err := v.read(ctx)
	if err != nil {
		return err
	}
	return v.write(s.Data)
}

func (v *secretVolume) read(ctx context.Context) (*corev1.Secret, error) {
	var s corev1.Secret
	if err := env.Client.Get(ctx, v.key, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// run syncs the volume until ctx ends: a changed Secret is written lag after
// it was first seen.
func (v *secretVolume) run(ctx context.Context) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			s, err := v.read(ctx)
			if err != nil {
				continue
			}
			v.mu.Lock()
			changed := !bytes.Equal(s.Data[corev1.TLSCertKey], v.mounted)
			if !changed {
				v.changedAt = time.Time{}
			} else if v.changedAt.IsZero() {
				v.changedAt = now
			}
			due := changed && now.Sub(v.changedAt) >= v.lag
			v.mu.Unlock()
			if due {
				if err := v.write(s.Data); err != nil {
					panic(err) // the test's own directory: nothing to recover
				}
			}
		}
	}
}

// write lays the keys out as the kubelet's atomic writer does.
func (v *secretVolume) write(data map[string][]byte) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.version++
	gen := fmt.Sprintf("..%d", v.version)
	if err := os.Mkdir(filepath.Join(v.dir, gen), 0o755); err != nil {
		return err
	}
	for k, val := range data {
		if err := os.WriteFile(filepath.Join(v.dir, gen, k), val, 0o600); err != nil {
			return err
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(gen, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		return err
	}
	for k := range data {
		link := filepath.Join(v.dir, k)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", k), link); err != nil {
				return err
			}
		}
	}
	if v.version > 1 {
		if err := os.RemoveAll(filepath.Join(v.dir, fmt.Sprintf("..%d", v.version-1))); err != nil {
			return err
		}
	}
	v.mounted, v.changedAt = data[corev1.TLSCertKey], time.Time{}
	return nil
}
