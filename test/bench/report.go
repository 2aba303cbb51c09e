package bench

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Table is one section of the results: a title, a header row, rows and notes
// printed under it.
type Table struct {
	Title  string     `json:"title"`
	Header []string   `json:"header"`
	Rows   [][]string `json:"rows"`
	Notes  []string   `json:"notes,omitempty"`
}

// AddRow appends a row of cells.
func (t *Table) AddRow(cells ...string) { t.Rows = append(t.Rows, cells) }

// Note appends a note line.
func (t *Table) Note(format string, args ...any) {
	t.Notes = append(t.Notes, fmt.Sprintf(format, args...))
}

// WriteMarkdown writes the table as a GitHub markdown table.
func (t *Table) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "### %s\n\n", t.Title)
	if len(t.Header) > 0 {
		fmt.Fprintf(w, "| %s |\n", strings.Join(t.Header, " | "))
		seps := make([]string, len(t.Header))
		for i := range seps {
			seps[i] = "---"
		}
		fmt.Fprintf(w, "|%s|\n", strings.Join(seps, "|"))
		for _, r := range t.Rows {
			cells := make([]string, len(t.Header))
			copy(cells, r)
			fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
		}
		fmt.Fprintln(w)
	}
	for _, n := range t.Notes {
		fmt.Fprintf(w, "- %s\n", n)
	}
	if len(t.Notes) > 0 {
		fmt.Fprintln(w)
	}
}

// Seconds formats a duration in seconds with a precision that suits it:
// "0.042 s", "1.23 s", "39.7 s".
func Seconds(d time.Duration) string {
	s := d.Seconds()
	switch {
	case s < 1:
		return fmt.Sprintf("%.3f s", s)
	case s < 10:
		return fmt.Sprintf("%.2f s", s)
	default:
		return fmt.Sprintf("%.1f s", s)
	}
}

// Millis formats a duration in milliseconds: "12.3 ms".
func Millis(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

// Times formats a ratio: "3.41×".
func Times(r float64) string { return fmt.Sprintf("%.2f×", r) }
