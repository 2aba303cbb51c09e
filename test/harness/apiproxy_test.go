package harness

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

// TestOnAnswerReportsTheStatusOnce: the status is reported once, before the
// client sees the answer, whether the handler sets it or only writes a body.
func TestOnAnswerReportsTheStatusOnce(t *testing.T) {
	for _, tt := range []struct {
		name   string
		handle func(w http.ResponseWriter)
		want   int
	}{
		{"WriteHeader then body", func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusTooManyRequests)
			w.WriteHeader(http.StatusOK) // superfluous: ignored
			_, _ = w.Write([]byte("no"))
		}, http.StatusTooManyRequests},
		{"body only", func(w http.ResponseWriter) { _, _ = w.Write([]byte("ok")) }, http.StatusOK},
	} {
		rec := httptest.NewRecorder()
		var seen []int
		tt.handle(OnAnswer(rec, func(status int) {
			if rec.Code != http.StatusOK || rec.Body.Len() != 0 || rec.Flushed {
				t.Errorf("%s: reported after the answer started", tt.name)
			}
			seen = append(seen, status)
		}))
		if !slices.Equal(seen, []int{tt.want}) || rec.Code != tt.want {
			t.Errorf("%s: reported %v, answered %d; want [%d] and %d", tt.name, seen, rec.Code, tt.want, tt.want)
		}
	}
}
