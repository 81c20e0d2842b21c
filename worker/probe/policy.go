package probe

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/shardpool/shardpool/stream"
)

// ErrPolicy wraps every problem in the policy file; the message names the
// file, line and field.
var ErrPolicy = errors.New("invalid policy file")

// Policy is the user's policy file: it can only tighten limits.
type Policy struct {
	Path   string `json:"path"`
	Loaded bool   `json:"loaded"`
	// Tier is the [tier.NAME] whose hosts this host's name matched: its
	// settings replace the file's top-level ones here.
	Tier          string         `json:"tier,omitempty"`
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

// hostSettings are what the top level of the policy file and each of its
// host tiers may set. Unset fields are nil: a tier replaces only what it
// sets.
type hostSettings struct {
	Caps struct {
		CPUs   *float64 `toml:"cpus"`
		Memory *string  `toml:"memory"`
		GPUs   *int     `toml:"gpus"`
		VRAM   *string  `toml:"vram"`
	} `toml:"caps"`
	Reserve struct {
		CPUs   *float64 `toml:"cpus"`
		Memory *string  `toml:"memory"`
		VRAM   *string  `toml:"vram"`
	} `toml:"reserve"`
	GPU struct {
		Share *bool `toml:"share"`
	} `toml:"gpu"`
	Scratch []string `toml:"scratch"`
}

type policyFile struct {
	hostSettings
	Fleet map[string]int      `toml:"fleet"`
	Tier  map[string]tierFile `toml:"tier"`
}

// tierFile is a [tier.NAME] table: the hosts it applies to, by name
// (shell patterns), and the settings that replace the top level's there.
type tierFile struct {
	Hosts []string `toml:"hosts"`
	hostSettings
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

// LoadPolicy reads the policy file for this host; a missing file is an
// empty policy.
func LoadPolicy(path string) (Policy, error) {
	host, _ := os.Hostname()
	return LoadPolicyFor(path, host)
}

// LoadPolicyFor reads the policy file as the host named host applies it:
// the top level, with the settings of the tier whose hosts match host in
// their place. Every tier is checked, whichever host reads the file, so a
// mistake in one shows on every host.
func LoadPolicyFor(path, host string) (Policy, error) {
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
			key := strings.Join(sm.Errors[0].Key(), ".")
			hint := ""
			if k := sm.Errors[0].Key(); len(k) == 3 && k[0] == "tier" && k[2] == "fleet" {
				hint = ": [fleet] caps count shards across every host, so they belong to the top level, not to a tier"
			}
			return p, fmt.Errorf("%s:%d: field %q: %w: unknown field%s", path, row, key, ErrPolicy, hint)
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
		n := stream.LineOf(src, table, key)
		if n == 0 {
			n = stream.LineOf(src, field, "") // a table's own header
		}
		if n > 0 {
			loc = fmt.Sprintf("%s:%d", path, n)
		}
		return fmt.Errorf("%s: field %q: %w: %s", loc, field, ErrPolicy, fmt.Sprintf(format, args...))
	}
	p.Loaded = true
	if err := p.apply(f.hostSettings, "", "policy "+path, bad); err != nil {
		return p, err
	}
	p.Fleet = f.Fleet
	for class, n := range f.Fleet {
		if !stream.ValidClass(class) || n < 0 {
			return p, bad("fleet."+class, "want a class name and a count of 0 or more")
		}
	}
	// Host names are not case-sensitive (RFC 4343): "Box" is box.
	host = strings.ToLower(host)
	short, _, _ := strings.Cut(host, ".")
	var matched []string
	for _, name := range slices.Sorted(maps.Keys(f.Tier)) {
		t := f.Tier[name]
		prefix := "tier." + name + "."
		if len(t.Hosts) == 0 {
			return p, bad("tier."+name, "no hosts: give hosts = [\"pattern\", ...], names or shell patterns such as \"gpu*\", for the hosts this tier is for")
		}
		match := false
		for i, pat := range t.Hosts {
			if _, err := filepath.Match(pat, ""); err != nil || pat == "" {
				return p, bad(prefix+"hosts", "entry %d (%q) is not a host name or shell pattern", i, pat)
			}
			for _, h := range []string{host, short} {
				if ok, _ := filepath.Match(strings.ToLower(pat), h); ok && h != "" {
					match = true
				}
			}
		}
		// A tier that does not apply here is still checked.
		var check Policy
		if err := check.apply(t.hostSettings, prefix, "", bad); err != nil {
			return p, err
		}
		if match {
			matched = append(matched, name)
		}
	}
	switch len(matched) {
	case 0:
	case 1:
		p.Tier = matched[0]
		if err := p.apply(f.Tier[matched[0]].hostSettings, "tier."+matched[0]+".", "policy "+path+" tier "+matched[0], bad); err != nil {
			return p, err
		}
	default:
		return p, fmt.Errorf("%s: %w: host %s matches the hosts of tiers %s: a host takes one tier; make their patterns apart",
			path, ErrPolicy, host, strings.Join(matched, " and "))
	}
	return p, nil
}

// apply sets what s sets, checked, on p; prefix is s's place in the file
// ("" or "tier.NAME."), for errors, and source names it in p's values.
func (p *Policy) apply(s hostSettings, prefix, source string, bad func(field, format string, args ...any) error) error {
	if c := s.Caps.CPUs; c != nil {
		if *c <= 0 {
			return bad(prefix+"caps.cpus", "want a positive number")
		}
		p.CPUs = Known(int64(*c*1000), source)
	}
	if g := s.Caps.GPUs; g != nil {
		if *g < 0 {
			return bad(prefix+"caps.gpus", "want 0 or more")
		}
		p.GPUs = Known(int64(*g), source)
	}
	for _, sz := range []struct {
		field string
		val   *string
		dst   *Value
	}{{"caps.memory", s.Caps.Memory, &p.Memory}, {"caps.vram", s.Caps.VRAM, &p.VRAM}} {
		if sz.val == nil {
			continue
		}
		n, err := stream.ParseSize(*sz.val)
		if err != nil {
			return bad(prefix+sz.field, "%v", err)
		}
		*sz.dst = Known(n, source)
	}
	if c := s.Reserve.CPUs; c != nil {
		if *c < 0 {
			return bad(prefix+"reserve.cpus", "want 0 or more")
		}
		p.ReserveCPU = int64(*c * 1000)
	}
	for _, sz := range []struct {
		field string
		val   *string
		dst   *int64
	}{{"reserve.memory", s.Reserve.Memory, &p.ReserveMemory}, {"reserve.vram", s.Reserve.VRAM, &p.ReserveVRAM}} {
		if sz.val == nil {
			continue
		}
		n, err := stream.ParseSize(*sz.val)
		if err != nil {
			return bad(prefix+sz.field, "%v", err)
		}
		*sz.dst = n
	}
	if s.GPU.Share != nil {
		p.ShareGPUs = *s.GPU.Share
	}
	if s.Scratch != nil {
		p.Scratch = nil
		for i, d := range s.Scratch {
			// Taken on every host the settings apply to, so it must
			// mean the same directory everywhere: absolute, and as
			// written (no shell expands it).
			if !filepath.IsAbs(d) {
				return bad(prefix+"scratch", "entry %d (%q): want an absolute path such as \"/local/scratch\" (no ~ or $VARIABLE: nothing expands them)", i, d)
			}
			p.Scratch = append(p.Scratch, filepath.Clean(d))
		}
	}
	return nil
}
