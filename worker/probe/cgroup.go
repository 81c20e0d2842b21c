package probe

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"path"
	"strconv"
	"strings"
)

// Level is one cgroup on the path from the process's cgroup to the root.
type Level struct {
	Path   string `json:"path"`  // the cgroup path, e.g. /user.slice/job-1
	Dir    string `json:"dir"`   // where its files are, e.g. /sys/fs/cgroup/memory/user.slice/job-1
	Limit  Value  `json:"limit"` // memory: min(memory.max, memory.high) or limit_in_bytes; cpu: millicores
	Detail string `json:"detail,omitempty"`
}

// Cgroups is the process's cgroup picture.
type Cgroups struct {
	Version      string  `json:"version"` // v1, v2, hybrid, none
	MemoryPath   string  `json:"memory_cgroup"`
	MemoryLevels []Level `json:"memory_levels"` // leaf first
	MemoryLimit  Value   `json:"memory_limit"`  // tightest over every level
	MemoryBinds  string  `json:"memory_binding,omitempty"`
	Usage        Value   `json:"memory_usage"`
	WorkingSet   Value   `json:"working_set"`
	OOMKills     Value   `json:"oom_kills"`
	CPUPath      string  `json:"cpu_cgroup"`
	CPULevels    []Level `json:"cpu_levels"`
	CPUQuota     Value   `json:"cpu_quota_millicores"`
	CPUBinds     string  `json:"cpu_binding,omitempty"`
	Cpuset       Value   `json:"cpuset_cpus"`
	CpusetList   string  `json:"cpuset_list,omitempty"`
	PSI          PSI     `json:"pressure"` // v2 only; unknown on v1
}

// hierarchy is where one controller's files live for this process.
type hierarchy struct {
	v2    bool
	mount Mount
	path  string // cgroup path of the process
}

// dir is the directory of cgroup path p in this hierarchy (relative to root).
func (h hierarchy) dir(p string) string {
	rel := p
	if h.mount.Root != "/" && strings.HasPrefix(p, h.mount.Root) {
		rel = strings.TrimPrefix(p, h.mount.Root)
	}
	return path.Join(h.mount.Point, rel)
}

// levels returns the cgroup paths from the process's up to the hierarchy root.
func (h hierarchy) levels() []string {
	var out []string
	p := path.Clean(h.path)
	root := path.Clean(h.mount.Root)
	for {
		out = append(out, p)
		if p == "/" || p == root || p == "." {
			return out
		}
		p = path.Dir(p)
	}
}

// findHierarchies maps controllers (memory, cpu, cpuset) to their hierarchy.
func (p *Prober) findHierarchies(mounts []Mount) (map[string]hierarchy, string, error) {
	b, err := p.read(path.Join(p.procDir(), "cgroup"))
	if err != nil {
		return nil, "none", err
	}
	v1 := map[string]string{} // controller -> path
	v2path, hasV2 := "", false
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2path, hasV2 = parts[2], true
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			v1[c] = parts[2]
		}
	}
	out := map[string]hierarchy{}
	var v2mount *Mount
	for i, m := range mounts {
		switch m.FSType {
		case "cgroup2":
			if v2mount == nil || m.Point == "/sys/fs/cgroup" {
				v2mount = &mounts[i]
			}
		case "cgroup":
			for _, opt := range strings.Split(m.SuperOpts, ",") {
				if cp, ok := v1[opt]; ok {
					out[opt] = hierarchy{mount: m, path: cp}
				}
			}
		}
	}
	version := "none"
	switch {
	case len(out) > 0 && hasV2 && v2mount != nil:
		version = "hybrid"
	case len(out) > 0:
		version = "v1"
	case hasV2 && v2mount != nil:
		version = "v2"
	}
	if hasV2 && v2mount != nil {
		ctrl, _ := p.read(path.Join(v2mount.Point, "cgroup.controllers"))
		for _, c := range strings.Fields(string(ctrl)) {
			if _, taken := out[c]; !taken {
				out[c] = hierarchy{v2: true, mount: *v2mount, path: v2path}
			}
		}
		if version == "hybrid" && len(strings.Fields(string(ctrl))) > 0 && out["memory"].v2 {
			version = "v2"
		}
	}
	return out, version, nil
}

