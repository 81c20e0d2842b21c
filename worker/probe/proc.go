package probe

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// PSI is pressure stall information: the share of time some (or all)
// tasks were stalled on a resource, averaged over 10 and 60 seconds.
type PSI struct {
	CPUSome10    Ratio `json:"cpu_some_avg10"`
	MemorySome10 Ratio `json:"memory_some_avg10"`
	MemoryFull10 Ratio `json:"memory_full_avg10"`
	IOSome10     Ratio `json:"io_some_avg10"`
	IOFull10     Ratio `json:"io_full_avg10"`
}

func unknownPSI(source, why string) PSI {
	u := Ratio{Unknown: why, Source: source}
	return PSI{u, u, u, u, u}
}

// psiFile reads one pressure file; a file that is absent or fails to read
// is unknown (a kernel without PSI, or psi=0).
func (p *Prober) psiFile(file string) (some, full Ratio) {
	b, err := p.read(file)
	if err != nil {
		why := fmt.Sprintf("read: %v", err)
		if errors.Is(err, fs.ErrNotExist) {
			why = "absent (kernel without PSI)"
		}
		u := Ratio{Unknown: why, Source: file}
		return u, u
	}
	some, full = Ratio{Unknown: "no 'some' line", Source: file}, Ratio{Unknown: "no 'full' line", Source: file}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		for _, kv := range f[1:] {
			if v, ok := strings.CutPrefix(kv, "avg10="); ok {
				x, err := strconv.ParseFloat(v, 64)
				r := Ratio{F: x, Source: file}
				if err != nil {
					r = Ratio{Unknown: "parse " + kv, Source: file}
				}
				switch f[0] {
				case "some":
					some = r
				case "full":
					full = r
				}
			}
		}
	}
	return some, full
}

func (p *Prober) psiDir(dir string) PSI {
	var out PSI
	out.CPUSome10, _ = p.psiFile(path.Join(dir, "cpu.pressure"))
	out.MemorySome10, out.MemoryFull10 = p.psiFile(path.Join(dir, "memory.pressure"))
	out.IOSome10, out.IOFull10 = p.psiFile(path.Join(dir, "io.pressure"))
	return out
}

func (p *Prober) hostPSI() PSI {
	var out PSI
	dir := path.Join(p.cfg.ProcRoot, "pressure")
	out.CPUSome10, _ = p.psiFile(path.Join(dir, "cpu"))
	out.MemorySome10, out.MemoryFull10 = p.psiFile(path.Join(dir, "memory"))
	out.IOSome10, out.IOFull10 = p.psiFile(path.Join(dir, "io"))
	return out
}

// Host is host-wide memory, swap and load.
type Host struct {
	MemTotal     Value  `json:"mem_total"`
	MemAvailable Value  `json:"mem_available"`
	SwapTotal    Value  `json:"swap_total"`
	SwapUsed     Value  `json:"swap_used"`
	Load1        Ratio  `json:"load1"`
	Load5        Ratio  `json:"load5"`
	Load15       Ratio  `json:"load15"`
	OnlineCPUs   Value  `json:"online_cpus"`
	Affinity     Value  `json:"affinity_cpus"`
	AffinityList string `json:"affinity_list,omitempty"`
	OOMKills     Value  `json:"oom_kills"`
	// OthersCPU is the CPU, in millicores, that everything but this
	// user's processes used of late (Config.CPUUse); absent when not
	// measured.
	OthersCPU *Value `json:"others_cpu_millicores,omitempty"`
}

