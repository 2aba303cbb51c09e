package armemulator

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Front serves an emulator (or any ARM handler) on an address of the test's
// choosing, and plays what lies between nodeguard and ARM:
//
//   - Down closes the listener and every open connection, so that calls are
//     refused (ECONNREFUSED) and calls in flight break, until Up listens on the
//     same address again;
//   - RequireBearer answers 401, as ARM does, to a call without a bearer token
//     that a TokenEndpoint issued.
type Front struct {
	addr    string
	handler http.Handler

	mu           sync.Mutex
	srv          *http.Server
	valid        func(token string) bool
	unauthorized int
	downs        int
}

// StartFront serves h on addr ("127.0.0.1:port"; use a reserved port, since
// Up must get the same one back).
func StartFront(addr string, h http.Handler) (*Front, error) {
	f := &Front{addr: addr, handler: h}
	if err := f.Up(); err != nil {
		return nil, err
	}
	return f, nil
}

// URL is the ARM endpoint to give nodeguard.
func (f *Front) URL() string { return "http://" + f.addr }

// Up listens again after Down (a no-op while up).
func (f *Front) Up() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.srv != nil {
		return nil
	}
	l, err := net.Listen("tcp", f.addr)
	if err != nil {
		return err
	}
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve), ReadHeaderTimeout: 10 * time.Second}
	go func(srv *http.Server) { _ = srv.Serve(l) }(f.srv)
	return nil
}

// Down closes the listener and every connection: new calls are refused.
func (f *Front) Down() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.srv == nil {
		return nil
	}
	err := f.srv.Close()
	f.srv = nil
	f.downs++
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// Downs is how many times Down closed the front.
func (f *Front) Downs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.downs
}

// Close stops serving for good.
func (f *Front) Close() error { return f.Down() }

// RequireBearer makes every call need an Authorization: Bearer token for which
// valid returns true.
func (f *Front) RequireBearer(valid func(token string) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.valid = valid
}

// Unauthorized is how many calls were answered 401.
func (f *Front) Unauthorized() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.unauthorized
}

func (f *Front) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	valid := f.valid
	f.mu.Unlock()
	if valid != nil && !strings.HasPrefix(r.URL.Path, "/emulator/") {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || !valid(token) {
			f.mu.Lock()
			f.unauthorized++
			f.mu.Unlock()
			w.Header().Set("WWW-Authenticate", `Bearer authorization_uri="https://login.microsoftonline.com/common", error="invalid_token"`)
			writeError(w, http.StatusUnauthorized, "InvalidAuthenticationToken", "The access token is invalid.")
			return
		}
	}
	f.handler.ServeHTTP(w, r)
}
