package probe

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/shardpool/shardpool/stream"
)

// ErrPolicy wraps every problem in the policy file; the message names the
// file, line and field.
var ErrPolicy = errors.New("invalid policy file")

// Policy is the user's policy file: it can only tighten limits.
type Policy struct {
	Path          string         `json:"path"`
	Loaded        bool           `json:"loaded"`
	CPUs          Value          `json:"cap_cpus_millicores"`
	Memory        Value          `json:"cap_memory"`
	GPUs          Value          `json:"cap_gpus"`
	VRAM          Value          `json:"cap_vram"`
	ReserveCPU    int64          `json:"reserve_cpus_millicores"`
	ReserveMemory int64          `json:"reserve_memory"`
	ReserveVRAM   int64          `json:"reserve_vram"`
	ShareGPUs     bool           `json:"share_gpus"`
	Scratch       []string       `json:"scratch,omitempty"`
	Fleet         map[string]int `json:"fleet_caps,omitempty"`
}

type policyFile struct {
	Caps struct {
		CPUs   *float64 `toml:"cpus"`
		Memory string   `toml:"memory"`
		GPUs   *int     `toml:"gpus"`
		VRAM   string   `toml:"vram"`
	} `toml:"caps"`
	Reserve struct {
		CPUs   float64 `toml:"cpus"`
		Memory string  `toml:"memory"`
		VRAM   string  `toml:"vram"`
	} `toml:"reserve"`
	GPU struct {
		Share bool `toml:"share"`
	} `toml:"gpu"`
	Scratch []string       `toml:"scratch"`
	Fleet   map[string]int `toml:"fleet"`
}

// DefaultPolicyPath is $XDG_CONFIG_HOME/shardpool/policy.toml (or ~/.config/...).
func DefaultPolicyPath(getenv func(string) string) string {
	if d := getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "shardpool", "policy.toml")
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".config", "shardpool", "policy.toml")
	}
	return ""
}

// LoadPolicy reads the policy file; a missing file is an empty policy.
func LoadPolicy(path string) (Policy, error) {
	p := Policy{Path: path, CPUs: Unlimited("no policy cap"), Memory: Unlimited("no policy cap"), GPUs: Unlimited("no policy cap"), VRAM: Unlimited("no policy cap")}
	if path == "" {
		return p, nil
	}
	src, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("%s: %w: %v", path, ErrPolicy, err)
	}
	var f policyFile
	if err := toml.NewDecoder(bytes.NewReader(src)).DisallowUnknownFields().Decode(&f); err != nil {
		var sm *toml.StrictMissingError
		var de *toml.DecodeError
		switch {
		case errors.As(err, &sm) && len(sm.Errors) > 0:
			row, _ := sm.Errors[0].Position()
			return p, fmt.Errorf("%s:%d: field %q: %w: unknown field", path, row, strings.Join(sm.Errors[0].Key(), "."), ErrPolicy)
		case errors.As(err, &de):
			row, _ := de.Position()
			return p, fmt.Errorf("%s:%d: field %q: %w: %s", path, row, strings.Join(de.Key(), "."), ErrPolicy, strings.TrimPrefix(de.Error(), "toml: "))
		}
		return p, fmt.Errorf("%s: %w: %v", path, ErrPolicy, err)
	}
	bad := func(field, format string, args ...any) error {
		loc := path
		table, key := "", field
		if i := strings.LastIndex(field, "."); i >= 0 {
			table, key = field[:i], field[i+1:]
		}
		if n := stream.LineOf(src, table, key); n > 0 {
			loc = fmt.Sprintf("%s:%d", path, n)
		}
		return fmt.Errorf("%s: field %q: %w: %s", loc, field, ErrPolicy, fmt.Sprintf(format, args...))
	}
	src2 := "policy " + path
	p.Loaded = true
	if f.Caps.CPUs != nil {
		if *f.Caps.CPUs <= 0 {
			return p, bad("caps.cpus", "want a positive number")
		}
		p.CPUs = Known(int64(*f.Caps.CPUs*1000), src2)
	}
	if f.Caps.GPUs != nil {
		if *f.Caps.GPUs < 0 {
			return p, bad("caps.gpus", "want 0 or more")
		}
		p.GPUs = Known(int64(*f.Caps.GPUs), src2)
	}
	for _, sz := range []struct {
		field, val string
		dst        *Value
	}{{"caps.memory", f.Caps.Memory, &p.Memory}, {"caps.vram", f.Caps.VRAM, &p.VRAM}} {
		if sz.val == "" {
			continue
		}
		n, err := stream.ParseSize(sz.val)
		if err != nil {
			return p, bad(sz.field, "%v", err)
		}
		*sz.dst = Known(n, src2)
	}
	if f.Reserve.CPUs < 0 {
		return p, bad("reserve.cpus", "want 0 or more")
	}
	p.ReserveCPU = int64(f.Reserve.CPUs * 1000)
	for _, sz := range []struct {
		field, val string
		dst        *int64
	}{{"reserve.memory", f.Reserve.Memory, &p.ReserveMemory}, {"reserve.vram", f.Reserve.VRAM, &p.ReserveVRAM}} {
		if sz.val == "" {
			continue
		}
		n, err := stream.ParseSize(sz.val)
		if err != nil {
			return p, bad(sz.field, "%v", err)
		}
		*sz.dst = n
	}
	p.ShareGPUs, p.Fleet = f.GPU.Share, f.Fleet
	for i, d := range f.Scratch {
		// Taken on every host that reads the policy, so it must mean the
		// same directory everywhere: absolute, and as written (no shell
		// expands it).
		if !filepath.IsAbs(d) {
			return p, bad("scratch", "entry %d (%q): want an absolute path such as \"/local/scratch\" (no ~ or $VARIABLE: nothing expands them)", i, d)
		}
		p.Scratch = append(p.Scratch, filepath.Clean(d))
	}
	for class, n := range f.Fleet {
		if !stream.ValidClass(class) || n < 0 {
			return p, bad("fleet."+class, "want a class name and a count of 0 or more")
		}
	}
	return p, nil
}
