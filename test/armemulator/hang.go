package armemulator

import (
	"io"
	"net/http"
)

// hang holds a request until the client gives up. The request body is read
// first: net/http notices a closed connection (and cancels the request's
// context) only once the body has been consumed, so a PUT would otherwise
// hang until the server closes.
func hang(r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	<-r.Context().Done()
}