func (p *Prober) host() Host {
	var h Host
	mi := path.Join(p.cfg.ProcRoot, "meminfo")
	vals, err := p.meminfo(mi)
	get := func(k string) Value {
		if err != nil {
			return Unknown(mi, "read: %v", err)
		}
		v, ok := vals[k]
		if !ok {
			return Unknown(mi, "no %s line", k)
		}
		return Known(v, mi+" "+k)
	}
	h.MemTotal, h.MemAvailable, h.SwapTotal = get("MemTotal"), get("MemAvailable"), get("SwapTotal")
	if free := get("SwapFree"); h.SwapTotal.IsKnown() && free.IsKnown() {
		h.SwapUsed = Known(h.SwapTotal.N-free.N, mi+" SwapTotal-SwapFree")
	} else {
		h.SwapUsed = Unknown(mi, "swap unreadable")
	}
	la := path.Join(p.cfg.ProcRoot, "loadavg")
	if b, err := p.read(la); err == nil && len(strings.Fields(string(b))) >= 3 {
		f := strings.Fields(string(b))
		for i, dst := range []*Ratio{&h.Load1, &h.Load5, &h.Load15} {
			x, err := strconv.ParseFloat(f[i], 64)
			*dst = Ratio{F: x, Source: la}
			if err != nil {
				*dst = Ratio{Unknown: "parse " + f[i], Source: la}
			}
		}
	} else {
		u := Ratio{Unknown: fmt.Sprintf("read: %v", err), Source: la}
		h.Load1, h.Load5, h.Load15 = u, u, u
	}
	online := path.Join(p.cfg.SysRoot, "devices/system/cpu/online")
	if b, err := p.read(online); err == nil {
		if n, err := countCPUList(strings.TrimSpace(string(b))); err == nil {
			h.OnlineCPUs = Known(int64(n), online)
		} else {
			h.OnlineCPUs = Unknown(online, "parse: %v", err)
		}
	} else {
		h.OnlineCPUs = Unknown(online, "read: %v", err)
	}
	h.Affinity, h.AffinityList = p.affinity()
	vm := path.Join(p.cfg.ProcRoot, "vmstat")
	if n, err := p.keyed(vm, "oom_kill"); err == nil {
		h.OOMKills = Known(n, vm)
	} else {
		h.OOMKills = Unknown(vm, "%v", err)
	}
	return h
}

func (p *Prober) meminfo(file string) (map[string]int64, error) {
	b, err := p.read(file)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		k, rest, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n *= 1024
		}
		out[k] = n
	}
	return out, nil
}

// affinity is the CPU count the process may run on: sched_getaffinity for
// this process on the real host, Cpus_allowed_list from status otherwise.
func (p *Prober) affinity() (Value, string) {
	if p.real() {
		if n, list, err := schedAffinity(); err == nil {
			return Known(int64(n), "sched_getaffinity"), list
		}
	}
	st := path.Join(p.procDir(), "status")
	b, err := p.read(st)
	if err != nil {
		return Unknown(st, "read: %v", err), ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			list := strings.TrimSpace(v)
			n, err := countCPUList(list)
			if err != nil {
				return Unknown(st, "parse Cpus_allowed_list: %v", err), ""
			}
			return Known(int64(n), st+" Cpus_allowed_list"), list
		}
	}
	return Unknown(st, "no Cpus_allowed_list"), ""
}

// UserLoad is one user's totals: no command lines, no environments.
type UserLoad struct {
	UID       int     `json:"uid"`
	Processes int     `json:"processes"`
	RSS       int64   `json:"rss"`
	CPUCores  float64 `json:"cpu_cores"`
	CPUTime   float64 `json:"cpu_seconds"`
}

type procSample struct {
	uid   int
	rss   int64
	ticks int64
}