func (p *Prober) cgroups(mounts []Mount) Cgroups {
	cg := Cgroups{}
	hs, version, err := p.findHierarchies(mounts)
	cg.Version = version
	if err != nil {
		why := fmt.Sprintf("read %s/cgroup: %v", p.procDir(), err)
		cg.MemoryLimit, cg.CPUQuota, cg.Cpuset = Unknown("cgroup", "%s", why), Unknown("cgroup", "%s", why), Unknown("cgroup", "%s", why)
		cg.Usage, cg.WorkingSet, cg.OOMKills = cg.MemoryLimit, cg.MemoryLimit, cg.MemoryLimit
		cg.PSI = unknownPSI("cgroup", why)
		return cg
	}
	if h, ok := hs["memory"]; ok {
		cg.MemoryPath = h.path
		p.memoryCgroup(&cg, h)
	} else {
		cg.MemoryLimit = Unlimited("no memory cgroup controller")
		cg.Usage = Unknown("cgroup", "no memory controller")
		cg.WorkingSet, cg.OOMKills = cg.Usage, cg.Usage
	}
	if h, ok := hs["cpu"]; ok {
		cg.CPUPath = h.path
		p.cpuCgroup(&cg, h)
	} else {
		cg.CPUQuota = Unlimited("no cpu cgroup controller")
	}
	if h, ok := hs["cpuset"]; ok {
		p.cpusetCgroup(&cg, h)
	} else {
		cg.Cpuset = Unlimited("no cpuset cgroup controller")
	}
	if h, ok := hs["memory"]; ok && h.v2 {
		cg.PSI = p.psiDir(h.dir(h.path))
	} else {
		cg.PSI = unknownPSI("cgroup", "per-cgroup pressure needs cgroup v2")
	}
	return cg
}

// readLimit reads one limit file: ok=false when the file does not exist
// (the controller is not enabled at this level, which limits nothing).
func (p *Prober) readLimit(file string, parse func(string) (Value, error)) (Value, bool) {
	b, err := p.read(file)
	if errors.Is(err, fs.ErrNotExist) {
		return Value{}, false
	}
	if err != nil {
		return Unknown(file, "read: %v", err), true
	}
	v, err := parse(strings.TrimSpace(string(b)))
	if err != nil {
		return Unknown(file, "parse %q: %v", strings.TrimSpace(string(b)), err), true
	}
	v.Source = file
	return v, true
}

// v1 reports "no limit" as a huge page-rounded number.
const v1Unlimited = int64(1) << 62

func parseBytesLimit(s string) (Value, error) {
	if s == "max" {
		return Unlimited(""), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return Value{}, err
	}
	if n >= v1Unlimited {
		return Unlimited(""), nil
	}
	return Known(n, ""), nil
}

// bind folds one level into the effective limit, recording the level's
// path in binds when it becomes the tightest. Unlimited levels bind nothing.
func bind(eff Value, lv Level, binds *string) Value {
	if lv.Limit.Unlimited {
		return eff
	}
	if next := tighter(eff, lv.Limit); next != eff {
		*binds = lv.Path
		return next
	}
	return eff
}

// parseInt reads a plain integer file value.
func parseInt(s string) (Value, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	return Known(n, ""), err
}

// tighter returns the smaller of two limits; unknown wins over everything,
// because an unknown limit might be the tightest.
func tighter(a, b Value) Value {
	switch {
	case a.IsUnknown():
		return a
	case b.IsUnknown():
		return b
	case a.Unlimited:
		return b
	case b.Unlimited:
		return a
	case b.N < a.N:
		return b
	}
	return a
}

func (p *Prober) memoryCgroup(cg *Cgroups, h hierarchy) {
	eff := Unlimited("cgroup memory: no level sets a limit")
	for i, cp := range h.levels() {
		dir := h.dir(cp)
		lv := Level{Path: cp, Dir: dir, Limit: Unlimited(dir)}
		if h.v2 {
			if mx, ok := p.readLimit(path.Join(dir, "memory.max"), parseBytesLimit); ok {
				lv.Limit = tighter(lv.Limit, mx)
			}
			if hi, ok := p.readLimit(path.Join(dir, "memory.high"), parseBytesLimit); ok {
				lv.Limit = tighter(lv.Limit, hi)
				if hi.IsKnown() {
					lv.Detail = "memory.high throttles before memory.max kills"
				}
			}
		} else if lim, ok := p.readLimit(path.Join(dir, "memory.limit_in_bytes"), parseBytesLimit); ok {
			lv.Limit = lim
		} else if i == 0 {
			lv.Limit = Unknown(dir, "memory.limit_in_bytes missing in the process's own cgroup")
		}
		eff = bind(eff, lv, &cg.MemoryBinds)
		cg.MemoryLevels = append(cg.MemoryLevels, lv)
	}
	cg.MemoryLimit = eff
	leaf := h.dir(h.path)
	usageFile, inactiveKey, oomFile := "memory.current", "inactive_file", "memory.events"
	if !h.v2 {
		usageFile, inactiveKey, oomFile = "memory.usage_in_bytes", "total_inactive_file", "memory.oom_control"
	}
	cg.Usage, _ = p.readLimit(path.Join(leaf, usageFile), parseInt)
	if cg.Usage.Source == "" {
		cg.Usage = Unknown(path.Join(leaf, usageFile), "missing")
	}
	inactive, err := p.keyed(path.Join(leaf, "memory.stat"), inactiveKey)
	switch {
	case !cg.Usage.IsKnown():
		cg.WorkingSet = cg.Usage
	case err != nil:
		cg.WorkingSet = Unknown(path.Join(leaf, "memory.stat"), "%v", err)
	default:
		cg.WorkingSet = Known(max(cg.Usage.N-inactive, 0), path.Join(leaf, usageFile)+" - "+inactiveKey)
	}
	if n, err := p.keyed(path.Join(leaf, oomFile), "oom_kill"); err == nil {
		cg.OOMKills = Known(n, path.Join(leaf, oomFile))
	} else {
		cg.OOMKills = Unknown(path.Join(leaf, oomFile), "%v", err)
	}
}

