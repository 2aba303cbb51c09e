package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

// Failure output is read in CI as an excerpt of a long log, so a failing test
// prints its own messages and little else: the logs around a failure (the
// control plane's, nodeguard's, its events) are kept in files under
// $TMPDIR/nodeguard-test-logs, and the output names them.

// keptLogsDir is where logs of failed tests and packages are kept.
func keptLogsDir() string { return filepath.Join(os.TempDir(), "nodeguard-test-logs") }

var unsafeNameChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// keepLog writes content to a new file named after name in keptLogsDir and
// returns its path, or a note saying why it could not.
func keepLog(name, content string) string {
	dir := keptLogsDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Sprintf("(not kept: %v)", err)
	}
	f, err := os.CreateTemp(dir, unsafeNameChars.ReplaceAllString(name, "_")+"-*.log")
	if err != nil {
		return fmt.Sprintf("(not kept: %v)", err)
	}
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		return fmt.Sprintf("(not kept: %v)", err)
	}
	return f.Name()
}
