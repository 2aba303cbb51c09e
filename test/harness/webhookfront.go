package harness

import (
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// WebhookFront listens where the installed webhook configurations call
// (Env.WebhookAddr) and forwards each connection, TLS passing through, to one
// of its backends in turn: several nodeguard replicas then answer one webhook
// configuration, as behind a Service. A backend that refuses the connection
// (a replica that is down) is skipped for the next one. kube-apiserver keeps
// connections open between calls, so SetBackends closes every connection made
// before: from then on calls reach only the new backends.
type WebhookFront struct {
	l        net.Listener
	mu       sync.Mutex
	backends []string
	conns    map[net.Conn]bool
	next     atomic.Uint64
}

// StartWebhookFront listens on addr until Close.
func StartWebhookFront(addr string) (*WebhookFront, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	f := &WebhookFront{l: l, conns: map[net.Conn]bool{}}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go f.serve(conn)
		}
	}()
	return f, nil
}

// SetBackends sets the addresses ("127.0.0.1:port") to forward to; none makes
// every call fail, as when nodeguard is down.
func (f *WebhookFront) SetBackends(addrs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.backends = addrs
	for c := range f.conns {
		c.Close()
	}
	clear(f.conns)
}

// Close stops listening and closes every connection.
func (f *WebhookFront) Close() {
	f.l.Close()
	f.SetBackends()
}

// track remembers an open connection, or closes it and reports false when
// the backends changed since the connection was accepted.
func (f *WebhookFront) track(c net.Conn, backends []string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(backends, f.backends) {
		c.Close()
		return false
	}
	f.conns[c] = true
	return true
}

func (f *WebhookFront) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
	c.Close()
}

func (f *WebhookFront) serve(conn net.Conn) {
	f.mu.Lock()
	backends := f.backends
	f.mu.Unlock()
	if len(backends) == 0 || !f.track(conn, backends) {
		conn.Close()
		return
	}
	defer f.untrack(conn)
	upstream := f.dial(backends)
	if upstream == nil || !f.track(upstream, backends) {
		return
	}
	defer f.untrack(upstream)
	go func() { _, _ = io.Copy(upstream, conn); upstream.Close() }()
	_, _ = io.Copy(conn, upstream)
}

// dial connects to the next backend that accepts, trying each once.
func (f *WebhookFront) dial(backends []string) net.Conn {
	start := f.next.Add(1)
	for i := range uint64(len(backends)) {
		c, err := net.DialTimeout("tcp", backends[(start+i)%uint64(len(backends))], time.Second)
		if err == nil {
			return c
		}
	}
	return nil
}
