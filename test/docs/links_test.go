// Package docs checks the README and the pages under docs/: every relative
// link resolves, to a file and, where it names one, to a heading of it.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/nodeguard/nodeguard/test/harness"
)

var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

func TestRelativeLinksResolve(t *testing.T) {
	root := harness.RepoRoot()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"))
	checked := 0
	for _, page := range pages {
		rel, _ := filepath.Rel(root, page)
		for _, l := range links(t, page) {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue
			}
			checked++
			file, anchor, _ := strings.Cut(l.target, "#")
			target := page
			if file != "" {
				target = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s:%d: link %s: %v", rel, l.line, l.target, err)
				continue
			}
			if anchor != "" && strings.HasSuffix(target, ".md") && !anchors(t, target)[anchor] {
				t.Errorf("%s:%d: link %s: no heading with the anchor #%s in %s", rel, l.line, l.target, anchor, filepath.Base(target))
			}
		}
	}
	if checked == 0 {
		t.Fatal("found no relative link to check")
	}
}

type pageLink struct {
	target string
	line   int
}

// links returns the Markdown links of a page outside code blocks and code
// spans.
func links(t *testing.T, page string) []pageLink {
	var out []pageLink
	for i, line := range lines(t, page) {
		for _, m := range link.FindAllStringSubmatch(stripCode(line), -1) {
			out = append(out, pageLink{target: m[1], line: i + 1})
		}
	}
	return out
}

// anchors are the heading anchors GitHub gives a page's headings.
func anchors(t *testing.T, page string) map[string]bool {
	out := map[string]bool{}
	for _, line := range lines(t, page) {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		a := slug(title)
		for n := 1; out[a]; n++ { // GitHub numbers repeated headings
			a = slug(title) + "-" + strconv.Itoa(n)
		}
		out[a] = true
	}
	return out
}

// slug is GitHub's heading anchor: lower case, spaces to hyphens, and only
// letters, digits, hyphens and underscores kept.
func slug(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// lines returns a page's lines, with those of fenced code blocks emptied.
func lines(t *testing.T, page string) []string {
	raw, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Split(string(raw), "\n")
	fenced := false
	for i, line := range all {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			all[i] = ""
			continue
		}
		if fenced {
			all[i] = ""
		}
	}
	return all
}

var codeSpan = regexp.MustCompile("`[^`]*`")

func stripCode(line string) string { return codeSpan.ReplaceAllString(line, "``") }
