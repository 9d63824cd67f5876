package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// table renders resources of type R as rows under a header in capitals.
// With -o wide, the columns of wideHeader and wideRow follow, when set.
type table[R any] struct {
	header     []string
	row        func(R) []string
	wideHeader []string
	wideRow    func(R) []string
}

func (t table[R]) write(w io.Writer, items []R, wide bool) error {
	wide = wide && t.wideRow != nil
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	header := t.header
	if wide {
		header = slices.Concat(header, t.wideHeader)
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, it := range items {
		row := t.row(it)
		if wide {
			row = slices.Concat(row, t.wideRow(it))
		}
		for i, cell := range row {
			row[i] = printable(cell, false)
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// printable returns s with its control characters (an escape sequence's
// ESC, a bell, a tab or newline unless keepLines) escaped as in a Go string
// literal, and its bytes that are not UTF-8 as U+FFFD: text a workspace
// chose (a file's name, a process's arguments, its agent's messages) must
// not steer the terminal it is printed on, nor a table's columns.
func printable(s string, keepLines bool) string {
	escaped := func(r rune) bool {
		return unicode.IsControl(r) && !(keepLines && (r == '\n' || r == '\t'))
	}
	if utf8.ValidString(s) && !strings.ContainsFunc(s, escaped) {
		return s
	}
	var b strings.Builder
	for _, r := range s { // a byte that is not UTF-8 comes as utf8.RuneError
		if escaped(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// show prints a response: with -o json or -o yaml the whole response
// message, else the resources it carries as a table.
func show[R any](cmd *cobra.Command, c *conn, resp proto.Message, t table[R], items ...R) error {
	if c.structured() {
		return c.writeMessage(cmd.OutOrStdout(), resp)
	}
	return t.write(cmd.OutOrStdout(), items, c.output == outputWide)
}

// confirm prints the response of a call that returns no resource: with -o
// json or -o yaml the whole message, else one line, format, of what it did.
func confirm(cmd *cobra.Command, c *conn, resp proto.Message, format string, a ...any) error {
	if c.structured() {
		return c.writeMessage(cmd.OutOrStdout(), resp)
	}
	_, err := fmt.Fprintf(cmd.OutOrStdout(), format+"\n", a...)
	return err
}

// structured reports whether -o asks for a whole message (json or yaml)
// rather than a table.
func (c *conn) structured() bool { return c.output == outputJSON || c.output == outputYAML }

// writeMessage prints m as JSON, or with -o yaml as YAML.
func (c *conn) writeMessage(w io.Writer, m proto.Message) error {
	if c.output == outputYAML {
		return writeYAML(w, m)
	}
	return writeJSON(w, m)
}

// writeYAML prints m as YAML: its protojson form, keys in the same order.
func writeYAML(w io.Writer, m proto.Message) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	var doc yaml.Node // JSON is YAML: parsing it keeps the order of the keys
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return err
	}
	blockStyle(&doc)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	return enc.Close()
}

// blockStyle turns the flow style and quotes of parsed JSON into YAML's
// block style; strings that need quotes (such as "1") keep them.
func blockStyle(n *yaml.Node) {
	n.Style = 0
	for _, c := range n.Content {
		blockStyle(c)
	}
}

// writeFields prints one resource as NAME value lines, the values aligned.
func writeFields(w io.Writer, fields [][2]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, f := range fields {
		fmt.Fprintf(tw, "%s\t%s\n", f[0], f[1])
	}
	return tw.Flush()
}

func writeJSON(w io.Writer, m proto.Message) error {
	b, err := marshalJSON(m, "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// marshalJSON renders m as protojson does, with whitespace of its own:
// protojson varies its whitespace on purpose from build to build, and
// scripts diff and hash what the CLI prints. An empty indent gives one
// line.
func marshalJSON(m proto.Message, indent string) ([]byte, error) {
	b, err := protojson.Marshal(m)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if indent == "" {
		err = json.Compact(&out, b)
	} else {
		err = json.Indent(&out, b, "", indent)
	}
	return out.Bytes(), err
}

// Cell formats shared by the tables.

// pairs formats a map as k=v, comma-joined and sorted by key; "-" when empty.
func pairs(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	out := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return strings.Join(out, ",")
}

// annotationCell is pairs of annotations for a table, each value cut
// after maxAnnotationCell characters: an annotation may hold hundreds of
// KiB, which -o json and -o yaml give whole.
func annotationCell(m map[string]string) string {
	clipped := make(map[string]string, len(m))
	for k, v := range m {
		if r := []rune(v); len(r) > maxAnnotationCell {
			v = string(r[:maxAnnotationCell]) + "…"
		}
		clipped[k] = v
	}
	return pairs(clipped)
}

// maxAnnotationCell is how much of an annotation's value a table shows.
const maxAnnotationCell = 60

// timestamp formats a time in RFC 3339, UTC; "-" when absent.
func timestamp(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}

// clock is the time ages are counted to; tests stop it.
var clock = time.Now

// age formats how long ago ts was, as kubectl does: 45s, 12m, 5h, 3d, 2y;
// "-" when absent.
func age(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	d := max(clock().Sub(ts.AsTime()), 0)
	switch {
	case d < 2*time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < 2*time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h"
	case d < 2*365*24*time.Hour:
		return strconv.Itoa(int(d.Hours()/24)) + "d"
	}
	return strconv.Itoa(int(d.Hours()/24/365)) + "y"
}

func decimal(n uint64) string { return strconv.FormatUint(n, 10) }

func boolean(b bool) string { return strconv.FormatBool(b) }

// orDash shows an empty cell as "-", which keeps the columns readable.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
