package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits are the suffixes ParseSize accepts: binary ones are powers of
// 1024, decimal ones powers of 1000, as in Kubernetes quantities. The first
// four are the binary units formatSize writes; KiB to TiB are accepted as
// their other spelling.
var sizeUnits = []struct {
	suffix string
	bytes  uint64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
}

// sizeHelp describes the SIZE syntax in flag help.
const sizeHelp = "SIZE is bytes, or a whole number with a binary suffix Ki, Mi, Gi, Ti (powers of 1024;\n" +
	"also KiB to TiB) or a decimal one k, M, G, T (powers of 1000). The server takes memory and\n" +
	"disk only in whole MiB, so a decimal size is almost always refused: 2G is 2,000,000,000\n" +
	"bytes; write 2Gi."

// ParseSize parses SIZE: "512Mi", "1Gi" or "1GiB", "2G", or plain bytes
// such as "1048576". Its errors quote s and say what is wanted, for the
// caller to prefix with where s came from.
func ParseSize(s string) (uint64, error) {
	num, mult := s, uint64(1)
	for _, u := range sizeUnits {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = n, u.bytes
			break
		}
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: want bytes or a whole number with a suffix such as 512Mi, 1Gi or 2G", s)
	}
	if n > math.MaxUint64/mult {
		return 0, fmt.Errorf("%q: too large", s)
	}
	return n * mult, nil
}

// parseSize is ParseSize of the value that name names in its errors: a
// flag ("--memory") or an argument ("SIZE").
func parseSize(name, s string) (uint64, error) {
	n, err := ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("%s %w", name, err)
	}
	return n, nil
}

// parseMiB is parseSize for a size the server takes only in whole MiB, such
// as a Volume's capacity; it refuses any other before a call is made.
func parseMiB(name, s string) (uint64, error) {
	n, err := parseSize(name, s)
	if err != nil {
		return 0, err
	}
	if n%(1<<20) != 0 {
		return 0, fmt.Errorf("%s %q is %d bytes, not a whole number of MiB: write it with Mi, Gi or Ti, such as 512Mi or 2Gi", name, s, n)
	}
	return n, nil
}

// formatSize formats a requested size exactly, in the largest binary unit
// that divides it, so that it reads back with parseSize: 512Mi, 1Gi, 1536Mi;
// "-" for zero, which requests leave to the server.
func formatSize(n uint64) string {
	if n == 0 {
		return "-"
	}
	for i := 3; i >= 0; i-- {
		if u := sizeUnits[i]; n%u.bytes == 0 {
			return strconv.FormatUint(n/u.bytes, 10) + u.suffix
		}
	}
	return strconv.FormatUint(n, 10)
}

// approxSize formats a measured size to one decimal in the largest binary
// unit below it: 11.8Mi, 2.0Gi; bytes below 1 KiB.
func approxSize(n uint64) string {
	for i := 3; i >= 0; i-- {
		if u := sizeUnits[i]; n >= u.bytes {
			return strconv.FormatFloat(float64(n)/float64(u.bytes), 'f', 1, 64) + u.suffix
		}
	}
	return strconv.FormatUint(n, 10)
}

// byteProgress formats done of total as "12.3 MiB / 40.0 MiB (30%)", both in
// the unit of total. The percentage rounds down, so 100% means complete.
func byteProgress(done, total uint64) string {
	unit, name := uint64(1), "B"
	for i := 3; i >= 0; i-- {
		if u := sizeUnits[i]; total >= u.bytes {
			unit, name = u.bytes, u.suffix+"B"
			break
		}
	}
	f := func(n uint64) string {
		if unit == 1 {
			return strconv.FormatUint(n, 10)
		}
		return strconv.FormatFloat(float64(n)/float64(unit), 'f', 1, 64)
	}
	return fmt.Sprintf("%s %s / %s %s (%d%%)", f(done), name, f(total), name, percent(done, total))
}

// percent is done of total in whole percent, rounded down; 0 when total is.
func percent(done, total uint64) int {
	if total == 0 {
		return 0
	}
	return int(math.Floor(float64(min(done, total)) * 100 / float64(total)))
}
