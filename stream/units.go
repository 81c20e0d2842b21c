package stream

import (
	"encoding/json"
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

// MarshalJSON writes the duration as a number of seconds.
func (d Seconds) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).Seconds())
}

// UnmarshalJSON reads a number of seconds.
func (d *Seconds) UnmarshalJSON(b []byte) error {
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*d = Seconds(time.Duration(f * float64(time.Second)))
	return nil
}

// D returns the value as a time.Duration.
func (d Seconds) D() time.Duration { return time.Duration(d) }