// sampleProcs reads uid, RSS and CPU ticks of every process.
func (p *Prober) sampleProcs() (map[int]procSample, error) {
	page := int64(os.Getpagesize())
	out := map[int]procSample{}
	err := p.eachProc(nil, func(pid, uid int, st Stat, ok bool) {
		s := procSample{uid: uid}
		if ok {
			s.ticks, s.rss = st.Ticks, st.RSSPages*page
		}
		out[pid] = s
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachProc calls fn with the uid and /proc/<pid>/stat of every process
// whose uid want takes (every process with want nil); ok is false for a
// stat that does not parse. On the real /proc the uid is the owner of the
// process's directory (its effective uid), known before its stat is read;
// fixture trees cannot carry ownership, so there the Uid line of status
// is read instead (-1 where it cannot be). A process that exits between
// the listing and the read is left out.
func (p *Prober) eachProc(want func(uid int) bool, fn func(pid, uid int, st Stat, ok bool)) error {
	dir := p.hostPath(p.cfg.ProcRoot)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		uid := -1
		if p.cfg.Root == "/" {
			if info, err := e.Info(); err == nil {
				if st, ok := info.Sys().(*syscall.Stat_t); ok {
					uid = int(st.Uid)
				}
			}
		} else {
			uid = p.uidOf(pid)
		}
		if want != nil && !want(uid) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		if err != nil {
			continue
		}
		st, ok := ParseStat(b)
		fn(pid, uid, st, ok)
	}
	return nil
}

// Stat is what shardpool reads from /proc/<pid>/stat.
type Stat struct {
	PPid     int   // parent process
	PGrp     int   // process group
	Ticks    int64 // utime + stime, in clock ticks
	Reaped   int64 // cutime + cstime: children waited for, in clock ticks
	RSSPages int64 // resident set, in pages
	Start    int64 // start time, in clock ticks since boot
	State    byte  // R, S, D, Z (zombie: dead, not yet reaped), ...
	Kernel   bool  // a kernel thread (PF_KTHREAD in its flags)
}

// pfKthread is the kernel's PF_KTHREAD task flag.
const pfKthread = 0x00200000

// ParseStat reads a /proc/<pid>/stat line. The fields are counted after
// the parenthesised command name, which may itself hold spaces and
// parentheses: state, ppid, pgrp, flags, utime, stime, cutime, cstime,
// starttime and rss are the 3rd to 5th, 9th, 14th to 17th, 22nd and 24th
// fields overall.
func ParseStat(b []byte) (Stat, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return Stat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 22 {
		return Stat{}, false
	}
	ppid, err0 := strconv.Atoi(f[1])
	pgrp, err1 := strconv.Atoi(f[2])
	u, err2 := strconv.ParseInt(f[11], 10, 64)
	k, err3 := strconv.ParseInt(f[12], 10, 64)
	rss, err4 := strconv.ParseInt(f[21], 10, 64)
	start, err5 := strconv.ParseInt(f[19], 10, 64)
	cu, err6 := strconv.ParseInt(f[13], 10, 64)
	cs, err7 := strconv.ParseInt(f[14], 10, 64)
	flags, err8 := strconv.ParseUint(f[6], 10, 64)
	if err0 != nil || err1 != nil || err2 != nil || err3 != nil || err4 != nil || err5 != nil || err6 != nil || err7 != nil || err8 != nil {
		return Stat{}, false
	}
	return Stat{PPid: ppid, PGrp: pgrp, Ticks: u + k, Reaped: cu + cs, RSSPages: rss, Start: start, State: f[0][0],
		Kernel: flags&pfKthread != 0}, true
}

// clockTicks is USER_HZ, 100 on every Linux shardpool supports.
const clockTicks = 100

func usersLoad(before, after map[int]procSample, seconds float64) []UserLoad {
	by := map[int]*UserLoad{}
	for pid, s := range after {
		u := by[s.uid]
		if u == nil {
			u = &UserLoad{UID: s.uid}
			by[s.uid] = u
		}
		u.Processes++
		u.RSS += s.rss
		u.CPUTime += float64(s.ticks) / clockTicks
		if b, ok := before[pid]; ok && seconds > 0 && s.ticks >= b.ticks {
			u.CPUCores += float64(s.ticks-b.ticks) / clockTicks / seconds
		}
	}
	out := make([]UserLoad, 0, len(by))
	for _, u := range by {
		out = append(out, *u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].RSS > out[j].RSS })
	return out
}

// PIDAlive reports whether pid is a running process of procRoot's host. A
// zombie is not: it is dead, only not yet reaped (a worker killed under a
// parent that does not reap, such as a container's pid 1 or a shell that
// started it in the background, stays one indefinitely). A process whose
// stat cannot be read for another reason counts as alive: nothing proves
// it gone.
func PIDAlive(procRoot string, pid int) bool {
	if pid <= 0 {
		return false
	}
	if procRoot == "/proc" {
		if err := syscall.Kill(pid, 0); err != nil && err != syscall.EPERM {
			return false
		}
	}
	st, err := ReadStat(procRoot, pid)
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	return st.State != 'Z'
}

// ReadStat reads and parses procRoot/<pid>/stat.
func ReadStat(procRoot string, pid int) (Stat, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return Stat{}, err
	}
	st, ok := ParseStat(b)
	if !ok {
		return Stat{}, fmt.Errorf("%s/%d/stat does not parse", procRoot, pid)
	}
	return st, nil
}

// Children lists the pids of the processes whose parent is pid, as
// procRoot shows them now (a process that ends meanwhile is left out).
func Children(procRoot string, pid int) []int {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		k, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := ReadStat(procRoot, k); err == nil && st.PPid == pid {
			out = append(out, k)
		}
	}
	return out
}
