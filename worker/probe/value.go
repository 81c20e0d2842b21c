package probe

import (
	"encoding/json"
	"fmt"
)

// Value is a three-state measurement: a number (bytes, a count, or
// millicores), unlimited, or unknown with a reason. Source names the file,
// syscall or library it came from.
type Value struct {
	N         int64
	Unlimited bool
	Unknown   string
	Source    string
}

// Known returns a value.
func Known(n int64, source string) Value { return Value{N: n, Source: source} }

// Unlimited returns "no limit here".
func Unlimited(source string) Value { return Value{Unlimited: true, Source: source} }

// Unknown returns "could not tell" with why.
func Unknown(source, format string, args ...any) Value {
	return Value{Unknown: fmt.Sprintf(format, args...), Source: source}
}

// IsKnown reports whether v holds a number.
func (v Value) IsKnown() bool { return v.Unknown == "" && !v.Unlimited }

// IsUnknown reports whether v could not be read.
func (v Value) IsUnknown() bool { return v.Unknown != "" }

type valueJSON struct {
	Value     *int64 `json:"value,omitempty"`
	Unlimited bool   `json:"unlimited,omitempty"`
	Unknown   string `json:"unknown,omitempty"`
	Source    string `json:"source,omitempty"`
}

// MarshalJSON writes {"value": n} or {"unlimited": true} or {"unknown": why}, with the source.
func (v Value) MarshalJSON() ([]byte, error) {
	j := valueJSON{Unlimited: v.Unlimited, Unknown: v.Unknown, Source: v.Source}
	if v.IsKnown() {
		n := v.N
		j.Value = &n
	}
	return json.Marshal(j)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (v *Value) UnmarshalJSON(b []byte) error {
	var j valueJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*v = Value{Unlimited: j.Unlimited, Unknown: j.Unknown, Source: j.Source}
	if j.Value != nil {
		v.N = *j.Value
	} else if !j.Unlimited && j.Unknown == "" {
		v.Unknown = "absent"
	}
	return nil
}

// Ratio is a three-state floating measurement (load averages, pressure).
type Ratio struct {
	F       float64 `json:"value"`
	Unknown string  `json:"unknown,omitempty"`
	Source  string  `json:"source,omitempty"`
}
