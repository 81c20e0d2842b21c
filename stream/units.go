package stream

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ParseSize reads a size with a unit: "512MiB", "2GiB", "1.5G", "100KB", "0".
// Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal ones (K, KB,
// M, MB, G, GB, T, TB) powers of 1000; a bare number or "B" is bytes.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size")
	}
	i := 0
	for i < len(t) && (t[i] == '.' || (t[i] >= '0' && t[i] <= '9')) {
		i++
	}
	num, unit := t[:i], strings.TrimSpace(t[i:])
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || num == "" {
		return 0, fmt.Errorf("size %q: want a number with a unit such as 512MiB or 2GiB", s)
	}
	mult, ok := sizeUnits[strings.ToLower(unit)]
	if !ok {
		return 0, fmt.Errorf("size %q: unknown unit %q (use B, KiB, MiB, GiB, TiB, K, M, G, T)", s, unit)
	}
	b := v * mult
	if b > math.MaxInt64/2 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(math.Round(b)), nil
}

var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"k": 1e3, "kb": 1e3, "kib": 1 << 10,
	"m": 1e6, "mb": 1e6, "mib": 1 << 20,
	"g": 1e9, "gb": 1e9, "gib": 1 << 30,
	"t": 1e12, "tb": 1e12, "tib": 1 << 40,
}

// FormatSize renders bytes in binary units for people.
func FormatSize(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%dB", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

// Seconds is a duration that machine-readable output carries as seconds.
type Seconds time.Duration

// MarshalJSON writes the duration as a number of seconds, formatted as
// encoding/json formats a float64. (Through strconv rather than
// json.Marshal: every shard record carries one per attempt, and the
// reflection round trip was a tenth of a short shard's JSON time.)
func (d Seconds) MarshalJSON() ([]byte, error) {
	f := time.Duration(d).Seconds()
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	b := strconv.AppendFloat(nil, f, format, -1, 64)
	if n := len(b); format == 'e' && n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
		b[n-2], b = b[n-1], b[:n-1] // e-09 becomes e-9, as encoding/json writes it
	}
	return b, nil
}

// UnmarshalJSON reads a number of seconds (null leaves it unchanged).
func (d *Seconds) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("seconds: %q is not a number", b)
	}
	*d = Seconds(time.Duration(f * float64(time.Second)))
	return nil
}

// D returns the value as a time.Duration.
func (d Seconds) D() time.Duration { return time.Duration(d) }