func parseCPUMax(s string) (Value, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return Value{}, fmt.Errorf("empty")
	}
	if f[0] == "max" {
		return Unlimited(""), nil
	}
	q, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return Value{}, err
	}
	period := 100000.0
	if len(f) > 1 {
		if period, err = strconv.ParseFloat(f[1], 64); err != nil || period <= 0 {
			return Value{}, fmt.Errorf("bad period")
		}
	}
	return Known(int64(math.Round(q*1000/period)), ""), nil
}

func (p *Prober) cpuCgroup(cg *Cgroups, h hierarchy) {
	eff := Unlimited("cgroup cpu: no level sets a quota")
	for _, cp := range h.levels() {
		dir := h.dir(cp)
		lv := Level{Path: cp, Dir: dir, Limit: Unlimited(dir)}
		if h.v2 {
			if v, ok := p.readLimit(path.Join(dir, "cpu.max"), parseCPUMax); ok {
				lv.Limit = v
			}
		} else if q, ok := p.readLimit(path.Join(dir, "cpu.cfs_quota_us"), func(s string) (Value, error) {
			if s == "-1" {
				return Unlimited(""), nil
			}
			return parseInt(s)
		}); ok {
			lv.Limit = q
			if q.IsKnown() {
				per, ok := p.readLimit(path.Join(dir, "cpu.cfs_period_us"), parseInt)
				if !ok || !per.IsKnown() || per.N <= 0 {
					lv.Limit = Unknown(path.Join(dir, "cpu.cfs_period_us"), "quota set but period unreadable")
				} else {
					lv.Limit = Known(q.N*1000/per.N, path.Join(dir, "cpu.cfs_quota_us"))
				}
			}
		}
		eff = bind(eff, lv, &cg.CPUBinds)
		cg.CPULevels = append(cg.CPULevels, lv)
	}
	cg.CPUQuota = eff
}

func (p *Prober) cpusetCgroup(cg *Cgroups, h hierarchy) {
	dir := h.dir(h.path)
	files := []string{"cpuset.cpus.effective", "cpuset.effective_cpus", "cpuset.cpus"}
	for _, f := range files {
		b, err := p.read(path.Join(dir, f))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			cg.Cpuset = Unknown(path.Join(dir, f), "read: %v", err)
			return
		}
		list := strings.TrimSpace(string(b))
		n, err := countCPUList(list)
		if err != nil {
			cg.Cpuset = Unknown(path.Join(dir, f), "parse %q: %v", list, err)
			return
		}
		cg.Cpuset, cg.CpusetList = Known(int64(n), path.Join(dir, f)), list
		return
	}
	cg.Cpuset = Unlimited(dir + ": no cpuset file")
}

// countCPUList counts a CPU list such as "0-3,8,10-11".
func countCPUList(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	n := 0
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0, err
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0, fmt.Errorf("bad range %q", part)
			}
		}
		n += b - a + 1
	}
	return n, nil
}

// keyed reads "key value" lines (memory.stat, memory.events, oom_control).
func (p *Prober) keyed(file, key string) (int64, error) {
	b, err := p.read(file)
	if err != nil {
		return 0, err
	}
	n, found, err := ParseKeyed(b, key)
	if err == nil && !found {
		err = fmt.Errorf("%s has no %s", file, key)
	}
	return n, err
}

// ParseKeyed finds key in the "key value" lines of b (vmstat, memory.stat,
// memory.events, memory.oom_control) and parses its number.
func ParseKeyed(b []byte, key string) (n int64, found bool, err error) {
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) == 2 && f[0] == key {
			n, err = strconv.ParseInt(f[1], 10, 64)
			return n, true, err
		}
	}
	return 0, false, nil
}
