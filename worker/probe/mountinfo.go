package probe

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// Mount is one line of /proc/<pid>/mountinfo.
type Mount struct {
	ID        string
	Root      string // path inside the filesystem that is mounted here
	Point     string // mount point
	FSType    string
	Source    string
	SuperOpts string
	MountOpts string
}

// parseMountinfo reads mountinfo lines (see proc(5)), undoing the octal
// escapes of spaces, tabs, newlines and backslashes in paths.
func parseMountinfo(r io.Reader) ([]Mount, error) {
	var out []Mount
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	n := 0
	for s.Scan() {
		n++
		f := strings.Fields(s.Text())
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if len(f) < 7 || sep < 6 || len(f) < sep+3 {
			return nil, fmt.Errorf("mountinfo line %d: malformed", n)
		}
		m := Mount{ID: f[0], Root: unescape(f[3]), Point: unescape(f[4]), MountOpts: f[5],
			FSType: f[sep+1], Source: unescape(f[sep+2])}
		if len(f) > sep+3 {
			m.SuperOpts = f[sep+3]
		}
		out = append(out, m)
	}
	return out, s.Err()
}

func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1:i+4]) {
			v := (s[i+1]-'0')*64 + (s[i+2]-'0')*8 + (s[i+3] - '0')
			b.WriteByte(v)
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(s string) bool {
	if len(s) != 3 {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '7' {
			return false
		}
	}
	return true
}

// mountFor returns the mount whose point is the longest prefix of path
// (the last one listed wins among equals, as stacked mounts do).
func mountFor(mounts []Mount, path string) (Mount, bool) {
	best, found := Mount{}, false
	for _, m := range mounts {
		p := m.Point
		if path == p || p == "/" || strings.HasPrefix(path, strings.TrimSuffix(p, "/")+"/") {
			if !found || len(p) >= len(best.Point) {
				best, found = m, true
			}
		}
	}
	return best, found
}
